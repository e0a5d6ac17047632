"""Bytes the results store writes for N runs, written the way the live flow writes them: before and after.

Each run: start, two baseline evaluations (16 + 32 items), S submissions (queued, scored, evaluated on 16 items),
the final evaluation (32 items), then the summary rows (leak audit, process metrics, route labels, LLM calls, tool
calls, resource samples, the final row).

- before: DuckDB's default 256 KB blocks and one connection (so one checkpoint) per call, as the store did;
- after:  a store created with `a2rl_bench.store.results.STORE_BLOCK_SIZE` blocks, and the summary rows in one
          `ResultsStore.batch()` (one connection, one transaction, one checkpoint).

Bytes are the process's `write_bytes` (block I/O) and `wchar` (bytes passed to write calls) from /proc/self/io.
Usage (repository root): python bench/bench_store_writes.py --runs 1000 [--before-runs 1000]
`--before-runs` smaller than `--runs` measures the old way on fewer runs and scales it linearly (said so; the real
cost grows faster, since each checkpoint rewrites indexes that grow with the store).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import duckdb

from a2rl_bench.records import EvalResult, ItemResult, LedgerEntry, RunConfig, RunSummary
from a2rl_bench.store.results import ResultsStore


def _io() -> tuple[int, int]:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["write_bytes"]), int(fields["wchar"])


def _eval(split: str, n: int, seed: int) -> EvalResult:
    items = [ItemResult(item_id=f"{split}-{i}", completion="", prediction=None, target="", correct=(i + seed) % 3 == 0,
                        detail={"generated_tokens": 50}) for i in range(n)]  # fmt: skip
    return EvalResult(task="gsm8k", split=split, score=100 * sum(i.correct for i in items) / n, n=n,
                      n_correct=sum(i.correct for i in items), evaluator_id="gsm8k/bench", items=items)


def write_run(store: ResultsStore, k: int, subs: int, batched: bool) -> None:
    run_id, config = f"run-{k}", RunConfig(seed=k, test_limit=32)
    store.start_run(run_id, config, None, "offline")
    for split, n in (("validation", 16), ("test", 32)):
        store.record_evaluation(run_id, f"baseline-0-{split}", "baseline", _eval(split, n, 0))
    for sid in range(1, subs + 1):
        entry = dict(seq=sid, kind="submission", run_id=run_id, submission_id=sid, split="validation",
                     model_path=f"output/v{sid}", weights_hash=f"h{k}-{sid}", agent_elapsed_s=10.0 * sid)
        store.record_submission(run_id, LedgerEntry(**entry, status="queued"))
        store.record_submission(run_id, LedgerEntry(**entry, status="scored", score=20.0 + sid))
        store.record_evaluation(run_id, f"submission-{sid}-validation", "submission", _eval("validation", 16, sid),
                                submission_id=sid)
    store.record_evaluation(run_id, f"final-{subs}-test", "final", _eval("test", 32, subs), submission_id=subs)
    summary = RunSummary(
        run_id=run_id, config=config, status="completed", protocol="heldout", variant_label="offline",
        baseline_val=10.0, baseline_test=12.0, best_val=20.0, best_submission_id=subs, final_submission_id=subs,
        final_test=15.0, delta_test=3.0, n_submissions=subs, n_scored=subs, agent_seconds=100.0,
        grading_seconds=10.0, wall_seconds=120.0,
    )  # fmt: skip
    metrics = {f"metric_{i}": float(i) for i in range(40)} | {"failure_class": "none"}
    calls = [{"seq": i, "model": "m", "input_tokens": 1000, "output_tokens": 100, "cost_usd": 0.01}
             for i in range(30)]  # fmt: skip
    tools = [{"seq": i, "tool": "bash", "ok": True, "duration_s": 1.0} for i in range(30)]
    samples = [{"seq": i, "elapsed_s": float(i), "n_procs": 3, "rss_bytes": 10**9} for i in range(10)]

    def summary_rows() -> None:
        store.record_metrics(run_id, {"leaked_items": 0})
        store.record_metrics(run_id, metrics)
        store.record_routes(run_id, {sid: "SFT" for sid in range(1, subs + 1)})
        store.replace_run_rows("llm_calls", run_id, calls)
        store.replace_run_rows("tool_calls", run_id, tools)
        store.replace_run_rows("resources", run_id, samples)
        store.finish_run(summary)

    if batched:
        with store.batch():
            summary_rows()
    else:
        summary_rows()


def measure(runs: int, subs: int, after: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="a2rl-bench-store-") as tmp:
        path = Path(tmp) / "results.duckdb"
        if not after:  # an existing file keeps its block size: DuckDB's default, as stores were made before
            duckdb.connect(str(path)).close()
        store = ResultsStore(path)
        w0, c0, t0 = *_io(), time.perf_counter()
        for k in range(runs):
            write_run(store, k, subs, batched=after)
        w1, c1, t1 = *_io(), time.perf_counter()
        t2 = time.perf_counter()
        n = int(store.query("SELECT count(*) AS n FROM runs WHERE status = 'completed'")["n"][0])
        read_s = time.perf_counter() - t2
        return {"runs": runs, "write_bytes": w1 - w0, "wchar": c1 - c0, "seconds": round(t1 - t0, 1),
                "store_bytes": path.stat().st_size, "rows_ok": n == runs, "one_read_s": round(read_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--before-runs", type=int, default=None, help="runs for the old way (default: --runs)")
    parser.add_argument("--subs", type=int, default=4, help="submissions per run")
    args = parser.parse_args()
    after = measure(args.runs, args.subs, after=True)
    before = measure(args.before_runs or args.runs, args.subs, after=False)
    scale = args.runs / before["runs"]
    result = {
        "machine": f"{platform.node()} ({os.cpu_count()} cpus), {platform.platform()}",
        "runs": args.runs, "subs_per_run": args.subs, "after": after, "before": before,
        "before_scaled_to_runs": {k: round(before[k] * scale) for k in ("write_bytes", "wchar")},
        "write_bytes_ratio": round(before["write_bytes"] * scale / max(after["write_bytes"], 1), 1),
        "wchar_ratio": round(before["wchar"] * scale / max(after["wchar"], 1), 1),
    }  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
