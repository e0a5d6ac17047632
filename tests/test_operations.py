"""Operating a2rl's local server: GPU slots that survive a server restart, and start-up refusals in one line.

Fast: the session's Prefect test server for the slots, plain sockets and state files for the refusals."""

from __future__ import annotations

import json
import re
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import psutil
import pytest

from a2rl import gpu_slots, ops


@pytest.fixture
def api_url(prefect_harness) -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def make_limit(api_url: str, limit: int, active_slots: int) -> str:
    name = f"gpu-test-{uuid.uuid4().hex[:8]}"
    r = httpx.post(f"{api_url}/v2/concurrency_limits/", json={"name": name, "limit": limit}, timeout=10)
    r.raise_for_status()
    httpx.patch(f"{api_url}/v2/concurrency_limits/{name}", json={"active_slots": active_slots},
                timeout=10).raise_for_status()  # fmt: skip
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
    ops._write_state(ops.ManagedProcess("server", me.pid, me.create_time(), "log", url=ops.api_url_of(
        "127.0.0.1", 4311)), ops.SERVER_STATE, tmp_path)  # fmt: skip
    with pytest.raises(ops.OpsError, match=r"already runs on http://127.0.0.1:4311/api .*stop it first"):
        ops.start_server(port=4312, home=tmp_path)


def test_server_start_on_a_port_another_program_holds_is_one_line(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ops.OpsError, match=f"port {port} on 127.0.0.1 is in use by another program") as e:
            ops.start_server(port=port, home=tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / ops.SERVER_STATE).exists()


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
    return httpx.get(f"{api_url}/flow_runs/{flow_run_id}", timeout=10).json()["state"]


def test_retry_refuses_a_completed_or_running_run(api_url):
    with pytest.raises(ops.OpsError, match="completed: a retry is refused"):
        ops.retry_flow_run(api_url, _flow_run_in("COMPLETED"))
    with pytest.raises(ops.OpsError, match="is Running: only a crashed"):
        ops.retry_flow_run(api_url, _flow_run_in("RUNNING"))


def test_retry_waits_out_a_second_crash_report_and_presses_again(api_url):
    """The worker's late second 'Crashed' lands right after the retry: the helper sees the retry undone before
    the run started again, waits for the state to settle, and retries once more; the run ends Scheduled."""
    run_id = _flow_run_in("CRASHED")
    late_report_sent = threading.Event()

    def late_crash_report() -> None:
        for _ in range(600):  # until the retry lands (polling a condition, not a timed race)
            if _state(api_url, run_id)["name"] == "AwaitingRetry":
                ops._set_state(api_url, run_id, {"type": "CRASHED", "name": "Crashed", "message": "late report"})
                late_report_sent.set()
                return
            threading.Event().wait(0.05)

    reporter = threading.Thread(target=late_crash_report, daemon=True)
    reporter.start()
    left_in = ops.retry_flow_run(api_url, run_id, settle_s=1.0, verify_s=1.0, poll_s=0.1, timeout_s=60)
    reporter.join(10)
    assert late_report_sent.is_set()
    assert left_in == "AwaitingRetry" and _state(api_url, run_id)["type"] == "SCHEDULED"


# -- a status an operator can read ---------------------------------------------------------------------
def test_status_lists_top_level_runs_by_flow_name_elapsed_time_and_the_true_state_of_store_rows(
    api_url, tmp_path, monkeypatch, capsys
):
    from prefect import flow

    from a2rl.cli import main
    from a2rl.records import RunConfig
    from a2rl.store import ResultsStore

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
