"""GPU slots: the Prefect global concurrency limit `gpu`, held by each agent session, that outlives the server.

Prefect keeps the leases of a concurrency limit in the server's memory by default; a server stopped while a
run held a slot forgot the lease, and the slot stayed taken for ever. `a2rl server start` therefore runs the
server with Prefect's file-based lease storage (leases under PREFECT_HOME/concurrency_leases, expired ones
revoked by the server's repossessor, also after a restart) and, at start-up, frees slots that no lease on
disk accounts for (a server that ran with in-memory leases). Each lease names its holder (the flow run), so
`a2rl status` can say who holds the slots, and a run that waits for one says so in its log and progress.

The limit through Prefect's client (a2rl_bench.ops.prefect_api); its leases from the files of the server's lease
storage, as Prefect's API tells only a limit's count of active slots, not its leases nor their holders and expiry. The
flow side is `hold_gpu_slot`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from a2rl_bench.ops import prefect_api

GPU_LIMIT = "gpu"
LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"
LEASE_STORAGE_ENV = "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"
LEASE_DIR = "concurrency_leases"
LEASE_S = 60.0
"""A lease a dead run cannot renew frees its slot within this long (the holder renews it while alive)."""


@dataclass
class SlotLimit:
    id: str
    limit: int
    active_slots: int
    active: bool


@dataclass
class SlotLease:
    lease_id: str
    slots: int
    holder: str | None
    """The holding flow run's id (None for a lease without a holder)."""
    expires: datetime

    @property
    def expired(self) -> bool:
        return self.expires <= datetime.now(timezone.utc)


def read_limit(api_url: str | None, name: str = GPU_LIMIT) -> SlotLimit | None:
    """The limit `name` on the server at `api_url` (None: the one this process uses, an ephemeral one too)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url) if api_url else get_client(sync_client=True) as c:
        try:
            d = c.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None
    return SlotLimit(str(d.id), int(d.limit), int(d.active_slots or 0), bool(d.active))


def read_leases(home: Path, limit_id: str) -> list[SlotLease]:
    """The leases on `limit_id` in the file storage of the server whose PREFECT_HOME is `home`. Read here, not
    through Prefect's API (which has no route for them) nor its storage class (which lists live leases only, and
    deletes or repairs the server's files from outside the server)."""
    leases = []
    for path in sorted((home / LEASE_DIR).glob("*.json")):
        try:
            d = json.loads(path.read_text())
            if limit_id not in [str(r) for r in d["resource_ids"]]:
                continue
            meta = d.get("metadata") or {}
            holder = (meta.get("holder") or {}).get("id")
            leases.append(SlotLease(str(d["id"]), int(meta.get("slots", 1)), str(holder) if holder else None,
                                    _utc(d["expiration"])))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue  # the index file, a half-written lease: not a lease we can account for
    return leases


def reconcile(api_url: str, home: Path, name: str = GPU_LIMIT) -> int:
    """Free slots of `name` that no live lease on disk accounts for (left by a server that kept its leases in
    memory, or by a kill between the two). Returns how many were freed."""
    limit = read_limit(api_url, name)
    if limit is None:
        return 0
    held = sum(lease.slots for lease in read_leases(home, limit.id) if not lease.expired)
    if limit.active_slots <= held:
        return 0
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    with prefect_api.client(api_url) as c:
        c.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=held))
    return limit.active_slots - held


def describe(api_url: str, home: Path, flow_run_name: Callable[[str], str], name: str = GPU_LIMIT) -> list[str]:
    """Lines for `a2rl status`: slots in use of the limit, and who holds each lease."""
    with prefect_api.client(api_url):  # one client for the limit and the holders' names
        limit = read_limit(api_url, name)
        if limit is None:
            return ["GPU slots: no limit `gpu` (made by the first sweep through deployments); runs do not wait"]
        inactive = "" if limit.active else " (limit inactive)"
        lines = [f"GPU slots: {limit.active_slots} of {limit.limit} in use{inactive}"]
        for lease in read_leases(home, limit.id):
            who = flow_run_name(lease.holder) if lease.holder else "no holder recorded"
            left = (lease.expires - datetime.now(timezone.utc)).total_seconds()
            state = (f"lease expired {-left:.0f} s ago, to be freed" if left <= 0
                     else f"lease renewed, {left:.0f} s left")  # fmt: skip
            lines.append(f"  held by {who} ({lease.slots} slot(s); {state})")
        return lines


@contextmanager
def hold_gpu_slot(flow_run_id: str | None, on_wait: Callable[[str], None], name: str = GPU_LIMIT,
                  timeout_s: float | None = None) -> Iterator[None]:
    """Hold one slot of `name` while the block runs (a no-op where the limit does not exist). When none is free,
    `on_wait` gets one line saying so before the wait starts; TimeoutError after `timeout_s` (None: no end)."""
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.concurrency.sync import concurrency
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    try:
        limit = read_limit(api_url or None, name)
    except Exception:  # only for what follows: the acquisition itself says what is wrong
        limit = SlotLimit("", 0, 0, False)
    if limit is None:  # no such limit (a plain run: sweeps make it): nothing to hold, and no warning of Prefect's
        yield
        return
    if limit.active and limit.active_slots >= limit.limit:
        on_wait(f"waiting for a GPU slot: {limit.active_slots} of {limit.limit} in use "
                "(`a2rl status` shows who holds them)")  # fmt: skip
    holder = ConcurrencyLeaseHolder(type="flow_run", id=flow_run_id) if flow_run_id else None
    with concurrency(name, occupy=1, lease_duration=LEASE_S, holder=holder, timeout_seconds=timeout_s):
        yield


def _utc(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
