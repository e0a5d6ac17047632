"""The agent's processes stopped while its budget clock is paused for grading: no unbudgeted agent work.

The clock pauses from a submission's arrival until its grade is recorded (grading time is not charged to the
agent). Without this, a checkpoint slow to evaluate, submitted without waiting, gave the agent up to the
evaluation's time limit of free work per submission. `AgentFreezer` is a clock listener (`BudgetClock.listen`)
that stops every process of the agent when pauses go from none to one and lets them run when they go back to
none; `run_agent` attaches it for the session and thaws on every way out. The stop must be atomic: a process
that forks and exits in a loop (pid hopping) is never in a listing of the agent's processes, and once free it
can `kill(-1, SIGCONT)` the rest. So, best first (`mechanism`, stated in the report):

- "cgroup": the cgroup v2 freezer. The leader's children join a cgroup of their own (`procs.freezer_cgroup`,
  where the machine delegates a writable one) before they execute anything; writing `cgroup.freeze` stops
  every process in it, forks included, in the kernel; `cgroup.events` says when all are frozen. Invisible to
  the agent (no signal, no job-control report).
- "uid": the agent runs under its own uid (a root harness with bubblewrap): `kill(-1, SIGSTOP)` sent by a
  helper running as that uid reaches every process of the agent in one call that a fork cannot race (the kernel
  signals the whole list under the lock `fork` takes to join it); nothing else runs under that uid.
- "tree" (weaker: the unsandboxed fallback, or a non-root harness without a delegated cgroup): SIGSTOP to the
  listed processes below the leader, parents first, a few passes. A pid-hopping agent can escape it.

A stop is confirmed by reading the kernel's state (the cgroup's `frozen`, or every process stopped, dead, or in
uninterruptible sleep, which it leaves only through the stop); `on_pause` waits for that at most `confirm_s`
and never under the clock's lock, and says whether it was confirmed: the clock charges the agent through a
pause whose freeze was not (a freeze that cannot be confirmed never stalls the harness, nor buys free time).

The leader itself (the sandbox's shim, or the host-side supervisor) is harness code and keeps running: it
forwards the harness's signals and, should the harness die, kills the stopped tree (SIGKILL ends a stopped or
frozen process). The grader never waits on the agent: a `/submit` with `wait: true` answers into the socket of
a stopped agent, which reads it once thawed. With signals, parents are stopped before their children and
continued after them, so that no shell with job control sees its command stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Literal

from a2rl_bench.isolation import procs

RULE = ("frozen while grading: the clock pauses while a submission waits for or is in grading, and the agent's "
        "processes are stopped for exactly that time")  # fmt: skip
"""The budget rule, as the report states it."""
Mechanism = Literal["cgroup", "uid", "tree"]
MECHANISMS: dict[str, str] = {
    "cgroup": "cgroup v2 freezer (atomic)",
    "uid": "SIGSTOP to every process of the agent's own uid at once (kill -1; atomic)",
    "tree": "SIGSTOP to the listed processes below the session's leader (weaker: a process that forks in a loop "
            "can escape it)",
}  # fmt: skip
"""How the agent was stopped, as the report states it."""
PASSES = 5
PARENTS_FIRST_S = 0.2
"""How long a uid freeze waits for the agent's shells to stop before it stops everything at once."""
"""Listings per "tree" freeze: a stopped process cannot fork, so each pass can only find children forked meanwhile."""
CONFIRM_S = 1.0
"""The longest a freeze waits to see the agent stopped; past it the pause is charged to the agent."""
RESEND_S = 0.1
"""A uid freeze sends `kill(-1, SIGSTOP)` again after this long while a process of the agent still runs. Two
`kill(-1)` calls walk the process list at once: an agent process inside its own `kill(-1, SIGCONT)` at that moment
(a pid hopper sends one each generation) takes back the stop of processes the harness's walk had already reached.
The sender itself stops as it leaves that call, so the next walk finds no one to undo it (seen once in a full
suite: the hopper's worker counted through a whole freeze)."""
_KILL_ALL = "import os, sys\ntry:\n    os.kill(-1, int(sys.argv[1]))\nexcept OSError:\n    pass"
"""The helper's program where there is no kill(1)."""
STOPPED_STATES = frozenset("TtZXD")
"""/proc states in which a process does no user work: stopped, traced, dead, or in uninterruptible sleep (with a
stop pending it can only leave that sleep into the stop; a vfork parent waits there for its stopped child)."""


