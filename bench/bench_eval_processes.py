"""The default run's gradings in one process against split over the machine's CPUs (one torch thread each).

The baseline, the final grading and the gradings of submissions run while no agent runs (the agent is frozen
while it is graded), so an evaluation may use every core: `evaluate_in_subprocess` splits its items over
`A2RL_EVAL_PROCESSES` processes (default: the CPUs it may use, at most one per 8 items). "one" forces one process
(torch's default threads, as before); "split" is the default. Runs alternate (one, split, one, split, ...) so
machine load hits both alike; each run's wall seconds and its processes' CPU seconds (imports and model load
included) are printed; completions and scores must be identical.

    python bench/bench_eval_processes.py --split validation --limit 16 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base-model key or checkpoint dir")
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--limit", type=int, default=16, help="items (the default run grades 16 / 32)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from a2rl_bench.base_models.registry import resolve_base_model
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference.evaluation import EVAL_PROCESSES_ENV, EvalSpec, evaluate_in_subprocess

    model = resolve_base_model(args.model)
    get_task("gsm8k").prepare("offline")
    spec = EvalSpec.of(get_task("gsm8k"), "offline", args.split, args.limit)
    cpus = len(os.sched_getaffinity(0))
    runs: dict[str, list[dict]] = {"one": [], "split": []}
    results = {}
    for _ in range(args.repeats):
        for label, processes in (("one", 1), ("split", cpus)):
            os.environ[EVAL_PROCESSES_ENV] = str(processes)
            load, cpu, wall = os.getloadavg()[0], children_cpu_s(), time.perf_counter()
            result = evaluate_in_subprocess(model, spec)
            row = {"mode": label, "processes": processes, "wall_s": round(time.perf_counter() - wall, 1),
                   "cpu_s": round(children_cpu_s() - cpu, 1), "load_1min": round(load, 1), "score": result.score,
                   "generated_tokens": result.generated_tokens}  # fmt: skip
            runs[label].append(row)
            results[label] = result
            print(json.dumps(row), flush=True)
    one, split = results["one"], results["split"]
    identical = [a.completion for a in split.items] == [b.completion for b in one.items]
    print(f"\n{one.n} {args.split} items, n = {args.repeats} runs each, {cpus} CPUs")
    print("| mode | processes | wall s (each run) | wall median | CPU s (each run) | CPU median | score "
          "| completions |")
    print("|---|---|---|---|---|---|---|---|")
    for label, rows in runs.items():
        walls, cpu_s = [r["wall_s"] for r in rows], [r["cpu_s"] for r in rows]
        print(f"| {label} | {rows[0]['processes']} | {', '.join(map(str, walls))} | {statistics.median(walls):.1f} | "
              f"{', '.join(map(str, cpu_s))} | {statistics.median(cpu_s):.1f} | {results[label].score:.2f} | "
              f"{'identical' if identical else 'DIFFER'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "completions_identical": identical}, indent=1))


if __name__ == "__main__":
    main()
