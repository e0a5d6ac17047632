"""Raw REST calls to a Prefect server, as the UI and the tests make them, retried where Prefect's own client
retries: a server whose SQLite database is busy (a loaded machine, several runs writing) answers 503 "Service
Unavailable" for a moment, which its client waits out (PREFECT_CLIENT_MAX_RETRIES, with backoff). A test that
sees that 503 has met the machine's load, not a fault of a2rl; any other answer is returned as it came."""

from __future__ import annotations

import random
import time

import httpx

RETRY_STATUS = (429, 502, 503)
TRIES = 6


def request(method: str, url: str, **kwargs) -> httpx.Response:
    kwargs.setdefault("timeout", 10)
    for attempt in range(TRIES):
        response = httpx.request(method, url, **kwargs)
        if response.status_code not in RETRY_STATUS or attempt == TRIES - 1:
            return response
        try:
            wait = float(response.headers.get("Retry-After", ""))
        except ValueError:
            wait = 0.5 * 2**attempt
        time.sleep(min(wait, 8.0) + random.uniform(0, 0.2))
    raise AssertionError("unreachable")


def get(url: str, **kwargs) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    return request("POST", url, **kwargs)


def patch(url: str, **kwargs) -> httpx.Response:
    return request("PATCH", url, **kwargs)


def delete(url: str, **kwargs) -> httpx.Response:
    return request("DELETE", url, **kwargs)
