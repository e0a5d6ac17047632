"""Red team, fifth pass (issue 43): the grading freeze, snapshot disk and plug-in data, each against its attack.

The freeze cases run a hostile agent (tests/freeze_agent.py) in the real sandbox, started by the real
`run_agent`; the harness pauses the agent's clock as the grader does and reads the agent's own progress
counters: frozen, they must not move at all (a count, not a time).
"""

from __future__ import annotations

import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from a2rl.agents.base import Agent, AgentEnv, run_agent
from a2rl.grading import BudgetClock
from a2rl.isolation import freezer, procs
from a2rl.isolation.sandbox import Limits, SandboxPolicy, sandbox_mode
from a2rl.workspace import RunPaths
from tests.sandbox_support import gone, needs_bwrap

FREEZE_AGENT = Path(__file__).with_name("freeze_agent.py")


class StopClock(BudgetClock):
    """A long budget that the test ends when it has seen what it needs."""

    def __init__(self) -> None:
        super().__init__(3600.0)
        self.done = threading.Event()

    @property
    def expired(self) -> bool:
        return self.done.is_set() or super().expired


class FreezeAgent(Agent):
    id = "freeze-redteam"

    def __init__(self, args: list[str]):
        self.args = args

    def install(self, workspace: Path) -> None:
        pass

    def command(self, workspace: Path) -> list[str]:
        return [sys.executable, f"code/{FREEZE_AGENT.name}", *self.args]


def _counters(path: Path) -> tuple[int, int, int]:
    """(worker's progress, hops, vfork parents in place) as the agent last wrote them."""
    try:
        raw = path.read_bytes()[:24]
    except OSError:
        return 0, 0, 0
    return struct.unpack("<QQQ", raw) if len(raw) == 24 else (0, 0, 0)


def _wait_for(what, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while not what():
        assert time.monotonic() < deadline, "the agent did not get going"
        time.sleep(0.1)


@needs_bwrap
@pytest.mark.parametrize("mechanism", ["cgroup", "uid"])
def test_a_pid_hopping_agent_with_vfork_parents_gets_no_work_done_while_frozen(tmp_path, monkeypatch, mechanism):
    """Issue 43, rows 1 and 2: a process that forks and exits in a loop was never in the freezer's listing and,
    once free, sent kill(-1, SIGCONT) to the rest (the worker ran straight through a 16 s freeze); 200 vfork
    parents in uninterruptible sleep cost the old freezer 50 ms each under the clock's lock (a 13.7 s freeze
    step). Now the whole agent stops at once (cgroup v2 freezer, or kill(-1, SIGSTOP) as the agent's uid): the
    worker (listed after every vfork parent) and the hopper make no progress at all while frozen, the freeze is
    confirmed, and it costs the harness a bounded step (the old one had a floor of 200 x 50 ms of sleeps)."""
    if mechanism == "cgroup" and procs.freezer_cgroup("probe") is None:
        pytest.skip("no writable cgroup v2 here")
    if mechanism == "uid":
        monkeypatch.setattr(procs, "freezer_cgroup", lambda label="agent": None)
    monkeypatch.setattr(freezer, "CONFIRM_S", 30.0)  # a loaded machine may take long to confirm: not the point
    paths = RunPaths.for_run(tmp_path / "runs", f"freeze-{mechanism}")
    paths.create()
    (paths.workspace / "code" / FREEZE_AGENT.name).write_text(FREEZE_AGENT.read_text())
    counter = paths.workspace / "counter.bin"
    policy = SandboxPolicy(paths.workspace, limits=Limits(nproc=2048))
    if mechanism == "uid" and sandbox_mode(policy) != "bwrap-root":
        pytest.skip("the agent has no uid of its own here (not a root harness)")
    clock, n_vfork = StopClock(), 200
    env = AgentEnv("gsm8k", "tiny", paths.workspace, "http://127.0.0.1:9", "token", seed=0)
    agent = FreezeAgent([counter.name, "--hop", "--vfork", str(n_vfork)])
    result: dict = {}
    session = threading.Thread(target=lambda: result.update(outcome=run_agent(
        agent, env, clock, paths.harness_dir / "agent.log", grace_s=1.0, poll_s=0.1, sandbox=policy)))
    session.start()
    try:
        _wait_for(lambda: _counters(counter)[2] == n_vfork and _counters(counter)[0] > 0)
        hops = _counters(counter)[1]
        _wait_for(lambda: _counters(counter)[1] > hops)  # the hopper is hopping
        began = time.monotonic()
        clock.pause()
        stop_s = time.monotonic() - began
        frozen_at = _counters(counter)
        agent_time = clock.elapsed()
        time.sleep(1.5)
        still = _counters(counter)
        charged = clock.elapsed() - agent_time
        clock.resume()
        _wait_for(lambda: _counters(counter)[0] > still[0], within_s=60)  # thawed, it runs again
    finally:
        clock.done.set()
        session.join(timeout=120)
    outcome = result["outcome"]
    assert still[0] == frozen_at[0], f"the worker counted {still[0] - frozen_at[0]} while frozen"
    assert still[1] == frozen_at[1], f"the hopper hopped {still[1] - frozen_at[1]} times while frozen"
    assert outcome.clock_rule["mechanism"] == mechanism, outcome.clock_rule
    assert outcome.clock_rule["unconfirmed"] == 0, outcome.clock_rule
    assert charged == 0.0, charged  # a confirmed freeze: the pause is not the agent's time
    assert stop_s < 5.0, stop_s  # the old freezer slept at least 10 s on the vfork parents
    assert gone(str(paths.workspace)), "a process of the agent outlived its session"


class _BlockingListener:
    def __init__(self, confirm: bool):
        self.confirm = confirm
        self.entered, self.release = threading.Event(), threading.Event()

    def on_pause(self) -> bool:
        self.entered.set()
        self.release.wait(60)
        return self.confirm

    def on_resume(self) -> None:
        pass


def test_a_freeze_in_progress_never_holds_the_clock():
    """Issue 43, row 2: the freeze waited for processes under the clock's lock, so the agent's `/budget` (and
    the budget check) waited with it (13.4 s). Now a freeze that has not returned leaves the clock readable."""
    clock, listener = BudgetClock(100.0), _BlockingListener(confirm=True)
    clock.start()
    clock.listen(listener)
    pausing = threading.Thread(target=clock.pause)
    pausing.start()
    assert listener.entered.wait(30)
    read: list[float] = []
    reader = threading.Thread(target=lambda: read.append(clock.elapsed()))
    reader.start()
    reader.join(timeout=20)
    blocked = reader.is_alive()
    listener.release.set()
    pausing.join(timeout=30)
    reader.join(timeout=30)
    assert not blocked, "elapsed() waited for the freeze"
    assert read and read[0] > 0


def test_a_freeze_that_cannot_be_confirmed_charges_the_agent():
    """A stop that is not confirmed in its bounded time keeps the agent's clock running through the pause (the
    agent may be running), while a confirmed one stops it."""
    clock, listener = BudgetClock(100.0), _BlockingListener(confirm=False)
    listener.release.set()
    clock.start()
    clock.listen(listener)
    clock.pause()
    first = clock.elapsed()
    time.sleep(0.05)
    assert clock.elapsed() > first, "an unconfirmed freeze stopped the agent's clock"
    clock.resume()
    listener.confirm = True
    clock.pause()
    first = clock.elapsed()
    time.sleep(0.05)
    assert clock.elapsed() == first, "a confirmed freeze left the agent's clock running"
    clock.resume()
