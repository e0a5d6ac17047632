"""One attempt at a time per flow run, across hosts: the run's lease, kept in the Prefect server.

A Retry starts a new attempt of the same flow run on whichever host's worker takes it, while the host of an
earlier attempt may still be running it (cut off, frozen, or only slow to die). Before an attempt starts work it
takes the run's lease: a Prefect Variable `a2rl-run-<flow run id>` that names the attempt (Prefect's run count),
its host and process, and when it expires. The attempt renews it every RENEW_S; an earlier attempt that finds it
naming a later attempt stops itself (its processes ended, no state reported), and the new attempt waits
TAKEOVER_WAIT_S after taking it from a live holder, so the two never work at once.

An attempt is stale, and stops, when the lease names a later attempt or when the flow run itself says so: a run
count past the attempt's, or a state no working attempt has (Scheduled or Pending: a Retry was pressed; Crashed,
Completed, Failed: the run has its ending). The renewal thread looks every RENEW_S, the flow before each phase.

The server side (a2rl_bench.ops.crash_reports, in the server process) reads the same lease: a crash report while the
run's lease is live is about an attempt that is over or will be confirmed by the lease (not applied). Whether an
attempt is dead is judged by `LeaseWatch` from the renewals the server *heard*: each renewal carries the attempt's
sequence number, and only time in which the server itself answered promptly counts as silence (a stalled server,
a database that is down, a sweep that ran late: that time is not held against any attempt). An attempt silent for
LEASE_S of such time, over at least MIN_ROUNDS sweeps, is dead, and so is a Running run whose attempt never took
the lease within UNCLAIMED_S. Every number here can be set in the environment (A2RL_LEASE_*; docs/scale-out.md §4).
Through Prefect's client (a2rl_bench.ops.prefect_api): status and the server's sweep use it too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx

from a2rl_bench.ops import prefect_api



def _seconds(name: str, default: float) -> float:
    """A time from the environment (a host's or the server's), else the default; a bad value is a one-line error."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SystemExit(f"a2rl: {name}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise SystemExit(f"a2rl: {name}={text!r} must be more than 0 seconds")
    return value


