"""Coverage of the 95% intervals when every seed shares one hidden test set (the table in BENCHMARKS.md).

Usage (from the repository root):  python bench/bench_coverage.py --reps 4000
For k = 1 (one run's item-level interval), 2, 3 and 5 seeds, n = 16, 32 and 134 items, over the scenario grid of
`a2rl.analysis.coverage.scenarios` (base rate 2/30/60/95%, true Δ 0 or +3/+10/-10 points, item correlation 0.5/0.9,
seed spread τ 0/0.15/0.3), and a stress grid with τ = 0.6: the smallest and the mean coverage over scenarios,
the share of Δ = 0 settings that got a verdict (improved or worse), and the median interval width. Beside a2rl's
intervals, the two the leaderboard used at 2d3f374 (t over seeds; item bootstrap pooled over seeds).
Writes `<out>/bench_coverage.json` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from a2rl.summary.intervals import t975
from a2rl.analysis.coverage import (
    covers,
    scenarios,
    seeds_items_bounds,
    simulate,
    single_run_bounds,
    t_over_seeds_bounds,
)

KS = (1, 2, 3, 5)
NS = (16, 32, 134)


def pooled_bootstrap_bounds(d, n_boot: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """2d3f374's pooled item-level interval: per-item mean Δ over seeds, expanded-percentile bootstrap over items;
    no interval (NaN, never covering) when every item moved alike."""
    per_item = (d.final - d.base).mean(axis=-2)  # reps × n
    reps, n = per_item.shape
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    alpha = 0.5 * math.erfc(math.sqrt(n / (n - 1)) * t975(n - 1) / math.sqrt(2))
    low, high = np.empty(reps), np.empty(reps)
    for i in range(0, reps, 200):
        means = per_item[i:i + 200][:, idx].mean(axis=-1)
        low[i:i + 200], high[i:i + 200] = np.quantile(means, [alpha, 1 - alpha], axis=-1)
    flat = np.ptp(per_item, axis=-1) == 0
    return np.where(flat, np.nan, low), np.where(flat, np.nan, high)


def cell(k: int, n: int, grid, reps: int, rng, method: str) -> dict:
    cov, width, verdicts = {"zero": [], "nonzero": []}, [], []
    for s in grid:
        d = simulate(rng, reps, k, n, s)
        if method == "a2rl" and k == 1:
            low, high = single_run_bounds(d)
            truth = d.run_truth
        elif method == "a2rl":
            (low, high), truth = seeds_items_bounds(d), s.delta
        elif method == "t over seeds (2d3f374)":
            (low, high), truth = t_over_seeds_bounds(d), s.delta
        else:
            (low, high), truth = pooled_bootstrap_bounds(d), s.delta
        hit = covers(low, high, truth)
        cov["zero" if s.delta == 0 else "nonzero"].append(float(hit.mean()))
        width.append(float(np.nanmedian(high - low)) if np.isfinite(high - low).any() else math.nan)
        if s.delta == 0:
            verdicts.append(float(((low > 0) | (high < 0)).mean()))
    row = {"k": k, "n": n, "method": method, "scenarios": len(grid)}
    for key, values in cov.items():
        row[f"min_cov_{key}"], row[f"mean_cov_{key}"] = round(min(values), 3), round(float(np.mean(values)), 3)
    row["verdict_rate_at_0_max"] = round(max(verdicts), 3)
    row["median_width_points"] = round(100 * float(np.nanmean(width)), 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=4000, help="replications per scenario and cell")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--out", default=None, help="directory for bench_coverage.json (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="a2rl-bench-coverage-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    rows = []
    grids = {"main": scenarios(), "stress (τ = 0.6)": scenarios(tau=(0.6,))}
    for grid_name, grid in grids.items():
        for k in KS:
            methods = ["a2rl"] + (["t over seeds (2d3f374)", "pooled bootstrap (2d3f374)"] if k > 1 else [])
            for method in methods:
                for n in NS:
                    reps = args.reps if method != "pooled bootstrap (2d3f374)" else min(args.reps, 1000)
                    rows.append(cell(k, n, grid, reps, rng, method) | {"grid": grid_name, "reps": reps})
                    print(json.dumps(rows[-1]), flush=True)
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, "reps": args.reps,
              "seed": args.seed, "seconds": round(time.perf_counter() - start, 1), "rows": rows}  # fmt: skip
    (out / "bench_coverage.json").write_text(json.dumps(report, indent=2))
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    """One line per grid, k and n: a2rl's interval, then the two of 2d3f374 (smallest coverage over scenarios)."""
    old = {(r["grid"], r["k"], r["n"], r["method"]): r for r in rows if r["method"] != "a2rl"}
    lines = ["| grid | seeds k | items n | a2rl: coverage Δ = 0, min / mean | a2rl: coverage Δ ≠ 0, min / mean | "
             "a2rl: verdict when Δ = 0, max | a2rl: median width (points) | 2d3f374 t over seeds: min coverage "
             "Δ = 0 / Δ ≠ 0 | 2d3f374 pooled bootstrap: min coverage Δ = 0 / Δ ≠ 0 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["method"] == "a2rl"):
        def was(method: str) -> str:
            o = old.get((r["grid"], r["k"], r["n"], method))
            return f"{o['min_cov_zero']:.3f} / {o['min_cov_nonzero']:.3f}" if o else "—"

        verdict = "—" if r["k"] == 1 else f"{r['verdict_rate_at_0_max']:.3f}"  # k = 1: the target is the run's Δ
        lines.append(f"| {r['grid']} | {r['k'] if r['k'] > 1 else '1 (one run)'} | {r['n']} | "
                     f"{r['min_cov_zero']:.3f} / {r['mean_cov_zero']:.3f} | {r['min_cov_nonzero']:.3f} / "
                     f"{r['mean_cov_nonzero']:.3f} | {verdict} | {r['median_width_points']:.1f} | "
                     f"{was('t over seeds (2d3f374)')} | {was('pooled bootstrap (2d3f374)')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
