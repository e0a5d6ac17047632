"""The run's lease in the server (a2rl_bench.ops.run_lease): one attempt at a time across hosts, a stale attempt stops
itself, an expired lease marks its Running flow run Crashed, and the verdicts the server's rule takes from it.

Fast: the session's Prefect test server (its Variables hold the leases); the server-side rule itself runs on
a2rl's own server in tests/test_multihost.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from a2rl_bench.grading.clock import CLOCK_FILE, ClockRecorder
from a2rl_bench.ops import run_lease
from a2rl_bench.ops.run_lease import AttemptLease, RunLease, StaleAttempt
import prefect_http


@pytest.fixture
def api_url(prefect_harness) -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def _running_flow_run(api_url: str, flow_name: str = "lease-target") -> str:
    """A flow run that went Pending → Running the way an engine takes it (run_count 1)."""
    flow = prefect_http.post(f"{api_url}/flows/", json={"name": flow_name}).json()
    body = {"flow_id": flow["id"], "name": f"lease-{uuid.uuid4().hex[:6]}", "state": {"type": "SCHEDULED"}}
    run = prefect_http.post(f"{api_url}/flow_runs/", json=body).json()
    for state in ({"type": "PENDING"}, {"type": "RUNNING"}):
        prefect_http.post(f"{api_url}/flow_runs/{run['id']}/set_state", json={"state": state}).raise_for_status()
    return run["id"]


def test_a_later_attempt_takes_the_lease_and_the_earlier_one_stops_itself(api_url, monkeypatch):
    monkeypatch.setattr(run_lease, "RENEW_S", 0.2)
    flow_run_id = str(uuid.uuid4())
    stale = threading.Event()
    reasons: list[str] = []

    def on_stale(why: str) -> None:
        reasons.append(why)
        stale.set()

    first = AttemptLease(api_url, flow_run_id, 1, on_stale, host="gpu-host-1")
    assert first.take() is None
    held = run_lease.read_lease(api_url, flow_run_id)
    assert held is not None and (held.attempt, held.host) == (1, "gpu-host-1") and held.live()

    waited: list[float] = []
    second = AttemptLease(api_url, flow_run_id, 2, lambda why: pytest.fail(why), host="gpu-host-2")
    taken_from = second.take(wait=waited.append)
    assert taken_from is not None and taken_from.attempt == 1  # a live holder on another host: wait for it
    assert waited == [run_lease.TAKEOVER_WAIT_S]
    assert stale.wait(60), "the earlier attempt never noticed"
    assert "a later attempt took the run's lease: attempt 2 on gpu-host-2" in reasons[0]

    first.release()  # the stale attempt leaves the later one's lease alone
    assert run_lease.read_lease(api_url, flow_run_id).attempt == 2
    with pytest.raises(StaleAttempt, match="attempt 1 of flow run .* is over: attempt 2 on gpu-host-2"):
        AttemptLease(api_url, flow_run_id, 1, on_stale, host="gpu-host-1").take()  # a late starter never works
    second.release()
    assert run_lease.read_lease(api_url, flow_run_id) is None


def test_a_take_cut_by_an_outage_is_taken_again_and_its_lease_renewed(api_url, monkeypatch):
    """The server goes away between the lease's write and its taker's record (an outage test met it twice in three
    runs): the attempt takes the lease again once the server answers, and renews it, instead of leaving a lease
    nobody renews (which the server marks Crashed while the run works). Past its time it gives up, saying why."""
    import httpx

    monkeypatch.setattr(run_lease, "RENEW_S", 0.2)
    real_write, failures = run_lease._write, []

    def write_cut_after_the_lease(api_url, name, lease, timeout_s):
        if name.startswith(run_lease.TAKEN_PREFIX) and len(failures) < 2:
            failures.append(name)
            raise httpx.ConnectError("the server stopped answering")
        real_write(api_url, name, lease, timeout_s)

    monkeypatch.setattr(run_lease, "_write", write_cut_after_the_lease)
    flow_run_id = str(uuid.uuid4())
    lease = AttemptLease(api_url, flow_run_id, 1, lambda why: pytest.fail(why), host="gpu-host-1")
    assert lease.take_until_answered() is None and len(failures) == 2
    assert run_lease.read_taken(api_url, flow_run_id).attempt == 1  # the takeover record is written after all
    first = run_lease.read_lease(api_url, flow_run_id).seq
    deadline = time.monotonic() + 30
    while run_lease.read_lease(api_url, flow_run_id).seq <= first and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_lease.read_lease(api_url, flow_run_id).seq > first, "the lease is not renewed"
    lease.release()

    failures.clear()
    monkeypatch.setattr(run_lease, "_write", lambda *a: (_ for _ in ()).throw(httpx.ConnectError("still down")))
    started = time.monotonic()
    with pytest.raises(httpx.ConnectError, match="still down"):
        AttemptLease(api_url, str(uuid.uuid4()), 1, lambda why: None).take_until_answered(within_s=1.0)
    assert time.monotonic() - started < 60  # it gives up (each try's reads may be slow on a loaded machine)


def test_an_earlier_attempt_that_wrote_over_the_takers_lease_still_stops_and_gives_it_back(api_url, monkeypatch):
    """The lost update (a fresh checkout's `make test`, 2026-11-30): the earlier attempt's renewal read the lease just
    before the later one took it, then wrote its own back over the taker's; with both renewing in step it read its
    own lease every time and never stopped. Here the taker is frozen after its take and the earlier attempt's lease
    is written over it by hand: the record only takers write still stops the earlier one, which puts the taker's
    lease back."""
    monkeypatch.setattr(run_lease, "RENEW_S", 0.2)
    flow_run_id = str(uuid.uuid4())
    stale = threading.Event()
    first = AttemptLease(api_url, flow_run_id, 1, lambda why: stale.set(), host="gpu-host-1")
    # The earlier attempt renews only after the hand-written write below: a renewal of its own while the later one
    # takes would find the take, give the lease back and stop, and the hand write would then land after it
    # (CI, 2026-12-01, under load), which no real attempt does: all its writes come from its one renewal thread.
    go = threading.Event()
    first._renew = lambda: go.wait(30) and AttemptLease._renew(first)
    first.take()
    second = AttemptLease(api_url, flow_run_id, 2, lambda why: pytest.fail(why), host="gpu-host-2")
    second.take(wait=lambda s: None)
    second._stop.set()  # the taker renews no more: nothing but the record says the run was taken
    run_lease.write_lease(api_url, first._mine())  # the earlier attempt's write, landed after the take
    go.set()
    assert stale.wait(30), "the earlier attempt never noticed"
    assert run_lease.read_lease(api_url, flow_run_id).attempt == 2  # the taker's lease, given back
    first.release()
    assert run_lease.read_lease(api_url, flow_run_id).attempt == 2
    second.release()
    assert run_lease.read_lease(api_url, flow_run_id) is None and run_lease.read_taken(api_url, flow_run_id) is None


def test_the_lease_goes_to_the_server_named_not_to_the_profiles_url(api_url):
    """Every ops call takes the server's URL (another port, another host's server): the client is built for it,
    whatever PREFECT_API_URL says in this process."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    flow_run_id = _running_flow_run(api_url)
    lease = RunLease(flow_run_id, 1, "gpu-host-1", 4242, datetime.now(timezone.utc) + timedelta(seconds=30))
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # nothing listens there
        run_lease.write_lease(api_url, lease)
        assert run_lease.read_lease(api_url, flow_run_id) == lease
        assert flow_run_id in {held.flow_run_id for held in run_lease.all_leases(api_url)}
        run_lease.drop_lease(api_url, flow_run_id)
        run_lease.drop_lease(api_url, flow_run_id)  # a second drop finds none: not an error
    assert run_lease.read_lease(api_url, flow_run_id) is None


