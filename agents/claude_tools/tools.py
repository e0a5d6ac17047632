"""The tools of `claude-tools`, executed for the harness-side loop inside the agent's workspace.

Commands run with the workspace as working directory and the agent's scrubbed environment (the runner's
environment after it removed its own harness-side variables), each in its own process group inside the
agent's session, so a timeout kills the command with everything it started and the harness's budget stop
reaches every one of them. File tools are confined to the workspace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

TOOL_SPECS: list[dict[str, Any]] = [
    {
        "name": "bash",
        "description": (
            "Run a bash command in the workspace (a fresh shell each call: cd and variables do not persist). "
            "Returns the exit code and the combined stdout/stderr, cut in the middle when long. The command is "
            "killed with everything it started after `timeout_s` seconds; run long jobs in the background "
            "with nohup and poll their logs."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command line."},
                "timeout_s": {"type": "number", "description": "Seconds before the command is killed."},
            },
            "required": ["command"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a text file of the workspace, with line numbers. Use offset/limit for long files.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace."},
                "offset": {"type": "integer", "description": "First line to show (1-based)."},
                "limit": {"type": "integer", "description": "Number of lines to show."},
            },
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a text file of the workspace (parent directories are created).",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "edit_file",
        "description": (
            "Replace `old_str` by `new_str` in a file of the workspace. `old_str` must occur exactly once "
            "unless `replace_all` is true."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
                "replace_all": {"type": "boolean"},
            },
            "required": ["path", "old_str", "new_str"],
        },
    },
    {
        "name": "submit",
        "description": (
            "Submit a merged checkpoint directory (e.g. output/v1) to the grading server and wait for its "
            "score. Each call uses one submission."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"model_path": {"type": "string", "description": "Checkpoint dir, e.g. output/v1."}},
            "required": ["model_path"],
        },
    },
    {
        "name": "check_budget",
        "description": "Time and submissions used and remaining.",
        "input_schema": {"type": "object", "properties": {}},
    },
]


class ToolResult(NamedTuple):
    text: str
    is_error: bool = False
    exit_code: int | None = None


class ToolError(Exception):
    """A tool call the model got wrong; the message goes back to it as an error result."""


def cut_middle(text: str, limit: int) -> str:
    """`text` with its middle replaced by a marker when longer than `limit` characters."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


