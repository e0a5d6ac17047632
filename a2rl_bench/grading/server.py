"""The agent-facing HTTP API of the grading service: FastAPI on 127.0.0.1, a bearer token per run."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import threading
import time
from pathlib import Path

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from a2rl_bench.grading.errors import SubmissionRejected
from a2rl_bench.grading.service import GradingService

MAX_BODY_BYTES = 64 * 1024
BODY_SECONDS = 30.0
HEAD_SECONDS = 10.0
"""A request's line and headers must arrive whole within this, from the connection's start (or the end of the
previous response): bytes trickled in one at a time do not hold a connection open."""
MAX_CONNECTIONS = 256
MAX_REQUEST_LOG_BYTES = 64 * 1024**2
"""The request log's size; past it requests are counted, not logged (`RequestGuard._log`)."""
MAX_CONNECTIONS_PER_CLIENT = 128
"""Per peer address. In the sandbox every agent connection arrives from its shim on 127.0.0.1 (one client)."""
log = logging.getLogger("a2rl_bench.grading")
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Everything else needs the bearer token, checked before a byte of the body is read."""


def _error(description: str) -> dict:
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


class Error(BaseModel):
    detail: str = Field(description="One harness-written line saying what was wrong.")


COMMON_RESPONSES: dict[int | str, dict] = {
    400: _error("Malformed request (bad Content-Length, headers over 16 KiB, not HTTP) or a refused checkpoint"),
    401: _error("Missing or wrong bearer token (checked before the body is read)"),
    408: _error(f"Request line and headers not received within {HEAD_SECONDS:.0f} s, or the body not within "
                f"{BODY_SECONDS:.0f} s (the connection is closed)"),
    413: _error(f"Request body over {MAX_BODY_BYTES} bytes, declared or streamed (chunked)"),
    422: _error("The body is not the JSON this route takes (one line naming the field; the input is never echoed)"),
    500: _error("An error of the grader itself (logged in the harness); nothing was spent"),
    503: _error(f"Over {MAX_CONNECTIONS} connections at once, or {MAX_CONNECTIONS_PER_CLIENT} from one address, "
                "none of them idle; retry"),
}
SUBMISSION_RESPONSES: dict[int | str, dict] = {
    403: _error("The session is over, or the checkpoint breaks the run's mode (strict mode)"),
    404: _error("model_path does not exist"),
    408: _error("Checking or copying the checkpoint ran past its time limit, or the body came too slowly"),
    409: _error("A checkpoint file changed while it was being checked or copied"),
    413: _error("Request body too large, or checkpoint over the size cap"),
    429: _error("Submission cap reached, or other checkpoints are being checked right now (retry when answered)"),
    507: _error("The run's disk for submission snapshots is used up (a harness-side quota); nothing was spent"),
}


class PathRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # no coercion: `true` is not submission 1, `0` not `false`

    model_path: str = Field(description="Checkpoint directory, relative to the workspace (e.g. output/v1).",
                            min_length=1, examples=["output/v1"])


class FinalRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # no coercion: `true` is not submission 1, `0` not `false`

    submission_id: int = Field(description="The submission to evaluate on the hidden test set after the session.")


class SubmitRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # no coercion: `true` is not submission 1, `0` not `false`

    model_path: str = Field(description="Checkpoint directory, relative to the workspace (e.g. output/v1).",
                            min_length=1, examples=["output/v1"])
    wait: bool = Field(default=False, description="Block until graded and return the score (original's sync mode).")
    stage: str | None = Field(
        default=None, max_length=32, pattern=r"^[A-Za-z0-9 +_.:-]*$", examples=["SFT", "GRPO"],
        description="Optional label of the training stage that made this checkpoint (e.g. SFT, GRPO): recorded "
                    "as the agent's own word, used only to group submissions in the analysis.",
    )  # fmt: skip
    parent: int | None = Field(
        default=None, ge=1, examples=[2],
        description="Optional id of this run's earlier submission whose checkpoint this one's training started "
                    "from: recorded as the agent's own word, used only to tell the analysis where a stage started "
                    "(RL's share).",
    )  # fmt: skip


class RequestGuard:
    """Outermost ASGI layer: the bearer token is checked before the body is read (public paths excepted),
    at most MAX_BODY_BYTES of the body are ever read, declared or chunked (the rest stays unread and the
    connection is closed), and every request is logged to the harness's request log."""

    def __init__(self, app, token: str, request_log: Path | None):
        self.app, self.token, self.request_log = app, token.encode(), request_log
        self._logged = request_log.stat().st_size if request_log is not None and request_log.exists() else 0
        self._dropped: dict[str, int] = {}
        self._counted_at = 0.0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status: list[int] = []

        async def logged_send(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self._guarded(scope, receive, logged_send)
        finally:
            self._log(scope, status[0] if status else 0, time.perf_counter() - start)

    async def _guarded(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or [])
        if scope["path"] not in PUBLIC_PATHS and not self._authorized(headers.get(b"authorization", b"")):
            return await _answer(send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return await _answer(send, 400, "bad Content-Length header")
            if int(declared) > MAX_BODY_BYTES:
                return await _answer(send, 413, f"request body over {MAX_BODY_BYTES} bytes")
        body = bytearray()
        deadline = time.monotonic() + BODY_SECONDS
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:  # a body trickled in too slowly: no task waits on it for ever
                return await _answer(send, 408, f"request body not received within {BODY_SECONDS:.0f} s")
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:  # a chunked body declares nothing: cap what is read
                return await _answer(send, 413, f"request body over {MAX_BODY_BYTES} bytes")
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def _authorized(self, header: bytes) -> bool:
        scheme, _, credentials = header.partition(b" ")
        return scheme.lower() == b"bearer" and secrets.compare_digest(credentials.strip(), self.token)

    def _log(self, scope, status: int, seconds: float) -> None:
        """One line a request, up to MAX_REQUEST_LOG_BYTES (an agent can make requests at will); past it, counts
        by status in `<log>.dropped.json`, rewritten at most once a second."""
        if self.request_log is None:
            return
        if self._logged >= MAX_REQUEST_LOG_BYTES:
            self._dropped[str(status)] = self._dropped.get(str(status), 0) + 1
            if time.monotonic() - self._counted_at > 1.0:
                self._counted_at = time.monotonic()
                self.request_log.with_suffix(".dropped.json").write_text(json.dumps(
                    {"after_bytes": MAX_REQUEST_LOG_BYTES, "requests_not_logged_by_status": self._dropped}))
            return
        line = json.dumps({"at": time.time(), "method": scope.get("method"), "route": scope.get("path")[:200],
                           "status": status, "latency_s": round(seconds, 4)}) + "\n"  # fmt: skip
        with self.request_log.open("a") as f:
            f.write(line)
        self._logged += len(line)


async def _answer(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), *headers]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def create_app(service: GradingService, token: str, request_log: Path | None = None) -> FastAPI:
    app = FastAPI(title="a2rl grading service", version="1", responses=COMMON_RESPONSES)
    bearer = HTTPBearer(auto_error=False)

    def authorized(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        # RequestGuard already checked the token; this declares the scheme in the OpenAPI document.
        if creds is None or not secrets.compare_digest(creds.credentials, token):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    app.add_middleware(RequestGuard, token=token, request_log=request_log)

    @app.exception_handler(SubmissionRejected)
    async def rejected(request: Request, exc: SubmissionRejected):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        # FastAPI's own answer echoes the input, which may not even be encodable (a lone surrogate): 500.
        return _json(422, validation_detail(exc.errors()))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception):
        log.error("grader error on %s %s", request.method, request.url.path, exc_info=exc)
        return _json(500, "internal error of the grader (logged in the harness); nothing was spent")

    # async: answered on the event loop, so it stays up even when every worker thread is busy.
    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "task": service.ctx.config.task, "protocol": service.ctx.config.protocol}

    @app.get("/budget", dependencies=[Depends(authorized)])
    def budget() -> dict:
        return service.budget()

    # Sync endpoints run in FastAPI's thread pool, so a waiting /submit does not block others.
    @app.post("/submit", dependencies=[Depends(authorized)], responses=SUBMISSION_RESPONSES)
    def submit(body: SubmitRequest) -> dict:
        return service.submit(body.model_path, wait=body.wait, stage=body.stage, parent=body.parent)

    @app.post("/validate", dependencies=[Depends(authorized)], responses=SUBMISSION_RESPONSES)
    def validate(body: PathRequest) -> dict:
        """Pre-check a checkpoint (path, config, weights, LoRA, architecture, vocabulary); spends nothing."""
        return service.validate(body.model_path)

    @app.post("/final", dependencies=[Depends(authorized)],
              responses={404: _error("No such submission"), 409: _error("That submission failed grading"),
                         429: _error("The final pick was changed too often (100 times)")})
    def final(body: FinalRequest) -> dict:
        """Declare the final pick (heldout protocol); default is the best submission on validation."""
        return service.declare_final(body.submission_id)

    @app.get("/submissions", dependencies=[Depends(authorized)])
    def submissions() -> list[dict]:
        return [service.response(e.submission_id) for e in service.submissions()]

    @app.get("/submissions/{submission_id}", dependencies=[Depends(authorized)],
             responses={404: _error("No such submission")})
    def submission(submission_id: int) -> dict:
        return service.response(submission_id)

    @app.get("/best", dependencies=[Depends(authorized)])
    def best() -> dict:
        b = service.best()
        return service.response(b.submission_id) if b else {"best": None}

    _add_error_schema(app)
    return app


