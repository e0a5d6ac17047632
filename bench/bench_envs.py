"""Interactive evaluation throughput: episodes/s of lockstep (batched) against sequential ReAct episodes.

Usage (from the repository root):  python bench/bench_envs.py --episodes 8 --max-steps 4 --max-new-tokens 8
Runs each interactive task twice on the same goals with the same model: all episodes in lockstep (one batched
`generate` per step) and one episode at a time (batch size 1); checks that both give the same transcripts and
prints episodes/s. `--model` defaults to a freshly built tiny model (CPU-friendly); pass a checkpoint directory
for real numbers. Also times the environments alone under their oracle policies (no model).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _oracle_steps_per_s(task_id: str, n: int) -> float:
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.benchmarks.envs.searchqa import oracle_actions as qa_oracle
    from a2rl_bench.benchmarks.envs.shop import oracle_actions as shop_oracle

    task = get_task(task_id)
    goals = task.load_split("offline", "validation")[:n]
    make_env = task.make_env("offline")
    steps, start = 0, time.perf_counter()
    for goal in goals:
        env = make_env()
        env.reset(goal)
        actions = {"webshop": shop_oracle, "deepsearchqa": qa_oracle}.get(task_id, lambda g: g["walkthrough"])(goal)
        for action in actions:
            env.step(action)
            steps += 1
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--tasks", default="webshop,deepsearchqa,alfworld")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from a2rl_bench.inference.generation import load_model
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.tiny_model
    from tests.tiny_model import build_tiny_model
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.benchmarks.envs.task import ModelPolicy

    torch.set_num_threads(args.threads)
    model_dir = args.model or build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    model = load_model(model_dir)
    rows = []
    for task_id in args.tasks.split(","):
        base = get_task(task_id)
        decoding = dataclasses.replace(base.decoding, max_new_tokens=args.max_new_tokens)
        task = dataclasses.replace(base, max_steps=args.max_steps, decoding=decoding)
        goals = task.load_split("offline", "validation", args.episodes)
        start = time.perf_counter()
        batched = task.play(goals, ModelPolicy(model, task.decoding, batch_size=len(goals)))
        t_batched = time.perf_counter() - start
        start = time.perf_counter()
        sequential = [task.play([g], ModelPolicy(model, task.decoding, batch_size=1))[0] for g in goals]
        t_sequential = time.perf_counter() - start
        same = [r.detail["turns"] for r in batched] == [r.detail["turns"] for r in sequential]
        rows.append(
            {
                "task": task_id,
                "episodes": len(goals),
                "max_steps": args.max_steps,
                "max_new_tokens": args.max_new_tokens,
                "batched_episodes_per_s": round(len(goals) / t_batched, 3),
                "sequential_episodes_per_s": round(len(goals) / t_sequential, 3),
                "speedup": round(t_sequential / t_batched, 2),
                "same_transcripts": same,
                "env_oracle_steps_per_s": round(_oracle_steps_per_s(task_id, 100)),
            }
        )
        print(json.dumps(rows[-1]))
    report = {
        "model": str(model_dir),
        "threads": args.threads,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
