"""CPU grading of the default run before/after shared-prefix reuse: same evaluation process, same items.

The default run grades GSM8K (offline) validation with 16 items, batch 16, through `evaluate_in_subprocess`
(the grader's own path: one evaluation process, OMP_WAIT_POLICY=PASSIVE). "before" forces plain transformers
`generate` (A2RL_DECODE_ENGINE=generate), which re-reads the ~700-token 4-shot exemplars with every item;
"after" is the default (`auto`), which prefills the exemplars once per evaluation and decodes the rest over a
static cache. Runs alternate (before, after, before, after, ...) so machine load hits both alike; completions
and scores must be identical.

    python bench/bench_prefix_reuse.py --model smollm2-135m-instruct --limit 16 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base-model key, checkpoint dir or 'tiny'")
    parser.add_argument("--limit", type=int, default=16, help="validation items (the default run grades 16)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from a2rl_bench.inference.evaluation import EvalSpec, evaluate_in_subprocess
    from a2rl_bench.base_models.registry import resolve_base_model

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.tiny_model
    from tests.tiny_model import build_tiny_model
    from a2rl_bench.benchmarks import get_task

    if args.model == "tiny":
        model = build_tiny_model(Path(tempfile.mkdtemp(prefix="a2rl-bench-prefix-")) / "tiny")
    else:
        model = resolve_base_model(args.model)
    get_task("gsm8k").prepare("offline")
    spec = EvalSpec.of(get_task("gsm8k"), "offline", "validation", args.limit, batch_size=args.batch_size)
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    results = {}
    for _ in range(args.repeats):
        for label, engine in (("before", "generate"), ("after", "auto")):
            os.environ["A2RL_DECODE_ENGINE"] = engine
            result = evaluate_in_subprocess(model, spec)
            seconds[label].append(result.duration_s)
            results[label] = result
            print(json.dumps({"mode": label, "engine": engine, "seconds": round(result.duration_s, 2),
                              "score": result.score, "generated_tokens": result.generated_tokens}), flush=True)
    before, after = results["before"], results["after"]
    identical = [a.completion for a in after.items] == [b.completion for b in before.items]
    med = {k: statistics.median(v) for k, v in seconds.items()}
    summary = {
        "model": str(args.model), "items": before.n, "repeats": args.repeats, "cpus": os.cpu_count(),
        "before_s": seconds["before"], "after_s": seconds["after"],
        "speedup_median": round(med["before"] / med["after"], 2),
        "score_before": before.score, "score_after": after.score,
        "completions_identical": identical,
    }  # fmt: skip
    print("\n| mode | engine | seconds (each run) | median | score | completions |")
    print("|---|---|---|---|---|---|")
    for label, engine in (("before", "generate"), ("after", "auto")):
        runs = ", ".join(f"{s:.1f}" for s in seconds[label])
        print(f"| {label} | {engine} | {runs} | {med[label]:.1f} | {results[label].score:.3f} | "
              f"{'identical' if identical else 'DIFFER'} |")
    print(f"\nspeed-up (median): {summary['speedup_median']}x on {before.n} items; n={args.repeats} runs each")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
