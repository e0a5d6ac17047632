"""The default run's hidden-test grading at batch 16 (before issue 48's fifth pass) against the default batch (by
numeric path: the whole 32-item split at once in CPU fp32), in CPU seconds.

Each grading is a whole evaluation as a run makes it (`evaluate_in_subprocess`: a fresh process, its imports, the
model load, the items), of the default base model (converted into the A2RL_HOME cache by `a2rl run`, or here) on
the gsm8k offline split the default run grades. The settings alternate; CPU s is the evaluation processes' user +
sys time (`getrusage(RUSAGE_CHILDREN)` around the call), which load on the cores stretches less than wall time; the
1-minute load average at each start is printed beside it. The completions of every run are compared with the first
batch-16 run's.

    python bench/bench_default_gradings.py --repeats 2               # test split, 32 items, 16 then default, x2
    python bench/bench_default_gradings.py --split validation --limit 16 --repeats 1
    python bench/bench_default_gradings.py --together --repeats 2  # the baseline's two splits: 2 processes or 1

`--drafting` runs the default run's three evaluations as a run makes them -- the baseline (16 validation + 32
hidden-test items in one process), a grading (16 validation items), the final evaluation (32 hidden-test items) --
with drafted tokens off (`A2RL_CPU_DRAFT=0`) and on, alternating (`--draft-modes 0 1 99`: also drafting in every
step, whatever its rows); completions compared item by item with the first mode's run.

    python bench/bench_default_gradings.py --drafting --repeats 2

`--together` compares the baseline's two splits (16 validation + 32 hidden-test items) as two default evaluations
(a run's baseline before issue 48's sixth pass, and still wherever answers depend on the batch) against ONE
evaluation process (`evaluate_splits_in_subprocess`, what a run's baseline does now on cpu-fp32: one import, one
model load, one prefill of the shared 4-shot prefix, one batch of 48); completions compared item by item.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

SETTINGS = {"batch 16": 16, "default": None}

def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base-model key or checkpoint dir")
    parser.add_argument("--split", default="test", choices=["validation", "test"])
    parser.add_argument("--limit", type=int, default=32, help="items (the default run: 16 validation, 32 test)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting, alternating")
    parser.add_argument("--together", action="store_true", help="the baseline's two splits: two processes or one")
    parser.add_argument("--drafting", action="store_true", help="a run's three evaluations, drafting off and on")
    parser.add_argument("--draft-modes", nargs="+", default=["0", "1"], metavar="A2RL_CPU_DRAFT",
                        help="with --drafting: the values of A2RL_CPU_DRAFT to alternate (0 off, 1 the default, "
                        "N > 1 drafting in steps of at most N rows; the first is the reference)")
    args = parser.parse_args()
    if args.together:
        return together(args.model, args.repeats)
    if args.drafting:
        return drafting(args.model, args.repeats, args.draft_modes)

    from a2rl_bench.base_models.registry import resolve_base_model
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate_in_subprocess

    model_dir = resolve_base_model(args.model)
    task = get_task("gsm8k")
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for name, batch in SETTINGS.items():
            spec = EvalSpec.of(task, "offline", args.split, args.limit, batch_size=batch)
            load = os.getloadavg()[0]
            cpu, wall = children_cpu_s(), time.perf_counter()
            result = evaluate_in_subprocess(model_dir, spec)
            run = {"setting": name, "repeat": repeat + 1, "cpu_s": children_cpu_s() - cpu,
                   "wall_s": time.perf_counter() - wall, "load": load, "batch": result.batch_size,
                   "score": result.score, "n": result.n, "tokens": result.generated_tokens,
                   "completions": [i.completion for i in result.items]}  # fmt: skip
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "completions"}), flush=True)
    table(runs)


def together(model: str, repeats: int) -> None:
    from a2rl_bench.base_models.registry import resolve_base_model
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate_in_subprocess, evaluate_splits_in_subprocess

    model_dir, task = resolve_base_model(model), get_task("gsm8k")
    specs = [EvalSpec.of(task, "offline", s, n) for s, n in (("validation", 16), ("test", 32))]
    rows = []
    for repeat in range(repeats):
        for mode in ("two processes", "one process"):
            load, cpu, wall = os.getloadavg()[0], children_cpu_s(), time.perf_counter()
            if mode == "two processes":
                results = [evaluate_in_subprocess(model_dir, spec) for spec in specs]
            else:
                results = evaluate_splits_in_subprocess(model_dir, specs)
            completions = [i.completion for r in results for i in r.items]
            tokens = sum(r.generated_tokens for r in results)
            rows.append({"mode": mode, "repeat": repeat + 1, "cpu_s": children_cpu_s() - cpu, "load": load,
                         "wall_s": time.perf_counter() - wall, "tokens": tokens, "completions": completions})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "completions"}), flush=True)
    reference = rows[0]["completions"]
    print("\n| mode | run | CPU s | wall s | 1-min load at its start | tokens | completions as the first run's |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        same = sum(a == b for a, b in zip(r["completions"], reference))
        print(f"| {r['mode']} | {r['repeat']} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | {r['load']:.1f} | {r['tokens']} "
              f"| {same}/{len(reference)} |")
    modes = ("two processes", "one process")
    medians = {m: statistics.median(r["cpu_s"] for r in rows if r["mode"] == m) for m in modes}
    print(f"\nmedian CPU s: two processes {medians['two processes']:.1f}, one process {medians['one process']:.1f} "
          f"(n = {repeats} each): {medians['one process'] / medians['two processes']:.2f}x")


def drafting(model: str, repeats: int, modes: list[str]) -> None:
    from a2rl_bench.base_models.registry import resolve_base_model
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate_in_subprocess, evaluate_splits_in_subprocess
    from a2rl_bench.inference.prefix_batching import DRAFT_ENV

    model_dir, task = resolve_base_model(model), get_task("gsm8k")
    validation, test = (EvalSpec.of(task, "offline", s, n) for s, n in (("validation", 16), ("test", 32)))
    evaluations = {"baseline 48": lambda: evaluate_splits_in_subprocess(model_dir, [validation, test]),
                   "grading 16": lambda: [evaluate_in_subprocess(model_dir, validation)],
                   "final 32": lambda: [evaluate_in_subprocess(model_dir, test)]}  # fmt: skip
    rows, reference = [], {}
    for repeat in range(repeats):
        for mode in modes:
            os.environ[DRAFT_ENV] = mode
            for name, evaluate in evaluations.items():
                load, cpu, wall = os.getloadavg()[0], children_cpu_s(), time.perf_counter()
                results = evaluate()
                completions = [i.completion for r in results for i in r.items]
                reference.setdefault(name, completions)
                rows.append({"evaluation": name, "drafting": mode, "repeat": repeat + 1, "load": load,
                             "cpu_s": children_cpu_s() - cpu, "wall_s": time.perf_counter() - wall,
                             "tokens": sum(r.generated_tokens for r in results),
                             "same": sum(a == b for a, b in zip(completions, reference[name])), "n": len(completions)})
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n| evaluation | {DRAFT_ENV} | run | CPU s | wall s | 1-min load at its start | tokens "
          f"| completions as the first {DRAFT_ENV}={modes[0]} run's |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['evaluation']} | {r['drafting']} | {r['repeat']} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} "
              f"| {r['load']:.1f} | {r['tokens']} | {r['same']}/{r['n']} |")
    for measure in ("cpu_s", "wall_s"):
        medians = {(e, m): statistics.median(r[measure] for r in rows if (r["evaluation"], r["drafting"]) == (e, m))
                   for e in evaluations for m in modes}  # fmt: skip
        print(f"\nmedian {measure} (n = {repeats} each; x over {DRAFT_ENV}={modes[0]}): " + "; ".join(
            f"{e} " + ", ".join(f"{m}: {medians[(e, m)]:.1f} ({medians[(e, m)] / medians[(e, modes[0])]:.2f}x)"
                                for m in modes) for e in evaluations))  # fmt: skip


def table(runs: list[dict]) -> None:
    reference = next(r["completions"] for r in runs if r["setting"] == "batch 16")
    print("\n| setting | run | batch recorded | CPU s | wall s | 1-min load at its start | score (n) | tokens "
          "| completions as the first batch-16 run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        same = sum(a == b for a, b in zip(r["completions"], reference))
        print(f"| {r['setting']} | {r['repeat']} | {r['batch']} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} "
              f"| {r['load']:.1f} | {r['score']:.2f} ({r['n']}) | {r['tokens']} | {same}/{len(reference)} |")
    medians = {s: statistics.median(r["cpu_s"] for r in runs if r["setting"] == s) for s in SETTINGS}
    n = {s: sum(r["setting"] == s for r in runs) for s in SETTINGS}
    print(f"\nmedian CPU s: batch 16 {medians['batch 16']:.1f} (n = {n['batch 16']}), default "
          f"{medians['default']:.1f} (n = {n['default']}): {medians['default'] / medians['batch 16']:.2f}x")


if __name__ == "__main__":
    main()
