"""A harness-side reverse proxy between a CLI agent and its LLM endpoint, on 127.0.0.1.

The CLI gets the proxy's URL and a per-session token instead of the driver's key; the proxy swaps in the
real key, streams the answer back unchanged and records every model call (tokens in/out, cache reads and
writes, cost, latency, status) to `llm_calls.jsonl`: the accounting does not depend on what the CLI reports.
Speaks the Anthropic Messages API, OpenAI's Responses / Chat Completions APIs (and any OpenAI-compatible
server) and the Gemini API (`:generateContent`, `:streamGenerateContent`), taking the CLI's token from the
header each sends it in (`x-api-key`, `Authorization: Bearer`, `x-goog-api-key` or Gemini's `?key=`); usage
from the JSON body or from the server-sent events.
"""

from __future__ import annotations

import http.server
import json
import secrets
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import httpx

from a2rl_bench.jsonl import append_jsonl
from a2rl_bench.agents.base import LLMCallEvent, LLMDriver

DEFAULT_UPSTREAM = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1",
                    "gemini": "https://generativelanguage.googleapis.com"}  # fmt: skip
_HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding",
                "x-api-key", "authorization", "x-goog-api-key", "proxy-authorization", "upgrade", "te",
                "trailer"}  # fmt: skip
_MODEL_ROUTES = ("/messages", "/responses", "/chat/completions", ":generateContent", ":streamGenerateContent")


class UsageParser:
    """Accumulates the usage of one response from its JSON body or its server-sent events."""

    def __init__(self):
        self.usage: dict[str, int] = {}
        self.model: str | None = None
        self.stop_reason: str | None = None
        self._buffer = b""

    def feed_sse(self, chunk: bytes) -> None:
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            line = line.strip()
            if line.startswith(b"data:"):
                try:
                    self.event(json.loads(line[5:].strip() or b"null"))
                except json.JSONDecodeError:
                    continue

    def event(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start":  # Anthropic: input and cache counts, output so far
            message = data.get("message", {})
            self.model = message.get("model", self.model)
            self._anthropic(message.get("usage") or {})
        elif kind == "message_delta":  # Anthropic: cumulative output tokens, stop reason
            self._anthropic(data.get("usage") or {})
            self.stop_reason = (data.get("delta") or {}).get("stop_reason") or self.stop_reason
        elif kind in ("response.completed", "response.incomplete", "response.failed"):  # OpenAI Responses
            response = data.get("response") or {}
            self.model = response.get("model", self.model)
            self._openai(response.get("usage") or {})
            self.stop_reason = response.get("status", self.stop_reason)
        elif kind is None and isinstance(data.get("candidates") or data.get("usageMetadata"), (list, dict)):
            self._gemini(data)  # a Gemini body or stream chunk: the usage so far, the last chunk's is the total
        elif kind == "message" or (kind is None and ("usage" in data or "choices" in data)):  # a body or chunk
            self.model = data.get("model") or self.model
            choice = (data.get("choices") or [{}])[0]
            self.stop_reason = data.get("stop_reason") or choice.get("finish_reason") or self.stop_reason
            usage = data.get("usage")
            if isinstance(usage, dict) and usage:  # chat chunks carry `usage: null` until the last one
                openai = "prompt_tokens" in usage or "input_tokens_details" in usage
                (self._openai if openai else self._anthropic)(usage)
        elif kind == "response":
            self.model = data.get("model", self.model)
            self._openai(data.get("usage") or {})
            self.stop_reason = data.get("status", self.stop_reason)

    def _anthropic(self, usage: dict) -> None:
        for src, dst in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                         ("cache_read_input_tokens", "cache_read_tokens"),
                         ("cache_creation_input_tokens", "cache_write_tokens")):  # fmt: skip
            if usage.get(src) is not None:
                self.usage[dst] = int(usage[src])

    def _gemini(self, data: dict) -> None:
        self.model = data.get("modelVersion") or self.model
        candidate = (data.get("candidates") or [{}])[0]
        self.stop_reason = candidate.get("finishReason") or self.stop_reason
        usage = data.get("usageMetadata") or {}
        if usage:
            cached = int(usage.get("cachedContentTokenCount") or 0)
            self.usage.update(input_tokens=int(usage.get("promptTokenCount") or 0) - cached, cache_read_tokens=cached,
                              output_tokens=int(usage.get("candidatesTokenCount") or 0)
                              + int(usage.get("thoughtsTokenCount") or 0))  # fmt: skip

    def _openai(self, usage: dict) -> None:
        prompt = usage.get("input_tokens", usage.get("prompt_tokens")) or 0
        details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") or 0
        output = usage.get("output_tokens", usage.get("completion_tokens")) or 0
        self.usage.update(input_tokens=int(prompt) - int(cached), cache_read_tokens=int(cached),
                          output_tokens=int(output))