class FakeClock:
    """The server's monotonic clock, advanced by hand: the sweeps below happen at the times the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _sweeps(api_url: str, watch, clock: FakeClock, n: int, step_s: float = run_lease.SWEEP_S) -> list[str]:
    from a2rl_bench.ops.crash_reports import sweep_expired_leases

    marked: list[str] = []
    for _ in range(n):
        clock.now += step_s
        marked += sweep_expired_leases(api_url, watch)
    return marked


def test_a_silent_lease_marks_its_running_flow_run_crashed_after_enough_heard_time_and_a_renewed_one_does_not(
        api_url, monkeypatch):  # fmt: skip
    monkeypatch.setattr(run_lease, "PROBE_S", 3600.0)  # the test server's speed is not what is tested here
    dead, alive = _running_flow_run(api_url), _running_flow_run(api_url)
    now = datetime.now(timezone.utc)
    run_lease.write_lease(api_url, RunLease(dead, 1, "gpu-host-1", 4242, now - timedelta(seconds=1)))
    alive_lease = RunLease(alive, 1, "gpu-host-2", 4343, now - timedelta(seconds=1))
    run_lease.write_lease(api_url, alive_lease)
    clock = FakeClock()
    watch = run_lease.LeaseWatch(clock)
    # Expired by the clock, yet not dead: the server has not heard LEASE_S of silence yet (a restarted server,
    # one that was stalled: it hears afresh).
    assert _sweeps(api_url, watch, clock, 3) == []
    for i in range(int(run_lease.LEASE_S / run_lease.SWEEP_S) + run_lease.MIN_ROUNDS):
        run_lease.write_lease(api_url, RunLease(alive, 1, "gpu-host-2", 4343, alive_lease.expires, seq=i + 1))
        if dead in _sweeps(api_url, watch, clock, 1):
            break
    else:
        pytest.fail("the silent lease's run was never marked crashed")
    assert i + 3 >= run_lease.LEASE_S / run_lease.SWEEP_S  # not before LEASE_S of heard silence
    state = prefect_http.get(f"{api_url}/flow_runs/{dead}").json()["state"]
    assert state["type"] == "CRASHED" and "its attempt 1 on gpu-host-1 stopped renewing the run's lease" in state["message"]
    assert run_lease.read_lease(api_url, dead) is None  # done with
    assert prefect_http.get(f"{api_url}/flow_runs/{alive}").json()["state"]["type"] == "RUNNING"  # it renewed
    run_lease.drop_lease(api_url, alive)


def test_time_the_server_could_not_hear_is_nobodys_silence(monkeypatch):
    """A stalled server (a long gap between its sweeps), a slow read (its database away or loaded) and a failed
    sweep add no silence; a renewal resets it; a lease is dead only after LEASE_S of heard silence over at least
    MIN_ROUNDS sweeps."""
    clock = FakeClock()
    watch = run_lease.LeaseWatch(clock)
    lease = RunLease("f", 1, "gpu-host-1", 7, datetime.now(timezone.utc))
    step = run_lease.SWEEP_S

    def sweep(after_s: float, read_s: float = 0.1, renewed: bool = False) -> float:
        nonlocal lease
        clock.now += after_s
        if renewed:
            lease = RunLease("f", 1, "gpu-host-1", 7, lease.expires, lease.seq + 1)
        return watch.silence(lease, watch.round(read_s))

    assert sweep(step) == 0.0  # first sweep: nothing heard yet
    assert sweep(step) == 0.0  # 10 s heard, fewer than MIN_ROUNDS sweeps so far
    assert sweep(45.0) == 0.0  # the server was stopped 45 s: that gap counts nothing
    watch.failed()  # its database was down for this sweep...
    assert sweep(step) == 0.0  # ... so only the time since the failed sweep counts: 20 s heard
    assert sweep(step, read_s=run_lease.PROBE_S + 1) == 0.0  # a slow read hears nothing
    assert sweep(step) == 3 * step >= run_lease.LEASE_S  # dead: 30 s heard without a renewal, over 3 sweeps
    assert sweep(step, renewed=True) == 0.0 and sweep(step) == 0.0  # a renewal: heard afresh


def test_a_running_benchmark_run_whose_attempt_never_takes_the_lease_is_crashed(api_url, monkeypatch):
    """The host died between its worker starting the run and the flow taking the lease: nothing reports it, no
    lease expires; the server marks it Crashed once UNCLAIMED_S of heard time passed (a Retry of a deployment's
    run is then taken: tests/test_one_ending.py)."""
    monkeypatch.setattr(run_lease, "PROBE_S", 3600.0)
    zombie = _running_flow_run(api_url, run_lease.BENCHMARK_FLOW)
    clock = FakeClock()
    watch = run_lease.LeaseWatch(clock)
    rounds = int(run_lease.UNCLAIMED_S / run_lease.SWEEP_S)
    assert zombie not in _sweeps(api_url, watch, clock, rounds)  # the first sweep hears nothing: 80 s counted
    assert zombie in _sweeps(api_url, watch, clock, 1)  # 90 s: within UNCLAIMED_S + SWEEP_S of its Running
    state = prefect_http.get(f"{api_url}/flow_runs/{zombie}").json()["state"]
    assert state["type"] == "CRASHED" and "its attempt 1 never took the run's lease" in state["message"]


def test_an_attempt_is_stale_once_its_run_moved_on(api_url):
    """Not only the lease: a Retry pressed (Scheduled), a later run count, an ending (Completed) each stop an
    attempt, at its next renewal, before its next step, and at the start."""
    assert run_lease.stale_verdict(1, 1, "RUNNING") is None
    assert "at attempt 2" in run_lease.stale_verdict(1, 2, "RUNNING")
    assert "AwaitingRetry" in run_lease.stale_verdict(1, 1, "SCHEDULED", "AwaitingRetry")
    assert "Completed" in run_lease.stale_verdict(2, 2, "COMPLETED", "Completed")
    flow_run_id = _running_flow_run(api_url)
    lease = AttemptLease(api_url, flow_run_id, 1, lambda why: pytest.fail(why), host="gpu-host-1")
    lease.take()
    lease.check()  # the current attempt: goes on
    assert run_lease.ended_earlier(api_url, flow_run_id) is None
    stopped: list[str] = []
    lease.on_stale = stopped.append
    done = {"type": "COMPLETED", "name": "Completed"}
    prefect_http.post(f"{api_url}/flow_runs/{flow_run_id}/set_state", json={"state": done, "force": True})
    lease.check()
    assert stopped and "Completed" in stopped[0], stopped
    lease.release()
    with pytest.raises(StaleAttempt, match="is over: the flow run is Completed"):
        AttemptLease(api_url, flow_run_id, 1, lambda why: None, host="gpu-host-1").take()
    # A Retry of the completed run (or, on a plain Prefect server, a new attempt it let start): the attempt that
    # runs finds the earlier ending in the run's history and does nothing (the flow returns Completed at once).
    url = f"{api_url}/flow_runs/{flow_run_id}/set_state"
    for state in ({"type": "SCHEDULED", "name": "AwaitingRetry"}, {"type": "PENDING"}, {"type": "RUNNING"}):
        prefect_http.post(url, json={"state": state, "force": True})
    assert "the flow run already completed at " in run_lease.ended_earlier(api_url, flow_run_id)


def test_the_servers_verdicts_on_crash_reports_and_expired_leases():
    now = datetime.now(timezone.utc)
    live = RunLease("f", 2, "gpu-host-2", 7, now + timedelta(seconds=20))
    expired = RunLease("f", 2, "gpu-host-2", 7, now - timedelta(seconds=1))
    # A live lease: a report is about an attempt that is over (or is confirmed later by the lease expiring).
    assert "the current attempt holds the run's lease" in run_lease.crash_report_verdict(live, 2, now)
    assert "attempt 2 (run at 1)" in run_lease.crash_report_verdict(live, 1, now)  # Pending: not counted yet
    assert run_lease.crash_report_verdict(expired, 2, now) is None  # nobody at work: the report applies
    assert run_lease.crash_report_verdict(None, 2, now) is None  # not an a2rl benchmark run
    silent = run_lease.LEASE_S
    assert "stopped renewing the run's lease" in run_lease.expired_verdict(expired, 2, "RUNNING", silent)
    assert run_lease.expired_verdict(expired, 2, "RUNNING", silent - 1) is None  # not heard silent long enough
    assert run_lease.expired_verdict(expired, 3, "RUNNING", silent) is None  # a later attempt is starting
    assert run_lease.expired_verdict(expired, 2, "COMPLETED", silent) is None
    assert RunLease.from_value({"attempt": "x"}) is None and RunLease.from_value("not json") is None


STALE_ATTEMPT = """
import subprocess, sys, time
from pathlib import Path
from a2rl_bench.ops import run_lease
from a2rl_bench.flows.benchmark_run import stop_stale_attempt
from a2rl_bench.grading.clock import BudgetClock, ClockRecorder

