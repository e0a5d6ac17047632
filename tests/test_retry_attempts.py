"""One attempt at a time per run (#19.1): a retried run first ends every process of the earlier attempt.

The flow run's harness process runs the agent session (reference-sft in the real sandbox, its training
looping) and is taken out mid-training: SIGKILLed (its parent-death signals take the sandbox down) or frozen
(SIGSTOP: Prefect saw the run crash, but no signal ever reached its processes, so only the retry's clean-up
can end them). The retry resumes the session: no process of the old attempt is left, only one trainer ever runs,
and the run completes with its submission graded and a final score.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from a2rl_bench.isolation import procs
from a2rl_bench.grading.ledger import read_ledger
from a2rl_bench.records import RunConfig

REPO = Path(__file__).resolve().parents[1]

FIRST_ATTEMPT = """
import sys
from pathlib import Path
from a2rl_bench.run import RunContext
from a2rl_bench.flows.benchmark_run import agent_session

ctx = RunContext.model_validate_json(Path(sys.argv[1]).read_text())
agent_session(ctx, {}, Path(sys.argv[2]), grace_s=3)
"""


def _trainers(ws: Path) -> list[int]:
    """Training processes of this workspace's agent."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmd = " ".join(p.info.get("cmdline") or [])
            if "train_sft.py" in cmd and str(ws) in cmd:
                found.append(p.pid)
        except (psutil.Error, TypeError):
            continue
    return found


class TrainerWatch(threading.Thread):
    """Counts the workspace's live trainers every 0.1 s; `most` is the largest count seen."""

    def __init__(self, ws: Path):
        super().__init__(daemon=True)
        self.ws, self.most, self.seen, self.stop = ws, 0, set(), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            pids = _trainers(self.ws)
            self.most = max(self.most, len(pids))
            self.seen |= set(pids)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_retry_after_the_harness_died_mid_training_runs_one_agent_and_completes(
    prefect_harness, tiny_model_dir, tmp_path, monkeypatch, how
):
    from prefect.settings import PREFECT_API_URL

    from a2rl_bench.flows.benchmark_run import agent_session, final_grading, provision_workspace
    from a2rl_bench.tasks.run_steps import open_run

    config = RunConfig(base_model=str(tiny_model_dir), budget_s=60, val_limit=2, test_limit=2, max_submissions=1,
                       sandbox="auto")  # fmt: skip
    ctx = open_run.fn(config, tmp_path / "results.duckdb", tmp_path / "runs")
    base_model_dir = provision_workspace(ctx)
    ws = ctx.paths.workspace
    (tmp_path / "ctx.json").write_text(ctx.model_dump_json())
    (tmp_path / "first.py").write_text(FIRST_ATTEMPT)

    # The first attempt: a training that would go on for minutes.
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": PREFECT_API_URL.value(),
           "A2RL_SFT_MAX_STEPS": "100000", "A2RL_SFT_TRAIN_S": "600", "A2RL_SFT_MAX_LENGTH": "256"}  # fmt: skip
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen([sys.executable, str(tmp_path / "first.py"), str(tmp_path / "ctx.json"),
                                  str(base_model_dir)], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 120
    while not _trainers(ws):
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the first attempt never started training"
        time.sleep(0.2)
    time.sleep(1)
    old = [p.pid for p in psutil.Process(first.pid).children(recursive=True)]
    old_trainers = set(_trainers(ws))
    first.send_signal(getattr(signal, how))

    # The retry, with a short training: the old attempt must be gone before the new agent starts.
    monkeypatch.setenv("A2RL_SFT_MAX_STEPS", "2")
    monkeypatch.setenv("A2RL_SFT_TRAIN_S", "2")
    monkeypatch.setenv("A2RL_SFT_MAX_LENGTH", "256")
    watch = TrainerWatch(ws)
    watch.start()
    try:
        outcome = agent_session(ctx, {}, base_model_dir, grace_s=3)
    finally:
        watch.stop.set()
        watch.join()
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
        first.wait()
    assert procs.wait_gone([first.pid, *old], 1.0) == [], "a process of the first attempt outlived the retry"
    assert watch.most == 1, f"{watch.most} trainers ran at once"
    assert watch.seen - old_trainers, "the retry's agent never trained"
    assert outcome.ended_by in ("exited", "budget")

    final = final_grading(ctx, base_model_dir)
    entries = read_ledger(ctx.paths.harness_dir / "ledger.jsonl")
    events = [e.detail.get("event") for e in entries if e.kind == "event"]
    assert events.count("session-resumed") == 1 and events.count("session-end") == 1
    subs = [e for e in entries if e.kind == "submission" and e.status in ("scored", "error", "refused")]
    assert subs and all(e.status == "scored" for e in subs), [(e.status, e.error) for e in subs]
    assert final.score is not None and final.submission_id == subs[-1].submission_id
