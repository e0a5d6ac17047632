"""The tools of `claude-tools`, executed for the harness-side loop inside the agent's workspace.

Commands run with the workspace as working directory and the agent's scrubbed environment (the runner's
environment after it removed its own harness-side variables). With the run's sandbox policy, each command runs
in a fresh sandbox (a2rl_bench.isolation.sandbox: bubblewrap, loopback + grader only, no harness files), which lives on
while jobs it left in the background run; without one, on the host. Either way each command has its own process
group inside the agent's session, so a timeout kills the command with everything it started and the harness's
budget stop reaches every one of them. File tools run in the runner itself and are confined to the workspace:
a path is checked after resolving its links, and opened without following a link swapped in since.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

from a2rl_bench.isolation import procs
from a2rl_bench.isolation.sandbox import SandboxPolicy, SandboxUnavailable, agent_uid, sandbox_mode, wrap

UNSANDBOXED_NOTE = "[note: no sandbox policy: commands run on the host with the harness's rights]"

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
                 max_command_timeout_s: float = 3 * 3600.0, output_limit: int = 20_000,
                 sandbox: SandboxPolicy | None = None):  # fmt: skip
        self.workspace = Path(workspace).resolve()
        self.env = dict(env)
        self.command_timeout_s = command_timeout_s
        self.max_command_timeout_s = max_command_timeout_s
        self.output_limit = output_limit
        self.sandbox = sandbox
        self.note = UNSANDBOXED_NOTE if sandbox is None else ""
        """Said once, with the first command's result."""
        self.read_only = ("models", *(sandbox.read_only if sandbox else ()))
        # A root harness gives the sandboxed agent its own uid: files the file tools create must be its own.
        self.owner = agent_uid(sandbox) if sandbox and sandbox_mode(sandbox) == "bwrap-root" else None
        self.groups: dict[int, subprocess.Popen] = {}
        """Commands (or their sandboxes) whose process group may still have members (background jobs)."""

    def run(self, name: str, args: dict[str, Any]) -> ToolResult:
        """Execute one call; mistakes (bad path, missing argument) come back as error results."""
        method = getattr(self, f"tool_{name}", None)
        if method is None:
            return ToolResult(f"unknown tool {name!r}", is_error=True)
        try:
            return method(**args)
        except TypeError as e:
            return ToolResult(f"bad arguments for {name}: {e}", is_error=True)
        except (ToolError, OSError, UnicodeError, SandboxUnavailable) as e:
            return ToolResult(f"{type(e).__name__}: {e}" if not isinstance(e, ToolError) else str(e), is_error=True)

    # -- commands ---------------------------------------------------------------------------------------
    def tool_bash(self, command: str, timeout_s: float | None = None) -> ToolResult:
        timeout = min(float(timeout_s or self.command_timeout_s), self.max_command_timeout_s)
        self.groups = {pid: p for pid, p in self.groups.items() if procs.group_running(p)}  # reaps sandboxes that ended
        # Output goes to a file, not a pipe: a background job holding a pipe open would block the call.
        with tempfile.TemporaryFile() as out:
            proc, report = self._start(command, out)
            self.groups[proc.pid] = proc
            try:
                rc = _wait(proc, report, timeout)
            except BaseException:  # interrupted (session stop): take the command down with us
                procs.kill_tree(proc.pid)
                raise
            finally:
                if report is not None:
                    os.close(report)
            timed_out = rc is None
            if timed_out:  # the command (sandboxed: its whole sandbox) with everything it started
                procs.kill_tree(proc.pid)
                rc = proc.wait()
                del self.groups[proc.pid]
            text = _read_head_tail(out, self.output_limit)
        if timed_out:
            text += f"\n[killed after {timeout:.0f} s timeout, with every process it started]"
        text, self.note = (f"{text}\n{self.note}" if self.note else text), ""
        return ToolResult(f"exit code {rc}\n{text}", is_error=timed_out, exit_code=rc)

    def _start(self, command: str, out) -> tuple[subprocess.Popen, int | None]:
        """`bash -c command` in its own process group; with a policy, in a fresh sandbox whose launcher writes the
        exit code to the returned pipe (the sandbox itself lives on while background jobs run)."""
        cmd, env = ["bash", "-c", command], self.env
        report, w = os.pipe() if self.sandbox is not None else (None, None)
        try:
            if self.sandbox is not None:
                cmd, env = wrap(cmd, env, self.sandbox, report_fd=w)
            # Dies with the runner (parent-death signal): a runner killed with the harness leaves no command.
            proc = procs.start(cmd, group="group", cwd=self.workspace, env=env, stdin=subprocess.DEVNULL, stdout=out,
                               stderr=subprocess.STDOUT, pass_fds=() if w is None else (w,))  # fmt: skip
        except BaseException:
            if report is not None:
                os.close(report)
            raise
        finally:
            if w is not None:  # only the sandbox holds the write end: EOF if it ends without a report
                os.close(w)
        return proc, report

    # -- files ------------------------------------------------------------------------------------------
    def resolve(self, path: str, for_writing: bool = False) -> Path:
        """A path of the workspace (relative or absolute); links leading outside it are refused."""
        p = Path(path)
        resolved = (p if p.is_absolute() else self.workspace / p).resolve()
        if resolved == self.workspace or self.workspace not in resolved.parents:
            raise ToolError(f"{path}: outside the workspace {self.workspace}; file tools only work inside it")
        for sub in self.read_only if for_writing else ():
            if (self.workspace / sub) in [resolved, *resolved.parents]:
                raise ToolError(f"{path}: {sub}/ is read-only (the base model, the task data); write to output/ "
                                "or code/")  # fmt: skip
        return resolved

    def open(self, path: str, write: bool = False) -> tuple[int, Path]:
        """A file descriptor for a workspace file and its path in the workspace. The path is checked by `resolve`,
        then walked one directory at a time without following links: a link that an agent's background job swaps
        in meanwhile is refused, not followed (this runs with the harness's rights). Writing creates missing
        directories and truncates the file."""
        rel = self.resolve(path, for_writing=write).relative_to(self.workspace)
        nofollow = os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang the runner
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in rel.parts[:-1]:
                if write:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                        self._own(part, fd)
                parent, fd = fd, os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fd)
                os.close(parent)
            if not write:
                file = os.open(rel.name, os.O_RDONLY | nofollow, dir_fd=fd)
            else:
                try:
                    file = os.open(rel.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o644, dir_fd=fd)
                    self._own(rel.name, fd)
                except FileExistsError:
                    file = os.open(rel.name, os.O_WRONLY | os.O_TRUNC | nofollow, dir_fd=fd)
        except FileNotFoundError as e:
            raise ToolError(f"{path}: no such file") from e
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(file).st_mode):
            os.close(file)
            raise ToolError(f"{path}: not a regular file")
        return file, rel

    def _own(self, name: str, dir_fd: int) -> None:
        """What the file tools create belongs to the sandboxed agent's uid (root harness), so that its commands
        can change it."""
        if self.owner is not None:
            os.chown(name, self.owner, self.owner, dir_fd=dir_fd, follow_symlinks=False)

    def read_text(self, path: str) -> str:
        with os.fdopen(self.open(path)[0], encoding="utf-8", errors="replace") as f:
            return f.read()

    def write_text(self, path: str, text: str) -> Path:
        fd, rel = self.open(path, write=True)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return rel

    def tool_read_file(self, path: str, offset: int = 1, limit: int | None = None) -> ToolResult:
        lines = self.read_text(path).splitlines()
        start = max(1, int(offset or 1))
        end = len(lines) if limit is None else min(len(lines), start - 1 + int(limit))
        body = "\n".join(f"{i:>6}\t{lines[i - 1][:2000]}" for i in range(start, end + 1))
        note = f"\n[lines {start}-{end} of {len(lines)}]" if (start > 1 or end < len(lines)) else ""
        return ToolResult(cut_middle(body, self.output_limit) + note)

    def tool_write_file(self, path: str, content: str) -> ToolResult:
        where = self.write_text(path, content)
        return ToolResult(f"wrote {len(content)} characters to {where}")

    def tool_edit_file(self, path: str, old_str: str, new_str: str, replace_all: bool = False) -> ToolResult:
        self.resolve(path, for_writing=True)
        text = self.read_text(path)
        count = text.count(old_str) if old_str else 0
        if count == 0:
            raise ToolError(f"{path}: old_str not found; read the file and copy the text exactly")
        if count > 1 and not replace_all:
            raise ToolError(f"{path}: old_str occurs {count} times; add context to make it unique or set replace_all")
        where = self.write_text(path, text.replace(old_str, new_str))
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
        """SIGTERM every command's process group (a sandbox's shim passes it on to the command inside), SIGKILL
        what is left after `grace_s`."""
        live = [p for p in self.groups.values() if procs.signal_group(p.pid, signal.SIGTERM)]
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            live = [p for p in live if procs.group_running(p)]
            time.sleep(0.05)
        for p in live:
            procs.kill_tree(p.pid)
            p.wait()
        self.groups.clear()


def _wait(proc: subprocess.Popen, report: int | None, timeout: float) -> int | None:
    """The command's exit code, or None once `timeout` has passed. Sandboxed, it comes from the launcher inside as
    soon as the command exits (the sandbox lives on for its background jobs); EOF means the sandbox never ran it."""
    if report is None:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
    if not select.select([report], [], [], timeout)[0]:
        return None
    data = os.read(report, 32).strip()
    if not data:
        return proc.wait()
    return int(data) if data.lstrip(b"-").isdigit() else -1  # the command itself wrote there: its own loss


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
