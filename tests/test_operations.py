"""Operating a2rl's local server: GPU slots that survive a server restart, and start-up refusals in one line.

Fast: the session's Prefect test server for the slots, plain sockets and state files for the refusals."""

from __future__ import annotations

import json
import re
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest

from a2rl_bench.ops import gpu_slots
from a2rl_bench.ops import prefect_local
from a2rl_bench.records import RunConfig
from a2rl_bench.run_options import RunOptions, run_parameters
import prefect_http


@pytest.fixture
def api_url(prefect_harness) -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def make_limit(api_url: str, limit: int, active_slots: int) -> str:
    name = f"gpu-test-{uuid.uuid4().hex[:8]}"
    r = prefect_http.post(f"{api_url}/v2/concurrency_limits/", json={"name": name, "limit": limit})
    r.raise_for_status()
    prefect_http.patch(f"{api_url}/v2/concurrency_limits/{name}", json={"active_slots": active_slots}).raise_for_status()
    return name


def write_lease(home: Path, limit_id: str, holder: str, expires_in_s: float) -> None:
    """A lease as Prefect's file-based lease storage writes it."""
    lease_id = str(uuid.uuid4())
    now = datetime.now(timezone.utc)
    (home / gpu_slots.LEASE_DIR).mkdir(parents=True, exist_ok=True)
    (home / gpu_slots.LEASE_DIR / f"{lease_id}.json").write_text(json.dumps({
        "id": lease_id, "resource_ids": [limit_id], "created_at": now.isoformat(),
        "expiration": (now + timedelta(seconds=expires_in_s)).isoformat(),
        "metadata": {"slots": 1, "holder": {"type": "flow_run", "id": holder}},
    }))  # fmt: skip


def test_reconcile_frees_slots_no_live_lease_holds_and_keeps_the_others(api_url, tmp_path):
    name = make_limit(api_url, limit=3, active_slots=3)
    limit = gpu_slots.read_limit(api_url, name)
    alive, dead = str(uuid.uuid4()), str(uuid.uuid4())
    write_lease(tmp_path, limit.id, alive, expires_in_s=50)
    write_lease(tmp_path, limit.id, dead, expires_in_s=-5)  # its run died while the server was down
    (tmp_path / gpu_slots.LEASE_DIR / "expirations.json").write_text("{}")  # the index is not a lease
    assert gpu_slots.reconcile(api_url, tmp_path, name) == 2  # one expired lease, one slot with no lease at all
    assert gpu_slots.read_limit(api_url, name).active_slots == 1
    assert gpu_slots.reconcile(api_url, tmp_path, name) == 0
    holders = {lease.holder: lease.expired for lease in gpu_slots.read_leases(tmp_path, limit.id)}
    assert holders == {alive: False, dead: True}


def test_a_run_waiting_for_a_gpu_slot_says_so(api_url):
    name = make_limit(api_url, limit=1, active_slots=1)
    said: list[str] = []
    with pytest.raises(TimeoutError):
        with gpu_slots.hold_gpu_slot(str(uuid.uuid4()), said.append, name=name, timeout_s=1):
            pass
    assert said and said[0].startswith("waiting for a GPU slot: 1 of 1 in use")


def test_status_lines_name_the_holder_of_each_slot(api_url, tmp_path):
    name = make_limit(api_url, limit=2, active_slots=1)
    limit = gpu_slots.read_limit(api_url, name)
    holder = str(uuid.uuid4())
    write_lease(tmp_path, limit.id, holder, expires_in_s=40)
    lines = gpu_slots.describe(api_url, tmp_path, lambda run_id: f"benchmark-run 'seed-3' ({run_id[:8]})", name)
    assert lines[0] == "GPU slots: 1 of 2 in use"
    assert lines[1].startswith(f"  held by benchmark-run 'seed-3' ({holder[:8]}) (1 slot(s); lease renewed")


