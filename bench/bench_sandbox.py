"""Whole-run cost of the sandbox: the same `a2rl run` with `--sandbox off` and `--sandbox auto`, interleaved.

Each pair runs the very same configuration (task, agent, seed, budget, submission cap, evaluation subsets),
once without the sandbox and once inside bubblewrap, in alternating order so that a drifting machine load
hits both sides alike. Reported per side (medians over the pairs): the run's wall time, the agent session's
wall time, and the agent's training throughput inside its budget (examples/s from the reference agents'
`TRAIN_SUMMARY` lines), which shows whether work inside the sandbox is slower even where the budget keeps
the wall time fixed.

    python bench/bench_sandbox.py --pairs 2 --budget 90 --max-submissions 1 --val-limit 4 --test-limit 4
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

from a2rl.paths import a2rl_home

SUMMARY_PREFIX = "TRAIN_SUMMARY "


def run_once(args: argparse.Namespace, sandbox: str, root: Path, index: int) -> dict:
    """One `a2rl run` in a fresh results dir; its wall time, session time, training throughput and label."""
    results = root / f"{index:02d}-{sandbox}" / "a2rl.duckdb"
    cmd = [sys.executable, "-m", "a2rl.cli", "run", "--task", args.task, "--agent", args.agent,
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
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "A2RL_HOME": str(home)})
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
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="a2rl-bench-sandbox-"))
    for name in ("models", "task-data"):
        (a2rl_home() / name).mkdir(parents=True, exist_ok=True)
    rows = []
    for pair in range(args.pairs):
        order = ("off", "auto") if pair % 2 == 0 else ("auto", "off")
        for sandbox in order:
            rows.append(run_once(args, sandbox, root, len(rows)))
            print(json.dumps(rows[-1]), flush=True)

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
