"""One truth per run (issue #45): however a run ends, its row in the store, the command's line and the Prefect
flow run's state say the same thing (docs/operations.md, "How a run ends"). Each case stops or fails a real
`a2rl run` (in this process, on the test server) at one point; the cheap ones at the preflight, the costly ones
(a whole run) where the issue found three truths: while the report is written, and after the row is final."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import duckdb
import pytest

# How it ends -> (row status, Prefect state, words of the command's last stderr line, exit code)
EXPECTED = {
    "failed": ("failed", "Failed", "recorded as 'failed'", 1),
    "Ctrl-C": ("interrupted", "Cancelled", "recorded as 'interrupted'", 130),
    "SIGTERM": ("interrupted", "Cancelled", "recorded as 'interrupted'", 143),
    "Ctrl-C after the row was final": ("completed", "Completed", "recorded 'completed'", 0),
    "SIGTERM after the row was final": ("completed", "Completed", "recorded 'completed'", 0),
}
SIGNALS = {"Ctrl-C": signal.SIGINT, "SIGTERM": signal.SIGTERM}


def _act(how: str) -> None:
    if how == "failed":
        raise RuntimeError("injected failure")
    os.kill(os.getpid(), SIGNALS[how.split(" ")[0]])  # handled in this (main) thread at once
    time.sleep(0.2)


def stop_at(monkeypatch, phase: str, how: str) -> None:
    """Fail or signal the run on entering `phase` ("done": its last step, once the row is final and the flow
    run only has to end)."""
    from a2rl_bench.ops.progress import ProgressWriter
    from a2rl_bench.tasks.phases import RunPhases

    if phase == "done":
        update = ProgressWriter.update

        def update_then_act(self, **fields):
            update(self, **fields)
            if fields.get("phase") == "done":
                _act(how)

        monkeypatch.setattr(ProgressWriter, "update", update_then_act)
        return
    enter = RunPhases.enter

    @contextlib.contextmanager
    def enter_then_act(self, name):
        with enter(self, name):
            if name == phase:
                _act(how)
            yield

    monkeypatch.setattr(RunPhases, "enter", enter_then_act)


@pytest.mark.parametrize(("phase", "how"), [
    ("preflight", "failed"), ("preflight", "Ctrl-C"), ("preflight", "SIGTERM"),
    ("summary", "Ctrl-C"),  # "[summary] writing the report": before the row is final
    ("done", "SIGTERM after the row was final"),
])  # fmt: skip
def test_the_row_the_line_and_prefects_state_agree_however_the_run_ends(
    prefect_harness, tiny_model_dir, tmp_path, monkeypatch, capsys, phase, how
):
    from prefect.client.orchestration import get_client

    from a2rl_bench.cli import main

    monkeypatch.setenv("A2RL_SFT_TRAIN_S", "3")
    monkeypatch.setenv("A2RL_SFT_MAX_STEPS", "2")
    monkeypatch.setenv("A2RL_SFT_MAX_LENGTH", "256")
    stop_at(monkeypatch, phase, how)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the CLI keeps its run's announcement
    results = tmp_path / "a.duckdb"
    previous = signal.getsignal(signal.SIGINT)
    # Ctrl-C as in a fresh process: Python's default handler (an earlier in-process test may have left one that
    # does not raise, and the run then went on to complete)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc = main(["run", "--base-model", str(tiny_model_dir), "--budget", "10", "--val-limit", "1", "--test-limit",
                   "1", "--sandbox", "off", "--results", str(results), "--runs-dir", str(tmp_path / "runs")])
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    status, state, words, code = EXPECTED[how]
    with duckdb.connect(str(results), read_only=True) as db:
        row = db.execute("SELECT status, prefect_state, flow_run_id FROM runs").fetchone()
    row_status, row_state, flow_run_id = row
    with get_client(sync_client=True) as client:
        prefect_state = client.read_flow_run(flow_run_id).state.name
    lines = [line for line in err.splitlines() if line.startswith("a2rl:")]
    assert (row_status, prefect_state, row_state) == (status, state, state), err[-3000:]
    assert rc == code and lines and words in lines[-1], (rc, err[-3000:])
    assert "Traceback" not in out + err
    assert not list(temp.glob("a2rl-run-*"))  # however the run ended, the CLI's own temporary folder is gone
    if status == "completed":
        assert "completed" in out and "stopped by" not in err, out[-2000:]
    else:
        assert str(Path(results)) in lines[-1]


FULL_AS_IT_OPENS = """
import errno, json, sys
from pathlib import Path
import duckdb
from a2rl_bench.cli import main
from a2rl_bench.tasks import run_steps

