"""reference-grpo / reference-sft-grpo: the GRPO script on the tiny model, its rewards, and a whole scripted
session (SFT warm-up, then GRPO from it) against the real grading HTTP API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl_bench.records import EvalResult, RunConfig
from a2rl_bench.workspace import RunPaths, build_workspace
from a2rl_bench.agents import AgentEnv, get_agent, run_agent
from a2rl_bench.agents.reference_grpo import agent as grpo_agent
from a2rl_bench.agents.reference_grpo import train_grpo
from a2rl_bench.agents.reference_sft import agent as sft_agent
from a2rl_bench.benchmarks.gsm8k.answers import extract_answer as grader_extract_answer

TRAIN_GRPO = Path(train_grpo.__file__)

# Single-digit targets: the random tiny model writes digits often enough that the rewards of a group differ,
# so GRPO's advantages (and gradients) are not all zero.
ROWS = [{"id": i, "question": f"What is {i % 10} plus 0?", "answer": f"{i % 10} + 0 = {i % 10}\n#### {i % 10}",
         "target": str(i % 10)} for i in range(20)]  # fmt: skip


@pytest.fixture(scope="module")
def train_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def max_weight_change(a: Path, b: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    ma = AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32).state_dict()
    mb = AutoModelForCausalLM.from_pretrained(b, dtype=torch.float32).state_dict()
    assert ma.keys() == mb.keys()
    return max((ma[k] - mb[k]).abs().max().item() for k in ma)


def test_train_grpo_runs_real_steps_and_writes_a_merged_lora_checkpoint(tiny_model_dir, train_jsonl, tmp_path):
    out = tmp_path / "output" / "v1"
    out.parent.mkdir()
    # 2 steps of 16 completions (2 prompts x 8 generations) of 32 tokens at temperature 1.5, so that some
    # completions hit the target and a group's rewards differ; lr 1e-2 because the tiny model's gradients are tiny.
    cmd = [sys.executable, str(TRAIN_GRPO), "--init", str(tiny_model_dir), "--out", str(out),
           "--data", str(train_jsonl),
           "--max-steps", "2", "--batch-size", "16", "--num-generations", "8", "--max-completion-length", "32",
           "--temperature", "1.5", "--lr", "1e-2", "--lora", "--lora-r", "4", "--lora-alpha", "8",
           "--time-limit", "60", "--seed", "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = sft_agent.parse_summary(proc.stdout.splitlines())
    assert summary is not None and summary["steps"] == 2 and summary["lora"] is True and summary["method"] == "GRPO"
    assert summary["correct_mean"] > 0  # the rule reward fired, so the update below is a real one
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not any(n.startswith("adapter_") for n in names), "LoRA adapter not merged"
    assert not any(p.name.startswith(".") for p in out.parent.iterdir()), "temp or trainer dirs left behind"
    assert max_weight_change(tiny_model_dir, out) > 0


def test_train_grpo_samples_through_the_decode_engine_on_a_lora_policy(tiny_model_dir, train_jsonl, tmp_path):
    """`--rollouts engine` (on CUDA the default): TRL's completions come from the decode engine on a bf16 copy of
    the policy with its LoRA merged in, synced before every generation; training and the merged checkpoint are
    as with `generate`."""
    out = tmp_path / "output" / "v1"
    out.parent.mkdir()
    cmd = [sys.executable, str(TRAIN_GRPO), "--init", str(tiny_model_dir), "--out", str(out), "--data", str(train_jsonl),
           "--max-steps", "2", "--batch-size", "32", "--num-generations", "8", "--max-completion-length", "32",
           "--temperature", "1.5", "--lr", "1e-2", "--lora", "--lora-r", "4", "--lora-alpha", "8",
           "--time-limit", "60", "--seed", "0", "--rollouts", "engine"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "decode engine failed" not in proc.stderr
    summary = sft_agent.parse_summary(proc.stdout.splitlines())
    assert summary["steps"] == 2 and summary["engine_generations"] == 2
    assert summary["correct_mean"] > 0  # 64 random completions: some hit their digit, so the update is real
    assert max_weight_change(tiny_model_dir, out) > 0


def test_engine_rollouts_follow_the_lora_policy(tiny_model_dir):
    """After the adapters change, `sync` makes the bf16 copy equal to the merged policy (what it samples from)."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    rollouts = train_grpo.EngineRollouts(policy, {2}, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4, seed=0,
                                         pad_id=0)  # fmt: skip
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.5)
    rollouts.sync(policy)
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    mine = rollouts.copy.state_dict()
    assert merged.keys() == mine.keys()
    for k in merged:
        assert torch.allclose(mine[k].float(), merged[k].to(torch.bfloat16).float(), atol=1e-2), k
    assert any(not torch.equal(mine[k].float(), base_w.to(torch.bfloat16).float())
               for k, base_w in AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict().items())
    assert len(rollouts.generate([[5, 6, 7], [8, 9]])) == 2