def test_server_start_on_another_port_while_ours_runs_says_so(tmp_path):
    me = psutil.Process(os.getpid())
    prefect_local._write_state(prefect_local.ManagedProcess(name="server", pid=me.pid, create_time=me.create_time(), log="log", url=prefect_local.api_url_of(
        "127.0.0.1", 4311)), prefect_local.SERVER_STATE, tmp_path)  # fmt: skip
    with pytest.raises(prefect_local.OpsError, match=r"already runs on http://127.0.0.1:4311/api .*stop it first"):
        prefect_local.start_server(port=4312, home=tmp_path)


def test_server_start_on_a_port_another_program_holds_is_one_line(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(prefect_local.OpsError, match=f"port {port} on 127.0.0.1 is in use by another program") as e:
            prefect_local.start_server(port=port, home=tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / prefect_local.SERVER_STATE).exists()


# -- retries that take ---------------------------------------------------------------------------------
def _flow_run_in(state_type: str) -> str:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import State, StateType

    @flow(name="retry-target")
    def target() -> None:
        pass

    with get_client(sync_client=True) as client:
        fr = client.create_flow_run(target, state=State(type=StateType.SCHEDULED))
        client.set_flow_run_state(fr.id, State(type=StateType(state_type), name=state_type.title()), force=True)
    return str(fr.id)


def _state(api_url: str, flow_run_id: str) -> dict:
    return prefect_http.get(f"{api_url}/flow_runs/{flow_run_id}").json()["state"]


def test_retry_refuses_a_completed_or_running_run(api_url):
    with pytest.raises(prefect_local.OpsError, match="completed: a retry is refused"):
        prefect_local.retry_flow_run(api_url, _flow_run_in("COMPLETED"))
    with pytest.raises(prefect_local.OpsError, match="is Running: only a crashed"):
        prefect_local.retry_flow_run(api_url, _flow_run_in("RUNNING"))


def test_retry_waits_out_a_second_crash_report_and_presses_again(api_url):
    """The worker's late second 'Crashed' lands right after the retry: the helper sees the retry undone before
    the run started again, waits for the state to settle, and retries once more; the run ends Scheduled."""
    run_id = _flow_run_in("CRASHED")
    late_report_sent = threading.Event()

    def late_crash_report() -> None:
        for _ in range(600):  # until the retry lands (polling a condition, not a timed race)
            if _state(api_url, run_id)["name"] == "AwaitingRetry":
                prefect_local._set_state(api_url, run_id, {"type": "CRASHED", "name": "Crashed", "message": "late report"})
                late_report_sent.set()
                return
            threading.Event().wait(0.05)

    reporter = threading.Thread(target=late_crash_report, daemon=True)
    reporter.start()
    left_in = prefect_local.retry_flow_run(api_url, run_id, settle_s=1.0, verify_s=1.0, poll_s=0.1, timeout_s=60)
    reporter.join(10)
    assert late_report_sent.is_set()
    assert left_in == "AwaitingRetry" and _state(api_url, run_id)["type"] == "SCHEDULED"


# -- a status an operator can read ---------------------------------------------------------------------
def test_status_lists_top_level_runs_by_flow_name_elapsed_time_and_the_true_state_of_store_rows(
    api_url, tmp_path, monkeypatch, capsys
):
    from prefect import flow

    from a2rl_bench.cli import main
    from a2rl_bench.records import RunConfig
    from a2rl_bench.store.results import ResultsStore

    @flow(name="status-child")
    def child() -> None:
        pass

    @flow(name="status-parent")
    def parent() -> None:
        child()

    parent()
    running = _flow_run_in("RUNNING")
    threading.Event().wait(2.1)  # it has been running for at least 2 s when status looks
    crashed = _flow_run_in("CRASHED")
    results = tmp_path / "a2rl.duckdb"
    run_id = f"gsm8k-reference-sft-abcdef-{crashed.replace('-', '')[:8]}"
    ResultsStore(results).start_run(run_id, RunConfig(), None, "offline")  # the process died: row left `running`
    monkeypatch.setenv("PREFECT_API_URL", api_url)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["status", "--results", str(results), "--limit", "100"]) == 0
    out = capsys.readouterr().out
    (tmp_path / "status.txt").write_text(out)
    lines = out.splitlines()
    assert any("status-parent / " in line and "Completed" in line for line in lines)
    assert not any("status-child" in line for line in lines)  # subflows are not listed
    running_line = next(line for line in lines if running in line)
    assert "retry-target / " in running_line and "Running" in running_line
    assert re.search(r"│ ([2-9]|[1-9][0-9]) s ", running_line), running_line  # its elapsed time, not 0 s
    assert "GPU slots:" in out
    row = next(line for line in lines if run_id in line)
    assert f"crashed (row not finished): a2rl retry {crashed}" in row


