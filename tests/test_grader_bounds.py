"""Every request path of the grader is bounded in memory and time (issue 24, item 1), each case against the real
server in this process, then the same server still answers /health and grades an honest submission."""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from a2rl.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl.grading.server import HEAD_SECONDS, MAX_CONNECTIONS
from a2rl.records import EvalResult, RunConfig

MiB = 1 << 20


def _constant(model_dir, weights_hash, spec, device=None) -> EvalResult:
    return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="constant",
                      weights_hash=weights_hash)  # fmt: skip


@pytest.fixture
def served(tmp_path, tiny_model_dir):
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, ws / "models" / "base")
    shutil.copytree(tiny_model_dir, ws / "output" / "honest")
    ctx = GradingContext("bounds", RunConfig(max_submissions=3), ws, tmp_path / "harness", {"validation": 10.0},
                         base_model_dir=tiny_model_dir)  # fmt: skip
    service = GradingService(ctx, BudgetClock(600), evaluate=_constant)
    with GradingServer(service) as server:
        yield ws, server
    service.close(10)


def _auth(server: GradingServer) -> dict:
    return {"Authorization": f"Bearer {server.token}"}


def still_healthy(server: GradingServer) -> None:
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    r = httpx.post(f"{server.url}/submit", json={"model_path": "output/honest", "wait": True}, headers=_auth(server),
                   timeout=120)  # fmt: skip
    assert r.status_code == 200 and r.json()["status"] == "scored", r.text


def _peak_rss_mb() -> float:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _with_header(ws: Path, name: str, header: bytes) -> None:
    ckpt = ws / "output" / name
    shutil.copytree(ws / "output" / "honest", ckpt)
    (ckpt / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)


def test_huge_headers_of_small_containers_do_not_grow_the_grader(served):
    """16 MiB safetensors headers (millions of empty lists: ~360 MB each for `json.loads`) and config.json files of
    a million values, validated and submitted at once: every answer a 4xx, the grader's peak memory stays small."""
    ws, server = served
    body = b"[],[]," * ((16 * MiB - 64) // 6)
    _with_header(ws, "header-bomb", b'{"w": [' + body + b'[]]}')
    ckpt = ws / "output" / "config-bomb"
    shutil.copytree(ws / "output" / "honest", ckpt)
    (ckpt / "config.json").write_text('{"a": [' + "[]," * 1_300_000 + "[]]}")  # 4 MiB: ~90 MB for json.loads
    _reset_peak_rss()
    start = _peak_rss_mb()

    def attack(i: int) -> int:
        route, path = ("/validate", "/submit")[i % 2], ("output/header-bomb", "output/config-bomb")[i // 2 % 2]
        return httpx.post(server.url + route, json={"model_path": path}, headers=_auth(server), timeout=120).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(attack, range(8)))
    grown = _peak_rss_mb() - start
    assert set(codes) <= {400, 429} and 400 in codes, codes
    assert grown < 200, f"the grader's peak RSS grew by {grown:.0f} MB"
    still_healthy(server)


def test_trickled_headers_are_cut_and_do_not_lock_the_agent_out(served):
    """MAX_CONNECTIONS + 44 connections that trickle header bytes: the agent's own /budget keeps answering
    meanwhile, and every trickling connection is answered 408 and closed within HEAD_SECONDS (plus slack)."""
    _, server = served
    n = MAX_CONNECTIONS + 44
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(0.05)
        socks.append(s)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            for s in socks:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            stop.wait(0.5)

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        budget = [httpx.get(f"{server.url}/budget", headers=_auth(server), timeout=10).status_code for _ in range(3)]
        assert budget == [200, 200, 200], budget
        deadline = time.monotonic() + HEAD_SECONDS + 30
        open_ = list(socks)
        while open_ and time.monotonic() < deadline:
            for s in list(open_):
                try:
                    data = s.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    data = b""
                assert not data or data.startswith(b"HTTP/1.1 408"), data[:100]
                open_.remove(s)
            time.sleep(0.2)
        assert not open_, f"{len(open_)} trickling connections still open after {HEAD_SECONDS + 30:.0f} s"
    finally:
        stop.set()
        feeder.join()
        for s in socks:
            s.close()
    still_healthy(server)


@pytest.mark.parametrize("body", [
    b'{"model_path": "\\ud800"}',
    b'{"model_path": "output/\\udfff\\ud800", "wait": true}',
    b'{"model_path": 7, "\\ud800": "\\ud800"}',
    b'{"model_path": "\\ud800", "wait": "\\ud800"}',
    b'{"model_path": ["\\ud800"]}',
    b'"\\ud800"',
    b'{"model_path": "\xff\xfe"}',
    b'[' * 30000 + b']' * 30000,
])  # fmt: skip
def test_undecodable_input_answers_4xx_without_echoing_it(served, body):
    """Lone surrogates, bytes that are not UTF-8, deep nesting: a one-line 4xx written by the grader (never the
    input), on both routes, each status documented in /openapi.json."""
    _, server = served
    spec = httpx.get(f"{server.url}/openapi.json").json()
    for route in ("/validate", "/submit"):
        r = httpx.post(server.url + route, content=body, headers={**_auth(server), "content-type": "application/json"})
        assert 400 <= r.status_code < 500, (route, r.status_code, r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "\\ud800" not in r.text and "ud800" not in detail, r.text
        assert str(r.status_code) in spec["paths"][route]["post"]["responses"], (route, r.status_code)
    still_healthy(server)


def test_every_status_the_routes_answer_is_documented(served):
    _, server = served
    spec = httpx.get(f"{server.url}/openapi.json").json()
    for route in ("/validate", "/submit"):
        documented = set(spec["paths"][route]["post"]["responses"])
        assert {"400", "401", "403", "404", "408", "409", "413", "422", "429", "500", "503"} <= documented, documented
        schema = spec["paths"][route]["post"]["responses"]["422"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/Error"}
