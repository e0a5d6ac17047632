"""Shared by the tests that run commands in the real sandbox: skip them where bubblewrap cannot run, and look
for processes that must be gone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from a2rl_bench.isolation.sandbox import SandboxPolicy, SandboxUnavailable, sandbox_mode


def bwrap_problem() -> str | None:
    try:
        sandbox_mode(SandboxPolicy(Path("/nonexistent")))
    except SandboxUnavailable as e:
        return str(e)
    return None


needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}")


def processes_with(text: str) -> list[int]:
    """Pids of live processes with `text` in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def appears(text: str, within_s: float = 10.0) -> list[int]:
    """`processes_with(text)` once it finds any, or [] after `within_s`: a background job whose shell has
    forked but not yet exec'ed it (a loaded machine) shows its shell's command line for a while."""
    deadline = time.monotonic() + within_s
    while not (found := processes_with(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def gone(text: str, within_s: float = 5.0) -> bool:
    """True once no process has `text` in its command line (the kernel ends a PID namespace asynchronously)."""
    deadline = time.monotonic() + within_s
    while processes_with(text) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not processes_with(text)
