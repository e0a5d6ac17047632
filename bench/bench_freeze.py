"""What a grading freeze costs the harness, and what the agent gets done during one (issue 43).

A hostile agent (tests/freeze_agent.py) runs in the real sandbox under the real `run_agent`: about 1,000
processes (vfork parents in uninterruptible sleep with their blocked children, sleepers, busy loops), a pid
hopper sending kill(-1, SIGCONT) from fresh pids, and a worker, the youngest process, that records its longest
gap between two steps. The harness pauses the clock as the grader does, holds the freeze, and resumes.
Reported per mechanism and round: the freeze step's harness time (`clock.pause()` returning), whether the stop
was confirmed, the longest time a reader of the clock (the agent's `/budget`) waited during the freeze, the
worker's steps while frozen and its longest gap (a worker that escaped shows a gap far below the freeze).

    python bench/bench_freeze.py --rounds 3 --freeze-s 5

Mechanisms: cgroup (v2 freezer), uid (kill(-1, SIGSTOP) as the agent's uid), tree (SIGSTOP to the listed
processes: the weaker fallback) and before (main 77516f7's clock and freezer, loaded from git).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import a2rl_bench.agents.base as agent_base  # noqa: E402
from a2rl_bench.agents.base import Agent, AgentEnv, run_agent  # noqa: E402
from a2rl_bench.grading import BudgetClock  # noqa: E402
from a2rl_bench.isolation import freezer, procs  # noqa: E402
from a2rl_bench.isolation.sandbox import Limits, SandboxPolicy, agent_uid  # noqa: E402
from a2rl_bench.workspace import RunPaths  # noqa: E402

AGENT = ROOT / "tests" / "freeze_agent.py"
BEFORE = "77516f7"


def _old_module(name: str, path: str):
    """A module of main `BEFORE`, loaded from git under its own name."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:{path}"], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


class Stoppable:
    done: threading.Event

    @property
    def expired(self) -> bool:
        return self.done.is_set() or self.remaining() <= 0.0


def _clock(before: bool):
    base = _old_module("old_clock", "a2rl_bench/grading/clock.py").BudgetClock if before else BudgetClock
    cls = type("BenchClock", (Stoppable, base), {})
    clock = cls(3600.0)
    clock.done = threading.Event()
    return clock


class FreezeAgent(Agent):
    id = "freeze-bench"

    def __init__(self, args: list[str]):
        self.args = args

    def install(self, workspace: Path) -> None:
        pass

    def command(self, workspace: Path) -> list[str]:
        return [sys.executable, f"code/{AGENT.name}", *self.args]


def _read(path: Path) -> tuple[int, int, int, float]:
    try:
        raw = path.read_bytes()[:32]
    except OSError:
        return 0, 0, 0, 0.0
    return struct.unpack("<QQQd", raw) if len(raw) == 32 else (0, 0, 0, 0.0)


