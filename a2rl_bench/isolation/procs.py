"""The one process supervisor: every process the harness starts on the host, and how it ends.

- `start` runs a command as the leader of its own session (or process group) with a parent-death signal, so
  that a harness that is SIGKILLed or OOM-killed takes it down with it (bubblewrap's `--die-with-parent` then
  takes the sandbox's whole PID namespace).
- `stop_group` / `stop_session` / `kill_tree` / `stop_tree` end what was started: SIGTERM with a grace period,
  then SIGKILL, and check that nothing is left.
- `Attempt` / `SessionRecord` / `end_earlier_attempts`: an attempt of a run is (run, flow run, attempt number,
  harness process); every process it starts (agent session, evaluation) is recorded in the run's harness
  directory with that identity (pid with its start time, so a reused pid is never mistaken for ours) and
  carries it in its environment (`ATTEMPT_ENV`); a retried run first ends every process an earlier attempt
  left, and checks they are gone, before it does anything, and never touches its own.
- `MemoryLimit`: a memory cap for what `start` runs (an evaluation): a cgroup v2 child with `memory.max` where
  the harness's cgroup delegates the memory controller and is writable, else `RLIMIT_AS` (address space, per
  process, inherited); `memory_limit_for` picks, and says which.
- `start(..., on_start=...)`: the caller learns each started process as a `Started` (pid + start time), e.g. to
  record it for a retry to end.

Standard library only at module level: the sandbox shim (run as `python -I -S`) loads this file by path.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SUPERVISOR_DEATH_SIGNAL = signal.SIGUSR1
"""What a supervisor gets when its parent (the harness) dies: catchable, unlike SIGKILL, so it can end first
every process below it, then itself."""
RECORD_FILE = "session-procs.jsonl"
"""In the run's harness directory: one line per agent session or evaluation started (`SessionRecord`)."""


class ProcessesSurvived(RuntimeError):
    """Processes of an earlier attempt could not be ended; the run must not start another agent beside them."""


