"""The reference-sft agent's own scripts: `train_sft.py` on a tiny model, `agent.py`'s planning helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from a2rl_bench.agents.reference_sft import agent, train_sft

TRAIN_SFT = Path(train_sft.__file__)

# Short GSM8K-style rows (the tiny tokenizer has a small vocabulary, so real rows would be long in tokens).
ROWS = [
    {
        "id": i,
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"Tom has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
    }
    for i, (a, b) in enumerate(zip(range(2, 22), range(5, 25), strict=True))
]


@pytest.fixture(scope="module")
def train_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def run_train_sft(init: Path, out: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    # 3 steps of 4 examples: enough to move the weights; a high lr because the tiny model's gradients are tiny.
    cmd = [sys.executable, str(TRAIN_SFT), "--init", str(init), "--out", str(out), "--data", str(data),
           "--max-steps", "3", "--batch-size", "4", "--max-length", "256", "--lr", "1e-2",
           "--time-limit", "60", "--seed", "3", *extra]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180, env=env)


def max_weight_change(a: Path, b: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    ma = AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32).state_dict()
    mb = AutoModelForCausalLM.from_pretrained(b, dtype=torch.float32).state_dict()
    assert ma.keys() == mb.keys()
    return max((ma[k] - mb[k]).abs().max().item() for k in ma)


def assert_merged_checkpoint(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not any(n.startswith("adapter_") for n in names), names
    assert not any(p.name.startswith(".") for p in out.parent.iterdir()), "temp or trainer dirs left behind"
    AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template


@pytest.mark.parametrize("lora_flag", [(), ("--lora",)], ids=["full", "lora"])
def test_train_sft_writes_a_merged_checkpoint_with_changed_weights(tiny_model_dir, train_jsonl, tmp_path, lora_flag):
    out = tmp_path / "output" / "v1"
    out.parent.mkdir()
    proc = run_train_sft(tiny_model_dir, out, train_jsonl, *lora_flag)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = agent.parse_summary(proc.stdout.splitlines())
    assert summary is not None and summary["steps"] == 3
    assert summary["lora"] is bool(lora_flag)  # the tiny model is under the 50M-parameter LoRA threshold
    assert_merged_checkpoint(out)
    assert max_weight_change(tiny_model_dir, out) > 1e-4


def test_train_sft_refuses_to_overwrite_an_output(tiny_model_dir, train_jsonl, tmp_path):
    out = tmp_path / "v1"
    out.mkdir()
    proc = run_train_sft(tiny_model_dir, out, train_jsonl)
    assert proc.returncode == 2 and "already exists" in proc.stderr


def test_train_sft_help_runs_without_ml_imports():
    cmd = [sys.executable, str(TRAIN_SFT), "--help"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "--time-limit" in proc.stdout


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # annotations removed, final line rewritten
        ("5 + 3 = <<5+3=8>>8 pens.\n#### 8", "5 + 3 = 8 pens.\nThe answer is 8"),
        # thousands separators dropped from the final number only
        ("It costs $1,200 in total.\n#### 1,200", "It costs $1,200 in total.\nThe answer is 1200"),
        # negative and decimal answers kept as written
        ("Change: <<3-5=-2>>-2.\n#### -2", "Change: -2.\nThe answer is -2"),
        # no final line: left as is
        ("Just text.", "Just text."),
    ],
)
def test_format_solution_matches_the_evaluation_answer_style(answer, expected):
    assert train_sft.format_solution(answer) == expected


def test_to_conversation_uses_the_evaluation_prompt():
    example = train_sft.to_conversation(ROWS[0])
    assert example["prompt"] == [
        {"role": "user", "content": "Question: " + ROWS[0]["question"] + "\nLet's think step by step\nAnswer:"}
    ]
    assert example["completion"][0]["content"].endswith("The answer is 7")


def test_select_examples_is_seeded_and_skips_examples_that_do_not_fit():
    def short(ex):
        return "Tom has 2 " not in ex["prompt"][0]["content"]

    first = train_sft.select_examples(ROWS, 5, seed=1, fits=short)
    assert first == train_sft.select_examples(ROWS, 5, seed=1, fits=short)
    assert first != train_sft.select_examples(ROWS, 5, seed=2, fits=short)
    assert len(first) == 5 and all(short(ex) for ex in first)
    assert len(train_sft.select_examples(ROWS, 100, seed=1, fits=short)) == len(ROWS) - 1


def test_fix_tokenizer_config_renames_a_list_of_extra_special_tokens(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"extra_special_tokens": ["<a>"], "x": 1}))
    train_sft.fix_tokenizer_config(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config == {"x": 1, "additional_special_tokens": ["<a>"]}


@pytest.mark.parametrize(
    ("remaining", "submitted", "start", "time_limit"),
    [
        (1000.0, False, True, 75.0),  # plenty: a full round
        (1000.0, True, True, 75.0),
        (100.0, True, True, 40.0),  # 100 - 10 margin - 50 overhead: a shortened round
        (65.0, True, False, 0.0),  # 5 s of training is not worth a round
        (65.0, False, True, 22.0),  # ... unless nothing was tried yet: due by two fifths of the 55 s left
        (-5.0, False, True, 1.0),  # the first round starts even with nothing left
    ],
)
def test_plan_round_fits_rounds_into_the_budget(remaining, submitted, start, time_limit):
    plan = agent.plan_round(remaining, overhead_s=50.0, train_s=75.0, margin_s=10.0, submitted=submitted)
    assert (plan.start, plan.time_limit_s) == (start, time_limit)


def test_the_first_round_is_due_by_two_fifths_of_the_budget_left_and_later_rounds_by_measured_steps():
    """Issue #26: on a loaded machine the first round must still submit well inside a 120 s budget, and a later
    round starts only when one and a half measured steps fit."""
    first = agent.plan_round(118.0, overhead_s=45.0, train_s=90.0, margin_s=13.6, submitted=False)
    assert first.start and first.ends_in_s == pytest.approx(0.4 * (118.0 - 13.6))
    later = agent.plan_round(60.0, overhead_s=20.0, train_s=90.0, margin_s=13.6, submitted=True, step_s=14.0)
    assert later.start and later.time_limit_s == pytest.approx(26.4) and later.ends_in_s == pytest.approx(46.4)
    slow = agent.plan_round(60.0, overhead_s=20.0, train_s=90.0, margin_s=13.6, submitted=True, step_s=30.0)
    assert not slow.start and "a round needs 79s" in slow.reason


def test_time_limit_callback_stops_before_a_step_would_pass_the_deadline():
    """The deadline is wall-clock: loading may have used most of it; the last step's time predicts the next."""
    from transformers import TrainerControl, TrainerState

    state, control = TrainerState(), TrainerControl()
    callback = train_sft.time_limit_callback(None, deadline=time.time() + 60.0, reserve_s=15.0)
    callback.on_train_begin(None, state, control)
    callback.on_step_end(None, state, control)  # a quick step: 45 s are left for the next ones
    assert not control.should_training_stop
    callback.t_last -= 50.0  # a 50 s step: the next one would leave less than the 15 s reserve
    callback.on_step_end(None, state, control)
    assert control.should_training_stop


