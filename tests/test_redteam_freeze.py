"""Red team, fifth pass (issue 43): the grading freeze, snapshot disk and plug-in data, each against its attack.

The freeze cases run a hostile agent (tests/freeze_agent.py) in the real sandbox, started by the real
`run_agent`; the harness pauses the agent's clock as the grader does and reads the agent's own progress
counters: frozen, they must not move at all (a count, not a time).
"""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from a2rl_bench.agents.base import Agent, AgentEnv, run_agent
from a2rl_bench.grading import BudgetClock
from a2rl_bench.isolation import freezer, procs
from a2rl_bench.isolation.sandbox import Limits, SandboxPolicy, sandbox_mode
from a2rl_bench.workspace import RunPaths
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
    if mechanism == "cgroup" and (probe := procs.freezer_cgroup("probe")) is None:
        pytest.skip("no writable cgroup v2 here")
    elif mechanism == "cgroup":
        procs.remove_cgroup(probe)
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
    from types import SimpleNamespace

    from a2rl_bench.records import RunConfig
    from a2rl_bench.summary.report import run_notes

    notes = run_notes(SimpleNamespace(config=RunConfig(), variant_label="offline", paths=paths), outcome.model_dump())
    assert any(freezer.MECHANISMS[mechanism] in n for n in notes), notes  # the report names how it was stopped


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


# -- plug-in data (issue 43, row 8) --------------------------------------------------------------------------
PLUGIN_CANARY = "PLUGIN-HIDDEN-SPLIT-7f3a"
PEEK = """
import os, sys
pkg = sys.argv[1]
try:
    print("LISTED", sorted(os.listdir(pkg)))
except OSError as e:
    print("UNLISTABLE", type(e).__name__)
try:
    print("READ", open(os.path.join(pkg, "hidden", "test.jsonl")).read())
except OSError as e:
    print("UNREADABLE", type(e).__name__)
"""


@needs_bwrap
def test_an_installed_plugin_tasks_hidden_split_is_unreadable_in_the_sandbox(tmp_path, monkeypatch):
    """Plug-in tasks kept their hidden data readable: the sandbox masked a fixed list of data distributions, and a
    plug-in task's package, bound in with the interpreter's site-packages, showed the agent all its entries.
    A throwaway plug-in (its own site folder, registered through the `a2rl.tasks` entry points, bound into the
    sandbox as site-packages would be) ships a hidden split; inside the real sandbox it cannot be listed or read."""
    from a2rl_bench.benchmarks import TASKS
    from a2rl_bench.isolation.sandbox import TASK_ENTRY_POINTS, plugin_task_paths, wrap

    assert TASK_ENTRY_POINTS == TASKS.group  # the group the registry reads is the one the sandbox masks
    site = tmp_path / "site"
    pkg = site / "toy_hidden_plugin"
    (pkg / "hidden").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "task.py").write_text("Task = None\n")
    (pkg / "hidden" / "test.jsonl").write_text(f'{{"question": "{PLUGIN_CANARY}", "answer": "1"}}\n')
    info = site / "toy_hidden_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-hidden-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[a2rl.tasks]\ntoy-hidden = toy_hidden_plugin.task:Task\n")
    (info / "RECORD").write_text("toy_hidden_plugin/__init__.py,,\ntoy_hidden_plugin/task.py,,\n"
                                 "toy_hidden_plugin/hidden/test.jsonl,,\n")  # fmt: skip
    for path in [tmp_path, site, *site.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the agent's uid, as site-packages are
    monkeypatch.syspath_prepend(str(site))
    assert pkg in plugin_task_paths()
    ws = tmp_path / "runs" / "r1" / "workspace"
    for sub in ("code", "data", "models/base"):
        (ws / sub).mkdir(parents=True)
    argv, env = wrap([sys.executable, "-I", "-S", "-c", PEEK, str(pkg)], {"PATH": "/usr/bin:/bin"},
                     SandboxPolicy(ws, extra_ro=(site,)))  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert "LISTED" in out.stdout or "UNLISTABLE" in out.stdout, out.stderr[-2000:]
    assert PLUGIN_CANARY not in out.stdout, out.stdout
    assert "LISTED []" in out.stdout or "UNLISTABLE" in out.stdout, out.stdout
    assert "UNREADABLE" in out.stdout, out.stdout


# -- snapshot disk (issue 43, row 7) -------------------------------------------------------------------------
MiB = 1 << 20


def _constant(model_dir, weights_hash, spec, device=None):
    from a2rl_bench.records import EvalResult

    return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="constant",
                      weights_hash=weights_hash)  # fmt: skip


