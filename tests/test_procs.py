"""The agent dies with the harness (#13.5) and the process supervisor a2rl_bench.isolation.procs (#20.4).

A harness process runs a real agent session (run_agent, the real bubblewrap sandbox, and without one); the
agent leaves background jobs, one of them a daemon in a session of its own. SIGKILL of the harness (what the
OOM killer or a dead worker host does) must end every process of the session within seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from sandbox_support import needs_bwrap

from a2rl_bench.isolation import procs

REPO = Path(__file__).resolve().parents[1]

# The agent: a background job, a daemon that left its session (double fork + setsid), then "training".
AGENT = textwrap.dedent("""
    import os, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    open("ready", "w").write(str(os.getpid()))
    while True:
        time.sleep(0.1)  # training
""")

# The harness: one agent session through run_agent, as the agent-session flow starts it.
HARNESS = textwrap.dedent("""
    import sys
    from pathlib import Path
    from a2rl_bench.grading.clock import BudgetClock
    from a2rl_bench.isolation.sandbox import SandboxPolicy
    from a2rl_bench.agents.base import Agent, AgentEnv, run_agent

    ws, sandboxed = Path(sys.argv[1]), sys.argv[2] == "1"

    class Looper(Agent):
        id = "looper"
        def install(self, workspace): pass
        def command(self, workspace): return [sys.executable, "code/agent.py"]

    env = AgentEnv("gsm8k", "tiny", ws, "http://127.0.0.1:9", "token", 0, harness_dir=ws.parent / "harness")
    policy = SandboxPolicy(ws) if sandboxed else None
    run_agent(Looper(), env, BudgetClock(600), ws.parent / "harness" / "agent.log", sandbox=policy)