PREFIX = "a2rl-run-"
LEASE_S = _seconds("A2RL_LEASE_S", 30.0)
"""Silence, in time the server heard, after which an attempt is dead (and a lease's nominal length)."""
RENEW_S = _seconds("A2RL_LEASE_RENEW_S", 5.0)
"""How often an attempt renews its lease (and looks whether it is still the run's current attempt)."""
TIMEOUT_S = _seconds("A2RL_LEASE_TIMEOUT_S", 10.0)
"""Each renewal's request timeout: a renewal the server answers later than this is tried again RENEW_S later."""
MIN_ROUNDS = 3
"""Sweeps that must each find the lease unchanged (besides LEASE_S of silence) before its attempt is dead."""
TAKEOVER_WAIT_S = 2 * RENEW_S + 2
"""After taking the lease from a live earlier attempt: the time that attempt needs to notice and stop."""
SWEEP_S = _seconds("A2RL_LEASE_SWEEP_S", 10.0)
"""How often the server looks at the leases of running flow runs."""
PROBE_S = _seconds("A2RL_LEASE_PROBE_S", 5.0)
"""A sweep whose reading of the leases took longer than this (the server or its database slow), or that came
more than this late, hears nothing: the time since the last sweep does not count as anyone's silence."""
UNCLAIMED_S = _seconds("A2RL_LEASE_UNCLAIMED_S", 90.0)
"""A Running benchmark run whose attempt has not taken the lease after this much heard time is Crashed (its host
died between the worker starting it and the flow taking the lease): within UNCLAIMED_S + SWEEP_S."""
TAKE_WITHIN_S = _seconds("A2RL_LEASE_TAKE_WITHIN_S", 600.0)
"""How long an attempt keeps trying to take its lease while the server cannot be asked (`take_until_answered`)."""
BENCHMARK_FLOW = "benchmark-run"
"""The flow whose runs take leases (the sweep looks for unclaimed runs of it only)."""
WORKING_STATES = frozenset({"RUNNING", "CANCELLING", "PAUSED"})
"""The flow-run states in which an attempt may go on working; any other says a Retry or an ending came."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunLease:
    """Who works on a flow run now: its attempt (Prefect's run count), host and process, and until when."""

    flow_run_id: str
    attempt: int
    host: str
    pid: int
    expires: datetime
    seq: int = 0
    """This attempt's renewals so far: a change is what tells the server it heard the attempt (no clocks compared)."""

    def beat(self) -> tuple[int, str, int, int]:
        return (self.attempt, self.host, self.pid, self.seq)

    def live(self, now: datetime | None = None) -> bool:
        return self.expires > (now or datetime.now(timezone.utc))

    def describe(self) -> str:
        return f"attempt {self.attempt} on {self.host} (pid {self.pid}), lease until {self.expires:%H:%M:%S} UTC"

    def to_value(self) -> dict[str, Any]:
        return asdict(self) | {"expires": self.expires.isoformat()}

    @classmethod
    def from_value(cls, value: Any) -> RunLease | None:
        """From a variable's value (a dict, or its JSON); None for anything else (not ours, or hand-edited)."""
        try:
            d = json.loads(value) if isinstance(value, str) else value
            return cls(str(d["flow_run_id"]), int(d["attempt"]), str(d["host"]), int(d["pid"]),
                       _utc(d["expires"]), int(d.get("seq", 0)))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None


TAKEN_PREFIX = "a2rl-taken-"
"""The latest attempt that took a run's lease, written by takers only (`taken_name`). The lease itself is read, then
written, by every renewal: an earlier attempt whose renewal read the lease just before a later one took it writes
its own lease back over the taker's, and with renewals in step (under load, with both queued at one server) it can
read its own lease every time and never stop. Nothing but a taker writes this record, so it cannot be lost so."""


def variable_name(flow_run_id: str) -> str:
    return f"{PREFIX}{flow_run_id}"


def taken_name(flow_run_id: str) -> str:
    return f"{TAKEN_PREFIX}{flow_run_id}"


def _read(api_url: str, name: str, timeout_s: float = prefect_api.TIMEOUT_S) -> RunLease | None:
    with prefect_api.client(api_url, timeout_s) as c:
        variable = c.read_variable_by_name(name)
    return RunLease.from_value(variable.value) if variable is not None else None


def read_lease(api_url: str, flow_run_id: str, timeout_s: float = prefect_api.TIMEOUT_S) -> RunLease | None:
    return _read(api_url, variable_name(flow_run_id), timeout_s)


def read_taken(api_url: str, flow_run_id: str, timeout_s: float = prefect_api.TIMEOUT_S) -> RunLease | None:
    """The lease as the latest attempt to take it wrote it (`TAKEN_PREFIX`), or None."""
    return _read(api_url, taken_name(flow_run_id), timeout_s)


def _write(api_url: str, name: str, lease: RunLease, timeout_s: float) -> None:
    from prefect.client.schemas.actions import VariableCreate, VariableUpdate
    from prefect.exceptions import ObjectAlreadyExists

    with prefect_api.client(api_url, timeout_s) as c:
        try:
            c.update_variable(VariableUpdate(name=name, value=lease.to_value()))
        except httpx.HTTPStatusError as e:  # the client's update does not map a missing variable
            if e.response.status_code != 404:
                raise
            try:
                c.create_variable(VariableCreate(name=name, value=lease.to_value()))
            except ObjectAlreadyExists as gone:  # another attempt created it meanwhile: the server's 409 as is
                raise gone.http_exc from None


def write_lease(api_url: str, lease: RunLease, timeout_s: float = prefect_api.TIMEOUT_S) -> None:
    """Raises httpx errors only (what the flow and the renewal thread catch: the server is away or refused)."""
    _write(api_url, variable_name(lease.flow_run_id), lease, timeout_s)


def drop_lease(api_url: str, flow_run_id: str) -> None:
    """The run's lease and its taker's record, both gone (a second drop finds none: not an error)."""
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url) as c:
        for name in (variable_name(flow_run_id), taken_name(flow_run_id)):
            try:
                c.delete_variable_by_name(name)
            except ObjectNotFound:
                pass


