"""Coverage of the 95% intervals when every seed shares one hidden test set (the table in BENCHMARKS.md).

Usage (from the repository root):  python bench/bench_coverage.py --reps 4000
For k = 1 (one run's item-level interval), 2, 3 and 5 seeds, n = 16, 32 and 134 items, over the scenario grid of
`a2rl_bench.analysis.coverage.scenarios` (base rate 2/30/60/95%, true Δ 0 or +3/+10/-10 points, item correlation
0.5/0.9, seed spread τ 0/0.15/0.3), and a stress grid with τ = 0.6: the smallest and the mean coverage over scenarios,
the share of Δ = 0 settings that got a verdict (improved or worse), and the median interval width. Beside a2rl's
intervals, the two the leaderboard used at 2d3f374 (t over seeds; item bootstrap pooled over seeds).
Writes `<out>/bench_coverage.json` and prints a markdown table.

With `--spread` (issue 47): a2rl's setting interval for k = 2..10 seeds, n = 32 and 134 items, at seed spreads τ = 0
to 0.6 (seeds whose own Δs differ by up to about 20 points), every scenario of the grid per cell; and the power at
Δ = +10 with k = 10 where one seed misses a few items. Writes `<out>/bench_coverage_spread.json`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from a2rl_bench.summary.intervals import binomial_var, crossed, t975
from a2rl_bench.analysis.coverage import (
    Scenario,
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


SPREAD_TAUS = (0.0, 0.15, 0.3, 0.45, 0.6)
"""Seed-to-seed spread on the probit scale: 0.6 gives seeds whose own Δs differ by up to about 20 points (sd)."""
SPREAD_KS = tuple(range(2, 11))
SPREAD_NS = (32, 134)


def spread_cell(k: int, n: int, tau: float, reps: int, rng) -> dict:
    """a2rl's setting interval over every scenario of one seed spread: the smallest coverage (Δ = 0 and Δ ≠ 0), the
    largest share of false verdicts where Δ = 0, the median width and the seeds' measured spread (sd of their own Δ,
    points; smallest and largest over scenarios)."""
    cov, false, width, spread = {"zero": [], "nonzero": []}, [], [], []
    for s in scenarios(tau=(tau,)):
        d = simulate(rng, reps, k, n, s)
        low, high = seeds_items_bounds(d)
        cov["zero" if s.delta == 0 else "nonzero"].append(float(covers(low, high, s.delta).mean()))
        if s.delta == 0:
            false.append(float(((low > 0) | (high < 0)).mean()))
        width.append(float(np.median(high - low)))
        spread.append(100 * float(d.run_truth.std(axis=-1, ddof=1).mean()))
    return {"k": k, "n": n, "tau": tau, "reps": reps, "spread_points": [round(min(spread), 1), round(max(spread), 1)],
            "min_cov_zero": round(min(cov["zero"]), 3), "min_cov_nonzero": round(min(cov["nonzero"]), 3),
            "max_false_verdicts": round(max(false), 3), "median_width_points": round(100 * float(np.mean(width)), 1)}


def power_cells(reps: int, rng, k: int = 10, missing: int = 3) -> list[dict]:
    """Power at Δ = +10 (k seeds; n = 32 and 134 items; base rate 30% and 60%, ρ = 0.9, seed spread τ = 0, 0.15 and
    0.3): every seed scored every item; one seed missing `missing` items (the shared-items design); and the fallback
    it replaced there (the t-interval over seeds plus a binomial bound for the items)."""
    rows = []
    for n, p_base, tau in itertools.product((32, 134), (0.3, 0.6), (0.0, 0.15, 0.3)):
        s = Scenario(p_base, 0.1, rho=0.9, tau=tau)
        d = simulate(rng, reps, k, n, s)
        diff = d.final - d.base
        full = crossed(diff)
        cut = crossed(diff[..., missing:])  # the items every seed scored: one seed lacks the first `missing`
        final, base = d.final.mean(axis=(-1, -2)), d.base.mean(axis=(-1, -2))
        seeds = diff.mean(axis=-1)  # each seed's Δ on its own items (the seed with fewer items included)
        seeds[:, 0] = diff[:, 0, missing:].mean(axis=-1)
        var_items = np.array([binomial_var(100 * f, n) + binomial_var(100 * b, n) for f, b in zip(final, base)])
        half = np.sqrt(t975(k - 1) ** 2 * seeds.var(axis=-1, ddof=1) * 1e4 / k + t975(n - 1) ** 2 * var_items)
        fallback_low = 100 * seeds.mean(axis=-1) - half
        for design, low in (("seeds × items (every item shared)", full.centre - full.half),
                            (f"seeds × shared items ({missing} of {n} left out)", cut.centre - cut.half),
                            ("seeds + binomial bound (the fallback before issue 47)", fallback_low / 100)):
            power = float((low > 0).mean())
            rows.append({"k": k, "n": n, "p_base": p_base, "tau": tau, "delta": 10, "design": design, "reps": reps,
                         "power": round(power, 3), "mc_se": round(math.sqrt(power * (1 - power) / reps), 3)})
    return rows


def main_spread(args, out: Path) -> None:
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    rows = []
    for tau in SPREAD_TAUS:
        for n in SPREAD_NS:
            for k in SPREAD_KS:
                rows.append(spread_cell(k, n, tau, args.reps, rng))
                print(json.dumps(rows[-1]), flush=True)
    power = power_cells(args.reps, rng)
    for r in power:
        print(json.dumps(r), flush=True)
    report = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, "reps": args.reps,
              "seed": args.seed, "seconds": round(time.perf_counter() - start, 1), "rows": rows, "power": power}
    (out / "bench_coverage_spread.json").write_text(json.dumps(report, indent=2))
    print(spread_markdown(rows, args.reps))


def spread_markdown(rows: list[dict], reps: int) -> str:
    """One line per spread and n, one column per k: smallest coverage / largest false-verdict share."""
    mc_cov, mc_false = math.sqrt(0.95 * 0.05 / reps), math.sqrt(0.05 * 0.95 / reps)
    lines = [f"Cells: smallest coverage over scenarios (Δ = 0 and Δ ≠ 0 together) / largest false-verdict share "
             f"(Δ = 0); {reps} replications per scenario, Monte-Carlo SE ±{mc_cov:.3f} at 0.95 and ±{mc_false:.3f} "
             "at 0.05.", "",
             "| τ (seed spread, points) | n | " + " | ".join(f"k = {k}" for k in SPREAD_KS) + " |",
             "|---|---|" + "---|" * len(SPREAD_KS)]
    for tau in SPREAD_TAUS:
        for n in SPREAD_NS:
            cells = {r["k"]: r for r in rows if r["tau"] == tau and r["n"] == n}
            if not cells:
                continue
            lo, hi = (min(c["spread_points"][0] for c in cells.values()),
                      max(c["spread_points"][1] for c in cells.values()))
            lines.append(f"| {tau} ({lo:.0f}–{hi:.0f}) | {n} | " + " | ".join(
                f"{min(c['min_cov_zero'], c['min_cov_nonzero']):.3f} / {c['max_false_verdicts']:.3f}"
                for c in (cells[k] for k in SPREAD_KS if k in cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=4000, help="replications per scenario and cell")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--out", default=None, help="directory for bench_coverage.json (default: a temp dir)")
    parser.add_argument("--spread", action="store_true", help="the grid of seed spread × k = 2..10 (and power at "
                        "+10 where one seed misses items) instead: bench_coverage_spread.json")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="a2rl-bench-coverage-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.spread:
        main_spread(args, out)
        return
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
