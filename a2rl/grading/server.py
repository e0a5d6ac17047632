"""The agent-facing HTTP API of the grading service: FastAPI on 127.0.0.1, a bearer token per run."""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from a2rl.grading.checkpoint import SubmissionRejected
from a2rl.grading.service import GradingService

MAX_BODY_BYTES = 64 * 1024


class PathRequest(BaseModel):
    model_path: str = Field(description="Checkpoint directory, relative to the workspace (e.g. output/v1).")


class FinalRequest(BaseModel):
    submission_id: int = Field(description="The submission to evaluate on the hidden test set after the session.")


class SubmitRequest(BaseModel):
    model_path: str = Field(description="Checkpoint directory, relative to the workspace (e.g. output/v1).")
    wait: bool = Field(default=False, description="Block until graded and return the score (original's sync mode).")


def create_app(service: GradingService, token: str, request_log: Path | None = None) -> FastAPI:
    app = FastAPI(title="a2rl grading service", version="1")
    bearer = HTTPBearer(auto_error=False)

    def authorized(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if creds is None or not secrets.compare_digest(creds.credentials, token):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.middleware("http")
    async def log_and_limit(request: Request, call_next):
        start = time.perf_counter()
        if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
            response = JSONResponse({"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)
        else:
            response = await call_next(request)
        if request_log is not None:
            line = {
                "at": time.time(),
                "method": request.method,
                "route": request.url.path,
                "status": response.status_code,
                "latency_s": round(time.perf_counter() - start, 4),
            }
            with request_log.open("a") as f:
                f.write(json.dumps(line) + "\n")
        return response

    @app.exception_handler(SubmissionRejected)
    async def rejected(request: Request, exc: SubmissionRejected):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "task": service.ctx.config.task, "protocol": service.ctx.config.protocol}

    @app.get("/budget", dependencies=[Depends(authorized)])
    def budget() -> dict:
        return service.budget()

    # Sync endpoints run in FastAPI's thread pool, so a waiting /submit does not block others.
    @app.post("/submit", dependencies=[Depends(authorized)])
    def submit(body: SubmitRequest) -> dict:
        return service.submit(body.model_path, wait=body.wait)

    @app.post("/validate", dependencies=[Depends(authorized)])
    def validate(body: PathRequest) -> dict:
        """Pre-check a checkpoint (path, config, tokenizer, weights, LoRA, architecture); spends nothing."""
        return service.validate(body.model_path)

    @app.post("/final", dependencies=[Depends(authorized)])
    def final(body: FinalRequest) -> dict:
        """Declare the final pick (heldout protocol); default is the best submission on validation."""
        return service.declare_final(body.submission_id)

    @app.get("/submissions", dependencies=[Depends(authorized)])
    def submissions() -> list[dict]:
        return [service.response(e.submission_id) for e in service.submissions()]

    @app.get("/submissions/{submission_id}", dependencies=[Depends(authorized)])
    def submission(submission_id: int) -> dict:
        return service.response(submission_id)

    @app.get("/best", dependencies=[Depends(authorized)])
    def best() -> dict:
        b = service.best()
        return service.response(b.submission_id) if b else {"best": None}

    return app


class GradingServer:
    """Runs the app with uvicorn on a daemon thread, on 127.0.0.1 and a free port."""

    def __init__(self, service: GradingService, token: str | None = None, request_log: Path | None = None):
        self.token = token or secrets.token_urlsafe(32)
        self.port = _free_port()
        app = create_app(service, self.token, request_log)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
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
