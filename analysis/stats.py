"""Statistics over runs: pass@k and the selection gap.

Pure functions on numbers and DataFrames; no store, no Prefect. The intervals of Δ (one run over items, a
setting over seeds) and the noise floor are in `a2rl_bench.summary.intervals`, where the run verdicts use them too;
every comparison of two settings is `a2rl_bench.analysis.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from a2rl_bench.summary.intervals import Interval, binomial_var, seeds_interval, two_tables_interval


def pass_at_k(deltas: Sequence[float], k: int) -> float:
    """Expected best Δ among k runs drawn without replacement from the n observed (unbiased estimator).

    Sort Δ ascending as Δ(1) ≤ … ≤ Δ(n); then E[max of k] = Σ_{i=k..n} C(i−1, k−1) / C(n, k) · Δ(i).
    k = 1 gives the mean and k = n the maximum.
    """
    values = sorted(float(d) for d in deltas)
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    total = math.comb(n, k)
    # int / int division is correctly rounded even when the binomials are huge.
    return float(sum(math.comb(i - 1, k - 1) / total * values[i - 1] for i in range(k, n + 1)))


def pass_at_k_curve(deltas: Sequence[float], ks: Sequence[int] | None = None) -> dict[int, float]:
    """pass@k for each k in `ks` (default 1..n) that the sample size allows."""
    n = len(deltas)
    return {k: pass_at_k(deltas, k) for k in (ks or range(1, n + 1)) if 1 <= k <= n}


def selection_gap_summary(gaps: pd.DataFrame, items: pd.DataFrame, by: Sequence[str] = ("setting_id",)
                          ) -> pd.DataFrame:
    """Per setting (group of `by`) of heldout runs: mean validation gain of the best submission, hidden-test gain of
    the final pick, and their gap (validation − test) with a 95% interval like Δ's: over the seeds and the items they
    share, on each split (`two_tables_interval`; no resampling of runs, and tied seeds never give zero width).

    Args:
        gaps: rows of the `selection_gap` view (`run_id`, `seed`, `val_gain`, `test_gain`, `selection_gap`, ...),
            with `val_n` and `test_n` (item counts) where known.
        items: per run and item, `split` (validation/test) and `value` = that run's gain on the item (the best
            submission − base on validation, the final pick − base on the test), item units.
    """
    rows = []
    for group, g in gaps.groupby(list(by), dropna=False, sort=True):
        iv, n_val, n_test = _gap_interval(g, items)
        rows.append(dict(zip(by, group if isinstance(group, tuple) else (group,))) | {
            "n": len(g), "n_val_items": n_val, "n_test_items": n_test,
            "mean_val_gain": float(g["val_gain"].mean()), "mean_test_gain": float(g["test_gain"].mean()),
            "mean_gap": float(g["selection_gap"].mean()), "gap_ci_low": iv.low, "gap_ci_high": iv.high,
            "p_value": iv.p_value, "verdict": {"improved": "validation overstates the test"}.get(iv.label(), iv.label()),
            "interval": iv.method,
            "final_is_val_best_rate": float(g["final_is_val_best"].mean()) if "final_is_val_best" in g else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(by) + [
        "n", "n_val_items", "n_test_items", "mean_val_gain", "mean_test_gain", "mean_gap", "gap_ci_low", "gap_ci_high",
        "p_value", "verdict", "interval", "final_is_val_best_rate"])


def _gap_interval(g: pd.DataFrame, items: pd.DataFrame) -> tuple[Interval, int, int]:
    """The gap's interval and the validation and test items it rests on."""
    mine = items[items["run_id"].isin(g["run_id"])] if len(items) else items
    tables = []
    for split in ("validation", "test"):
        part = mine[mine["split"] == split] if len(mine) else mine
        table = part.pivot_table(index="run_id", columns="item_id", values="value", aggfunc="first") if len(part) \
            else None
        if table is None or len(table) != len(g) or table.isna().to_numpy().any():
            tables = None
            break
        tables.append(table.loc[g["run_id"]].to_numpy(dtype=float))
    if tables:
        return two_tables_interval(*tables), tables[0].shape[1], tables[1].shape[1]
    # No shared per-item results on both splits: the t-interval over seeds plus binomial bounds of the four scores.
    n_val, n_test = _count(g, "val_n"), _count(g, "test_n")
    var = None
    if n_val > 1 and n_test > 1 and {"best_val", "baseline_val", "final_test", "baseline_test"} <= set(g.columns):
        var = (binomial_var(float(g["best_val"].mean()), n_val) + binomial_var(float(g["baseline_val"].mean()), n_val)
               + binomial_var(float(g["final_test"].mean()), n_test)
               + binomial_var(float(g["baseline_test"].mean()), n_test))
    iv = seeds_interval(g["selection_gap"].tolist(), var, min(n_val, n_test) if var else 0, bounds=(-200.0, 200.0))
    return iv, n_val, n_test


def _count(g: pd.DataFrame, column: str) -> int:
    n = g[column].dropna() if column in g else pd.Series(dtype=float)
    return int(n.min()) if len(n) else 0