def all_leases(api_url: str) -> list[RunLease]:
    """Every run lease on the server (the server's sweep for expired ones)."""
    from prefect.client.schemas.objects import Variable

    leases, offset = [], 0
    with prefect_api.client(api_url) as c:
        while True:
            # The client's read_variables takes no name filter and no offset: the filter route through its session.
            body = {"variables": {"name": {"like_": PREFIX}}, "limit": 200, "offset": offset}
            page = Variable.model_validate_list(c.request("POST", "/variables/filter", json=body).json())
            leases += [lease for v in page if (lease := RunLease.from_value(v.value)) is not None]
            if len(page) < 200:
                return leases
            offset += 200


class StaleAttempt(RuntimeError):
    """A later attempt of this flow run holds its lease, or the run has moved on: this attempt must not work on."""


def stale_verdict(attempt: int, run_count: int, state_type: str, state_name: str = "") -> str | None:
    """Why attempt `attempt` must stop, given its flow run as the server has it; None while it is the current one.
    A run count past it: a later attempt runs. Scheduled or Pending: a Retry was pressed for a new attempt. Crashed,
    Completed, Failed, Cancelled: the run has its ending, and a second one is never written."""
    if run_count > attempt:
        return f"the flow run is at attempt {run_count} ({state_name or state_type})"
    if state_type not in WORKING_STATES:
        return f"the flow run is {state_name or state_type} (attempt {run_count}): this attempt's work is over"
    return None


def flow_run_verdict(api_url: str, flow_run_id: str, attempt: int, timeout_s: float = prefect_api.TIMEOUT_S
                     ) -> str | None:  # fmt: skip
    """`stale_verdict` for the flow run as the server has it now; raises httpx errors (the caller goes on)."""
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url, timeout_s) as c:
        try:
            run = c.read_flow_run(flow_run_id)
        except ObjectNotFound:
            return None  # not a flow run of this server (a test's, or deleted): nothing says we are over
    if run.state is None:
        return None
    return stale_verdict(attempt, int(run.run_count or 0), run.state.type.value, run.state.name or "")


def ended_earlier(api_url: str, flow_run_id: str) -> str | None:
    """When the flow run already completed in an earlier attempt (its state history holds a Completed state): one
    line saying so; None otherwise, or when the server cannot be asked. On a server without a2rl's rule a new attempt
    may start on a completed run (Prefect accepts Completed → Running), and a Retry of a completed run may land on
    a host without its summary: either way the run is not done twice."""
    try:
        with prefect_api.client(api_url, TIMEOUT_S) as c:
            states = c.read_flow_run_states(flow_run_id)
    except Exception as e:  # the server is away or the run unknown: nothing says it ended
        log.warning("could not read the flow run's states: %s", e)
        return None
    done = [s for s in states if s.type.value == "COMPLETED"]
    if not done:
        return None
    at = f" at {done[-1].timestamp:%Y-%m-%d %H:%M:%S} UTC" if done[-1].timestamp is not None else ""
    return f"the flow run already completed{at}: this attempt does nothing (one ending per run)"


