"""Run one HumanEval program (candidate code + unit tests) in a throw-away, locked-down process.

Each run gets a fresh temporary directory as its working directory, a minimal environment (no API keys
or tokens of the grader), `python -I`, and resource limits (address space, CPU seconds, processes, file
size, no core dumps). A program that loops, forks, crashes the interpreter or exits early fails only its
own sample. Layers added where the machine allows them (`isolation()` says which were used):

- as root with util-linux: a new network namespace (no network at all) and PID namespace (every process
  the program starts dies with it), the program running as `nobody`;
- Linux Landlock (kernel >= 5.13, unprivileged): the program can read only the Python installation and
  system libraries, and write only its own directory; reading anything else (the grader's data, the
  agent's workspace, /etc) fails.

Without root there is no network isolation and a process that calls `setsid()` can outlive the time
limit while it sleeps (CPU-bound ones still hit the CPU limit): run the grader as root, or in a
container, to get the full set.

A sample passes only when a random marker written after `check(entry_point)` returned reaches stdout,
so `sys.exit(0)` / `os._exit(0)` before the tests run is a failure, not a pass. A program that
introspects the interpreter to find that marker is outside what this guards against. Before the first
program, a known-good one is run: if it does not pass (the interpreter cannot start as `nobody`, Landlock
hides its standard library, ...), `SandboxBroken` is raised instead of scoring every sample 0.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from a2rl_bench.isolation import procs

NOBODY = 65534
ExecutionStatus = Literal["passed", "failed", "timeout", "crashed"]

# Runs inside the sandbox, before the program: limits, then Landlock, then the program. The pass marker
# arrives on stdin (not in any file the program could read) and is written only after the program's last
# statement, `check(entry_point)`, returned.
_RUNNER = r"""
import ctypes, json, os, resource, sys

def limit(cfg):
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))

def landlock(cfg):
    paths = cfg["landlock"]
    if not paths:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(444, None, 0, 1)
    if abi < 1:
        raise SystemExit("landlock requested but unavailable")
    read = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read_file, read_dir
    handled = (1 << 13) - 1  # every ABI-1 filesystem right
    if abi >= 2:
        handled |= 1 << 13  # refer
    if abi >= 3:
        handled |= 1 << 14  # truncate
    attr = ctypes.c_uint64(handled)
    ruleset = libc.syscall(444, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        raise SystemExit("landlock_create_ruleset failed: errno %d" % ctypes.get_errno())

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    file_rights = (1 << 0) | (1 << 1) | (1 << 2) | (handled & (1 << 14))
    for path, access in [(p, read) for p in paths["read"]] + [(p, handled) for p in paths["write"]]:
        if not os.path.isdir(path):
            access &= file_rights  # directory rights on a file are an error
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        rule = PathBeneath(access, fd)
        if libc.syscall(445, ruleset, 1, ctypes.byref(rule), 0) != 0:
            raise SystemExit("landlock_add_rule failed for %s: errno %d" % (path, ctypes.get_errno()))
        os.close(fd)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, ruleset, 0) != 0:
        raise SystemExit("landlock_restrict_self failed: errno %d" % ctypes.get_errno())
    os.close(ruleset)

def main():
    marker = sys.stdin.readline().strip()
    cfg = json.loads(sys.argv[1])
    limit(cfg)
    landlock(cfg)
    with open("program.py", encoding="utf-8") as f:
        code = compile(f.read(), "program.py", "exec")
    # Not "__main__": a reply's `if __name__ == "__main__":` demo code must not run (it may read stdin).
    exec(code, {"__name__": "program", "__builtins__": __builtins__})
    os.write(1, ("\n" + marker + "\n").encode())
    os._exit(0)

main()
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. The time limit is wall-clock; CPU seconds are capped at the same value."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    """Address-space limit (RLIMIT_AS) of each process."""
    max_processes: int = 32
    """RLIMIT_NPROC as `nobody`; without root, added to the user's current process count."""
    max_file_mb: int = 16
    """Largest file (and stdout/stderr) the program may write (RLIMIT_FSIZE)."""


class ExecutionResult(NamedTuple):
    status: ExecutionStatus
    reason: str
    """Why it did not pass: the last line of the traceback, the signal, or the time limit."""
    seconds: float
    output_tail: str
    """The end of stdout + stderr, for the report."""


class SandboxBroken(RuntimeError):
    """The sandbox cannot run even a trivial passing program here; scores would all be 0, so none are given."""


class Isolation(NamedTuple):
    namespaces: bool
    """Network + PID namespaces via `unshare` (root only)."""
    drop_to_nobody: bool
    landlock: bool

    def describe(self) -> str:
        parts = ["rlimits", "fresh cwd", "clean env", "python -I"]
        parts += ["no network (netns)", "pid namespace"] if self.namespaces else ["NO network isolation"]
        parts += ["uid nobody"] if self.drop_to_nobody else []
        parts += ["landlock fs"] if self.landlock else ["no filesystem read restriction"]
        return ", ".join(parts)


