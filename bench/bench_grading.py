"""Grading latency through the real HTTP API: a fresh evaluation against an identical resubmission (cache hit).

Builds a throwaway run directory with a checkpoint, starts the grading service on 127.0.0.1, submits the
checkpoint with `wait`, then submits a byte-identical copy, and reports both latencies and their ratio.

    python bench/bench_grading.py --model smollm2-135m-instruct --val-limit 8
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl_bench.base_models.registry import resolve_base_model
from a2rl_bench.records import RunConfig
from a2rl_bench.benchmarks import get_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.tiny_model
from tests.tiny_model import build_tiny_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally) or a base-model key / checkpoint dir")
    parser.add_argument("--val-limit", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="a2rl-bench-grading-"))
    model = build_tiny_model(tmp / "tiny") if args.model == "tiny" else resolve_base_model(args.model)
    ws = tmp / "workspace"
    for name in ("v1", "v1-copy"):
        shutil.copytree(model, ws / "output" / name, ignore=shutil.ignore_patterns("a2rl-model.json"))
    get_task("gsm8k").prepare("offline")
    # A split selection of its own, so the first evaluation cannot come from an earlier cache entry.
    config = RunConfig(val_limit=args.val_limit, test_limit=1, budget_s=3600, max_submissions=10,
                       eval_batch_size=16 + int(time.time()) % 7)  # fmt: skip
    ctx = GradingContext("bench", config, ws, tmp / "harness", base_model_dir=model, task=get_task(config.task))
    clock = BudgetClock(config.budget_s)
    clock.start()
    service = GradingService(ctx, clock)
    rows = {}
    with GradingServer(service) as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        for label, path in (("fresh evaluation", "output/v1"), ("identical resubmission", "output/v1-copy")):
            t = time.perf_counter()
            r = httpx.post(server.url + "/submit", json={"model_path": path, "wait": True}, headers=auth, timeout=3600)
            rows[label] = {"seconds": round(time.perf_counter() - t, 3), "cached": r.json()["cached"],
                           "score": r.json()["score"]}  # fmt: skip
    service.close(60)
    ratio = rows["fresh evaluation"]["seconds"] / max(rows["identical resubmission"]["seconds"], 1e-6)
    print(f"model {args.model}, {args.val_limit} validation items")
    print("| submission | latency s | cached | score |\n|---|---|---|---|")
    for label, row in rows.items():
        print(f"| {label} | {row['seconds']} | {row['cached']} | {row['score']} |")
    print(f"cache hit is {ratio:.0f}x faster")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ratio": ratio}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