class Toolbox:
    """Runs tool calls for one session; `close()` stops every process group the commands started."""

    def __init__(self, workspace: Path, env: dict[str, str], command_timeout_s: float = 900.0,
                 max_command_timeout_s: float = 3 * 3600.0, output_limit: int = 20_000):  # fmt: skip
        self.workspace = Path(workspace).resolve()
        self.env = dict(env)
        self.command_timeout_s = command_timeout_s
        self.max_command_timeout_s = max_command_timeout_s
        self.output_limit = output_limit
        self.groups: set[int] = set()
        """Process groups of commands that may still have members (background jobs)."""

    def run(self, name: str, args: dict[str, Any]) -> ToolResult:
        """Execute one call; mistakes (bad path, missing argument) come back as error results."""
        method = getattr(self, f"tool_{name}", None)
        if method is None:
            return ToolResult(f"unknown tool {name!r}", is_error=True)
        try:
            return method(**args)
        except TypeError as e:
            return ToolResult(f"bad arguments for {name}: {e}", is_error=True)
        except (ToolError, OSError, UnicodeError) as e:
            return ToolResult(f"{type(e).__name__}: {e}" if not isinstance(e, ToolError) else str(e), is_error=True)

    # -- commands ---------------------------------------------------------------------------------------
    def tool_bash(self, command: str, timeout_s: float | None = None) -> ToolResult:
        timeout = min(float(timeout_s or self.command_timeout_s), self.max_command_timeout_s)
        # Output goes to a file, not a pipe: a background job holding a pipe open would block the call.
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(
                ["bash", "-c", command], cwd=self.workspace, env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, process_group=0,
            )  # fmt: skip
            self.groups.add(proc.pid)
            timed_out = False
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            finally:
                if proc.poll() is None:  # interrupted (session stop): take the command down with us
                    _kill_group(proc.pid, signal.SIGKILL)
            text = _read_head_tail(out, self.output_limit)
        if timed_out:
            text += f"\n[killed after {timeout:.0f} s timeout, with every process it started]"
            self.groups.discard(proc.pid)
        return ToolResult(f"exit code {rc}\n{text}", is_error=timed_out, exit_code=rc)

    # -- files ------------------------------------------------------------------------------------------
    def resolve(self, path: str, for_writing: bool = False) -> Path:
        """A path of the workspace (relative or absolute); links leading outside it are refused."""
        p = Path(path)
        resolved = (p if p.is_absolute() else self.workspace / p).resolve()
        if resolved != self.workspace and self.workspace not in resolved.parents:
            raise ToolError(f"{path}: outside the workspace {self.workspace}; file tools only work inside it")
        if for_writing and (self.workspace / "models") in [resolved, *resolved.parents]:
            raise ToolError(f"{path}: models/ holds the read-only base model; write to output/ or code/")
        return resolved

    def tool_read_file(self, path: str, offset: int = 1, limit: int | None = None) -> ToolResult:
        target = self.resolve(path)
        if not target.is_file():
            raise ToolError(f"{path}: no such file")
        lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
        start = max(1, int(offset or 1))
        end = len(lines) if limit is None else min(len(lines), start - 1 + int(limit))
        body = "\n".join(f"{i:>6}\t{lines[i - 1][:2000]}" for i in range(start, end + 1))
        note = f"\n[lines {start}-{end} of {len(lines)}]" if (start > 1 or end < len(lines)) else ""
        return ToolResult(cut_middle(body, self.output_limit) + note)

    def tool_write_file(self, path: str, content: str) -> ToolResult:
        target = self.resolve(path, for_writing=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return ToolResult(f"wrote {len(content)} characters to {target.relative_to(self.workspace)}")

    def tool_edit_file(self, path: str, old_str: str, new_str: str, replace_all: bool = False) -> ToolResult:
        target = self.resolve(path, for_writing=True)
        if not target.is_file():
            raise ToolError(f"{path}: no such file")
        text = target.read_text(encoding="utf-8")
        count = text.count(old_str) if old_str else 0
        if count == 0:
            raise ToolError(f"{path}: old_str not found; read the file and copy the text exactly")
        if count > 1 and not replace_all:
            raise ToolError(f"{path}: old_str occurs {count} times; add context to make it unique or set replace_all")
        target.write_text(text.replace(old_str, new_str), encoding="utf-8")
        where = target.relative_to(self.workspace)
        return ToolResult(f"replaced {count if replace_all else 1} occurrence(s) in {where}")

    # -- grading API ------------------------------------------------------------------------------------
    def tool_submit(self, model_path: str) -> ToolResult:
        status, body = self._grading("POST", "/submit", {"model_path": model_path, "wait": True}, timeout=6 * 3600)
        return ToolResult(f"HTTP {status}\n{json.dumps(body, indent=1)}", is_error=status != 200)

    def tool_check_budget(self) -> ToolResult:
        status, body = self._grading("GET", "/budget")
        return ToolResult(f"HTTP {status}\n{json.dumps(body, indent=1)}", is_error=status != 200)

    def budget(self) -> dict | None:
        """`GET /budget`, or None when the server does not answer."""
        try:
            status, body = self._grading("GET", "/budget", timeout=10)
        except ToolError:
            return None
        return body if status == 200 else None

    def _grading(self, method: str, route: str, body: dict | None = None, timeout: float = 60) -> tuple[int, Any]:
        url = self.env.get("GRADING_SERVER_URL", "").rstrip("/") + route
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.env.get('GRADING_TOKEN', '')}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read() or b"{}"
            try:
                return e.code, json.loads(raw)
            except json.JSONDecodeError:
                return e.code, {"detail": raw.decode(errors="replace")[:2000]}
        except (urllib.error.URLError, OSError) as e:
            raise ToolError(f"grading server {url} unreachable: {e}") from e

    # -- lifetime ---------------------------------------------------------------------------------------
    def close(self, grace_s: float = 2.0) -> None:
        """SIGTERM every command's process group, SIGKILL what is left after `grace_s`."""
        live = [g for g in self.groups if _kill_group(g, signal.SIGTERM)]
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            live = [g for g in live if _group_alive(g)]
            time.sleep(0.05)
        for g in live:
            _kill_group(g, signal.SIGKILL)
        self.groups.clear()


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _read_head_tail(f, limit: int) -> str:
    """The output file's text, only its head and tail when it is longer than `limit` bytes."""
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    if size <= limit:
        return f.read().decode("utf-8", errors="replace")
    half = limit // 2
    head = f.read(half).decode("utf-8", errors="replace")
    f.seek(size - half)
    tail = f.read().decode("utf-8", errors="replace")
    return f"{head}\n... [{size - limit} bytes cut] ...\n{tail}"