def _grader(tmp_path: Path, **ctx):
    from a2rl_bench.grading import GradingContext, GradingService
    from a2rl_bench.records import RunConfig

    paths = RunPaths.for_run(tmp_path / "runs", "snapshot-run")
    paths.create()
    context = GradingContext("snapshot-run", RunConfig(max_submissions=6), paths.workspace, paths.harness_dir,
                             {"validation": 10.0}, **ctx)  # fmt: skip
    return paths, GradingService(context, BudgetClock(600), evaluate=_constant)


def _checkpoint(root: Path, data: bytes, apparent: int) -> None:
    """config.json and a .bin of `apparent` bytes holding `data` at its start and its end, a hole between."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "vocab_size": 8}')
    with open(root / "pytorch_model.bin", "wb") as f:
        f.write(data)
        f.seek(apparent - len(data))
        f.write(data)


def test_a_sparse_checkpoint_stays_sparse_in_the_snapshots(tmp_path):
    """The grader copied a sparse checkpoint densely: 472 KB on the agent's disk became 1.1 GB in
    `harness/snapshots` per submission. Now only the data is copied; the hole stays a hole."""
    import httpx

    from a2rl_bench.grading import GradingServer

    paths, service = _grader(tmp_path)
    ckpt = paths.workspace / "output" / "sparse"
    _checkpoint(ckpt, b"\x01" * 64 * 1024, 256 * MiB)
    assert (ckpt / "pytorch_model.bin").stat().st_blocks * 512 < 4 * MiB  # the agent's disk: sparse
    with GradingServer(service) as server:
        r = httpx.post(f"{server.url}/submit", json={"model_path": "output/sparse", "wait": True},
                       headers={"Authorization": f"Bearer {server.token}"}, timeout=300)  # fmt: skip
    service.close(30)
    assert r.status_code == 200 and r.json()["status"] == "scored", r.text
    copy = paths.harness_dir / "snapshots" / "s1" / "pytorch_model.bin"
    assert copy.stat().st_size == 256 * MiB  # the file as submitted (its hole reads as zeros)
    assert copy.stat().st_blocks * 512 < 4 * MiB, f"the snapshot takes {copy.stat().st_blocks * 512} bytes of disk"
    with open(copy, "rb") as f:
        assert f.read(16) == b"\x01" * 16
        f.seek(128 * MiB)
        assert f.read(16) == b"\0" * 16


def test_snapshots_count_against_a_harness_side_quota_with_a_clear_refusal(tmp_path):
    """20 submissions x 64 GiB could fill the harness disk. The bytes snapshots write are counted against the
    run's snapshot quota: past it a submission is refused (507, one line saying why, nothing spent) and the
    refusal is on the ledger; what fits still goes through."""
    import httpx

    from a2rl_bench.grading import GradingServer
    from a2rl_bench.grading.ledger import Ledger

    paths, service = _grader(tmp_path, snapshot_quota_bytes=int(2.5 * MiB))
    for name, size in (("a", MiB), ("b", MiB), ("c", MiB), ("small", MiB // 4)):
        _checkpoint(paths.workspace / "output" / name, bytes([len(name)]) * (size // 2), size)
    codes, details = [], []
    with GradingServer(service) as server:
        for name in ("a", "b", "c", "small"):
            r = httpx.post(f"{server.url}/submit", json={"model_path": f"output/{name}", "wait": True},
                           headers={"Authorization": f"Bearer {server.token}"}, timeout=300)  # fmt: skip
            codes.append(r.status_code)
            details.append(r.json().get("detail", ""))
    service.close(30)
    assert codes == [200, 200, 507, 200], (codes, details)
    assert "snapshots is used up" in details[2] and "nothing was spent" in details[2], details[2]
    events = [e.detail for e in Ledger(paths.harness_dir / "ledger.jsonl").entries() if e.kind == "event"]
    refused = [d for d in events if d.get("event") == "snapshot-quota-refused"]
    assert len(refused) == 1 and refused[0]["quota_bytes"] == int(2.5 * MiB), events
    assert not list((paths.harness_dir / "snapshots").glob(".pending-*"))
