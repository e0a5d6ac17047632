"""The grader's answers to input it cannot take (issue 24, item 1): always a documented 4xx written by the grader,
never the input echoed, never a 500; then the same server still answers /health and grades an honest
submission. The memory and time bounds of each request path have their red-team cases in test_redteam.py."""

from __future__ import annotations

import shutil

import httpx
import pytest

from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl_bench.records import EvalResult, RunConfig


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


def test_the_request_log_stops_growing_at_its_cap(tmp_path, tiny_model_dir, monkeypatch):
    """An agent can make requests at will: past its cap the request log counts them by status instead."""
    import json
    import time

    from a2rl_bench.grading import server as server_module

    monkeypatch.setattr(server_module, "MAX_REQUEST_LOG_BYTES", 2000)
    ctx = GradingContext("log", RunConfig(), tmp_path / "ws", tmp_path / "harness", {})
    (tmp_path / "ws").mkdir()
    service = GradingService(ctx, BudgetClock(600), evaluate=_constant)
    log = tmp_path / "harness" / "requests.jsonl"
    with GradingServer(service, request_log=log) as server:
        with httpx.Client() as client:
            for _ in range(100):
                assert client.get(f"{server.url}/health").status_code == 200
            time.sleep(1.1)
            client.get(f"{server.url}/nothing-here")
    service.close(5)
    assert log.stat().st_size < 2000 + 200
    counted = json.loads(log.with_suffix(".dropped.json").read_text())["requests_not_logged_by_status"]
    assert len(log.read_text().splitlines()) + sum(counted.values()) == 101, counted


def test_a_websocket_upgrade_is_answered_as_plain_http(served):
    """An upgraded connection would leave the HTTP layer's bounds: the grader does not upgrade (no WebSocket route)."""
    import socket

    _, server = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                  b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200") and b"101" not in answer.split(b"\r\n")[0], answer[:200]
    still_healthy(server)
