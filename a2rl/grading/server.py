"""The agent-facing HTTP API of the grading service: FastAPI on 127.0.0.1, a bearer token per run."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
import time
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from a2rl.grading.errors import SubmissionRejected
from a2rl.grading.service import GradingService

MAX_BODY_BYTES = 64 * 1024
BODY_SECONDS = 30.0
MAX_CONNECTIONS = 256
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Everything else needs the bearer token, checked before a byte of the body is read."""


def _error(description: str) -> dict:
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


class Error(BaseModel):
    detail: str = Field(description="One harness-written line saying what was wrong.")


COMMON_RESPONSES: dict[int | str, dict] = {
    400: _error("Malformed request (bad Content-Length) or a refused checkpoint"),
    401: _error("Missing or wrong bearer token (checked before the body is read)"),
    408: _error(f"Request body not received within {BODY_SECONDS:.0f} s"),
    413: _error(f"Request body over {MAX_BODY_BYTES} bytes, declared or streamed (chunked)"),
    503: _error(f"Over {MAX_CONNECTIONS} connections at once (uvicorn's limit_concurrency); retry"),
}
SUBMISSION_RESPONSES: dict[int | str, dict] = {
    403: _error("The session is over, or the checkpoint breaks the run's mode (strict mode)"),
    404: _error("model_path does not exist"),
    408: _error("Checking or copying the checkpoint ran past its time limit, or the body came too slowly"),
    409: _error("A checkpoint file changed while it was being copied"),
    413: _error("Request body too large, or checkpoint over the size cap"),
    429: _error("Submission cap reached"),
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


class RequestGuard:
    """Outermost ASGI layer: the bearer token is checked before the body is read (public paths excepted),
    at most MAX_BODY_BYTES of the body are ever read, declared or chunked (the rest stays unread and the
    connection is closed), and every request is logged to the harness's request log."""

    def __init__(self, app, token: str, request_log: Path | None):
        self.app, self.token, self.request_log = app, token.encode(), request_log

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
        if self.request_log is None:
            return
        line = {"at": time.time(), "method": scope.get("method"), "route": scope.get("path"), "status": status,
                "latency_s": round(seconds, 4)}  # fmt: skip
        with self.request_log.open("a") as f:
            f.write(json.dumps(line) + "\n")


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
        return service.submit(body.model_path, wait=body.wait, stage=body.stage)

    @app.post("/validate", dependencies=[Depends(authorized)], responses=SUBMISSION_RESPONSES)
    def validate(body: PathRequest) -> dict:
        """Pre-check a checkpoint (path, config, weights, LoRA, architecture, vocabulary); spends nothing."""
        return service.validate(body.model_path)

    @app.post("/final", dependencies=[Depends(authorized)],
              responses={404: _error("No such submission"), 409: _error("That submission failed grading")})
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
    """uvicorn's h11 protocol (pinned uvicorn), with two bounds it lacks: a connection past MAX_CONNECTIONS is
    closed at once, and a connection that sends nothing is closed after the keep-alive timeout (uvicorn arms
    that timer only after a response). Idle connections must not run the harness out of file descriptors."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)


class GradingServer:
    """Runs the app with uvicorn on a daemon thread, on 127.0.0.1 and a free port."""

    def __init__(self, service: GradingService, token: str | None = None, request_log: Path | None = None):
        self.token = token or secrets.token_urlsafe(32)
        self.port = _free_port()
        app = create_app(service, self.token, request_log)
        # limit_concurrency: connections past it get a 503 and are closed, so an agent opening thousands of
        # connections cannot run the harness process out of file descriptors (its ledger needs them).
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                limit_concurrency=MAX_CONNECTIONS, http=BoundedH11Protocol)  # fmt: skip
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
