"""Prefect's own Python client, pointed at a given server: the one way `a2rl_bench.ops` talks to Prefect's API.

Every ops function takes the server's API URL (`a2rl server start --port`, PREFECT_API_URL, a test's server), so
the client is built for that URL rather than from the settings (`get_client()` reads PREFECT_API_URL only). Its
own retries are off: our callers already come back (the lease renewal every RENEW_S, the server's sweep every
SWEEP_S, `a2rl retry`'s verify loop) or answer an operator at once, so a stuck server costs one timeout, not
Prefect's five backed-off attempts. A server that answers "busy" at once is another matter: 503 is what Prefect's
server says while its SQLite database is locked by other writers (a sweep's runs, a loaded machine), and that
request is asked again a few times within about two seconds (`BusyRetries`) rather than failing an operator's
`a2rl retry`. Prefect is imported here, on first use only: `a2rl` commands that never reach the server do not
pay for it.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class FlowRunState:
    """A flow run as the Prefect server has it now: its state and how many attempts it has had (what the store's
    merge asks of the server, a2rl_bench.store.merge.FlowRunLookup)."""

    state_type: str
    state_name: str
    run_count: int


BUSY_STATUS = frozenset({429, 502, 503})
"""Answers that say "ask again shortly" (Prefect's client retries the same ones)."""
BUSY_WAITS_S = (0.25, 0.5, 1.0)
"""The waits before asking a busy server again: four tries in about two seconds, then its answer stands."""


class BusyRetries(httpx.HTTPTransport):
    """The ops client's transport: a request the server answered "busy" (BUSY_STATUS) is sent again after each of
    BUSY_WAITS_S; anything else, a timeout included, is handed back at once. Connecting is retried as Prefect's
    own transport does (`connect_retries=3`), for a server that is restarting."""

    def __init__(self, waits_s: tuple[float, ...] = BUSY_WAITS_S, connect_retries: int = 3,
                 verify: ssl.SSLContext | bool = True) -> None:  # fmt: skip
        super().__init__(retries=connect_retries, verify=verify)
        self.waits_s = waits_s

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for wait_s in self.waits_s:
            response = super().handle_request(request)
            if response.status_code not in BUSY_STATUS:
                return response
            response.read()
            response.close()
            time.sleep(wait_s)
        response = super().handle_request(request)
        # A database outage (a2rl_bench.ops.crash_reports) tells Prefect's client to ask again until it ends; an ops
        # read (a2rl status, a lease renewal) reports it instead.
        response.headers.pop("Prefect-Maintenance", None)
        return response


_OPEN: ContextVar[dict[tuple[str, float], SyncPrefectClient]] = ContextVar("a2rl_prefect_clients", default={})
"""The clients open in this thread (a context variable: each thread starts with none), by URL and timeout."""


@contextmanager
def client(api_url: str, timeout_s: float = TIMEOUT_S) -> Iterator[SyncPrefectClient]:
    """A started SyncPrefectClient for `api_url` (with the profile's API key or auth string, as Prefect's own
    `get_client` would); each call raises httpx errors (PrefectHTTPStatusError, ConnectError, ...) or
    prefect.exceptions.ObjectNotFound for a 404 where the client maps it. Inside an outer `client(api_url)` of
    the same thread, that one is reused: `a2rl status` opens one and its dozen reads share it (~50 ms each)."""
    key = (api_url, timeout_s)
    if (open_one := _OPEN.get().get(key)) is not None:
        yield open_one
        return
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_KEY

    with _without_client_retries():
        tls = _tls_context()  # given to the client too, which then makes none of its own
        with SyncPrefectClient(api_url, api_key=PREFECT_API_KEY.value(), auth_string=PREFECT_API_AUTH_STRING.value(),
                               httpx_settings={"timeout": timeout_s, "verify": tls,
                                               "transport": BusyRetries(verify=tls)}) as c:  # fmt: skip
            token = _OPEN.set({**_OPEN.get(), key: c})
            try:
                yield c
            finally:
                _OPEN.reset(token)


# Why the two caches below: a client made afresh cost ~155 ms of CPU on the 2-core machine (Prefect's settings copied
# and validated ~60 ms, two TLS contexts loading certifi's bundle ~40 ms each) against ~4 ms for a read, and each lease
# renewal made four (BENCHMARKS.md "Suite wall time, seventeenth pass").
_DERIVED: dict[int, tuple[Any, Any]] = {}
"""Per settings object in use (by id, the object kept so that its id is not reused): the same settings with the
client's own retries off."""
_TLS: dict[tuple[bool, str | None, int | None], ssl.SSLContext] = {}
"""One TLS context per (skip verification, CA file, its modification time), as Prefect's client makes it from its
settings."""


@contextmanager
def _without_client_retries() -> Iterator[None]:
    """`temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0})`, with the copy of the settings made once per settings
    object rather than at every call (Prefect's client reads the setting at each request, so it must be in force
    while the client is used)."""
    from prefect.context import SettingsContext, get_settings_context
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    context = get_settings_context()
    cached = _DERIVED.get(id(context.settings))
    if cached is None or cached[0] is not context.settings:
        if len(_DERIVED) >= 32:  # settings objects come and go with tests' temporary settings: keep a few
            _DERIVED.clear()
        cached = (context.settings, context.settings.copy_with_update(updates={PREFECT_CLIENT_MAX_RETRIES: 0}))
        _DERIVED[id(context.settings)] = cached
    with SettingsContext(profile=context.profile, settings=cached[1]):
        yield


def _tls_context() -> ssl.SSLContext:
    """The TLS context for PREFECT_API_TLS_INSECURE_SKIP_VERIFY and PREFECT_API_SSL_CERT_FILE, as Prefect's client
    makes it from them (httpx's default, certifi's bundle, when neither is set), made once. The transport gets it
    too: a transport made without it verified against the default whatever the settings said, so a server behind a
    private CA could not be reached by a2rl's ops calls."""
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

    cafile = PREFECT_API_SSL_CERT_FILE.value() or None
    try:
        stamp = os.stat(cafile).st_mtime_ns if cafile else None  # a CA file replaced while a long run works: read again
    except OSError:
        stamp = None  # no such file: made below, which raises as Prefect's client would
    key = (bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value()), cafile, stamp)
    if (ctx := _TLS.get(key)) is None:
        if key[0]:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=cafile) if cafile else httpx.create_ssl_context()
        ctx = _TLS.setdefault(key, ctx)
    return ctx


def flow_runs_json(runs: list[Any]) -> list[dict[str, Any]]:
    """The client's FlowRun models as the API's JSON (what the status rows and `a2rl retry` read)."""
    return [r.model_dump(mode="json") for r in runs]


def read_flow_runs(api_url: str, flow_runs: dict[str, Any], limit: int, sort: str | None = None,
                   flows: dict[str, Any] | None = None, offset: int = 0) -> list[dict[str, Any]]:
    """Flow runs through the client's read_flow_runs, the filters given as the API's JSON (validated into the
    client's filter models), the runs handed back as the API's JSON."""
    from prefect.client.schemas.filters import FlowFilter, FlowRunFilter
    from prefect.client.schemas.sorting import FlowRunSort

    with client(api_url) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter.model_validate(flow_runs),
                                flow_filter=FlowFilter.model_validate(flows) if flows else None,
                                sort=FlowRunSort(sort) if sort else None, limit=limit, offset=offset)  # fmt: skip
    return flow_runs_json(runs)
