"""One attempt at a time per flow run, across hosts: the run's lease, kept in the Prefect server.

A Retry starts a new attempt of the same flow run on whichever host's worker takes it, while the host of an
earlier attempt may still be running it (cut off, frozen, or only slow to die). Before an attempt starts work it
takes the run's lease: a Prefect Variable `a2rl-run-<flow run id>` that names the attempt (Prefect's run count),
its host and process, and when it expires. The attempt renews it every RENEW_S; an earlier attempt that finds it
naming a later attempt stops itself (its processes ended, no state reported), and the new attempt waits
TAKEOVER_WAIT_S after taking it from a live holder, so the two never work at once.

The server side (a2rl.ops.crash_reports, in the server process) reads the same lease: a crash report while the
run's lease is live is about an attempt that is over or will be confirmed by the lease (not applied), and a
lease that expires while its attempt's flow run reads Running marks the run Crashed: a dead host's run within
LEASE_S + SWEEP_S. Through Prefect's client (a2rl.ops.prefect_api): status and the server's sweep use it too.
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

from a2rl.ops import prefect_api

PREFIX = "a2rl-run-"
LEASE_S = 30.0
"""A lease its attempt stopped renewing (host or process dead) expires this long after its last renewal."""
RENEW_S = 5.0
TAKEOVER_WAIT_S = 2 * RENEW_S + 2
"""After taking the lease from a live earlier attempt: the time that attempt needs to notice and stop."""
SWEEP_S = 10.0
"""How often the server looks for expired leases of running flow runs."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunLease:
    """Who works on a flow run now: its attempt (Prefect's run count), host and process, and until when."""

    flow_run_id: str
    attempt: int
    host: str
    pid: int
    expires: datetime

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
                       _utc(d["expires"]))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None


def variable_name(flow_run_id: str) -> str:
    return f"{PREFIX}{flow_run_id}"


def read_lease(api_url: str, flow_run_id: str) -> RunLease | None:
    with prefect_api.client(api_url) as c:
        variable = c.read_variable_by_name(variable_name(flow_run_id))
    return RunLease.from_value(variable.value) if variable is not None else None


def write_lease(api_url: str, lease: RunLease) -> None:
    """Raises httpx errors only (what the flow and the renewal thread catch: the server is away or refused)."""
    from prefect.client.schemas.actions import VariableCreate, VariableUpdate
    from prefect.exceptions import ObjectAlreadyExists

    name = variable_name(lease.flow_run_id)
    with prefect_api.client(api_url) as c:
        try:
            c.update_variable(VariableUpdate(name=name, value=lease.to_value()))
        except httpx.HTTPStatusError as e:  # the client's update does not map a missing variable
            if e.response.status_code != 404:
                raise
            try:
                c.create_variable(VariableCreate(name=name, value=lease.to_value()))
            except ObjectAlreadyExists as gone:  # another attempt created it meanwhile: the server's 409 as is
                raise gone.http_exc from None


def drop_lease(api_url: str, flow_run_id: str) -> None:
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url) as c:
        try:
            c.delete_variable_by_name(variable_name(flow_run_id))
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
    """A later attempt of this flow run holds its lease: this attempt must not work on."""


class AttemptLease:
    """The flow side: take the run's lease for this attempt, renew it in a thread, call `on_stale` (once, from
    that thread) when a later attempt has taken it, and give it back at the end."""

    def __init__(self, api_url: str, flow_run_id: str, attempt: int, on_stale: Callable[[str], None],
                 host: str | None = None) -> None:  # fmt: skip
        self.api_url, self.flow_run_id, self.attempt, self.on_stale = api_url, flow_run_id, attempt, on_stale
        self.host = host or os.environ.get("A2RL_HOST") or socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _mine(self) -> RunLease:
        expires = datetime.now(timezone.utc) + timedelta(seconds=LEASE_S)
        return RunLease(self.flow_run_id, self.attempt, self.host, os.getpid(), expires)

    def take(self, wait: Callable[[float], None] = time.sleep) -> RunLease | None:
        """Take the lease; returns the live earlier holder it was taken from (after waiting for it to stop), else
        None. StaleAttempt if a later attempt already holds it."""
        held = read_lease(self.api_url, self.flow_run_id)
        if held is not None and held.attempt > self.attempt:
            raise StaleAttempt(f"attempt {self.attempt} of flow run {self.flow_run_id} is over: {held.describe()}")
        write_lease(self.api_url, self._mine())
        self._thread = threading.Thread(target=self._renew, name="a2rl-run-lease", daemon=True)
        self._thread.start()
        if held is not None and held.attempt < self.attempt and held.live() and not self._gone_here(held):
            wait(TAKEOVER_WAIT_S)  # it renews every RENEW_S, finds the lease taken and stops itself
            return held
        return None

    def _gone_here(self, held: RunLease) -> bool:
        """The holder ran on this host and its process is gone: nothing to wait for."""
        return held.host == self.host and not os.path.exists(f"/proc/{held.pid}")

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                held = read_lease(self.api_url, self.flow_run_id)
                if held is not None and held.attempt > self.attempt:
                    self._stop.set()
                    self.on_stale(f"a later attempt took the run's lease: {held.describe()}")
                    return
                write_lease(self.api_url, self._mine())
            except httpx.HTTPError as e:  # the server is away: keep working, the lease says when we were last seen
                log.warning("could not renew the run's lease: %s", e)

    def release(self) -> None:
        """Stop renewing; drop the lease if it is still this attempt's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        try:
            held = read_lease(self.api_url, self.flow_run_id)
            if held is not None and held.attempt == self.attempt and held.pid == os.getpid():
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


def expired_verdict(lease: RunLease, run_count: int, state_type: str, now: datetime | None = None) -> str | None:
    """The message to mark a flow run Crashed with, when its current attempt's lease expired while it reads
    Running; None otherwise."""
    if lease.live(now) or state_type != "RUNNING" or lease.attempt != run_count:
        return None
    return (f"its attempt {lease.attempt} on {lease.host} stopped renewing the run's lease (expired "
            f"{lease.expires:%H:%M:%S} UTC): the host or its flow-run process died")


def _utc(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