def _json(status: int, detail: str) -> Response:
    """An answer whose bytes are always encodable: ASCII JSON (a lone surrogate becomes an escape)."""
    return Response(json.dumps({"detail": detail}), status_code=status, media_type="application/json")


def validation_detail(errors: list[dict]) -> str:
    """One harness-written line for a request body that does not validate: where and what kind of error, never
    the input (field names come from our models; anything else is escaped and cut)."""
    parts = []
    for e in errors[:3]:
        loc = ".".join(str(x) if isinstance(x, int) or (isinstance(x, str) and x.isidentifier() and len(x) <= 40)
                       else "?" for x in e.get("loc", ()))  # fmt: skip
        msg = str(e.get("msg", "invalid")).encode("ascii", "replace").decode()[:100]
        parts.append(f"{loc or 'body'}: {msg}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def _add_error_schema(app: FastAPI) -> None:
    """Put the `Error` body (referenced by every documented 4xx) into the OpenAPI document."""
    make = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = make()
            schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = Error.model_json_schema()
        return app.openapi_schema

    app.openapi = openapi


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol (pinned uvicorn), with the bounds it lacks:

    - a request's line and headers must arrive whole within HEAD_SECONDS of the connection's start (or of the
      previous response's end), else 408 and the connection is closed: trickled header bytes hold nothing open;
    - a connection that sends nothing is closed after the keep-alive timeout (uvicorn arms that timer only after
      a response);
    - at most MAX_CONNECTIONS at once and MAX_CONNECTIONS_PER_CLIENT from one peer address: past either cap the
      connection of that pool that has waited longest for a request is closed to make room (so a flood of slow
      or idle connections cannot lock out a new one), and the new one is refused only when none is waiting.
    Idle connections must not run the harness out of file descriptors, nor the agent's own /budget out of room."""

    head_timer: asyncio.TimerHandle | None = None
    waiting_since: float = 0.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.waiting_since = self.loop.time()
        if not self._make_room():
            transport.close()
            return
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.head_timer is not None:  # a whole request head came
            self.head_timer.cancel()
            self.head_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.waiting_since = self.loop.time()
            self._arm_head_timer()  # the next request's head gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        super().connection_lost(exc)

    def waiting(self) -> bool:
        """No request in progress: idle, or still receiving a request's head."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def _arm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
        self.head_timer = self.loop.call_later(HEAD_SECONDS, self._head_timeout)

    def _head_timeout(self) -> None:
        self.head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        body = json.dumps({"detail": f"request head not received within {HEAD_SECONDS:.0f} s"}).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
        self.transport.close()

    def _make_room(self) -> bool:
        """Admit this connection under both caps, closing the longest-waiting connection of a full pool."""
        others = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        host = self.client[0] if self.client else None
        same = [c for c in others if host is not None and c.client and c.client[0] == host]
        for pool, cap in ((same, MAX_CONNECTIONS_PER_CLIENT), (others, MAX_CONNECTIONS)):
            if len(pool) < cap:
                continue
            idle = [c for c in pool if isinstance(c, BoundedH11Protocol) and c.waiting()]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c.waiting_since)
            oldest.transport.close()
            others.remove(oldest)
            if oldest in same:
                same.remove(oldest)
        return True


def return_large_buffers_to_the_os(threshold: int = 1 << 20) -> None:
    """glibc's malloc serves a large buffer (a 16 MiB header read) from a thread's arena once a buffer that size
    was freed (its mmap threshold adapts upwards), and the arena keeps the memory: forty request threads reading
    hostile headers left ~180 MB resident after the requests. A fixed threshold sends every buffer past it to
    mmap, returned on free. Process-wide, and harmless elsewhere (numpy and torch buffers are mmap'd already)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD: fixed, no longer adaptive
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


class GradingServer:
    """Runs the app with uvicorn on a daemon thread, on 127.0.0.1 and a free port."""

    def __init__(self, service: GradingService, token: str | None = None, request_log: Path | None = None):
        return_large_buffers_to_the_os()
        self.token = token or secrets.token_urlsafe(32)
        self.port = _free_port()
        app = create_app(service, self.token, request_log)
        # BoundedH11Protocol keeps connections within MAX_CONNECTIONS (an agent opening thousands cannot run the
        # harness process out of file descriptors: its ledger needs them); limit_concurrency, a little above (a
        # connection closed to make room leaves the set a moment later), caps requests in progress: 503 past it.
        # ws="none": no WebSocket upgrades (the API has no WebSocket route, and an upgraded connection would leave
        # BoundedH11Protocol's bounds); an upgrade request is answered as plain HTTP.
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                limit_concurrency=MAX_CONNECTIONS + 32, http=BoundedH11Protocol, ws="none")  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="grading-server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GradingServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("grading server did not start within 30 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