def _sweep_child(api_url: str, deployment_id: str, task_run_id: str, runs_dir: Path, state: dict) -> str:
    """A flow run a sweep started through the `benchmark-run` deployment (its parent is the sweep's task run)."""
    params = run_parameters(RunConfig(), RunOptions(runs_dir=runs_dir, results=runs_dir / "r.db"))
    r = prefect_http.post(f"{api_url}/deployments/{deployment_id}/create_flow_run",
                          json={"parent_task_run_id": task_run_id, "parameters": params})
    r.raise_for_status()
    prefect_local._set_state(api_url, r.json()["id"], state)
    return r.json()["id"]


def test_status_lists_a_sweeps_runs_with_their_true_state_and_one_next_step_each(api_url, tmp_path, monkeypatch,
                                                                                  capsys):  # fmt: skip
    """#29.5: every run the last sweep started through the deployment (they have a parent task run) is listed, each
    with one next step: a crashed one `a2rl retry <id>`; one that reads Running while its process is gone says
    so; and their store rows read the flow run's true state instead of "running? process N is gone"."""
    from a2rl_bench.cli import main
    from a2rl_bench.ops.progress import ProgressWriter
    from a2rl_bench.records import RunConfig
    from a2rl_bench.store.results import ResultsStore

    flow_id = prefect_http.post(f"{api_url}/flows/", json={"name": "benchmark-run"}).json()["id"]
    deployment = {"name": f"status-{uuid.uuid4().hex[:6]}", "flow_id": flow_id}
    deployment_id = prefect_http.post(f"{api_url}/deployments/", json=deployment).json()["id"]
    sweep_flow = prefect_http.post(f"{api_url}/flows/", json={"name": "sweep"}).json()["id"]
    sweep = prefect_http.post(f"{api_url}/flow_runs/", json={"flow_id": sweep_flow, "name": "nightly"}).json()
    prefect_local._set_state(api_url, sweep["id"], {"type": "RUNNING", "name": "Running"})
    launch = {"flow_run_id": sweep["id"], "task_key": "launch", "dynamic_key": "0", "name": "launch"}
    task_run = prefect_http.post(f"{api_url}/task_runs/", json=launch).json()
    runs_dir = tmp_path / "runs"
    crashed = _sweep_child(api_url, deployment_id, task_run["id"], runs_dir, {"type": "CRASHED", "name": "Crashed"})
    gone = _sweep_child(api_url, deployment_id, task_run["id"], runs_dir, {"type": "RUNNING", "name": "Running"})
    done = [_sweep_child(api_url, deployment_id, task_run["id"], runs_dir, {"type": "COMPLETED", "name": "Completed"})
            for _ in range(10)]  # more than the newest 8 `status` lists besides the last sweep's runs
    results = runs_dir / "r.db"
    store = ResultsStore(results)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for child in (crashed, gone):  # both rows left `running` by a process that died
        run_id = f"gsm8k-reference-sft-abcdef-{child.replace('-', '')[:8]}"
        store.start_run(run_id, RunConfig(), str(runs_dir / run_id / "harness"), "offline")
        (runs_dir / run_id / "harness").mkdir(parents=True)
        writer = ProgressWriter(run_id, runs_dir / run_id / "harness", 60)
        writer.update(pid=int(dead.stdout), phase="agent_session")
    monkeypatch.setenv("PREFECT_API_URL", api_url)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["status", "--results", str(results)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(any(child in line and "Completed" in line for line in lines) for child in done)  # every one, by default
    crashed_line = next(line for line in lines if crashed in line and "(in a sweep)" in line)
    assert "Crashed" in crashed_line and f"a2rl retry {crashed}" in crashed_line
    gone_line = next(line for line in lines if gone in line and "(in a sweep)" in line)
    assert f"its process {int(dead.stdout)} is gone: a2rl retry {gone}" in gone_line
    assert any("sweep / nightly" in line for line in lines)
    rows = [line for line in lines if "gsm8k-reference-sft-abcdef-" in line]
    assert any(f"crashed (row not finished): a2rl retry {crashed}" in row for row in rows), rows
    assert any(f"its flow run still reads Running: a2rl retry {gone}" in row for row in rows), rows


# -- clean stops ----------------------------------------------------------------------------------------
# A worker like `prefect worker start`, whose flow run (a child) needs a moment after SIGTERM to record its
# end, and writes down whether its worker was still up at that time (it must be: the run reports to Prefect).
WORKER_WITH_A_RUN = '''
import os, signal, subprocess, sys, time
log = sys.argv[1]
run = subprocess.Popen([sys.executable, "-c", """
import os, signal, sys, time
def on_term(sig, frame):
    time.sleep(1.0)  # recording `interrupted` and the report
    open(sys.argv[1], "a").write("run recorded; worker alive: %s\\\\n" % (os.getppid() != 1))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1], "a").write("run ready\\\\n")
while True:
    time.sleep(0.1)
""", log])
terms = []
def on_term(sig, frame):
    terms.append(sig)
    if len(terms) == 2:
        run.kill()  # what a Prefect worker does to its runs on the second SIGTERM
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(0.1)
'''


def test_stopping_a_worker_lets_its_flow_runs_record_their_end_first(tmp_path):
    import sys

    script, log = tmp_path / "worker.py", tmp_path / "events.log"
    script.write_text(WORKER_WITH_A_RUN)
    proc = prefect_local._spawn([sys.executable, str(script), str(log)], env={"PATH": "/usr/bin:/bin"}, log=tmp_path / "out.log")
    for _ in range(600):
        if "run ready" in (log.read_text() if log.exists() else ""):
            break
        threading.Event().wait(0.05)
    worker = prefect_local.ManagedProcess(name="worker", pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(),
                                          log=str(log))
    prefect_local._write_state(worker, prefect_local.WORKER_STATE, tmp_path)
    assert prefect_local.stop_worker(tmp_path, timeout_s=20, flow_run_grace_s=30) is True
    assert "run recorded; worker alive: True" in log.read_text()
    assert not worker.alive()


# -- what kills leave behind ----------------------------------------------------------------------------
def test_temporaries_of_killed_processes_are_removed_and_live_ones_kept(tmp_path):
    import fcntl
    import subprocess
    import sys

    from a2rl_bench.ops.housekeeping import clean_stale_temp

    models, cache = tmp_path / "models", tmp_path / "eval-cache"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, me = int(dead.stdout), os.getpid()
    abandoned = models / ".smollm2.tmp-abc123"
    building = models / ".qwen.tmp-def456"
    for d in (abandoned, building):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 1024)
    cache.mkdir()
    stale = [cache / f"run-{dead_pid}-1795697499776996935.json", cache / f"abc.{dead_pid}.140001.tmp"]
    live = [cache / f"run-{me}-1795697499776996935.json", cache / f"abc.{me}.140001.tmp", cache / "abc.json"]
    recent = cache / f"run-{dead_pid}-1795697499776996936.json"  # maybe another container's live evaluation
    live.append(recent)
    for f in stale + live:
        f.write_text("{}")
    hours_ago = time.time() - 3 * 3600
    for f in stale + live[:-1]:
        os.utime(f, (hours_ago, hours_ago))
    with open(models / ".qwen.lock", "a") as lock:  # a conversion of qwen is in progress
        fcntl.flock(lock, fcntl.LOCK_EX)
        removed = clean_stale_temp(models, cache)
    assert sorted(removed) == sorted([abandoned, *stale])
    assert building.exists() and all(f.exists() for f in live)


