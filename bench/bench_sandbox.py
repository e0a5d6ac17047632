"""Whole-run cost of the sandbox: the same `a2rl run` with `--sandbox off` and `--sandbox auto`, interleaved.

Each pair runs the very same configuration (task, agent, seed, budget, submission cap, evaluation subsets),
once without the sandbox and once inside bubblewrap, in alternating order so that a drifting machine load
hits both sides alike. Reported per side (medians over the pairs): the run's wall time, the agent session's
wall time, and the agent's training throughput inside its budget (examples/s from the reference agents'
`TRAIN_SUMMARY` lines), which shows whether work inside the sandbox is slower even where the budget keeps
the wall time fixed.

    python bench/bench_sandbox.py --pairs 2 --budget 90 --max-submissions 1 --val-limit 4 --test-limit 4

A budget-bound run hides a slower sandbox (the agent just does less in its budget), and a short round's
throughput is dominated by its first step; `--workload-pairs N` therefore also times a fixed amount of work,
the reference agent's `train_sft.py` for `--workload-steps` steps on the base model and the task's training
data, outside and inside the sandbox (interleaved), from its own `train_s`:

    python bench/bench_sandbox.py --pairs 0 --workload-pairs 3 --workload-steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from a2rl_bench.paths import a2rl_home

SUMMARY_PREFIX = "TRAIN_SUMMARY "


def run_once(args: argparse.Namespace, sandbox: str, root: Path, index: int) -> dict:
    """One `a2rl run` in a fresh results dir; its wall time, session time, training throughput and label."""
    results = root / f"{index:02d}-{sandbox}" / "a2rl.duckdb"
    cmd = [sys.executable, "-m", "a2rl_bench.cli", "run", "--task", args.task, "--agent", args.agent,
           "--base-model", args.base_model, "--budget", str(args.budget), "--seed", "0",
           "--max-submissions", str(args.max_submissions), "--val-limit", str(args.val_limit),
           "--test-limit", str(args.test_limit), "--sandbox", sandbox, "--results", str(results)]  # fmt: skip
    # A fresh evaluation cache per run (shared converted model and task data): every run evaluates its
    # baseline and submissions itself, so no run gets another's evaluations for free.
    home = results.parent / "a2rl-home"
    home.mkdir(parents=True)
    for name in ("models", "task-data"):
        (home / name).symlink_to(a2rl_home() / name, target_is_directory=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "A2RL_HOME": str(home)}, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({sandbox}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run_dir = next((results.parent / "runs").iterdir())
    with duckdb.connect(str(results), read_only=True) as db:
        phases = json.loads(db.execute("SELECT phase_seconds_json FROM runs").fetchone()[0])
    log = (run_dir / "harness" / "agent.log").read_text(errors="replace").splitlines()
    summaries = [json.loads(line.split(SUMMARY_PREFIX, 1)[1]) for line in log if SUMMARY_PREFIX in line]
    examples = sum(s.get("examples_seen", s.get("completions_seen", 0)) for s in summaries)
    train_s = sum(s.get("train_s", 0.0) for s in summaries)
    report = (run_dir / "harness" / "report.md").read_text()
    label = next((line.strip("- ") for line in report.splitlines() if "Sandbox:" in line), "")
    return {"sandbox": sandbox, "wall_s": round(wall, 1), "session_s": round(phases["agent_session"], 1),
            "examples_per_s": round(examples / train_s, 3) if train_s else None, "rounds": len(summaries),
            "label": label}  # fmt: skip


def workload_once(ws: Path, sandboxed: bool, steps: int, index: int) -> float:
    """Seconds of training steps of one fixed `train_sft.py` job, run in `ws`, in the sandbox or not."""
    from a2rl_bench.isolation.sandbox import SandboxPolicy, wrap

    cmd = [sys.executable, "code/train_sft.py", "--init", "models/base", "--out", f"output/w{index}",
           "--data", "data/train.jsonl", "--max-steps", str(steps), "--seed", "0"]  # fmt: skip
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if sandboxed:
        cmd, env = wrap(cmd, env, SandboxPolicy(ws))
    proc = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if SUMMARY_PREFIX in line]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"workload failed (sandboxed={sandboxed}):\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return json.loads(lines[-1].split(SUMMARY_PREFIX, 1)[1])["train_s"]


def workload(args: argparse.Namespace, root: Path) -> None:
    """Fixed work outside and inside the sandbox, interleaved; prints the medians and their ratio."""
    import shutil

    from a2rl_bench.base_models.registry import resolve_base_model
    from a2rl_bench.benchmarks import get_task

    ws = root / "workload-ws"
    for sub in ("models", "data", "code", "output"):
        (ws / sub).mkdir(parents=True, exist_ok=True)
    shutil.copytree(resolve_base_model(args.base_model), ws / "models" / "base")
    shutil.copy(get_task(args.task).prepare("offline").public_dir / "train.jsonl", ws / "data" / "train.jsonl")
    shutil.copy(Path(__file__).resolve().parents[1] / "agents" / "reference_sft" / "train_sft.py", ws / "code")
    for path in [ws, *ws.rglob("*")]:  # readable by the agent uid, as the harness's own workspaces are
        path.chmod(0o755 if path.is_dir() else 0o644)
    times: dict[bool, list[float]] = {False: [], True: []}
    for pair in range(args.workload_pairs):
        for sandboxed in ((False, True) if pair % 2 == 0 else (True, False)):
            times[sandboxed].append(workload_once(ws, sandboxed, args.workload_steps, 2 * pair + sandboxed))
            print(json.dumps({"sandboxed": sandboxed, "train_s": times[sandboxed][-1]}), flush=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"\nfixed work: train_sft.py, {args.workload_steps} steps, {args.base_model}, {args.workload_pairs} pairs")
    print("| training seconds (median) | sandbox off | sandbox on | on / off |\n|---|---|---|---|")
    print(f"| train_s | {off:.1f} | {on:.1f} | {on / off:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--agent", default="reference-sft")
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--budget", type=float, default=90)
    parser.add_argument("--max-submissions", type=int, default=1)
    parser.add_argument("--val-limit", type=int, default=4)
    parser.add_argument("--test-limit", type=int, default=4)
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--workload-pairs", type=int, default=0, help="pairs of fixed training jobs (0: none)")
    parser.add_argument("--workload-steps", type=int, default=8)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="a2rl-bench-sandbox-"))
    root.chmod(0o755)  # a root harness runs the agent under its own uid, which must reach the workspace
    for name in ("models", "task-data"):
        (a2rl_home() / name).mkdir(parents=True, exist_ok=True)
    rows = []
    for pair in range(args.pairs):
        order = ("off", "auto") if pair % 2 == 0 else ("auto", "off")
        for sandbox in order:
            rows.append(run_once(args, sandbox, root, len(rows)))
            print(json.dumps(rows[-1]), flush=True)

    if args.workload_pairs:
        workload(args, root)
    if not rows:
        return

    def median(side: str, key: str) -> float | None:
        values = [r[key] for r in rows if r["sandbox"] == side and r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    print(f"\n{args.task} / {args.agent} / {args.base_model}, budget {args.budget:g} s, {args.pairs} pairs")
    print("| metric (median) | sandbox off | sandbox on | on / off |\n|---|---|---|---|")
    for key in ("wall_s", "session_s", "examples_per_s"):
        off, on = median("off", key), median("auto", key)
        ratio = f"{on / off:.3f}" if off and on else "n/a"
        print(f"| {key} | {off} | {on} | {ratio} |")
    print(f"sandbox on: {next(r['label'] for r in rows if r['sandbox'] == 'auto')}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