class AgentFreezer:
    """Stops and continues the agent below `leader_pid` (a clock listener: `on_pause` / `on_resume`): through
    `cgroup` where given, else by `uid` where given, else by listing the processes below the leader."""

    def __init__(self, leader_pid: int, cgroup: str | Path | None = None, uid: int | None = None,
                 confirm_s: float | None = None):  # fmt: skip
        self.leader_pid = leader_pid
        self.cgroup = Path(cgroup) if cgroup is not None else None
        self.uid = uid
        self.mechanism: Mechanism = "cgroup" if cgroup is not None else "uid" if uid is not None else "tree"
        self.confirm_s = CONFIRM_S if confirm_s is None else confirm_s
        self._lock = threading.Lock()
        self._stopped: dict[int, int] = {}  # "tree": pid -> start ticks (a pid reused meanwhile is not continued)
        self._since: float | None = None
        self._confirmed = False
        self.freezes = 0
        self.unconfirmed = 0
        self.frozen_s = 0.0
        self.longest_stop_s = 0.0
        """The longest a freeze took the harness (signals, waits and checks)."""

    def on_pause(self) -> bool:
        """Stop the agent; True once it is seen stopped (within `confirm_s`), False if it could not be."""
        with self._lock:
            if self._since is not None:
                return self._confirmed
            self._since = began = time.monotonic()
            self.freezes += 1
            deadline = began + self.confirm_s
            if self.mechanism == "cgroup":
                self._confirmed = self._freeze_cgroup(deadline)
            elif self.mechanism == "uid":
                self._stop_parents_first(began + PARENTS_FIRST_S)
                self._as_agent(signal.SIGSTOP)
                self._stop_others()
                self._confirmed = self._uid_stopped(deadline)
            else:
                self._stop_tree(deadline)
                self._confirmed = _until(deadline, lambda: self._all_stopped(list(self._stopped)))
            self.longest_stop_s = max(self.longest_stop_s, time.monotonic() - began)
            self.unconfirmed += not self._confirmed
            return self._confirmed

    def on_resume(self) -> None:
        with self._lock:
            if self._since is None:
                return
            self.frozen_s += time.monotonic() - self._since
            self._since = None
            if self.mechanism == "cgroup":
                _write(self.cgroup / "cgroup.freeze", "0")
                return
            listed = self._uid_pids() if self.mechanism == "uid" else []
            for pid, ticks in reversed(self._stopped.items()):  # children before their parents
                if procs.alive(pid, ticks):
                    _signal(pid, signal.SIGCONT)
            self._stopped.clear()
            tree = procs.descendants(self.leader_pid)  # parents before their children
            rest = set(listed) - set(tree)
            # children before their parents (by the tree: a shell and its command often share a start tick), which
            # also continues anything stopped that the record missed; then what left the tree, the youngest first
            for pid in [*reversed(tree), *sorted(rest, key=_start_ticks, reverse=True)]:
                _signal(pid, signal.SIGCONT)
            if self.mechanism == "uid":
                self._as_agent(signal.SIGCONT)

    def describe(self) -> dict:
        return {"clock_rule": RULE, "mechanism": self.mechanism, "freeze": MECHANISMS[self.mechanism],
                "freezes": self.freezes, "unconfirmed": self.unconfirmed, "frozen_s": round(self.frozen_s, 3),
                "longest_stop_s": round(self.longest_stop_s, 3)}  # fmt: skip

    # -- mechanisms --------------------------------------------------------------------------------------------
    def _freeze_cgroup(self, deadline: float) -> bool:
        if not _write(self.cgroup / "cgroup.freeze", "1"):
            return False
        return _until(deadline, lambda: _cgroup_frozen(self.cgroup))

    def _as_agent(self, sig: signal.Signals) -> None:
        """`kill(-1, sig)` as the agent's uid: every process of that uid, in one system call. kill(1) where there
        is one (`kill -STOP -1` means that to procps, util-linux and busybox alike), else a Python helper."""
        kill = shutil.which("kill")
        cmd = ([kill, f"-{sig.name.removeprefix('SIG')}", "-1"] if kill
               else [sys.executable, "-I", "-S", "-c", _KILL_ALL, str(int(sig))])  # fmt: skip
        try:
            subprocess.run(cmd, user=self.uid, group=self.uid, extra_groups=[], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=10, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass  # not root (no uid of its own to become): the confirmation then fails and the agent is charged

    def _uid_stopped(self, deadline: float) -> bool:
        """Whether every process of the agent's uid is seen stopped by `deadline`, the stop sent again every
        `RESEND_S` until then (a concurrent `kill(-1, SIGCONT)` of the agent's may have taken the first one back)."""

        def stopped() -> bool:
            return all(s in STOPPED_STATES for s in self._uid_states())

        while True:
            if _until(min(deadline, time.monotonic() + RESEND_S), stopped):
                return True
            if time.monotonic() >= deadline:
                return False
            self._as_agent(signal.SIGSTOP)

    def _uid_pids(self) -> list[int]:
        return [p.pid for p in procs.all_procs(with_uid=True) if p.uid == self.uid]

    def _uid_states(self) -> list[str]:
        """The /proc state of every process of the agent's uid, in one pass over /proc."""
        states = []
        with os.scandir("/proc") as it:
            for entry in it:
                if not entry.name.isdigit():
                    continue
                try:
                    if entry.stat(follow_symlinks=False).st_uid != self.uid:
                        continue
                    states.append(_state(int(entry.name)))
                except OSError:
                    continue
        return states

    def _stop_parents_first(self, deadline: float) -> None:
        """The agent's processes that have children (shells waiting on a command), stopped before `kill -1`
        stops everything: a shell still running when its command stopped reads the stop and reports the command
        "Stopped" (exit 147) after the freeze. One short shared wait, never one per process: a parent that does
        not stop in time (a vfork parent in D state) is stopped by the `kill -1` that follows all the same."""
        listing = procs.all_procs()
        parents = {p.ppid for p in listing}
        sent = [pid for pid in procs.descendants(self.leader_pid, listing)
                if pid in parents and _signal(pid, signal.SIGSTOP)]  # fmt: skip
        _until(deadline, lambda: self._all_stopped(sent))

    def _stop_others(self) -> None:
        """What runs below the leader outside the agent's uid (bubblewrap, an LLM agent's runner): harness code,
        which does not fork to escape, stopped in one pass, parents first."""
        listing = procs.all_procs(with_uid=True)
        by_pid = {p.pid: p for p in listing}
        for pid in procs.descendants(self.leader_pid, listing):
            if by_pid[pid].uid != self.uid and _signal(pid, signal.SIGSTOP):
                self._stopped[pid] = by_pid[pid].start_ticks

    def _stop_tree(self, deadline: float) -> None:
        """SIGSTOP the listed processes below the leader, parents first, each seen stopped before its children
        are signalled, until `deadline` (one deadline for all: a process that does not stop, a vfork
        parent in uninterruptible sleep, costs its wait once, not once each)."""
        for n in range(PASSES):
            if n and time.monotonic() >= deadline:
                break
            fresh = [p for p in procs.descendants(self.leader_pid) if p not in self._stopped]
            if not fresh:
                break
            for pid in fresh:  # parents before their children (`descendants` lists them so)
                if (st := procs.proc_stat(pid)) is not None and _signal(pid, signal.SIGSTOP):
                    self._stopped[pid] = st.start_ticks
                    _until(deadline, lambda pid=pid: _state(pid) in STOPPED_STATES, first_s=0.0005)

    def _all_stopped(self, pids: list[int]) -> bool:
        return all(_state(p) in STOPPED_STATES for p in pids)


def _until(deadline: float, done, first_s: float = 0.001) -> bool:
    """Polls `done()` until it is true (True) or `deadline` passes (False); the wait doubles up to 20 ms."""
    wait = first_s
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
        wait = min(wait * 2, 0.02)


def _cgroup_frozen(cgroup: Path) -> bool:
    try:
        return "frozen 1" in (cgroup / "cgroup.events").read_text().splitlines()
    except OSError:
        return False


def _state(pid: int) -> str:
    """The process's /proc state letter ("X" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _start_ticks(pid: int) -> int:
    st = procs.proc_stat(pid)
    return st.start_ticks if st is not None else 0


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
        return True
    except OSError:
        return False


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:  # gone, or not ours to signal
        return False