@functools.cache
def isolation() -> Isolation:
    """Which isolation layers this machine allows (probed once per process)."""
    root = os.geteuid() == 0
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    namespaces = False
    if root and unshare:
        probe = subprocess.run(
            [unshare, "--net", "--pid", "--fork", "--kill-child", "true"], capture_output=True, check=False
        )
        namespaces = probe.returncode == 0
    return Isolation(namespaces, namespaces and setpriv is not None, _landlock_abi() >= 1)


def _landlock_abi() -> int:
    if sys.platform != "linux":
        return 0
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(444, None, 0, 1))
    except (OSError, AttributeError):
        return 0


def _user_process_count() -> int:
    uid, count = os.getuid(), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    count += int(line.split()[1]) == uid
                    break
        except OSError:
            continue
    return count


def _readable_roots() -> list[str]:
    """What a sandboxed Python needs to read: its installation and the system's shared libraries."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots |= {"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/etc/ld.so.cache"}
    roots.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted(p for p in roots if os.path.exists(p))


def _command(work: Path, limits: SandboxLimits, iso: Isolation) -> list[str]:
    nproc = limits.max_processes if iso.drop_to_nobody else _user_process_count() + limits.max_processes
    cpu = max(1, int(limits.timeout_s + 0.999))
    cfg = {
        "rlimits": {
            "RLIMIT_AS": limits.memory_mb * 1024**2,
            "RLIMIT_CPU": cpu,
            "RLIMIT_NPROC": nproc,
            "RLIMIT_FSIZE": limits.max_file_mb * 1024**2,
            "RLIMIT_CORE": 0,
        },
        "landlock": {"read": _readable_roots() + ["/dev"], "write": [str(work)]} if iso.landlock else None,
    }
    cmd = [sys.executable, "-I", "-c", _RUNNER, json.dumps(cfg)]
    if iso.drop_to_nobody:
        cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *cmd]
    if iso.namespaces:
        cmd = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--", *cmd]
    return cmd


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run `source` (a complete program ending in `check(...)`) and say whether it passed.

    Raises:
        SandboxBroken: on first use, if a trivial passing program does not pass here (for example the
            interpreter cannot be executed as `nobody`, or Landlock hides its standard library).
    """
    check_sandbox()
    return _run_in_sandbox(source, limits)


@functools.cache
def check_sandbox() -> None:
    """Run a known-good program once per process; a broken sandbox is an evaluator error, not a 0 score."""
    program = (
        "import collections, hashlib, math, re, typing\n\n"
        "def check(candidate):\n    assert candidate(2) == 4\n\n"
        "check(lambda x: x * x)\n"
    )
    result = _run_in_sandbox(program, SandboxLimits(timeout_s=30.0))
    if result.status != "passed":
        raise SandboxBroken(
            f"the code-execution sandbox ({isolation().describe()}) fails a trivial passing program: "
            f"{result.status}, {result.reason}\n{result.output_tail[-800:]}"
        )


def _run_in_sandbox(source: str, limits: SandboxLimits) -> ExecutionResult:
    iso = isolation()
    work = Path(tempfile.mkdtemp(prefix="a2rl-exec-"))
    try:
        (work / "program.py").write_text(source, encoding="utf-8")
        if iso.drop_to_nobody:
            for path in (work, work / "program.py"):
                os.chown(path, NOBODY, NOBODY)
        return _run(work, limits, iso)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(work: Path, limits: SandboxLimits, iso: Isolation) -> ExecutionResult:
    marker = secrets.token_hex(16)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work)}
    # Output goes to files outside the program's directory, so the file-size limit bounds it and the
    # program cannot read or rewrite it.
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        # Under the harness's process supervisor: a child subreaper, so a daemon the program leaves (in a session
        # of its own, orphaned) is still below it and is killed with it, PID namespace or not.
        proc = procs.start(
            procs.supervised(_command(work, limits, iso), sys.executable),
            group="session",
            death_signal=procs.SUPERVISOR_DEATH_SIGNAL,
            cwd=work,
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            proc.stdin.write((marker + "\n").encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            returncode: int | None = proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            procs.end_session_of(proc)  # its session, its group and all below the supervisor
        seconds = time.perf_counter() - started
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
    tail = text[-2000:].replace(marker, "<pass marker>")
    if returncode is None:
        return ExecutionResult("timeout", f"time limit of {limits.timeout_s:g} s exceeded", seconds, tail)
    if marker in text:
        return ExecutionResult("passed", "", seconds, tail)
    if returncode < 0:  # `unshare` re-raises its child's fatal signal on itself, so this holds there too
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        return ExecutionResult("crashed", f"killed by {name}", seconds, tail)
    lines = [line for line in text.splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit code {returncode} before the tests finished"
    return ExecutionResult("failed", reason[:300], seconds, tail)

