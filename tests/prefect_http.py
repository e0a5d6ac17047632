"""Raw REST calls to a Prefect server, as the UI and the tests make them, retried where Prefect's own client
retries: a server whose SQLite database is busy (a loaded machine, several runs writing) answers 503 "Service
Unavailable" for a moment, which its client waits out (PREFECT_CLIENT_MAX_RETRIES, with backoff). A test that
sees that 503 has met the machine's load, not a fault of a2rl; any other answer is returned as it came.

The retries are the ops client's own (`a2rl_bench.ops.prefect_api.BusyRetries`), with a longer backoff (six tries over
about 15 s) and no retried connection: a test that reaches a stopped server sees that at once."""

from __future__ import annotations

import httpx

from a2rl_bench.ops.prefect_api import BusyRetries

WAITS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
TLS = httpx.create_ssl_context()
"""Made once: a transport made without it loads certifi's bundle each time (~45 ms of CPU here), and the tests poll."""


def request(method: str, url: str, **kwargs) -> httpx.Response:
    transport = BusyRetries(WAITS_S, connect_retries=0, verify=TLS)
    with httpx.Client(transport=transport, timeout=kwargs.pop("timeout", 10)) as c:
        return c.request(method, url, **kwargs)


def get(url: str, **kwargs) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    return request("POST", url, **kwargs)


def patch(url: str, **kwargs) -> httpx.Response:
    return request("PATCH", url, **kwargs)


def delete(url: str, **kwargs) -> httpx.Response:
    return request("DELETE", url, **kwargs)
