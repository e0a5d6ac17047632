"""A loopback stand-in for the Anthropic Messages API, for tests that drive the real `anthropic` SDK.

    with AnthropicLoopback(responder=lambda request: "[[A]]") as server:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="test")
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert server.requests[0].body["model"] == "m"

It serves `POST /v1/messages` (non-streaming) on 127.0.0.1 at a free port, from a background thread.
Replies come from `script` (a list used in order; the last entry repeats) or from `responder(request)`;
either may give a string (the reply text) or a `Reply`. Every request is recorded, failures included.
`fail_next(status, times)` answers the next requests with an API error (529 overloaded by default), with
`retry-after-ms` set so that the SDK's retries are quick.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass
class Reply:
    """One scripted answer."""

    text: str = ""
    stop_reason: str = "end_turn"
    input_tokens: int | None = None
    """None: counted as whitespace-separated words of the request's messages and system prompt."""
    output_tokens: int | None = None
    """None: whitespace-separated words of `text`."""


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 200
    """What the server answered."""

    @property
    def prompt(self) -> str:
        """The text of the last message (string or text blocks)."""
        return _text(self.body["messages"][-1]["content"])


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content if isinstance(block, dict))


@dataclass
class _Failure:
    status: int
    remaining: int
    retry_after_ms: int


Responder = Callable[[RecordedRequest], "str | Reply"]


@dataclass
class AnthropicLoopback:
    responder: Responder | None = None
    script: list[str | Reply] | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    _failures: list[_Failure] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _script_pos: int = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> AnthropicLoopback:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="anthropic-loopback", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> AnthropicLoopback:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the loopback server is not running; call start()")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- test controls ---------------------------------------------------------------------------
    def fail_next(self, status: int = 529, times: int = 1, retry_after_ms: int = 5) -> None:
        """Answer the next `times` requests with an API error of this HTTP status."""
        with self._lock:
            self._failures.append(_Failure(status, times, retry_after_ms))

    @property
    def served(self) -> list[RecordedRequest]:
        """Requests answered with a message (status 200)."""
        with self._lock:
            return [r for r in self.requests if r.status == 200]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._failures.clear()
            self._script_pos = 0

    # -- serving ---------------------------------------------------------------------------------
    def _next_failure(self) -> _Failure | None:
        with self._lock:
            while self._failures and self._failures[0].remaining <= 0:
                self._failures.pop(0)
            if not self._failures:
                return None
            self._failures[0].remaining -= 1
            return self._failures[0]

    def _reply_for(self, request: RecordedRequest) -> Reply:
        if self.script is not None:
            with self._lock:
                answer = self.script[min(self._script_pos, len(self.script) - 1)]
                self._script_pos += 1
        elif self.responder is not None:
            answer = self.responder(request)
        else:
            answer = "ok"
        return answer if isinstance(answer, Reply) else Reply(text=answer)

    def _message(self, request: RecordedRequest, reply: Reply) -> dict[str, Any]:
        body = request.body
        texts = [str(body.get("system", ""))] + [_text(m.get("content", "")) for m in body.get("messages", [])]
        words_in = sum(len(t.split()) for t in texts)
        return {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", ""),
            "content": [{"type": "text", "text": reply.text}],
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.input_tokens if reply.input_tokens is not None else max(1, words_in),
                "output_tokens": reply.output_tokens if reply.output_tokens is not None else len(reply.text.split()),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        loopback = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("request-id", f"req_{uuid.uuid4().hex[:16]}")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
                kind = _ERROR_TYPES.get(status, "api_error")
                self._send(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                request = RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with loopback._lock:
                    loopback.requests.append(request)
                if self.path.split("?")[0] != "/v1/messages":
                    request.status = 404
                    return self._error(404, f"no route {self.path}")
                if body.get("stream"):
                    request.status = 400
                    return self._error(400, "the loopback server does not stream")
                if not body.get("model") or not body.get("messages") or not body.get("max_tokens"):
                    request.status = 400
                    return self._error(400, "model, messages and max_tokens are required")
                failure = loopback._next_failure()
                if failure is not None:
                    request.status = failure.status
                    return self._error(failure.status, "injected failure",
                                       {"retry-after-ms": str(failure.retry_after_ms)})  # fmt: skip
                try:
                    reply = loopback._reply_for(request)
                except Exception as e:  # a broken responder is a test bug: say so in the reply
                    request.status = 500
                    return self._error(500, f"responder raised {type(e).__name__}: {e}", {"x-should-retry": "false"})
                self._send(200, loopback._message(request, reply))

        return Handler
