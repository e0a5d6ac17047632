"""One attempt, one ending, on a2rl's own server (`a2rl server start`'s process: Prefect's server with a2rl's
orchestration rules and lease sweep), its lease times shortened through the A2RL_LEASE_* settings an operator
would set. No worker: the tests make the state changes a worker and a flow engine make, over the REST API.

* a completed run refuses a new attempt (Pending, Running) and a second ending; a Retry is still taken;
* a benchmark run with parameters its flow does not take ends Failed, naming them, not Crashed;
* a Running benchmark run whose attempt never took the lease is Crashed, and can be retried;
* the server stopped (SIGSTOP) for several lease lengths while one attempt renews and another is dead: after it
  wakes, the dead one is Crashed and the live one is not.

Slow-ish (a server start, ~1-3 minutes on busy cores); its waits follow the server's states, not the clock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest

from a2rl_bench.ops import prefect_local, run_lease
from tests.live_server import SERVER_ENV, SHORT_LEASE, family, free_port, start_sqlite_server
from tests.live_server import flow_run as _flow_run
from tests.live_server import set_state as _set_state
from tests.live_server import wait_for as _wait_for
import prefect_http

pytestmark = pytest.mark.prefect_server

LEASE = {**SHORT_LEASE, "A2RL_LEASE_UNCLAIMED_S": "5"}
"""The server's lease times for these tests: dead after 10 s of heard silence, unclaimed after 5 s."""
STALL_S = 35.0
"""How long the server is stopped: more than three lease lengths."""


@dataclass
class Server:
    url: str
    pid: int


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("one-ending") / "prefect"
    proc = start_sqlite_server(home, port=free_port(), env={**SERVER_ENV, **LEASE}, timeout_s=300)
    try:
        yield Server(proc.url, proc.pid)
    finally:
        prefect_local.stop_server(home)
        assert not family(proc.pid), "the server left processes behind"


def _deployment(url: str, flow_name: str) -> str:
    prefect_http.post(f"{url}/work_pools/", json={"name": "nobody", "type": "process"})
    flow = prefect_http.post(f"{url}/flows/", json={"name": flow_name}).json()
    deployment = prefect_http.post(f"{url}/deployments/", json={
        "name": flow_name, "flow_id": flow["id"], "work_pool_name": "nobody"}).json()  # fmt: skip
    return deployment["id"]


def _running(url: str, flow_name: str, parameters: dict | None = None, states=("PENDING", "RUNNING")) -> str:
    """A deployment's flow run taken as a worker and an engine take it (not forced)."""
    run = prefect_http.post(f"{url}/deployments/{_deployment(url, flow_name)}/create_flow_run",
                            json={"parameters": parameters or {}}).json()  # fmt: skip
    for state in states:
        assert _set_state(url, run["id"], {"type": state, "name": state.title()}, force=False)["status"] == "ACCEPT"
    return run["id"]


def test_a_completed_run_takes_no_new_attempt_and_no_second_ending_but_a_retry(live):
    server = live.url
    run = _running(server, "ended")
    assert _set_state(server, run, {"type": "COMPLETED", "name": "Completed"}, force=False)["status"] == "ACCEPT"
    for late in ("PENDING", "RUNNING", "COMPLETED", "FAILED"):  # a stale attempt's, or a worker's, too late
        answer = _set_state(server, run, {"type": late, "name": late.title()}, force=False)
        assert answer["status"] == "ABORT" and "one ending per run" in answer["details"]["reason"], (late, answer)
    assert _flow_run(server, run)["state_type"] == "COMPLETED"
    retry = {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"}
    assert _set_state(server, run, retry, force=False)["status"] == "ACCEPT"  # the flow returns its summary


def test_a_benchmark_run_with_old_flat_parameters_ends_failed_naming_them(live):
    """Its flow-run process dies loading the parameters (SignatureMismatchError) and its worker reports it
    Crashed; the server makes that Failed with one line naming the fields, so nothing retries it."""
    server = live.url
    run = _running(server, run_lease.BENCHMARK_FLOW, {"seed": 3, "task": "gsm8k"}, states=("PENDING",))
    report = {"type": "CRASHED", "name": "Crashed", "message": "Flow run infrastructure exited with non-zero status "
              "code 1."}  # fmt: skip
    _set_state(server, run, report, force=False)
    state = _flow_run(server, run)["state"]
    assert state["type"] == "FAILED", state
    assert "parameters the benchmark-run flow does not take: seed, task" in state["message"]
    assert "\n" not in state["message"]


def test_a_running_benchmark_run_whose_host_died_before_the_lease_is_crashed_and_retried(live):
    server = live.url
    run = _running(server, run_lease.BENCHMARK_FLOW)
    t = time.monotonic()
    crashed = _wait_for(lambda: (r := _flow_run(server, run))["state_type"] == "CRASHED" and r, timeout_s=120,
                        what="the unclaimed run crashed")  # fmt: skip
    assert time.monotonic() - t <= 120  # within 2 minutes (here: 5 s of heard time)
    assert "its attempt 1 never took the run's lease" in crashed["state"]["message"]
    retry = {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"}
    assert _set_state(server, run, retry, force=False)["status"] == "ACCEPT"


RENEWING = """
import sys, time
from a2rl_bench.ops import run_lease

run_lease.RENEW_S, run_lease.TIMEOUT_S, run_lease.LEASE_S = 0.5, 2.0, 10.0
api_url, flow_run_id = sys.argv[1:3]
run_lease.AttemptLease(api_url, flow_run_id, 1, lambda why: sys.exit("stale: " + why), host="gpu-host-1").take()
print("holding", flush=True)
time.sleep(600)
"""


def test_a_stalled_server_crashes_the_dead_attempt_and_not_the_live_one(live):
    """The server is stopped for more than three lease lengths, and so is a host whose attempt renews its lease;
    another attempt is dead. The server wakes first, the host 2 s later (hosts come back as they can). A server that
    judged by its clock would find both leases long expired when it wakes and crash both; judging what it heard,
    it crashes the dead one LEASE_S of heard time after waking, by which time the live one renewed."""
    server = live.url
    alive, dead = _running(server, "stall-live"), _running(server, "stall-dead")
    repo = Path(__file__).resolve().parents[1]
    host = subprocess.Popen([sys.executable, "-c", RENEWING, server, alive], cwd=repo, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(repo)})  # fmt: skip
    try:
        assert host.stdout.readline().strip() == "holding"
        now = datetime.now(timezone.utc)
        run_lease.write_lease(server, run_lease.RunLease(dead, 1, "gpu-host-2", 4242, now + timedelta(seconds=10)))
        stopped = [psutil.Process(host.pid), *_stop(live.pid)]
        stopped[0].suspend()
        try:
            time.sleep(STALL_S)  # what is tested is a stall of this length
        finally:
            for p in stopped[1:]:
                p.resume()
            time.sleep(2.0)  # the host comes back after its server
            stopped[0].resume()
        _wait_for(lambda: _flow_run(server, dead)["state_type"] == "CRASHED", timeout_s=180,
                  what="the dead attempt's run crashed")  # fmt: skip
        assert _flow_run(server, alive)["state_type"] == "RUNNING"
        assert host.poll() is None, "the live attempt stopped itself"
        assert run_lease.read_lease(server, alive).attempt == 1
    finally:
        host.kill()
        host.wait()


def _stop(pid: int) -> list[psutil.Process]:
    """SIGSTOP the server process and any children of it."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        p.suspend()
    return procs
