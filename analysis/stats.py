"""Statistics over runs: pass@k, bootstrap intervals, paired comparisons, selection gap.

Pure functions on numbers and DataFrames; no store, no Prefect. The intervals of Δ (one run over items, a
setting over seeds) and the noise floor are in `a2rl.summary.intervals`, where the run verdicts use them too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from a2rl.summary.intervals import seeds_interval, sign_flip_pvalue
from a2rl.setting import SETTING_KEY


class CI(NamedTuple):
    """A point estimate with a confidence interval; low/high are NaN when n < 2."""

    estimate: float
    low: float
    high: float
    n: int


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


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable[[np.ndarray], np.ndarray] | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> CI:
    """Percentile bootstrap interval of `stat` (default: the mean), resampling values with replacement.

    `stat` gets a (n_boot, n) array and must reduce along axis 1. Fixed seed: the same data give the same CI.
    """
    x = np.asarray([v for v in values if v is not None and not np.isnan(v)], dtype=float)
    n = len(x)
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0)
    reduce = stat or (lambda a: a.mean(axis=1))
    estimate = float(reduce(x[None, :])[0])
    if n < 2:
        return CI(estimate, math.nan, math.nan, n)
    rng = np.random.default_rng(seed)
    # Resample in chunks so a large group never needs an n_boot × n matrix at once.
    chunk = max(1, min(n_boot, 4_000_000 // n))
    stats = np.concatenate([
        reduce(x[rng.integers(0, n, size=(min(chunk, n_boot - i), n))]) for i in range(0, n_boot, chunk)
    ])  # fmt: skip
    alpha = (1 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return CI(estimate, float(low), float(high), n)


def paired_comparison(
    runs: pd.DataFrame,
    field: str,
    a: str,
    b: str,
    averaged: Sequence[str] = (),
) -> pd.DataFrame:
    """Per group: Δ of `field` = b minus Δ of `field` = a on runs that agree on every other setting column and
    the seed. Agent level: `field="agent"`, `averaged=("driver",)` (an agent's drivers averaged, said so);
    driver level: `field="driver"` (same agent, two drivers). Columns: n_pairs, mean_diff with a t-interval over
    the pairs (none below 2 pairs), wins/losses/ties of b and a sign-flip p-value.
    """
    fixed = [c for c in SETTING_KEY if c != field and c not in averaged and c in runs.columns]
    by = [c for c in ("task", "variant", "agent", "driver") if c in fixed]
    keys = fixed + ["seed"]
    done = runs[runs["delta_test"].notna()]
    first = done[done[field] == a].groupby(keys, dropna=False)["delta_test"].mean().rename("delta_a")
    second = done[done[field] == b].groupby(keys, dropna=False)["delta_test"].mean().rename("delta_b")
    pairs = pd.concat([first, second], axis=1, join="inner").reset_index()
    rows = []
    for group, g in pairs.groupby(by, dropna=False, sort=True):
        diff = (g["delta_b"] - g["delta_a"]).to_numpy()
        ci = seeds_interval(diff)
        rows.append(dict(zip(by, group if isinstance(group, tuple) else (group,))) | {
            "compared": field, "a": a, "b": b, "averaged_over": ", ".join(averaged) or "-", "n_pairs": len(diff),
            "mean_delta_a": float(g["delta_a"].mean()), "mean_delta_b": float(g["delta_b"].mean()),
            "mean_diff": ci.estimate, "ci_low": ci.low, "ci_high": ci.high, "interval": ci.method,
            "wins_b": int((diff > 0).sum()), "losses_b": int((diff < 0).sum()), "ties": int((diff == 0).sum()),
            "p_value": sign_flip_pvalue(diff),
        })  # fmt: skip
    columns = ["compared", "a", "b", "averaged_over"] + by + [
        "n_pairs", "mean_delta_a", "mean_delta_b", "mean_diff", "ci_low", "ci_high", "interval", "wins_b",
        "losses_b", "ties", "p_value"]
    return pd.DataFrame(rows, columns=columns)


def selection_gap_summary(
    gaps: pd.DataFrame, by: Sequence[str] = ("task", "agent"), n_boot: int = 2000
) -> pd.DataFrame:
    """Mean validation gain, test gain and their gap (with a bootstrap CI) per group of heldout runs."""
    rows = []
    for group, g in gaps.groupby(list(by), dropna=False, sort=True):
        ci = bootstrap_ci(g["selection_gap"].to_numpy(), n_boot=n_boot)
        rows.append(dict(zip(by, group if isinstance(group, tuple) else (group,))) | {
            "n": len(g), "mean_val_gain": float(g["val_gain"].mean()), "mean_test_gain": float(g["test_gain"].mean()),
            "mean_gap": ci.estimate, "gap_ci_low": ci.low, "gap_ci_high": ci.high,
            "final_is_val_best_rate": float(g["final_is_val_best"].mean()) if "final_is_val_best" in g else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(by) + ["n", "mean_val_gain", "mean_test_gain", "mean_gap", "gap_ci_low",
                                                  "gap_ci_high", "final_is_val_best_rate"])