def test_a_retry_of_a_completed_run_returns_its_summary_and_changes_nothing(tmp_path):
    from a2rl_bench.records import RunConfig, RunSummary
    from a2rl_bench.run import make_run_id
    from a2rl_bench.store.results import ResultsStore
    from a2rl_bench.tasks.summary_steps import completed_before

    config, flow_run_id = RunConfig(), str(uuid.uuid4())
    run_id = make_run_id(config, flow_run_id)
    results, runs_dir = tmp_path / "a2rl.duckdb", tmp_path / "runs"
    summary = RunSummary(
        run_id=run_id, config=config, status="completed", protocol="heldout", variant_label="offline",
        baseline_val=0.0, baseline_test=0.0, best_val=12.5, best_submission_id=1, final_submission_id=1,
        final_test=6.25, delta_test=6.25, n_submissions=2, n_scored=2, agent_seconds=118.0, grading_seconds=90.0,
        wall_seconds=310.0,
    )  # fmt: skip
    store = ResultsStore(results)
    store.start_run(run_id, config, None, "offline")
    assert completed_before(config, results, runs_dir, flow_run_id) is None  # running: a retry resumes it
    store.finish_run(summary)
    harness = runs_dir / run_id / "harness"
    harness.mkdir(parents=True)
    (harness / "report.json").write_text(json.dumps({"summary": json.loads(summary.model_dump_json())}))
    before = store.query("SELECT finished_at, wall_seconds FROM runs").to_dict("records")
    assert completed_before(config, results, runs_dir, flow_run_id) == summary
    assert completed_before(config, results, runs_dir, str(uuid.uuid4())) is None  # another flow run: a new run
    assert store.query("SELECT finished_at, wall_seconds FROM runs").to_dict("records") == before