class LLMProxy:
    """`with LLMProxy(driver, log_path) as proxy:` gives `proxy.url` and `proxy.token` for the CLI."""

    def __init__(self, driver: LLMDriver, log_path: Path, timeout_s: float = 900.0):
        self.driver = driver
        self.upstream = (driver.base_url or DEFAULT_UPSTREAM[driver.api]).rstrip("/")
        self.log_path = Path(log_path)
        self.token = "a2rl-proxy-" + secrets.token_urlsafe(24)
        self.calls = 0
        self.cost_usd = 0.0
        self._lock = threading.Lock()  # guards the call counter and cost total across handler threads
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=30.0))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="llm-proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LLMProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def authorized(self, headers, query: dict[str, list[str]]) -> bool:
        offered = (headers.get("x-api-key") or headers.get("x-goog-api-key")
                   or (headers.get("authorization") or "").removeprefix("Bearer ").strip()
                   or (query.get("key") or [""])[0])  # fmt: skip
        return secrets.compare_digest(offered or "", self.token)

    def upstream_headers(self, headers) -> dict[str, str]:
        out = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
        key = self.driver.api_key.get_secret_value()
        if self.driver.api == "anthropic":
            out["x-api-key"] = key
        elif self.driver.api == "gemini":
            out["x-goog-api-key"] = key
        else:
            out["Authorization"] = f"Bearer {key}"
        return out

    def upstream_url(self, path: str) -> str:
        """The upstream URL of a request path, without a `key` query parameter (the token goes no further)."""
        parts = urlsplit(path)
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "key"])
        return self.upstream + parts.path + (f"?{query}" if query else "")

    def record(self, path: str, started: float, status: int, parser: UsageParser, error: str | None) -> None:
        path = urlsplit(path).path
        if not any(path.endswith(route) for route in _MODEL_ROUTES):
            return
        u = parser.usage
        cost = self.driver.cost_usd(u.get("input_tokens", 0), u.get("output_tokens", 0),
                                    u.get("cache_read_tokens", 0), u.get("cache_write_tokens", 0))  # fmt: skip
        with self._lock:
            self.calls += 1
            self.cost_usd += cost
            call = self.calls
        event = LLMCallEvent(call=call, model=parser.model or self.driver.model, **u, cost_usd=round(cost, 8),
                             latency_s=round(time.monotonic() - started, 3), stop_reason=parser.stop_reason,
                             status=status, error=error, source="proxy")  # fmt: skip
        append_jsonl(self.log_path, event)

    def _handler_class(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def forward(self) -> None:
                started = time.monotonic()
                if not proxy.authorized(self.headers, parse_qs(urlsplit(self.path).query)):
                    self.reply(401, {"type": "error", "error": {"type": "authentication_error", "code": 401,
                                                                "message": "a2rl proxy: wrong token"}})  # fmt: skip
                    return
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                parser = UsageParser()
                try:
                    request = proxy._client.build_request(self.command, proxy.upstream_url(self.path),
                                                          headers=proxy.upstream_headers(self.headers),
                                                          content=body or None)  # fmt: skip
                    upstream = proxy._client.send(request, stream=True)
                except httpx.HTTPError as e:
                    self.reply(502, {"type": "error", "error": {"type": "api_error", "message": f"upstream: {e}"}})
                    proxy.record(self.path, started, 502, parser, f"upstream unreachable: {e}")
                    return
                try:
                    self.relay(upstream, parser)
                finally:
                    upstream.close()
                error = None if upstream.status_code < 400 else f"HTTP {upstream.status_code}"
                proxy.record(self.path, started, upstream.status_code, parser, error)

            def relay(self, upstream: httpx.Response, parser: UsageParser) -> None:
                self.send_response(upstream.status_code)
                for k, v in upstream.headers.items():
                    if k.lower() not in _HOP_HEADERS and k.lower() != "content-encoding":
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sse = "text/event-stream" in upstream.headers.get("content-type", "")
                whole = b""
                try:
                    for chunk in upstream.iter_bytes():
                        if sse:
                            parser.feed_sse(chunk)
                        elif len(whole) < 4_000_000:
                            whole += chunk
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                if not sse and whole:
                    try:
                        parser.event(json.loads(whole))
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        pass

            def reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = forward

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        return Handler