# -- starting -----------------------------------------------------------------------------------------------
def parent_death_signal(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` giving the child `sig` when the thread that started it ends (the harness killed). prctl is
    looked up before the fork; a parent that died between fork and prctl is caught by comparing the ppid."""
    parent, prctl = os.getpid(), _prctl()

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def _prctl():
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).prctl
        fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        return fn
    except (OSError, AttributeError):  # not Linux: no parent-death signal, group stops still apply
        return None


@dataclass(frozen=True)
class Started:
    """A process `start` began: `pid` with `start_ticks` identifies it for good (a reused pid has another start
    time), e.g. in a run's attempt record that a retry reads to end what an earlier attempt left."""

    pid: int
    start_ticks: int
    """Start time in clock ticks after boot (`ProcStat.start_ticks`); -1 when it was already gone."""
    argv0: str
    memory_limit: str | None = None
    """`MemoryLimit.describe()` of the limit it runs under, or None."""


OnStart = Callable[[Started], None]
"""Called with every process `start` began, right after it began (from the calling thread)."""


def start(cmd: list[str], group: Literal["session", "group", "inherit"] = "session", die_with_parent: bool = True,
          death_signal: int = signal.SIGKILL, memory: MemoryLimit | None = None, on_start: OnStart | None = None,
          cgroup: str | Path | None = None, **popen_kwargs) -> subprocess.Popen:  # fmt: skip
    """`subprocess.Popen(cmd, **popen_kwargs)` that dies with this harness (unless `die_with_parent` is False: a
    server meant to outlive the command that started it): as the leader of a new session (the harness's group
    signals do not reach it; `stop_group` / `stop_session` do), of a new process group in this session, or in
    the caller's group ("inherit": the caller's group signals reach it). The signal comes when the *thread* that
    called `start` ends: call it from the thread that waits for the process, not from a short-lived one.

    `memory`: the process (and all it starts) runs under that limit, applied before it executes anything; call
    `memory.release()` once it has ended. `cgroup`: a cgroup v2 directory the process joins before it executes
    anything (`freezer_cgroup`). `on_start`: told the process's `Started` as soon as it runs."""
    if group == "session":
        popen_kwargs["start_new_session"] = True
    elif group == "group":
        popen_kwargs["process_group"] = 0
    steps = [parent_death_signal(death_signal)] if die_with_parent else []
    if memory is not None:
        steps.append(memory.preexec())
    if cgroup is not None:
        steps.append(join_cgroup(cgroup))
    preexec = steps[0] if len(steps) == 1 else (lambda: [step() for step in steps]) if steps else None
    proc = subprocess.Popen(cmd, preexec_fn=preexec, **popen_kwargs)
    if on_start is not None:
        st = proc_stat(proc.pid)
        on_start(Started(proc.pid, st.start_ticks if st else -1, str(cmd[0]) if cmd else "",
                         memory.describe() if memory else None))  # fmt: skip
    return proc


# -- memory limits ------------------------------------------------------------------------------------------
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class MemoryLimit:
    """At most `max_bytes` for a process and everything it starts.

    `how` = "cgroup": a fresh cgroup v2 child of the harness's own cgroup with `memory.max` (and no swap), which
    the child joins before it executes anything; the kernel's OOM killer then ends only that cgroup (SIGKILL, exit
    -9), and `release` kills whatever is left in it and removes it. `how` = "rlimit": `RLIMIT_AS` on the process,
    inherited by its children: each may map at most `max_bytes` (allocations past it fail: MemoryError). Address
    space is not memory (CUDA reserves far more than it uses), so `memory_limit_for` never picks it for a GPU."""

    max_bytes: int
    how: Literal["cgroup", "rlimit"]
    cgroup: Path | None = None

    def preexec(self) -> Callable[[], None]:
        if self.how == "cgroup":
            return join_cgroup(self.cgroup)
        limit = self.max_bytes

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        return cap

    def describe(self) -> str:
        where = f"cgroup v2 {self.cgroup}" if self.how == "cgroup" else "RLIMIT_AS (address space, per process)"
        return f"{self.max_bytes / 2**30:.1f} GiB via {where}"

    def oom_killed(self) -> bool:
        """The cgroup's OOM killer ended a process in it (always False for an rlimit: allocations just fail)."""
        if self.how != "cgroup" or self.cgroup is None:
            return False
        try:
            events = dict(line.split() for line in (self.cgroup / "memory.events").read_text().splitlines())
        except (OSError, ValueError):
            return False
        return int(events.get("oom_kill", 0)) > 0

    def release(self) -> None:
        """Kill what is left in the cgroup and remove it (nothing to do for an rlimit)."""
        if self.how != "cgroup" or self.cgroup is None:
            return
        remove_cgroup(self.cgroup)


def join_cgroup(cgroup: str | Path) -> Callable[[], None]:
    """A `preexec_fn` moving the child into `cgroup` before it executes anything (and all it will start)."""
    procs_file = str(Path(cgroup) / "cgroup.procs")

    def join() -> None:  # in the child, before exec: "0" moves the writing process itself
        fd = os.open(procs_file, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    return join


def cgroup2_mount() -> Path | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup, or beside v1 controllers in a hybrid layout
    (/sys/fs/cgroup/unified)."""
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                return Path(left.split()[4].replace("\\040", " "))
    except (OSError, IndexError):
        pass
    return None


def freezer_cgroup(label: str = "agent") -> Path | None:
    """A fresh cgroup v2 child of this process's cgroup whose `cgroup.freeze` the harness may write (the v2
    freezer needs no controller: any delegated, writable cgroup has one), or None where there is none."""
    mount = cgroup2_mount()
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if mount is None or rel is None:
        return None
    here = mount / rel.lstrip("/")
    _remove_stale_cgroups(here)
    child = here / f"a2rl-{label}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        child.mkdir()
    except OSError:
        return None
    if os.access(child / "cgroup.freeze", os.W_OK) and os.access(child / "cgroup.procs", os.W_OK):
        return child
    remove_cgroup(child)
    return None


def _remove_stale_cgroups(parent: Path) -> None:
    """Empty `a2rl-<label>-<pid>-<ns>` cgroups whose harness process is gone: `remove_cgroup` gives up on one whose
    killed processes take long to exit (thousands, on a loaded machine), and the next harness sweeps it."""
    for stale in parent.glob("a2rl-*-*-*"):
        try:
            os.kill(int(stale.name.rsplit("-", 2)[1]), 0)
        except ProcessLookupError:
            try:
                stale.rmdir()  # only an empty one goes; one still populated stays for a later sweep
            except OSError:
                pass
        except (OSError, ValueError):
            continue


def remove_cgroup(cgroup: Path) -> None:
    """Kill whatever is left in `cgroup` and remove it (bounded: a process stuck in the kernel keeps it)."""
    for _ in range(50):
        try:
            (cgroup / "cgroup.kill").write_text("1")
        except OSError:
            signal_pids(_cgroup_pids(cgroup), signal.SIGKILL)
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # still populated: its processes are being reaped
            time.sleep(0.1)


def _cgroup_pids(cgroup: Path) -> list[int]:
    try:
        return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def own_cgroup() -> Path | None:
    """This process's cgroup v2 directory where it can make children with a memory limit, else None: the
    unified hierarchy is mounted, our cgroup's `cgroup.subtree_control` delegates `memory`, and it is writable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if rel is None or not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None  # cgroup v1 or a hybrid mount: no unified memory controller here
    here = CGROUP_ROOT / rel.lstrip("/")
    try:
        delegated = "memory" in (here / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    return here if delegated and os.access(here, os.W_OK) else None


def memory_limit_for(max_bytes: int, gpu: bool = False, label: str = "proc") -> MemoryLimit | None:
    """A `MemoryLimit` of `max_bytes`: a cgroup where one can be made here, else RLIMIT_AS, except for a process
    that will use a GPU (CUDA reserves address space far beyond memory): then None, and the caller says so."""
    parent = own_cgroup()
    if parent is not None:
        child = parent / f"a2rl-{label}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            child.mkdir()
            (child / "memory.max").write_text(str(max_bytes))
            try:
                (child / "memory.swap.max").write_text("0")
            except OSError:  # no swap accounting: memory.max still binds
                pass
            return MemoryLimit(max_bytes, "cgroup", child)
        except OSError:
            try:
                child.rmdir()
            except OSError:
                pass
    return None if gpu else MemoryLimit(max_bytes, "rlimit")


# -- looking ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    """Start time in clock ticks after boot: with the pid, identifies one process for good."""
    uid: int | None = None


def proc_stat(pid: int) -> ProcStat | None:
    """The process `pid` as /proc shows it, or None when there is none (or only a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return ProcStat(pid, int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` is alive on this machine. A zombie is not: a SIGKILLed child stays one until its
    parent reaps it (a busy Prefect worker can take a while), and a retry or a clean-up must see it gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive (its /proc entry may be hidden from us)
    return proc_stat(pid) is not None or not os.path.isdir("/proc")


def all_procs(with_uid: bool = False) -> list[ProcStat]:
    out = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else []:
        if entry.name.isdigit() and (st := proc_stat(int(entry.name))) is not None:
            if with_uid:
                try:
                    st = ProcStat(**{**asdict(st), "uid": os.stat(entry.path).st_uid})
                except OSError:
                    continue
            out.append(st)
    return out


def session_members(sid: int) -> list[int]:
    """Pids of the live processes of session `sid`."""
    return [p.pid for p in all_procs() if p.sid == sid]


def group_members(pgid: int) -> list[int]:
    return [p.pid for p in all_procs() if p.pgid == pgid]


def descendants(pid: int, procs: list[ProcStat] | None = None) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in procs if procs is not None else all_procs():
        children.setdefault(p.ppid, []).append(p.pid)
    out, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop()
        out.append(child)
        queue += children.get(child, [])
    return out


def alive(pid: int, start_ticks: int | None = None) -> bool:
    st = proc_stat(pid)
    return st is not None and (start_ticks is None or st.start_ticks == start_ticks)


# -- ending -------------------------------------------------------------------------------------------------
def signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when it has no member (or none we may signal)."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: Iterable[int], timeout_s: float, interval_s: float = 0.05) -> list[int]:
    """The pids still alive after up to `timeout_s` seconds (children of ours are reaped as they end)."""
    left = list(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        left = [p for p in left if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(interval_s)


def stop_session(sid: int, grace_s: float = 0.0) -> None:
    """SIGTERM, then after `grace_s` SIGKILL, every process still in session `sid`."""
    if grace_s > 0 and (pids := session_members(sid)):
        signal_pids(pids, signal.SIGTERM)
        wait_gone(pids, grace_s, interval_s=0.1)
    signal_pids(session_members(sid), signal.SIGKILL)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group led by `proc`, SIGKILL it after `grace_s` (the leader may have exited: its
    children must not outlive it), then end what is left of its session (groups a tool runner made)."""
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    end_session_of(proc)


def end_session_of(proc: subprocess.Popen) -> None:
    """SIGKILL everything below `proc` (a supervisor's adopted orphans included), its group and the session it
    leads (started with group="session"), and reap it."""
    signal_pids(descendants(proc.pid), signal.SIGKILL)
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    stop_session(proc.pid)


def kill_tree(pid: int) -> None:
    """SIGKILL the process group of `pid` and those of its children: for a sandbox, the shim's and bubblewrap's
    (whose end ends the sandbox's PID namespace) or, unsandboxed, the launcher's with the command."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    for group in (pid, *children):
        signal_group(group, signal.SIGKILL)


def group_running(proc: subprocess.Popen) -> bool:
    """The command (reaped by `poll` once it ended) or its process group has a live member."""
    return proc.poll() is None or signal_group(proc.pid, 0)


def stop_tree(pid: int, start_time: float, term_signals: int, timeout_s: float) -> None:
    """End a long-lived leader we started (a server, a worker) with everything below it: SIGTERM the leader
    `term_signals` times (a few seconds apart), then SIGTERM and finally SIGKILL whatever is left of its
    process group and its descendants (flow runs, their agents). `start_time`: psutil's create_time, so that
    a reused pid is left alone."""
    import psutil

    try:
        leader = psutil.Process(pid)
        ours = abs(leader.create_time() - start_time) < 1.0 and leader.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        ours = False
    family: list[int] = []
    if ours:
        family = descendants(pid)
        deadline = time.monotonic() + timeout_s
        for i in range(term_signals):
            signal_pids([pid], signal.SIGTERM)
            wait_s = 3 if i < term_signals - 1 else timeout_s
            if not wait_gone([pid], max(0.0, min(deadline, time.monotonic() + wait_s) - time.monotonic())):
                break
        family += descendants(pid)
    _term_then_kill([p for p in {*family, *group_members(pid)} if p != os.getpid()])


def _term_then_kill(pids: list[int], grace_s: float = 10.0) -> None:
    left = [p for p in pids if alive(p)]
    if not left:
        return
    signal_pids(left, signal.SIGTERM)
    left = wait_gone(left, grace_s)
    signal_pids(left, signal.SIGKILL)
    wait_gone(left, 5.0)


# -- a supervisor for commands that run on the host ------------------------------------------------------------
def supervised(cmd: list[str], python: str, cgroup: str | Path | None = None) -> list[str]:
    """`cmd` under a supervisor (this file run as a script): start it with group="session" and
    death_signal=SUPERVISOR_DEATH_SIGNAL. With `cgroup`, `cmd` (not the supervisor) joins it."""
    where = ["--cgroup", str(cgroup)] if cgroup is not None else []
    return [python, "-I", "-S", str(Path(__file__).resolve()), "--supervise", *where, "--", *cmd]


def supervise(cmd: list[str], cgroup: str | None = None) -> int:
    """Run `cmd` and outlive everything it starts: as a child subreaper, orphans (a daemon that left its session
    included) become our children, not init's. When the harness dies (SUPERVISOR_DEATH_SIGNAL) or `cmd` exits,
    every process below us is killed. Group signals (the budget's SIGTERM) reach `cmd` directly; we ignore them.
    `cmd`'s exit status is ours (a death by signal N too)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def end_all(signum=None, frame=None) -> None:
        # Until nothing is left below us, not a fixed number of passes: a process killed in one pass may take a
        # moment to exit on a loaded machine, and only then are its children reparented to us (the subreaper);
        # had we exited first, they would go to init and outlive the harness.
        # Members of our session too, where we lead it (group="session"): a process whose parent died before we
        # listed it may already be init's (seen: an evaluation's child outliving a SIGKILLed grader).
        me, deadline = os.getpid(), time.monotonic() + 5.0
        leader = os.getsid(0) == me
        while time.monotonic() < deadline:
            listing = all_procs()  # one /proc scan a pass serves both questions
            left = set(descendants(me, listing)) | {p.pid for p in listing if leader and p.sid == me and p.pid != me}
            if not left:
                break
            signal_pids(left, signal.SIGKILL)
            time.sleep(0.01)
        if signum is not None:
            os._exit(128 + signum)

    signal.signal(SUPERVISOR_DEATH_SIGNAL, end_all)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: None)  # a handler, not SIG_IGN: `cmd` must not inherit "ignored"
    try:
        child = start(cmd, group="inherit", cgroup=cgroup)
    except OSError as e:
        print(f"[supervisor] cannot start {cmd[:1]}: {e}", file=sys.stderr, flush=True)
        return 127
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            break
    end_all()
    code = child.returncode
    if code is not None and code < 0:  # die the same way, so the harness sees what ended the command
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code is not None else 1


# -- attempts and the records of their processes, for retries ---------------------------------------------
ATTEMPT_ENV = "A2RL_RUN_ATTEMPT"
"""Set in the environment of every process an attempt starts (agent, evaluations): `Attempt.tag`."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run: the flow run, its attempt number, and the harness process that runs it."""

    run_id: str
    flow_run_id: str | None
    number: int
    """1 for the first attempt on the run's directory, one more for each retry that resumed it."""
    harness: int
    harness_start: int

    @classmethod
    def here(cls, run_id: str, flow_run_id: str | None, number: int) -> Attempt:
        me = proc_stat(os.getpid())
        return cls(run_id, flow_run_id, number, os.getpid(), me.start_ticks if me else -1)

    @property
    def tag(self) -> str:
        return f"{self.run_id}/{self.number}/{self.harness}:{self.harness_start}"


_CURRENT: tuple[Path, Attempt] | None = None
"""The attempt this process runs, and its run's harness directory (set by the benchmark flow)."""


def begin_attempt(harness_dir: Path, attempt: Attempt) -> None:
    """From now on, processes this harness starts carry `attempt`'s tag (in this process's environment, which
    they inherit; the agent's, built from scratch, gets it from `attempt_env`), and those recorded with
    `record_started` are recorded as `attempt`'s."""
    global _CURRENT
    _CURRENT = (Path(harness_dir), attempt)
    os.environ[ATTEMPT_ENV] = attempt.tag


def end_attempt() -> None:
    """The attempt is over (its flow returns): nothing more is recorded or tagged as its."""
    global _CURRENT
    if _CURRENT is not None and os.environ.get(ATTEMPT_ENV) == _CURRENT[1].tag:
        del os.environ[ATTEMPT_ENV]
    _CURRENT = None


def current_attempt() -> Attempt | None:
    return _CURRENT[1] if _CURRENT else None


def attempt_env() -> dict[str, str]:
    """The tag of the current attempt, for the environment of a process it starts (empty outside a run)."""
    return {ATTEMPT_ENV: _CURRENT[1].tag} if _CURRENT else {}


@dataclass(frozen=True)
class SessionRecord:
    """Processes an attempt started (an agent session, an evaluation), as the harness started them."""

    leader: int
    """The leader (a sandbox shim, a harness-side runner, an evaluation), started with group="session"."""
    leader_start: int
    harness: int
    """The harness process that started it (the flow run's process)."""
    harness_start: int
    agent_uid: int | None = None
    """Root harness with bubblewrap: the uid every process of the agent runs under (one per workspace)."""
    kind: str = "agent"
    """"agent" or "evaluation"."""
    flow_run_id: str | None = None
    attempt: int | None = None
    """The attempt that started it (None: recorded outside a run's attempt)."""

    @classmethod
    def of(cls, leader: int, agent_uid: int | None = None, kind: str = "agent") -> SessionRecord:
        me, lead, attempt = proc_stat(os.getpid()), proc_stat(leader), current_attempt()
        return cls(leader, lead.start_ticks if lead else -1, os.getpid(), me.start_ticks if me else -1, agent_uid,
                   kind, attempt.flow_run_id if attempt else None, attempt.number if attempt else None)  # fmt: skip

    def running(self) -> bool:
        """Its leader, or a process of its session started after it, is alive."""
        lead = proc_stat(self.leader)
        if lead is not None and lead.start_ticks == self.leader_start:
            return True
        return any(p.sid == self.leader and p.start_ticks >= self.leader_start for p in all_procs())

    def ours(self) -> bool:
        """Started by this very process (the current attempt), not by an earlier one."""
        me = proc_stat(os.getpid())
        return self.harness == os.getpid() and me is not None and self.harness_start == me.start_ticks


def record_session(harness_dir: Path, record: SessionRecord) -> None:
    with (Path(harness_dir) / RECORD_FILE).open("a") as f:
        f.write(json.dumps(asdict(record)) + "\n")


def record_started(started: Started, kind: str = "evaluation") -> None:
    """Record a process the current attempt just started (`start(..., on_start=record_started)`; a no-op outside
    a run), so that a retry ends it should this harness die first."""
    if _CURRENT is not None and _CURRENT[0].is_dir():
        record = SessionRecord.of(started.pid, kind=kind)
        record_session(_CURRENT[0], replace(record, leader_start=started.start_ticks))


def read_records(harness_dir: Path) -> list[SessionRecord]:
    path = Path(harness_dir) / RECORD_FILE
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(SessionRecord(**json.loads(line)))
        except (ValueError, TypeError):  # a torn last line from a crash
            continue
    return out


def earlier_attempt_pids(records: list[SessionRecord], run_id: str | None = None) -> list[int]:
    """Live processes of the recorded sessions of earlier attempts: the harness that started them (unless it is
    this process or one of its ancestors), the leader's descendants and session, every process of the agent's
    uid, and (with `run_id`) every process tagged with another attempt of that run (ATTEMPT_ENV)."""
    records = [r for r in records if not r.ours()]
    procs = all_procs(with_uid=any(r.agent_uid is not None for r in records))
    by_pid = {p.pid: p for p in procs}
    spared = {os.getpid(), *_ancestors(os.getpid(), by_pid)}
    found: set[int] = set()
    for r in records:
        harness = by_pid.get(r.harness)
        if harness is not None and harness.start_ticks == r.harness_start and r.harness not in spared:
            found.add(r.harness)
        leader = by_pid.get(r.leader)
        if leader is not None and leader.start_ticks != r.leader_start:
            leader = None  # the pid was reused: the recorded session is empty (Linux keeps an sid while used)
        elif leader is not None:
            found |= {r.leader, *descendants(r.leader, procs)}
        if (r.leader not in by_pid and r.leader_start >= 0) or leader is not None:
            found |= {p.pid for p in procs if p.sid == r.leader and p.start_ticks >= r.leader_start}
        if r.agent_uid is not None:
            found |= {p.pid for p in procs if p.uid == r.agent_uid}
    if run_id is not None:
        found |= set(tagged_pids(run_id, procs))
    return sorted(found - spared)


def tagged_pids(run_id: str, procs: list[ProcStat] | None = None) -> list[int]:
    """Processes (that we may read) tagged with an attempt of `run_id` other than this process's."""
    mine = attempt_env().get(ATTEMPT_ENV)
    prefix = f"{ATTEMPT_ENV}={run_id}/".encode()
    out = []
    for p in procs if procs is not None else all_procs():
        try:
            environ = Path(f"/proc/{p.pid}/environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(prefix) and var.decode(errors="replace") != f"{ATTEMPT_ENV}={mine}":
                out.append(p.pid)
                break
    return out


def _ancestors(pid: int, by_pid: dict[int, ProcStat]) -> list[int]:
    out = []
    while (p := by_pid.get(pid)) is not None and p.ppid not in out and p.ppid > 0:
        out.append(p.ppid)
        pid = p.ppid
    return out


def end_earlier_attempts(harness_dir: Path, timeout_s: float = 15.0, run_id: str | None = None,
                         on_kill: Callable[[], None] | None = None) -> list[int]:  # fmt: skip
    """End every process an earlier attempt of this run left (SIGKILL: its session is over; a frozen harness
    is ended too), and check they are gone; raise ProcessesSurvived otherwise. Returns the pids ended.
    `on_kill` is called right before the first SIGKILL: the moment they stopped running, which a loaded
    machine's wait for them to be gone comes long after."""
    records = read_records(harness_dir)
    if not records and run_id is None:
        return []
    ended: list[int] = []
    for _ in range(3):  # a process forking while we kill: look again
        pids = earlier_attempt_pids(records, run_id)
        if not pids:
            break
        if on_kill is not None and not ended:
            on_kill()
        signal_pids(pids, signal.SIGKILL)
        ended += pids
        if left := wait_gone(pids, timeout_s):
            raise ProcessesSurvived(f"processes of an earlier attempt still run after SIGKILL: {left}")
    else:
        if left := earlier_attempt_pids(records, run_id):
            raise ProcessesSurvived(f"processes of an earlier attempt keep appearing: {left}")
    return sorted(set(ended))


if __name__ == "__main__" and sys.argv[1:3] == ["--supervise", "--"]:
    sys.exit(supervise(sys.argv[3:]))
if __name__ == "__main__" and sys.argv[1:3] == ["--supervise", "--cgroup"] and sys.argv[4:5] == ["--"]:
    sys.exit(supervise(sys.argv[5:], cgroup=sys.argv[3]))