def _reset_gap(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(24)
        f.write(struct.pack("<d", 0.0))


def one_round(mechanism: str, args: argparse.Namespace, root: Path, index: int) -> dict:
    paths = RunPaths.for_run(root / "runs", f"{mechanism}-{index}")
    paths.create()
    (paths.workspace / "code" / AGENT.name).write_text(AGENT.read_text())
    counter = paths.workspace / "counter.bin"
    policy = SandboxPolicy(paths.workspace, limits=Limits(nproc=4096))
    uid = agent_uid(policy)
    made = {
        "cgroup": lambda pid, cgroup, uid: freezer.AgentFreezer(pid, cgroup, uid),
        "uid": lambda pid, cgroup, uid: freezer.AgentFreezer(pid, None, uid),
        "tree": lambda pid, cgroup, uid: freezer.AgentFreezer(pid),
        "before": lambda pid, cgroup, uid: _old_module("old_freezer",
                                                       "a2rl_bench/isolation/freezer.py").AgentFreezer(pid),
    }[mechanism]
    agent_base.AgentFreezer = made
    clock = _clock(before=mechanism == "before")
    env = AgentEnv("gsm8k", "tiny", paths.workspace, "http://127.0.0.1:9", "token", seed=0)
    agent = FreezeAgent([counter.name, "--hop", "--vfork", str(args.vfork), "--sleepers", str(args.sleepers),
                         "--spinners", str(args.spinners)])  # fmt: skip
    out: dict = {}
    session = threading.Thread(target=lambda: out.update(outcome=run_agent(
        agent, env, clock, paths.harness_dir / "agent.log", grace_s=1.0, poll_s=0.2, sandbox=policy)))
    session.start()
    try:
        deadline = time.monotonic() + 300
        while _read(counter)[2] < args.vfork or _read(counter)[0] == 0:
            assert time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.2)
        time.sleep(2.0)  # sleepers and spinners in place
        n_procs = sum(1 for p in procs.all_procs(with_uid=True) if p.uid == uid)
        _reset_gap(counter)
        waits: list[float] = []
        pausing = threading.Event()

        def read_clock() -> None:  # the agent's /budget, as the grader answers it
            while not pausing.is_set():
                time.sleep(0.001)
            while pausing.is_set():
                t = time.monotonic()
                clock.elapsed()
                waits.append(time.monotonic() - t)
                time.sleep(0.01)

        reader = threading.Thread(target=read_clock)
        reader.start()
        pausing.set()
        began = time.monotonic()
        clock.pause()
        stop_s = time.monotonic() - began
        frozen_at = _read(counter)
        time.sleep(args.freeze_s)
        still = _read(counter)
        pausing.clear()
        reader.join()
        clock.resume()
        time.sleep(1.0)
        gap = _read(counter)[3]
    finally:
        clock.done.set()
        session.join(timeout=300)
    rule = out["outcome"].clock_rule or {}
    assert rule.get("mechanism", "before") == {"before": "before"}.get(mechanism, mechanism), rule
    return {"mechanism": mechanism, "processes": n_procs, "stop_s": round(stop_s, 3),
            "confirmed": rule.get("unconfirmed", 0) == 0, "clock_read_wait_max_s": round(max(waits, default=0), 3),
            "worker_steps_frozen": still[0] - frozen_at[0], "hops_frozen": still[1] - frozen_at[1],
            "worker_longest_gap_s": round(gap, 3), "freeze_s": round(stop_s + args.freeze_s, 3)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--freeze-s", type=float, default=5.0)
    ap.add_argument("--vfork", type=int, default=300, help="vfork parents (each with its blocked child)")
    ap.add_argument("--sleepers", type=int, default=390)
    ap.add_argument("--spinners", type=int, default=4)
    ap.add_argument("--mechanisms", default="cgroup,uid,tree,before")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-freeze-") as tmp:
        for i in range(args.rounds):
            for mechanism in args.mechanisms.split(","):
                row = one_round(mechanism, args, Path(tmp), i)
                print(json.dumps(row), flush=True)
                rows.append(row)
    for mechanism in args.mechanisms.split(","):
        mine = [r for r in rows if r["mechanism"] == mechanism]
        stops = [r["stop_s"] for r in mine]
        print(f"{mechanism}: n={len(mine)} processes {statistics.median(r['processes'] for r in mine):.0f}, "
              f"stop_s median {statistics.median(stops):.3f} max {max(stops):.3f}, "
              f"confirmed {sum(r['confirmed'] for r in mine)}/{len(mine)}, clock read wait max "
              f"{max(r['clock_read_wait_max_s'] for r in mine):.3f} s, worker steps frozen "
              f"{[r['worker_steps_frozen'] for r in mine]}, longest gap {[r['worker_longest_gap_s'] for r in mine]} "
              f"(freeze {[r['freeze_s'] for r in mine]})")  # fmt: skip


if __name__ == "__main__":
    main()
