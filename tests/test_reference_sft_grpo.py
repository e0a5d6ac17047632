"""reference-sft-grpo on an interactive task (alfworld): the in-process session (SFT rounds until validation
stops rising, then GRPO with online rollouts and a loop penalty), its stop rule, its rewards, and the mode
sft-only, on the tiny model against the real grading HTTP API."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from a2rl.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl.records import EvalResult, RunConfig
from a2rl.summary.routes import route_label
from a2rl.workspace import RunPaths, build_workspace
from agents import AgentEnv, get_agent, run_agent
from agents.reference_sft_grpo import grpo_env_torch, sft_torch
from agents.reference_sft_grpo.sft_grpo_session import Knobs, read_mode, sft_finished


# -- the stop rule and the rewards ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scores", "baseline", "done"),
    [
        ([10.0], 0.0, False),  # one round: nothing to compare with
        ([10.0, 20.0], 0.0, False),  # still rising
        ([10.0, 20.0, 20.0], 0.0, True),  # a tie is not a rise
        ([10.0, 20.0, 15.0], 0.0, True),
        ([0.0, 0.0], 0.0, False),  # not above the baseline yet: keep going
        ([0.0, 5.0, 3.0], 5.0, False),
        ([10.0, None], 0.0, True),  # an unscored round does not rise either
        ([None, None], 0.0, False),
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.0, True),  # max rounds
    ],
)
def test_sft_stops_when_validation_stops_rising(scores, baseline, done):
    assert sft_finished(scores, baseline, max_rounds=6) is done


def test_sft_stop_rule_with_patience_two():
    assert not sft_finished([10.0, 20.0, 15.0], 0.0, max_rounds=9, patience=2)
    assert sft_finished([10.0, 20.0, 15.0, 20.0], 0.0, max_rounds=9, patience=2)


def test_loop_penalty_counts_repeated_actions():
    assert grpo_env_torch.repeat_fraction([]) == 0.0
    assert grpo_env_torch.repeat_fraction(["look", "go to desk 1", "take pen 1 from desk 1"]) == 0.0
    assert grpo_env_torch.repeat_fraction(["go to desk 1", "look", "Go to  desk 1", "look"]) == 0.5
    assert grpo_env_torch.shaped_reward(1.0, ["a", "b"], 0.5) == 1.0
    assert grpo_env_torch.shaped_reward(0.0, ["a", "a", "a", "a"], 0.4) == pytest.approx(-0.3)


def test_group_advantages_normalise_within_each_group():
    adv = grpo_env_torch.group_advantages([1.0, 0.0, 0.5, 0.5, -0.2, 0.0], group_size=2)
    assert adv[0] == pytest.approx(1.0, abs=1e-3) and adv[1] == pytest.approx(-1.0, abs=1e-3)
    assert adv[2:4] == [0.0, 0.0]  # equal rewards carry no signal
    assert adv[4] < 0 < adv[5]
    with pytest.raises(ValueError):
        grpo_env_torch.group_advantages([1.0, 0.0, 1.0], group_size=2)


def test_mode_comes_from_the_instructions(tmp_path):
    assert read_mode(tmp_path) == "free"
    (tmp_path / "instructions.md").write_text("# Instructions\n- Mode: `sft-only`. Only SFT.\n")
    assert read_mode(tmp_path) == "sft-only"


def test_knobs_default_to_the_gpu_recipe():
    k = Knobs.from_env({})
    assert (k.sft_lr, k.sft_batch_size, k.group_size, k.loop_penalty) == (1e-4, 32, 4, 0.5)
    assert Knobs.from_env({"A2RL_SFT_ROUND_S": "7", "A2RL_GRPO_LOOP_PENALTY": "0.2"}).sft_round_s == 7.0


# -- the trainers on the tiny model ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alfworld_data(tmp_path_factory) -> Path:
    """The alfworld workspace data: 8 training games, 40 worked examples, the environments."""
    from benchmarks import get_task

    public = get_task("alfworld").prepare("offline").public_dir
    data = tmp_path_factory.mktemp("alfworld-data")
    (data / "envlib.zip").write_bytes((public / "envlib.zip").read_bytes())
    for name, n in (("train.jsonl", 8), ("sft.jsonl", 40)):
        (data / name).write_text("\n".join((public / name).read_text().splitlines()[:n]) + "\n")
    return data


def _tiny(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), tokenizer


def test_sft_examples_carry_the_loss_on_the_reply_only(tiny_model_dir, alfworld_data):
    _, tokenizer = _tiny(tiny_model_dir)
    examples, rows = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
    assert rows == 40 and len(examples) == 40
    row = json.loads((alfworld_data / "sft.jsonl").read_text().splitlines()[0])
    ex = examples[0]
    reply = tokenizer.decode([t for t in ex.labels if t != sft_torch.IGNORE])
    assert reply.startswith(row["completion"][0]["content"])
    assert row["prompt"][-1]["content"][:30] not in reply
    short, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=len(ex.input_ids) - 1)
    assert len(short) < 40  # too long is skipped, never truncated


def test_epoch_batches_cover_every_example_once():
    import random

    batches = sft_torch.epoch_batches(70, 8, random.Random(0), lengths=[i % 13 for i in range(70)])
    assert sorted(i for b in batches for i in b) == list(range(70))


def test_sft_rounds_and_grpo_iterations_change_the_weights(tiny_model_dir, alfworld_data):
    import torch

    model, tokenizer = _tiny(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    examples, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
    sft = sft_torch.SFTRounds(model, tokenizer, examples, lr=1e-2, batch_size=4, seed=0)
    stats = sft.train(seconds=60, max_steps=2)
    assert stats.steps == 2 and stats.examples == 8 and stats.loss > 0
    after_sft = {k: v.clone() for k, v in model.state_dict().items()}
    assert max((after_sft[k] - before[k]).abs().max().item() for k in before) > 0

    envlib = grpo_env_torch.import_envlib(alfworld_data)
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "alfworld", alfworld_data, lr=1e-2, goals_per_step=2,
                                  group_size=2, max_episode_steps=3, temperature=1.0, loop_penalty=0.5, seed=0,
                                  max_new_tokens=8)  # fmt: skip
    # A scripted sampler: one episode of each group loops, the other does not, so advantages are not zero.
    calls = {"n": 0}

    def looping_or_not(conversations):
        out = []
        for row, conv in enumerate(conversations):
            ids = tokenizer(conv[-1]["content"][:20], add_special_tokens=False)["input_ids"][:4] or [1]
            text = "look" if row % 2 == 0 else f"go to cabinet {calls['n'] + 1}"
            out.append((ids, tokenizer(text, add_special_tokens=False)["input_ids"], text))
        calls["n"] += 1
        return out

    grpo.sample = looping_or_not
    stats = grpo.grpo_step()
    assert stats.episodes == 4 and stats.samples > 0 and stats.mean_repeat > 0
    assert max((model.state_dict()[k] - after_sft[k]).abs().max().item() for k in before) > 0
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_play_uses_the_evaluators_environment_and_real_sampling(tiny_model_dir, alfworld_data):
    model, tokenizer = _tiny(tiny_model_dir)
    envlib = grpo_env_torch.import_envlib(alfworld_data)
    goals = envlib.load_goals(alfworld_data)[:2]
    sample = grpo_env_torch.sampler(model, tokenizer, max_new_tokens=6, temperature=1.0, stop=envlib.STOP)
    rollouts = grpo_env_torch.play(envlib, "alfworld", alfworld_data, goals, sample, max_steps=2, seed=0)
    assert [len(r.steps) for r in rollouts] == [2, 2] and all(not r.won for r in rollouts)
    for r in rollouts:
        for prompt_ids, action_ids in r.steps:
            assert prompt_ids and len(action_ids) <= 6
    # Past the deadline no step is played: the round's time is kept even by its first GRPO step.
    cut = grpo_env_torch.play(envlib, "alfworld", alfworld_data, goals, sample, max_steps=2, seed=0,
                              deadline=time.monotonic() - 1)  # fmt: skip
    assert [len(r.steps) for r in cut] == [0, 0] and not any(r.won for r in cut)


# -- a whole session against the grading server ---------------------------------------------------------------
def _scripted_evaluator(scores: list[float]):
    calls = {"n": 0}

    def evaluate(model_dir: Path, weights_hash: str, spec, device=None) -> EvalResult:
        score = scores[min(calls["n"], len(scores) - 1)]
        calls["n"] += 1
        return EvalResult(task=spec.task, split=spec.split, score=score, n=10, n_correct=int(score // 10),
                          evaluator_id="scripted", weights_hash=weights_hash)  # fmt: skip

    return evaluate


KNOBS = {"A2RL_SFT_MAX_STEPS": "2", "A2RL_SFT_BATCH_SIZE": "2", "A2RL_SFT_LR": "1e-3", "A2RL_SFT_ROUND_S": "30",
         "A2RL_SFT_MAX_LENGTH": "4096", "A2RL_GRPO_MAX_STEPS": "1", "A2RL_GRPO_GOALS_PER_STEP": "2",
         "A2RL_GRPO_NUM_GENERATIONS": "2", "A2RL_GRPO_MAX_EPISODE_STEPS": "2", "A2RL_GRPO_ROUND_S": "30"}  # fmt: skip


def _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, mode: str, scores: list[float], cap: int):
    for k, v in KNOBS.items():
        monkeypatch.setenv(k, v)
    paths = RunPaths.for_run(tmp_path / "runs", f"run-{mode}")
    build_workspace(paths, alfworld_data, tiny_model_dir, "# Task\n", f"# Instructions\n- Mode: `{mode}`. x\n")
    agent = get_agent("reference-sft-grpo")
    agent.install(paths.workspace)
    ctx = GradingContext(f"run-{mode}", RunConfig(task="alfworld", max_submissions=cap, mode=mode),
                         paths.workspace, paths.harness_dir, baseline={"validation": 5.0},
                         base_model_dir=tiny_model_dir)  # fmt: skip
    service = GradingService(ctx, BudgetClock(900), evaluate=_scripted_evaluator(scores))
    with GradingServer(service) as server:
        env = AgentEnv("alfworld", "tiny", paths.workspace, server.url, server.token, 0, harness_dir=paths.harness_dir)
        outcome = run_agent(agent, env, BudgetClock(900), paths.harness_dir / "agent.log", grace_s=5)
    service.close(drain_timeout_s=10)
    log = (paths.harness_dir / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    notes = (paths.workspace / "code" / "NOTES.md").read_text()
    methods = [line.split(" | ")[1] for line in notes.splitlines() if line[:3] in {f"| {i}" for i in range(1, 10)}]
    return paths, service, log, methods


def test_session_runs_sft_until_validation_stops_rising_then_grpo(tiny_model_dir, alfworld_data, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    paths, service, log, methods = _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, "free",
                                            [10.0, 20.0, 20.0, 30.0], cap=4)  # fmt: skip
    assert "stopping: submission cap reached" in log, log[-3000:]
    assert methods == ["SFT", "SFT", "SFT", "GRPO"]
    assert "restored the best checkpoint output/v2" in log  # the tie at round 3 is rolled back before GRPO
    scored = [(e.model_path, e.score) for e in service.submissions() if e.status == "scored"]
    assert scored == [("output/v1", 10.0), ("output/v2", 20.0), ("output/v3", 20.0), ("output/v4", 30.0)]
    assert route_label(paths.workspace / "code") == "SFT+RL"


def test_session_in_mode_sft_only_keeps_to_sft(tiny_model_dir, alfworld_data, tmp_path, monkeypatch):
    paths, service, log, methods = _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, "sft-only",
                                            [10.0, 10.0, 15.0], cap=3)  # fmt: skip
    assert methods == ["SFT", "SFT", "SFT-anneal"]
    assert not (paths.workspace / "code" / "grpo_env_torch.py").exists()
    assert route_label(paths.workspace / "code") == "SFT"
    assert [e.detail.get("mode_ok") for e in service.submissions()] == [True, True, True]


# -- the GPU table's SQL ----------------------------------------------------------------------------------------
def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def test_the_alfworld_table_sql_gives_newcombes_interval_and_the_gpu(tmp_path):
    """bench/alfworld_table.sql on a store with one run (0/134 -> 30/134), and BENCHMARKS.md quotes it whole."""
    import duckdb

    from a2rl.store.results import ResultsStore

    repo = Path(__file__).resolve().parents[1]
    sql = (repo / "bench" / "alfworld_table.sql").read_text()
    assert sql.strip() in (repo / "BENCHMARKS.md").read_text()
    store = tmp_path / "a2rl.duckdb"
    ResultsStore(store)
    con = duckdb.connect(str(store))
    con.execute("""INSERT INTO runs (run_id, task, mode, base_model, seed, budget_s, status, baseline_val, best_val,
                                     baseline_test, final_test, delta_test, n_submissions, agent_seconds,
                                     wall_seconds, phase_seconds_json, started_at)
                   VALUES ('r1', 'alfworld', 'free', 'smollm2', 0, 90, 'completed', 0, 30, 0, 22.39, 22.39, 2, 88,
                           280, '{"baseline": 1.0}', now())""")  # fmt: skip
    for kind, k in (("baseline", 0), ("final", 30)):
        con.execute("INSERT INTO evaluations (run_id, eval_key, kind, split, score, n, n_correct, duration_s) "
                    "VALUES ('r1', ?, ?, 'test', ?, 134, ?, 20)", [kind, kind, 100 * k / 134, k])  # fmt: skip
        for i in range(134):  # the final model wins games 0..29, the base model none
            won = kind == "final" and i < k
            con.execute("INSERT INTO item_results (run_id, eval_key, split, item_id, score, correct) "
                        "VALUES ('r1', ?, 'test', ?, ?, ?)", [kind, f"g{i}", float(won), won])  # fmt: skip
    con.execute("""INSERT INTO events (run_id, seq, kind, detail_json)
                   VALUES ('r1', 1, 'session-start', '{"gpus": ["NVIDIA H100 80GB HBM3"]}')""")
    rel = con.sql(sql)
    row = dict(zip(rel.columns, rel.fetchall()[0]))
    con.close()
    (l0, u0), (l1, u1) = _wilson(0, 134), _wilson(30, 134)
    d = 30 / 134
    assert row["delta_ci95_lo"] == round(100 * (d - ((d - l1) ** 2 + u0**2) ** 0.5), 1)
    assert row["delta_ci95_hi"] == round(100 * (d + ((u1 - d) ** 2 + l0**2) ** 0.5), 1)
    assert 0 < row["delta_ci95_lo"] < 22.39 < row["delta_ci95_hi"]
    sd = (30 * (1 - d) ** 2 + 104 * d**2) / 133  # variance of the per-game differences (30 ones, 104 zeros)
    half = 1.96 + 2.4 / 133  # the store's t975 beyond 30 degrees of freedom
    assert row["paired_ci95_lo"] == round(100 * (d - half * (sd / 134) ** 0.5), 1)
    assert row["paired_ci95_hi"] == round(100 * (d + half * (sd / 134) ** 0.5), 1)
    assert (row["baseline_test_games"], row["final_test_games"]) == ("0/134", "30/134")
    assert row["gpu"] == "NVIDIA H100 80GB HBM3"