def test_next_version_never_reuses_a_checkpoint_name(tmp_path):
    assert agent.next_version(tmp_path) == 1
    for name in ("v1", "v3", "vx", ".v7.tmp-1"):
        (tmp_path / name).mkdir()
    assert agent.next_version(tmp_path) == 4


def test_is_better_needs_a_strictly_higher_score():
    assert agent.is_better(0.1, None)
    assert not agent.is_better(None, 0.1)
    assert not agent.is_better(0.1, 0.1)
    assert agent.is_better(0.2, 0.1)


def test_settings_read_the_workspace_environment(tmp_path):
    env = {"WORKSPACE": str(tmp_path), "GRADING_SERVER_URL": "http://127.0.0.1:1/", "A2RL_SFT_MAX_STEPS": "3",
           "A2RL_SFT_LR": "0.01", "AGENT_SEED": "7"}  # fmt: skip
    settings = agent.Settings.from_env(env)
    assert settings.server_url == "http://127.0.0.1:1"
    assert (settings.max_steps, settings.lr, settings.seed) == (3, 0.01, 7)
    assert settings.output_dir == tmp_path.resolve() / "output"


def test_time_limit_callback_stops_training_once_the_limit_has_passed():
    from transformers import TrainerControl, TrainerState

    state, control = TrainerState(), TrainerControl()
    unlimited = train_sft.time_limit_callback(None)
    unlimited.on_train_begin(None, state, control)
    unlimited.on_step_end(None, state, control)
    assert not control.should_training_stop
    generous = train_sft.time_limit_callback(60.0)
    generous.on_train_begin(None, state, control)
    generous.on_step_end(None, state, control)
    assert not control.should_training_stop
    expired = train_sft.time_limit_callback(0.0)
    expired.on_train_begin(None, state, control)
    expired.on_step_end(None, state, control)
    assert control.should_training_stop


