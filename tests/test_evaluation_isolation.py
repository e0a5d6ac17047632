"""An evaluation runs under the harness's process supervisor and a memory limit (issue 24, item 2).

The grader's evaluation process must die with the grader (SIGKILL of the grading service mid-evaluation left it
running as root), must not grow past its memory limit (an inflated config grew until the OOM killer), and a
config that implies more parameters than its weights hold is refused before a model is built.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from a2rl_bench.inference.config_check import architecture_parameters
from a2rl_bench.inference.evaluation import (ONE_THREAD_BELOW_PARAMS, EvalSpec, EvaluationFailed, eval_env,
                                             evaluate_in_subprocess)
from a2rl_bench.isolation import procs
from tests.hostile_tasks import HoggingTask, ThreadsTask

REPO = Path(__file__).resolve().parents[1]

# The grading service of a run, in a process of its own: one submission whose evaluation never ends.
GRADER = textwrap.dedent("""
    import shutil, sys, time
    from pathlib import Path
    from a2rl_bench.grading import BudgetClock, GradingContext, GradingService
    from a2rl_bench.records import RunConfig
    from tests.hostile_tasks import SleepingTask

    root, model = Path(sys.argv[1]), Path(sys.argv[2])
    shutil.copytree(model, root / "workspace" / "output" / "v1")
    ctx = GradingContext("r", RunConfig(task="sleeping", max_submissions=2), root / "workspace", root / "harness", {},
                         base_model_dir=model, task=SleepingTask())
    service = GradingService(ctx, BudgetClock(600))
    service.submit("output/v1")
    time.sleep(600)
""")


def _gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if procs.alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_an_evaluation_dies_with_its_grader(tmp_path, tiny_model_dir):
    """SIGKILL of the grading service mid-evaluation: its evaluation process, and what that started, end too."""
    (tmp_path / "grader.py").write_text(GRADER)
    pid_file = tmp_path / "eval.pids"
    env = {**os.environ, "PYTHONPATH": str(REPO), "A2RL_TEST_PID_FILE": str(pid_file)}
    grader = subprocess.Popen([sys.executable, str(tmp_path / "grader.py"), str(tmp_path / "run"), str(tiny_model_dir)],
                              cwd=REPO, env=env, stderr=open(tmp_path / "grader.err", "w"))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert grader.poll() is None, (tmp_path / "grader.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "the evaluation never started"
            time.sleep(0.2)
        time.sleep(0.2)
        evaluation = [int(p) for p in pid_file.read_text().split()]
        assert all(procs.alive(p) for p in evaluation)
        grader.send_signal(signal.SIGKILL)
        grader.wait()
        left = _gone(evaluation, 10)
        assert left == [], f"evaluation processes outlived the grader: {left}"
    finally:
        grader.kill()
        if pid_file.exists():
            procs.signal_pids([int(p) for p in pid_file.read_text().split()], signal.SIGKILL)


def test_an_evaluation_past_its_memory_limit_fails_as_out_of_memory(tiny_model_dir, monkeypatch):
    """An evaluation that takes 3 GiB under a 1.5 GiB limit ends as `oom`; the harness is untouched."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("A2RL_EVAL_MEMORY_BYTES", str(3 << 29))
    spec = EvalSpec.of(HoggingTask(), "offline", "validation")
    with pytest.raises(EvaluationFailed) as failed:
        evaluate_in_subprocess(tiny_model_dir, spec, timeout_s=300)
    assert failed.value.kind == "oom", str(failed.value)


def test_the_caller_learns_the_evaluation_process_and_its_limit(tiny_model_dir, monkeypatch):
    """`on_start`: the evaluation's supervisor (pid, start time) and the limit it runs under (cgroup v2 where one
    can be made, RLIMIT_AS otherwise), for a run's record of its processes; it is gone once the call returns."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("A2RL_EVAL_MEMORY_BYTES", str(3 << 29))
    started: list[procs.Started] = []
    with pytest.raises(EvaluationFailed):
        evaluate_in_subprocess(tiny_model_dir, EvalSpec.of(HoggingTask(), "offline", "validation"), timeout_s=300,
                               on_start=started.append)  # fmt: skip
    assert len(started) == 1 and started[0].start_ticks > 0
    assert "1.5 GiB via" in started[0].memory_limit
    assert not procs.alive(started[0].pid, started[0].start_ticks)


def test_a_small_models_evaluation_runs_one_thread_and_a_real_models_the_default(tiny_model_dir, tmp_path,
                                                                                  monkeypatch):  # fmt: skip
    """A ~100k-parameter model's ops are too small to split: its evaluation process runs one OpenMP thread (two
    only added a wake-up per op: ~0.45 s of a 2 s evaluation), unless the operator set OMP_NUM_THREADS; a model
    of SmolLM2-135M's size, or one on a GPU, keeps torch's default."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = evaluate_in_subprocess(tiny_model_dir, EvalSpec.of(ThreadsTask(), "offline", "validation"), timeout_s=300)
    assert {item.completion for item in result.items} == {"1"}
    assert eval_env(tiny_model_dir)["OMP_NUM_THREADS"] == "1"
    smollm2 = tmp_path / "smollm2-135m"
    smollm2.mkdir()
    (smollm2 / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True}))
    assert architecture_parameters(smollm2) > ONE_THREAD_BELOW_PARAMS  # the config is read, not skipped
    assert "OMP_NUM_THREADS" not in eval_env(smollm2)
    assert "OMP_NUM_THREADS" not in eval_env(tiny_model_dir, device="0")  # a GPU evaluation
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert eval_env(tiny_model_dir)["OMP_NUM_THREADS"] == "3"


def test_start_tells_the_caller_each_process_it_began():
    """`procs.start(on_start=...)`: pid and start time, as a retry needs them to end exactly that process."""
    seen: list[procs.Started] = []
    proc = procs.start([sys.executable, "-c", "import time; time.sleep(30)"], on_start=seen.append)
    try:
        assert [s.pid for s in seen] == [proc.pid]
        assert seen[0].start_ticks == procs.proc_stat(proc.pid).start_ticks
    finally:
        procs.end_session_of(proc)


def test_an_inflated_config_is_refused_by_the_evaluation_before_any_weight_is_loaded(tmp_path, tiny_model_dir,
                                                                                     monkeypatch):  # fmt: skip
    """A config 2x wider in its feed-forward than its weights (too small for the grader's cheap estimate to
    refuse): the evaluation process compares the exact count and fails as a load error, at once."""
    from a2rl_bench.benchmarks import get_task

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    model = tmp_path / "inflated"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    task = get_task("gsm8k")
    task.prepare("offline")
    with pytest.raises(EvaluationFailed) as failed:
        evaluate_in_subprocess(model, EvalSpec.of(task, "offline", "validation", 2), timeout_s=300)
    assert failed.value.kind == "load" and "size mismatch" in str(failed.value), str(failed.value)