def test_train_grpo_refuses_a_batch_that_is_not_whole_groups(tiny_model_dir, train_jsonl, tmp_path):
    cmd = [sys.executable, str(TRAIN_GRPO), "--init", str(tiny_model_dir), "--out", str(tmp_path / "v1"),
           "--data", str(train_jsonl), "--batch-size", "6", "--num-generations", "4"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "multiple of --num-generations" in proc.stderr


@pytest.mark.parametrize(
    ("completion", "target", "correct", "fmt"),
    [
        ("3 + 4 = 7.\nThe answer is 7", "7", 1.0, 1.0),  # the evaluation format, right
        ("3 + 4 = 7.\nThe answer is 8.", "7", 0.0, 1.0),  # well formatted, wrong
        ("The answer is $1,200. Then more text", "1200", 1.0, 0.5),  # said, but not at the end
        ("so 3 + 4 = 7", "7", 1.0, 0.0),  # no marker: the last number counts, no format reward
        ("#### 12", "12", 1.0, 0.5),  # GSM8K reference marker
        ("The answer is 5. Question: what is 2+2? The answer is 4", "5", 1.0, 0.5),  # invented next question
        ("no number at all", "1", 0.0, 0.0),
    ],
)
def test_rewards_follow_the_graders_rule(completion, target, correct, fmt):
    conversational = [[{"role": "assistant", "content": completion}]]
    assert train_grpo.correctness_reward(conversational, target=[target]) == [correct]
    assert train_grpo.correctness_reward([completion], target=[target]) == [correct]
    assert train_grpo.format_reward(conversational) == [fmt]


@pytest.mark.parametrize(
    "text",
    ["The answer is 42", "#### 1,234", "It is -5 degrees", "costs $3.50 total", "answer is: 0.50",
     "first 3 then 4", "The answer is 7. Question: next one is 9", "5-day trip, 10 miles", "nothing"],
)
def test_the_scripts_answer_extraction_agrees_with_the_grader(text):
    assert train_grpo.extract_answer(text) == grader_extract_answer(text)


def test_target_comes_from_the_row_or_its_solution():
    assert train_grpo.target_of({"target": "1,000"}) == "1000"
    assert train_grpo.target_of({"answer": "work\n#### 72"}) == "72"
    assert train_grpo.target_of({"answer": "no marker"}) is None


def test_grpo_settings_come_from_the_environment():
    s = grpo_agent.GRPOSettings.from_env({"A2RL_GRPO_MAX_STEPS": "2", "A2RL_GRPO_LR": "0.5"})
    assert (s.max_steps, s.lr, s.num_generations, s.max_completion_length) == (2, 0.5, 4, 128)


def _constant_evaluator(score: float):
    def evaluate(model_dir: Path, weights_hash: str, spec, device=None) -> EvalResult:
        return EvalResult(task=spec.task, split=spec.split, score=score, n=4, n_correct=2,
                          evaluator_id="constant", weights_hash=weights_hash)  # fmt: skip

    return evaluate


def test_reference_sft_grpo_session_warms_up_with_sft_then_runs_grpo_from_it(
    tiny_model_dir, train_jsonl, tmp_path, monkeypatch
):
    knobs = {"A2RL_SFT_MAX_STEPS": "2", "A2RL_SFT_BATCH_SIZE": "2", "A2RL_SFT_LR": "1e-2", "A2RL_SFT_TRAIN_S": "30",
             "A2RL_GRPO_MAX_STEPS": "2", "A2RL_GRPO_MAX_COMPLETION_LENGTH": "16", "A2RL_GRPO_LR": "1e-2",
             "A2RL_GRPO_TRAIN_S": "30"}  # fmt: skip
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    public = train_jsonl.parent
    paths = RunPaths.for_run(tmp_path / "runs", "run-g")
    build_workspace(paths, public, tiny_model_dir, "# Task\n", "# Instructions\n")
    agent = get_agent("reference-sft-grpo")
    agent.install(paths.workspace)
    code = {p.name for p in (paths.workspace / "code").iterdir()}
    assert code == {"agent.py", "train_grpo.py", "train_grpo_env.py", "train_sft.py", "round_loop.py",
                    "decode_engine.py", "train_precision.py", "train_common.py", "sft_grpo_session.py", "sft_torch.py",
                    "grpo_env_torch.py", "search_demos.py"}
    clock = BudgetClock(600)
    ctx = GradingContext("run-g", RunConfig(max_submissions=2), paths.workspace, paths.harness_dir,
                         baseline={"validation": 25.0}, base_model_dir=tiny_model_dir)  # fmt: skip
    service = GradingService(ctx, clock, evaluate=_constant_evaluator(50.0))
    with GradingServer(service) as server:
        env = AgentEnv("gsm8k", "tiny", paths.workspace, server.url, server.token, 0, harness_dir=paths.harness_dir)
        outcome = run_agent(agent, env, clock, paths.harness_dir / "agent.log", grace_s=5)
    service.close(drain_timeout_s=10)
    log = (paths.harness_dir / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    assert "stopping: submission cap reached" in log
    scored = [(e.model_path, e.score) for e in service.submissions() if e.status == "scored"]
    assert scored == [("output/v1", 50.0), ("output/v2", 50.0)]
    notes = (paths.workspace / "code" / "NOTES.md").read_text()
    rows = [line for line in notes.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert rows[0].startswith("| 1 | SFT | models/base |") and rows[1].startswith("| 2 | GRPO | output/v1 |")
    assert "--sft-warmup" in " ".join(agent.command(paths.workspace))


# -- online rollouts in an interactive task's environment (train_grpo_env.py) ------------------------------
from a2rl_bench.agents.reference_grpo import train_grpo_env  # noqa: E402


@pytest.fixture(scope="module")
def searchqa_data(tmp_path_factory) -> Path:
    """The deepsearchqa workspace data (train goals, corpus, envlib.zip), first 8 training goals only."""
    from a2rl_bench.benchmarks import get_task

    public = get_task("deepsearchqa").prepare("offline").public_dir
    data = tmp_path_factory.mktemp("searchqa-data")
    for name in ("corpus.jsonl", "envlib.zip"):
        (data / name).write_bytes((public / name).read_bytes())
    lines = (public / "train.jsonl").read_text().splitlines()[:8]
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    return data


def test_episode_tokens_train_on_the_actions_and_mask_the_observations(tiny_model_dir, searchqa_data):
    from transformers import AutoTokenizer

    envlib = train_grpo_env.import_envlib(searchqa_data)
    goal = envlib.load_goals(searchqa_data)[0]
    make_env, prompter = envlib.make_env("deepsearchqa", searchqa_data), envlib.prompter("deepsearchqa")
    actions = iter([f"search[{goal['question']}]", f"answer[{goal['answer']}]"])
    [episode] = envlib.run_episodes(make_env, [goal], lambda convs: [next(actions)], prompter, max_steps=4)
    assert episode.won
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt_ids, completion, mask = train_grpo_env.episode_tokens(
        tokenizer, prompter(goal, episode.observation, []), episode.turns, max_tokens=10_000
    )
    model_text = tokenizer.decode([t for t, m in zip(completion, mask) if m])
    env_text = tokenizer.decode([t for t, m in zip(completion, mask) if not m])
    for turn in episode.turns:
        assert turn["action"] in model_text and turn["action"] not in env_text
    assert episode.turns[0]["observation"][:40] in env_text and "Observation:" not in model_text
    # The whole sequence is the conversation the chat template renders.
    full = prompter(goal, episode.observation, []) + [
        m for t in episode.turns for m in ({"role": "assistant", "content": t["action"]},
                                           {"role": "user", "content": f"Observation: {t['observation']}"})]  # fmt: skip
    rendered = tokenizer.apply_chat_template(full, tokenize=False, add_generation_prompt=False)
    assert tokenizer.decode(prompt_ids + completion).startswith(rendered.rsplit("Observation:", 1)[0][:-20])


def test_env_grpo_learns_from_episode_rewards(tiny_model_dir, searchqa_data, tmp_path, monkeypatch, capsys):
    """A policy that answers right in every other episode gives groups whose rewards differ: real GRPO steps
    change the weights, and the summary counts the episodes played and won."""
    goals = train_grpo_env.import_envlib(searchqa_data).load_goals(searchqa_data)
    calls = {"answers": 0}

    def half_right_policy(model, tokenizer, max_new_tokens, temperature, stop):
        def policy(conversations):
            replies = []
            for conv in conversations:
                goal = next(g for g in goals if g["question"] in conv[1]["content"])
                if len(conv) == 2:
                    replies.append(f"search[{goal['question']}]")
                else:
                    calls["answers"] += 1
                    replies.append(f"answer[{goal['answer'] if calls['answers'] % 2 else 'no idea'}]")
            return replies

        return policy

    monkeypatch.setattr(train_grpo_env, "sampling_policy", half_right_policy)
    out = tmp_path / "v1"
    rc = train_grpo_env.main(["--init", str(tiny_model_dir), "--out", str(out), "--task", "deepsearchqa",
                              "--data", str(searchqa_data), "--max-steps", "2", "--goals-per-step", "2",
                              "--num-generations", "4", "--lr", "1e-2", "--seed", "0"])  # fmt: skip
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.split(train_grpo_env.SUMMARY_PREFIX)[1].splitlines()[0])
    assert summary["steps"] == 2 and summary["episodes"] == 16 and summary["win_rate"] == 0.5
    assert (out / "model.safetensors").exists() and max_weight_change(tiny_model_dir, out) > 0


def test_the_env_trainer_refuses_a_task_without_environments(tiny_model_dir, train_jsonl, tmp_path, capsys):
    rc = train_grpo_env.main(["--init", str(tiny_model_dir), "--out", str(tmp_path / "v1"), "--task", "gsm8k",
                              "--data", str(train_jsonl.parent)])  # fmt: skip
    assert rc == 2 and "not an interactive task" in capsys.readouterr().err