def test_submission_paths_are_relative_to_the_workspace(tmp_path):
    (tmp_path / "ws" / "output" / "v2").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "ws", target_is_directory=True)
    assert agent.relative_to_workspace(tmp_path / "ws" / "output" / "v2", tmp_path / "ws") == "output/v2"
    assert agent.relative_to_workspace(tmp_path / "ws" / "output" / "v2", tmp_path / "link") == "output/v2"
    assert agent.relative_to_workspace(tmp_path / "elsewhere", tmp_path / "ws") == str(tmp_path / "elsewhere")


def test_training_precision_is_bf16_on_a_gpu_and_fp32_on_cpu(tiny_model_dir):
    """The reference scripts' dtype rule (agents/reference_sft/train_precision.py, copied beside them)."""
    from a2rl_bench.agents.reference_sft.train_precision import choose_precision, count_parameters, load_for_training

    cpu = choose_precision(7_000_000_000, lora=True, cuda=False, bf16_supported=False)
    assert (cpu.load_dtype, cpu.bf16, cpu.gradient_checkpointing) == ("float32", False, False)
    assert cpu.trainer_kwargs() == {"bf16": False, "fp16": False, "gradient_checkpointing": False}
    big = choose_precision(7_000_000_000, lora=True, cuda=True, bf16_supported=True)
    assert (big.load_dtype, big.bf16, big.gradient_checkpointing) == ("bfloat16", True, True)
    assert big.trainer_kwargs()["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    small_full = choose_precision(135_000_000, lora=False, cuda=True, bf16_supported=True)
    assert (small_full.load_dtype, small_full.bf16, small_full.gradient_checkpointing) == ("float32", True, False)
    assert not choose_precision(500_000_000, lora=True, cuda=True, bf16_supported=False).bf16  # e.g. a V100

    model, n_params, use_lora, precision = load_for_training(str(tiny_model_dir), None, 10**9)
    assert n_params == count_parameters(str(tiny_model_dir)) == sum(p.numel() for p in model.parameters())
    assert not use_lora and precision.load_dtype == "float32" and next(model.parameters()).dtype.is_floating_point
    assert str(next(model.parameters()).dtype) == "torch.float32"  # this machine has no GPU


def test_a_stop_during_a_submission_lets_it_land_first(tmp_path):
    """The budget can end while the grader copies a checkpoint the agent just sent; SIGTERM then waits for the
    answer (the grace period is for that), and stops the agent right after it."""
    script = tmp_path / "stop_while_submitting.py"
    script.write_text(f"""
import http.server, json, os, signal, sys, threading, time
sys.path.insert(0, {str(Path(agent.__file__).parent)!r})
import agent

class Slow(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(1.0)  # the grader copying and hashing the checkpoint
        body = json.dumps({{"status": "queued", "submission_id": 1}}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
threading.Thread(target=server.serve_forever, daemon=True).start()
signal.signal(signal.SIGTERM, agent.raise_stopped)
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
client = agent.GradingClient(f"http://127.0.0.1:{{server.server_address[1]}}", "t")
try:
    client.submit("output/v1")
    print("not stopped")
except agent.Stopped as stop:
    print("stopped after the answer:", stop)
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert "SIGTERM while submitting: finishing the submission first" in out.stdout, out.stdout + out.stderr
    assert out.stdout.strip().endswith("stopped after the answer: SIGTERM"), out.stdout + out.stderr