run_lease.RENEW_S = 0.2
api_url, flow_run_id, harness = sys.argv[1:4]
child = subprocess.Popen(["sleep", "600"])  # what an attempt starts: its agent, an evaluation
lease = run_lease.AttemptLease(api_url, flow_run_id, 1, lambda why: stop_stale_attempt(Path(harness), "run", why),
                               host="gpu-host-1")
lease.take()
clock = BudgetClock(600)  # its agent's clock, saved only at the end (no periodic save comes)
ClockRecorder(clock, Path(harness) / "clock.json", interval_s=600).__enter__()
clock.start()
print(child.pid, time.time(), flush=True)
time.sleep(600)
"""


def test_a_stale_attempt_ends_its_processes_and_exits_without_a_word(api_url, tmp_path):
    """The flow side's answer to a lost lease (flows/benchmark_run.stop_stale_attempt), in a process of its own:
    its children end with it, its agent's clock is saved as it stops (the attempt that took over resumes from
    there), and it exits STALE_EXIT."""
    from pathlib import Path

    import psutil

    from a2rl_bench.flows.benchmark_run import STALE_EXIT

    repo = Path(__file__).resolve().parents[1]
    flow_run_id = str(uuid.uuid4())
    proc = subprocess.Popen([sys.executable, "-c", STALE_ATTEMPT, api_url, flow_run_id, str(tmp_path)], cwd=repo,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(repo)})  # fmt: skip
    try:
        child, clock_started = proc.stdout.readline().split()
        child = int(child)
        assert run_lease.read_lease(api_url, flow_run_id).attempt == 1
        time.sleep(1.0)
        taken = time.time()
        AttemptLease(api_url, flow_run_id, 2, lambda why: pytest.fail(why), host="gpu-host-2").take(wait=lambda s: None)
        assert proc.wait(timeout=120) == STALE_EXIT
        exited = time.time()
        # The clock ran until the attempt stopped itself: after the lease was taken, before the process was gone.
        stopped = float(clock_started) + ClockRecorder.used_seconds(tmp_path / CLOCK_FILE)
        assert taken - 0.1 <= stopped <= exited + 0.1, (taken, stopped, exited)
        try:  # SIGKILLed: gone, or a zombie until init reaps it
            assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass
        assert run_lease.read_lease(api_url, flow_run_id).attempt == 2  # the stale one left the lease alone
    finally:
        proc.kill()
        run_lease.drop_lease(api_url, flow_run_id)


FROZEN_ATTEMPT = """
import sys, time
from a2rl_bench.ops import run_lease
from a2rl_bench.flows.benchmark_run import StaleStop