def test_a_sweep_through_deployments_before_a2rl_deploy_says_deploy_first(api_url, monkeypatch, capsys):
    from a2rl_bench.cli import main

    monkeypatch.setenv("PREFECT_API_URL", api_url)
    assert main(["sweep", "--deployment", "--seeds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"a2rl: deploy first: a2rl deploy (no deployment 'benchmark-run/benchmark-run' on {api_url})"]


def test_a_sweep_stops_watching_after_its_timeout_and_names_the_runs_still_going(api_url):
    from prefect import flow

    from a2rl_bench.records import RunConfig
    from a2rl_bench.flows.sweep import SweepItem, watch_runs

    waiting = _flow_run_in("SCHEDULED")  # no worker will ever take it

    @flow(name="watch-test")
    def watch() -> SweepItem:
        item = SweepItem(config=RunConfig(), parameters={}, status="launched", flow_run_id=waiting)
        watch_runs([item], poll_s=0.2, timeout_s=1.0)
        return item

    item = watch()
    assert item.status == "launched" and item.detail.startswith("still Scheduled when the sweep stopped watching")


def test_the_run_limit_is_on_the_runs_queue_so_a_sweep_never_takes_a_place_its_runs_need(api_url):
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    prefect_http.post(f"{api_url}/work_pools/", json={"name": pool, "type": "process"}).raise_for_status()
    prefect_local.set_queue_limit(api_url, pool, prefect_local.RUNS_QUEUE, 1)
    prefect_local.set_queue_limit(api_url, pool, "sweeps", None)  # created on the way, without a limit
    queues = {q["name"]: q["concurrency_limit"] for q in prefect_http.post(
        f"{api_url}/work_pools/{pool}/queues/filter", json={}, timeout=10).json()}  # fmt: skip
    assert queues == {"default": 1, "sweeps": None}


def test_server_start_right_after_a_stop_is_not_refused_for_the_port(tmp_path):
    """A stopped or killed server leaves its connections behind for a minute (TIME_WAIT, or half-closed while a
    worker keeps its end open); the port is free to listen on again with SO_REUSEADDR, which uvicorn sets on
    its socket, and the probe must say so."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        closed, half_open = (socket.create_connection(("127.0.0.1", port)) for _ in range(2))
        for client in (closed, half_open):
            conn, _ = listener.accept()
            conn.close()  # the server's end closes first: TIME_WAIT, or FIN_WAIT_2 while the client stays open
        closed.close()
    try:
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # what the old probe did: refused
        assert prefect_local._port_taken("127.0.0.1", port) is None
    finally:
        half_open.close()
