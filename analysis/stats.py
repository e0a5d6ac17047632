"""Statistics over runs: pass@k, bootstrap intervals, noise floor, paired comparisons, selection gap.

Pure functions on numbers and DataFrames; no store, no Prefect.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd


class CI(NamedTuple):
    """A point estimate with a confidence interval; low/high are NaN when n < 2."""

    estimate: float
    low: float
    high: float
    n: int


class NoiseFloor(NamedTuple):
    value: float
    """|Δ| below this is indistinguishable from re-evaluating the base model."""
    source: str
    """'re-evaluations (2 sd)' or 'binomial approximation (2 se)'."""
    k: int
    """Number of fresh baseline evaluations behind it."""


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


def noise_floor(scores: Sequence[float], n_items: int | None = None, z: float = 2.0) -> NoiseFloor:
    """Noise floor of a task from k fresh baseline evaluations of the same model and evaluator.

    With k ≥ 2: z × their sample standard deviation. Otherwise z × the binomial standard error of the
    (0–100) score on `n_items` items — only an approximation, and labelled as such.
    """
    x = np.asarray(scores, dtype=float)
    if len(x) >= 2:
        return NoiseFloor(float(z * x.std(ddof=1)), f"re-evaluations ({z:g} sd)", len(x))
    if n_items and len(x):
        p = min(max(x.mean() / 100.0, 0.0), 1.0)
        se = 100.0 * math.sqrt(p * (1 - p) / n_items)
        return NoiseFloor(float(z * se), f"binomial approximation ({z:g} se)", len(x))
    return NoiseFloor(math.nan, "unknown", len(x))


def sign_flip_pvalue(diffs: Sequence[float], n_perm: int = 20_000, seed: int = 0) -> float:
    """Two-sided paired randomisation test of mean(diffs) = 0.

    Exact for n ≤ 16, Monte Carlo with `n_perm` sign flips up to n = 200, and beyond that the normal limit
    of the sign-flip distribution (mean 0, variance Σd²/n²), which is accurate at that size.
    """
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n == 0:
        return math.nan
    observed = abs(d.mean())
    if n <= 16:
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
        return float((np.abs((signs * d).mean(axis=1)) >= observed - 1e-12).mean())
    if n > 200:
        spread = math.sqrt(float((d**2).sum())) / n
        return 1.0 if spread == 0 else math.erfc(observed / spread / math.sqrt(2))
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_perm, 2_000_000 // n))  # bounded memory for thousands of pairs
    hits = 0
    for i in range(0, n_perm, chunk):
        signs = rng.choice([-1.0, 1.0], size=(min(chunk, n_perm - i), n))
        hits += int((np.abs(signs @ d / n) >= observed - 1e-12).sum())
    return hits / n_perm


def paired_comparison(
    runs: pd.DataFrame,
    agent_a: str,
    agent_b: str,
    by: Sequence[str] = ("task", "variant", "protocol"),
    pair_on: Sequence[str] = ("mode", "base_model", "seed"),
    n_boot: int = 2000,
) -> pd.DataFrame:
    """Per task: Δ of agent B minus Δ of agent A on runs paired by mode, base model and seed.

    Runs of one agent that share a pair key (e.g. several drivers) are averaged first. Columns: n_pairs,
    mean_diff, ci_low, ci_high (bootstrap), wins/losses/ties of B, p_value (sign-flip test).
    """
    keys = list(by) + list(pair_on)
    done = runs[(runs["status"] == "completed") & runs["delta_test"].notna()]
    a = done[done["agent"] == agent_a].groupby(keys, dropna=False)["delta_test"].mean().rename("delta_a")
    b = done[done["agent"] == agent_b].groupby(keys, dropna=False)["delta_test"].mean().rename("delta_b")
    pairs = pd.concat([a, b], axis=1, join="inner").reset_index()
    rows = []
    for group, g in pairs.groupby(list(by), dropna=False, sort=True):
        diff = (g["delta_b"] - g["delta_a"]).to_numpy()
        ci = bootstrap_ci(diff, n_boot=n_boot)
        rows.append(dict(zip(by, group if isinstance(group, tuple) else (group,))) | {
            "agent_a": agent_a, "agent_b": agent_b, "n_pairs": len(diff),
            "mean_delta_a": float(g["delta_a"].mean()), "mean_delta_b": float(g["delta_b"].mean()),
            "mean_diff": ci.estimate, "ci_low": ci.low, "ci_high": ci.high,
            "wins_b": int((diff > 0).sum()), "losses_b": int((diff < 0).sum()), "ties": int((diff == 0).sum()),
            "p_value": sign_flip_pvalue(diff),
        })  # fmt: skip
    columns = list(by) + ["agent_a", "agent_b", "n_pairs", "mean_delta_a", "mean_delta_b", "mean_diff", "ci_low",
                          "ci_high", "wins_b", "losses_b", "ties", "p_value"]
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