small, model = Path(sys.argv[1]), sys.argv[2]
manifest = run_steps.write_manifest

def manifest_then_a_full_disk(ctx):  # the disk fills (for real) once the run has its directory and manifest
    out = manifest(ctx)
    try:
        with open(small / "filler", "wb", buffering=0) as f:
            while f.write(bytes(1 << 16)):
                pass
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    return out

run_steps.write_manifest = manifest_then_a_full_disk
rc = main(["run", "--base-model", model, "--val-limit", "1", "--test-limit", "1", "--sandbox", "off",
           "--results", str(small / "a.duckdb")])
store = small / "a.duckdb"
tables = []
if store.exists():
    with duckdb.connect(str(store), read_only=True) as db:
        tables = [t for (t,) in db.execute("SELECT table_name FROM information_schema.tables").fetchall()]
print(json.dumps({"rc": rc, "store": store.exists(), "runs_table": "runs" in tables,
                  "manifest": bool(list(small.glob("runs/*/harness/manifest.json")))}))
"""


def test_a_disk_that_fills_as_the_run_opens_says_what_to_do_and_leaves_no_store_without_its_tables(
    prefect_harness, tiny_model_dir, tmp_path
):
    """Issue #45: "the run could not start: TransactionException … No space left on device" with no what-to-do,
    though the run's directory and manifest existed, and a new store left with no `runs` table."""
    import subprocess
    import sys

    from test_cli_newcomer import _in_bwrap, cli_env, harness_api_url

    small = tmp_path / "small"
    small.mkdir()
    env = cli_env(tmp_path, A2RL_HOME=str(tmp_path / "a2rl-home"), **harness_api_url())
    prefix = _in_bwrap("--size", str(160 * 1024**2), "--tmpfs", str(small))
    proc = subprocess.run([*prefix, sys.executable, "-c", FULL_AS_IT_OPENS, str(small), str(tiny_model_dir)],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["rc"] == 1 and outcome["manifest"], outcome
    assert not outcome["store"] or outcome["runs_table"], outcome  # there with its tables, or not at all
    lines = [line for line in proc.stderr.splitlines() if line.startswith("a2rl:")]
    assert len(lines) == 1 and "the disk is full at" in lines[0] and "free some space" in lines[0], proc.stderr[-3000:]
    assert "could not start" not in lines[0] and "Traceback" not in proc.stderr


def test_retry_of_a_run_started_by_a2rl_run_says_what_to_do_instead(prefect_harness, capsys, monkeypatch):
    """Issue #45: `a2rl retry` on `a2rl run`'s flow run (no deployment, no pool) said "a worker on its pool picks it
    up" and left it AwaitingRetry for good. It now refuses, leaves the state as it was and gives the command."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from a2rl_bench.cli import main
    from a2rl_bench.records import RunConfig
    from a2rl_bench.run_options import run_parameters

    @flow(name="benchmark-run")
    def local_run(config: dict, options: dict) -> None:
        raise RuntimeError("failed in its baseline")

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())
    params = run_parameters(RunConfig(seed=3, budget_s=600))
    state = local_run(**params, return_state=True)
    flow_run_id = str(state.state_details.flow_run_id)
    assert main(["retry", flow_run_id]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no deployment" in line and "a2rl run --seed 3 --budget 600" in line, line
    assert "picks it up" not in line
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.type.value == "FAILED"  # not left AwaitingRetry


def test_the_report_says_its_wall_time_is_not_the_prefect_uis_duration(tmp_path):
    """The run page's duration counts only Running time (9m 39s for a 24-minute run); the report says so."""
    from a2rl_bench.records import RunConfig
    from a2rl_bench.run import RunContext
    from a2rl_bench.summary.report import run_notes
    from a2rl_bench.workspace import RunPaths

    ctx = RunContext(run_id="r", config=RunConfig(), paths=RunPaths.for_run(tmp_path, "r"), results_path=tmp_path)
    note = next(n for n in run_notes(ctx, {}) if n.startswith("Wall time"))
    assert "Prefect UI's duration" in note and "only its time in the Running state" in note