""")


def _run_dir(tmp_path: Path) -> Path:
    ws = tmp_path / "run" / "workspace"
    for sub in ("code", "output", "data", "models/base"):
        (ws / sub).mkdir(parents=True)
    (tmp_path / "run" / "harness").mkdir()
    (ws / "code" / "agent.py").write_text(AGENT)
    (tmp_path / "harness.py").write_text(HARNESS)
    return ws


def _start_session(tmp_path: Path, sandboxed: bool) -> tuple[subprocess.Popen, Path]:
    ws = _run_dir(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    harness = subprocess.Popen([sys.executable, str(tmp_path / "harness.py"), str(ws), "1" if sandboxed else "0"],
                               env=env, cwd=REPO, stderr=open(tmp_path / "harness.err", "w"))  # fmt: skip
    deadline = time.monotonic() + 60
    while not (ws / "ready").exists():
        assert harness.poll() is None, (tmp_path / "harness.err").read_text()
        assert time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.1)
    return harness, ws


def _tree(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _cwd_in(ws: Path) -> list[int]:
    """Processes working in the workspace (the daemon left the harness's tree, not the workspace)."""
    found = []
    for p in psutil.process_iter(["cwd"]):
        if p.info.get("cwd") and p.info["cwd"].startswith(str(ws)):
            found.append(p.pid)
    return found


# Sandboxed: the shim's parent-death signal, bubblewrap's --die-with-parent and its PID namespace. Without a
# sandbox: the supervisor, a child subreaper that ends everything below it when the harness dies.
@pytest.mark.parametrize("sandboxed", [pytest.param(True, marks=needs_bwrap), False], ids=["bwrap", "unsandboxed"])
def test_sigkill_of_the_harness_ends_the_whole_agent_session(tmp_path: Path, sandboxed: bool):
    harness, ws = _start_session(tmp_path, sandboxed)
    tree = _tree(harness.pid)
    in_ws = _cwd_in(ws)
    assert len(tree) >= 3 and len(in_ws) >= 3, (tree, in_ws)  # (shim, bubblewrap,) agent, its job, the daemon
    record = procs.read_records(ws.parent / "harness")
    assert len(record) == 1 and record[0].harness == harness.pid

    harness.kill()
    harness.wait()
    t = time.monotonic()
    left = procs.wait_gone([p.pid for p in tree] + in_ws, timeout_s=5.0)
    assert left == [], f"{len(left)} processes of the session outlived the harness: {left}"
    assert time.monotonic() - t < 5.5


def test_a_retry_ends_what_an_earlier_attempt_left_and_spares_itself(tmp_path: Path):
    """A frozen harness (Prefect saw its run crash; SIGKILL never came) still supervises a training agent: the
    retry ends both, checks they are gone, and leaves its own process and ancestors alone."""
    harness, ws = _start_session(tmp_path, sandboxed=False)
    tree = [p.pid for p in _tree(harness.pid)]
    harness.send_signal(signal.SIGSTOP)
    try:
        ended = procs.end_earlier_attempts(ws.parent / "harness", timeout_s=10)
    finally:
        harness.send_signal(signal.SIGCONT)
    assert harness.pid in ended
    assert procs.wait_gone([harness.pid, *tree], 2.0) == []  # its supervisor, the agent, its job and its daemon
    assert os.getpid() not in ended
    harness.wait(timeout=10)
    # Nothing left: a second retry has nothing to do.
    assert procs.end_earlier_attempts(ws.parent / "harness") == []


def test_start_gives_a_parent_death_signal_unless_told_not_to(tmp_path: Path):
    code = "import subprocess, sys, time; from a2rl_bench.isolation import procs; " \
           "p = procs.start([sys.executable, '-c', 'import time; time.sleep(600)'], die_with_parent=%s); " \
           "print(p.pid, flush=True); time.sleep(600)"  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for dies in (True, False):
        parent = subprocess.Popen([sys.executable, "-c", code % dies], env=env, stdout=subprocess.PIPE, text=True)
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        left = procs.wait_gone([child], 3.0)
        assert (left == []) is dies
        procs.signal_pids(left, signal.SIGKILL)


# A harness that began attempt 1 of run-x: an evaluation under the supervisor (recorded through on_start), and a
# process that escaped into a session of its own without being recorded (it still carries the attempt's tag).
ATTEMPT_HARNESS = textwrap.dedent("""
    import subprocess, sys
    from pathlib import Path
    from a2rl_bench.isolation import procs

    procs.begin_attempt(Path(sys.argv[1]), procs.Attempt.here("run-x", "flow-run-1", 1))
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    ev = procs.start(procs.supervised(sleeper, sys.executable), group="session",
                     death_signal=procs.SUPERVISOR_DEATH_SIGNAL, on_start=procs.record_started)
    stray = procs.start(sleeper, group="session", die_with_parent=False)
    print(ev.pid, stray.pid, flush=True)
    ev.wait()
""")


def test_every_process_of_an_attempt_carries_its_identity_and_a_retry_ends_those_of_earlier_attempts_only(
    tmp_path: Path, monkeypatch
):
    """#29.2: evaluations are recorded like agent sessions, with the attempt that started them; everything an
    earlier attempt left (its frozen harness, its evaluation, a tagged process it did not record) is ended by
    the next attempt, whose own processes and records are left alone."""
    harness_dir = tmp_path / "harness"
    harness_dir.mkdir()
    (tmp_path / "harness.py").write_text(ATTEMPT_HARNESS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, str(tmp_path / "harness.py"), str(harness_dir)], env=env,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    ev, stray = (int(x) for x in first.stdout.readline().split())
    deadline = time.monotonic() + 30
    while len(ev_tree := [ev, *procs.descendants(ev)]) < 2:  # the supervisor and, once it started it, the evaluation
        assert time.monotonic() < deadline, "the supervisor never started the evaluation"
        time.sleep(0.05)
    tag = "run-x/1/%d:%d" % (first.pid, procs.proc_stat(first.pid).start_ticks)
    for pid in (*ev_tree, stray):
        assert f"{procs.ATTEMPT_ENV}={tag}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    first.send_signal(signal.SIGSTOP)  # the harness freezes: nothing of it will end by itself

    # The retry, in this process: attempt 2, with an evaluation of its own already running.
    monkeypatch.delenv(procs.ATTEMPT_ENV, raising=False)
    monkeypatch.setattr(procs, "_CURRENT", None)
    procs.begin_attempt(harness_dir, procs.Attempt.here("run-x", "flow-run-1", 2))
    own = procs.start([sys.executable, "-c", "import time; time.sleep(600)"], on_start=procs.record_started)
    try:
        records = procs.read_records(harness_dir)
        assert [(r.kind, r.flow_run_id, r.attempt) for r in records] == [("evaluation", "flow-run-1", 1),
                                                                         ("evaluation", "flow-run-1", 2)]
        ended = procs.end_earlier_attempts(harness_dir, timeout_s=10, run_id="run-x")
        assert {first.pid, *ev_tree, stray} <= set(ended) and own.pid not in ended
        assert procs.wait_gone([first.pid, *ev_tree, stray], 2.0) == []
        assert own.poll() is None  # this attempt's own evaluation runs on
        assert procs.end_earlier_attempts(harness_dir, run_id="run-x") == []
    finally:
        procs.end_attempt()
        own.kill()
        own.wait()
        first.wait(timeout=10)


@pytest.mark.parametrize("mechanism", ["tree", "cgroup", "uid"])
def test_a_freeze_is_invisible_to_a_shell_with_job_control(mechanism):
    """A command that spans a grading freeze must not look stopped to the shell running it: an agent's terminal
    tool (OpenHands' bash, job control on) reported every `curl .../submit` as failed (exit 147) when the shell
    was continued before its command. Parents are stopped first and continued last (signals), or nothing is
    signalled at all (the cgroup freezer)."""
    import shutil
    import subprocess
    import time

    from a2rl_bench.isolation.freezer import AgentFreezer

    if mechanism == "cgroup" and (probe := procs.freezer_cgroup("test")) is None:
        pytest.skip("no writable cgroup v2 here")
    elif mechanism == "cgroup":
        procs.remove_cgroup(probe)
    uid = 1_999_999_000 + os.getpid() % 1000 if mechanism == "uid" else None
    if mechanism == "uid" and (os.geteuid() != 0 or not shutil.which("setpriv")):
        pytest.skip("needs root and setpriv to run the shell under a uid of its own")
    shell = ["bash", "-c", "set -m; sleep 1.5; echo rc=$?"]
    if uid is not None:
        shell = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *shell]
    for _ in range(3):
        cgroup = procs.freezer_cgroup("test") if mechanism == "cgroup" else None
        leader = procs.start(procs.supervised(shell, sys.executable, cgroup=cgroup), group="session",
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            time.sleep(0.5)
            freezer = AgentFreezer(leader.pid, cgroup, uid, confirm_s=30)
            assert freezer.on_pause()
            time.sleep(1.0)
            freezer.on_resume()
            out, _ = leader.communicate(timeout=30)
        finally:
            leader.kill()
            if cgroup is not None:
                procs.remove_cgroup(cgroup)
        assert out.strip() == "rc=0", out
        assert freezer.freezes == 1 and freezer.frozen_s >= 1.0