run_lease.RENEW_S = 0.2
api_url, flow_run_id = sys.argv[1:3]
run_lease.AttemptLease(api_url, flow_run_id, 1, StaleStop(), host="gpu-host-1").take()
print("holding", flush=True)
time.sleep(600)
"""


def test_an_attempt_frozen_until_its_retry_completed_stops_at_once_without_a_second_ending(api_url):
    """Attempt 1's host freezes (SIGSTOP); the run is retried, attempt 2 completes and gives the lease back (none
    left to name it). Attempt 1 wakes: the run's state, not the lease, tells it the run is over: it exits
    STALE_EXIT, writing no lease and no state."""
    import signal
    from pathlib import Path

    from a2rl_bench.flows.benchmark_run import STALE_EXIT

    repo = Path(__file__).resolve().parents[1]
    flow_run_id = _running_flow_run(api_url)
    proc = subprocess.Popen([sys.executable, "-c", FROZEN_ATTEMPT, api_url, flow_run_id], cwd=repo,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(repo)})  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "holding"
        os.kill(proc.pid, signal.SIGSTOP)
        url = f"{api_url}/flow_runs/{flow_run_id}/set_state"
        prefect_http.post(url, json={"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}, "force": True})
        for state in ({"type": "PENDING"}, {"type": "RUNNING"}):
            assert prefect_http.post(url, json={"state": state}).json()["status"] == "ACCEPT"
        assert prefect_http.get(f"{api_url}/flow_runs/{flow_run_id}").json()["run_count"] == 2
        second = AttemptLease(api_url, flow_run_id, 2, lambda why: pytest.fail(why), host="gpu-host-2")
        second.take(wait=lambda s: None)
        prefect_http.post(url, json={"state": {"type": "COMPLETED", "name": "Completed"}, "force": True})
        second.release()
        assert run_lease.read_lease(api_url, flow_run_id) is None
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=120) == STALE_EXIT
        assert run_lease.read_lease(api_url, flow_run_id) is None  # it wrote no lease of its own again
        states = prefect_http.get(f"{api_url}/flow_run_states/", params={"flow_run_id": flow_run_id}).json()
        assert [s["type"] for s in states].count("COMPLETED") == 1
    finally:
        proc.kill()
        run_lease.drop_lease(api_url, flow_run_id)
