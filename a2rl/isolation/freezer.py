"""The agent's processes stopped while its budget clock is paused for grading: no unbudgeted agent work.

The clock pauses from a submission's arrival until its grade is recorded (grading time is not charged to the
agent). Without this, a checkpoint slow to evaluate, submitted without waiting, gave the agent up to the
evaluation's time limit of free work per submission. `AgentFreezer` SIGSTOPs every process below the session's
leader when the clock's pauses go from none to one (parents first, each stopped before its children) and SIGCONTs
them when they go back to none (children first), so that no shell sees its command stop; `run_agent`
attaches it to the clock for the session and thaws on every way out.

The leader itself (the sandbox's shim, or the host-side supervisor) is harness code and keeps running: it
forwards the harness's signals and, should the harness die, kills the stopped tree (SIGKILL ends a stopped
process). The grader never waits on the agent: a `/submit` with `wait: true` answers into the socket of a
stopped agent, which reads it once thawed. Standard signals only (no cgroup freezer needed): a process forked
between the listing and the stop is caught by the next pass.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from a2rl.isolation import procs

RULE = ("frozen while grading: the clock pauses while a submission waits for or is in grading, and the agent's "
        "processes are stopped (SIGSTOP) for exactly that time")  # fmt: skip
"""The budget rule, as the report states it."""
PASSES = 5
"""Listings per freeze: a stopped process cannot fork, so each pass can only find children forked meanwhile."""


class AgentFreezer:
    """Stops and continues the processes below `leader_pid` (a clock listener: `on_pause` / `on_resume`)."""

    def __init__(self, leader_pid: int):
        self.leader_pid = leader_pid
        self._lock = threading.Lock()
        self._stopped: dict[int, int] = {}  # pid -> start ticks (a pid reused meanwhile is not continued)
        self._since: float | None = None
        self.freezes = 0
        self.frozen_s = 0.0

    def on_pause(self) -> None:
        with self._lock:
            if self._since is not None:
                return
            self._since = time.monotonic()
            self.freezes += 1
            for _ in range(PASSES):
                fresh = [p for p in procs.descendants(self.leader_pid) if p not in self._stopped]
                if not fresh:
                    break
                for pid in fresh:  # parents before their children (`descendants` lists them so)
                    if (st := procs.proc_stat(pid)) is not None and _signal(pid, signal.SIGSTOP):
                        self._stopped[pid] = st.start_ticks
                        _wait_stopped(pid)

    def on_resume(self) -> None:
        with self._lock:
            if self._since is None:
                return
            self.frozen_s += time.monotonic() - self._since
            self._since = None
            for pid, ticks in reversed(self._stopped.items()):  # children before their parents
                if procs.alive(pid, ticks):
                    _signal(pid, signal.SIGCONT)
            self._stopped.clear()
            for pid in procs.descendants(self.leader_pid):  # anything stopped that the record missed
                _signal(pid, signal.SIGCONT)

    def describe(self) -> dict:
        return {"clock_rule": RULE, "freezes": self.freezes, "frozen_s": round(self.frozen_s, 3)}


def _wait_stopped(pid: int, timeout_s: float = 0.05) -> None:
    """Until `pid` is stopped (or gone, or the time is up). A parent must be stopped before its child is: an
    interactive shell with job control that saw its running command stop would report it "Stopped" (exit 147)
    and move on, so an agent's terminal tool would fail on every command that spans a grading. Continuing in the
    reverse order (children first) means a parent, once it runs again, finds its children running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.0005)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:  # gone, or not ours to signal
        return False