class AttemptLease:
    """The flow side: take the run's lease for this attempt, renew it in a thread, call `on_stale` (once, from
    that thread) when a later attempt has taken it, and give it back at the end."""

    def __init__(self, api_url: str, flow_run_id: str, attempt: int, on_stale: Callable[[str], None],
                 host: str | None = None) -> None:  # fmt: skip
        self.api_url, self.flow_run_id, self.attempt, self.on_stale = api_url, flow_run_id, attempt, on_stale
        self.host = host or os.environ.get("A2RL_HOST") or socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._stale = threading.Lock()

    def _mine(self) -> RunLease:
        self._seq += 1
        expires = datetime.now(timezone.utc) + timedelta(seconds=LEASE_S)
        return RunLease(self.flow_run_id, self.attempt, self.host, os.getpid(), expires, self._seq)

    def take(self, wait: Callable[[float], None] = time.sleep) -> RunLease | None:
        """Take the lease; returns the live earlier holder it was taken from (after waiting for it to stop), else
        None. StaleAttempt if a later attempt already holds it, or the flow run has moved past this attempt."""
        held = read_lease(self.api_url, self.flow_run_id)
        later = held if held is not None and held.attempt > self.attempt else self._taken_later()
        if later is not None:
            raise StaleAttempt(f"attempt {self.attempt} of flow run {self.flow_run_id} is over: {later.describe()}")
        if (why := flow_run_verdict(self.api_url, self.flow_run_id, self.attempt)) is not None:
            raise StaleAttempt(f"attempt {self.attempt} of flow run {self.flow_run_id} is over: {why}")
        mine = self._mine()
        write_lease(self.api_url, mine)
        _write(self.api_url, taken_name(self.flow_run_id), mine, prefect_api.TIMEOUT_S)  # a takeover cannot be lost
        self._thread = threading.Thread(target=self._renew, name="a2rl-run-lease", daemon=True)
        self._thread.start()
        if held is not None and held.attempt < self.attempt and held.live() and not self._gone_here(held):
            wait(TAKEOVER_WAIT_S)  # it renews every RENEW_S, finds the lease taken and stops itself
            return held
        return None

    def take_until_answered(self, wait: Callable[[float], None] = time.sleep, within_s: float | None = None
                            ) -> RunLease | None:  # fmt: skip
        """`take`, tried again every RENEW_S while the server cannot be asked, for at most `within_s` (TAKE_WITHIN_S);
        then the last httpx error. Why: a take cut by an outage between writing the lease and its taker's record
        left a lease that nobody renewed, and once the server heard again it marked the working run Crashed
        (BENCHMARKS.md "Suite wall time, fourteenth pass"). A take tried again finds its own earlier lease and writes
        both again; the server counts none of an outage's time as silence."""
        give_up = time.monotonic() + (TAKE_WITHIN_S if within_s is None else within_s)
        while True:
            try:
                return self.take(wait)
            except httpx.HTTPError as e:
                if time.monotonic() + RENEW_S > give_up:
                    raise
                log.warning("could not take the run's lease (%s): trying again in %g s", e, RENEW_S)
                time.sleep(RENEW_S)

    def _gone_here(self, held: RunLease) -> bool:
        """The holder ran on this host and its process is gone: nothing to wait for."""
        return held.host == self.host and not os.path.exists(f"/proc/{held.pid}")

    def _taken_later(self, timeout_s: float = prefect_api.TIMEOUT_S) -> RunLease | None:
        """A later attempt's lease as it wrote it when it took the run (`TAKEN_PREFIX`), else None."""
        taker = read_taken(self.api_url, self.flow_run_id, timeout_s)
        return taker if taker is not None and taker.attempt > self.attempt else None

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                held = read_lease(self.api_url, self.flow_run_id, TIMEOUT_S)
                if held is not None and held.attempt > self.attempt:
                    self._go_stale(f"a later attempt took the run's lease: {held.describe()}")
                    return
                if (why := flow_run_verdict(self.api_url, self.flow_run_id, self.attempt, TIMEOUT_S)) is not None:
                    self._go_stale(why)
                    return
                write_lease(self.api_url, self._mine(), TIMEOUT_S)
                if (taker := self._taken_later(TIMEOUT_S)) is not None:  # taken while this renewal ran: written over
                    write_lease(self.api_url, taker, TIMEOUT_S)  # the taker's lease back, then stop
                    self._go_stale(f"a later attempt took the run's lease: {taker.describe()}")
                    return
            except httpx.HTTPError as e:  # the server is away: keep working; the server counts no silence it missed
                log.warning("could not renew the run's lease: %s", e)

    def check(self) -> None:
        """Before a step of the flow: stop (through on_stale) if the run has moved past this attempt. A server that
        cannot be asked does not stop the attempt."""
        try:
            why = flow_run_verdict(self.api_url, self.flow_run_id, self.attempt, TIMEOUT_S)
        except httpx.HTTPError as e:
            log.warning("could not read the flow run's state before the next step: %s", e)
            return
        if why is not None:
            self._go_stale(why)

    def _go_stale(self, why: str) -> None:
        self._stop.set()
        if self._stale.acquire(blocking=False):  # once, from whichever thread sees it first
            self.on_stale(why)

    def release(self) -> None:
        """Stop renewing; drop the lease if it is still this attempt's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        try:
            held = read_lease(self.api_url, self.flow_run_id)
            if (held is not None and held.attempt == self.attempt and held.pid == os.getpid()
                    and not self._taken_later()):  # not a later attempt's lease that this one wrote over
                drop_lease(self.api_url, self.flow_run_id)
        except httpx.HTTPError as e:
            log.warning("could not release the run's lease (it expires in %.0f s): %s", LEASE_S, e)


# -- the server's view --------------------------------------------------------------------------------------
def crash_report_verdict(lease: RunLease | None, run_count: int, now: datetime | None = None) -> str | None:
    """Why a (not forced) crash report for a running flow run at attempt `run_count` is not applied, or None to
    apply it. A live lease means an attempt is at work: the current one (its own crash, if any, shows as the
    lease expiring: the server's sweep marks it then) or the earlier one the report is about, still inside its
    lease time. A plain worker's report names no attempt, so the lease is what tells."""
    if lease is None or not lease.live(now):
        return None
    which = "the current attempt" if lease.attempt == run_count else f"attempt {lease.attempt} (run at {run_count})"
    return (f"{which} holds the run's lease ({lease.describe()}): a crash report of an attempt that is over is "
            "not applied; should this attempt be dead, its lease expires and the server marks the run crashed")


def expired_verdict(lease: RunLease, run_count: int, state_type: str, heard_silent_s: float) -> str | None:
    """The message to mark a flow run Crashed with, when its current attempt has been silent for LEASE_S of the
    server's heard time while it reads Running; None otherwise."""
    if heard_silent_s < LEASE_S or state_type != "RUNNING" or lease.attempt != run_count:
        return None
    return (f"its attempt {lease.attempt} on {lease.host} stopped renewing the run's lease: no renewal in "
            f"{heard_silent_s:.0f} s of time the server could hear it (renewals every {RENEW_S:g} s; time the server "
            "or its database could not answer not counted): the host or its flow-run process died")


def unclaimed_verdict(run_count: int, heard_s: float) -> str | None:
    """The message to mark a Running flow run Crashed with, when its attempt has not taken the lease for
    UNCLAIMED_S of heard time; None otherwise."""
    if heard_s < UNCLAIMED_S:
        return None
    return (f"its attempt {run_count} never took the run's lease ({heard_s:.0f} s of time the server could hear it "
            "after it read Running): its host or flow-run process died before the run started work")


class LeaseWatch:
    """The server's memory of what it heard: per lease, the renewal last seen and the heard time since; per Running
    run without its attempt's lease, the heard time since it was first seen so. Time counts only between two
    sweeps that both read promptly (each sweep's `heard_s`), so a server that was stalled or could not reach its
    database holds none of that time against an attempt. Starts empty: a restarted server hears afresh."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: float | None = None
        self._silent: dict[str, tuple[tuple[int, str, int, int], float, int]] = {}
        self._unclaimed: dict[tuple[str, int], float] = {}

    def round(self, read_s: float) -> float:
        """A sweep that read the leases in `read_s`: the heard time it adds (0 after a stall, a failed sweep, a
        slow read). Call `failed()` for a sweep that could not read at all."""
        now = self.clock()
        last, self._last = self._last, now
        if last is None or read_s > PROBE_S or now - last > SWEEP_S + PROBE_S:
            return 0.0
        return now - last

    def failed(self) -> None:
        self._last = self.clock()  # the next sweep counts from here: nothing while the server could not read

    def silence(self, lease: RunLease, heard_s: float) -> float:
        """The heard time without a renewal of `lease`, as of this sweep (0 once a renewal arrived), or 0.0 until
        MIN_ROUNDS sweeps have each found it unchanged."""
        beat = lease.beat()
        seen = self._silent.get(lease.flow_run_id)
        if seen is None or seen[0] != beat:
            self._silent[lease.flow_run_id] = (beat, 0.0, 0)
            return 0.0
        silent, rounds = seen[1] + heard_s, seen[2] + (heard_s > 0)
        self._silent[lease.flow_run_id] = (beat, silent, rounds)
        return silent if rounds >= MIN_ROUNDS else 0.0

    def unclaimed(self, flow_run_id: str, run_count: int, heard_s: float) -> float:
        """The heard time run `flow_run_id` has read Running at `run_count` without that attempt's lease."""
        key = (flow_run_id, run_count)
        self._unclaimed[key] = self._unclaimed.get(key, 0.0) + heard_s
        return self._unclaimed[key]

    def forget(self, leases: set[str], unclaimed: set[str]) -> None:
        """Keep only what it remembers of the leases and of the unclaimed runs this sweep found."""
        self._silent = {k: v for k, v in self._silent.items() if k in leases}
        self._unclaimed = {k: v for k, v in self._unclaimed.items() if k[0] in unclaimed}


def _utc(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
