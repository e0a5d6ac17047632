"""95% intervals that hold their promise, for one run's Δ and for a setting's Δ over seeds.

- One run: the final pick and the base model answered the same hidden-test items, so Δ is a paired difference.
  For right/wrong items: Newcombe's hybrid score interval for a paired difference of proportions (method 10,
  Stat. Med. 1998) with the exact McNemar p-value; for graded items: a paired bootstrap over items (expanded
  percentile, which corrects the plain percentile interval's under-coverage at small n) with a sign-flip p-value.
- Over seeds: Student's t-interval of the mean Δ. It needs n >= 2 seeds (n = 1 gives no interval, and says so);
  at n = 2 it is honest and wide (t = 12.7).
- Pooled over seeds that share items: the per-item mean difference over seeds, bootstrapped over items.
- Noise: the baseline's item-level standard error (Agresti-Coull binomial, or sd/sqrt(n) of graded items).

`tests/test_analysis.py` checks the coverage of these intervals by simulation (>= 93% at nominal 95%).
All scores here are on the 0-100 scale of the task's metric; item scores are 0-1 (right/wrong, or graded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# Two-sided 95% Student t quantiles for df = 1..30 (the store's `t975` macro holds the same table).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z975 = 1.959964
MIN_SEEDS = 2
"""The fewest seeds for an interval over seeds."""


class Interval(NamedTuple):
    """A Δ (points, 0-100 scale) with its 95% interval; low/high are NaN when there is none (see `method`)."""

    estimate: float
    low: float
    high: float
    n: int
    """Items for an item-level interval, seeds for an interval over seeds."""
    p_value: float
    method: str

    @property
    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)

    def label(self) -> str:
        """`improved`, `worse` or `no significant change` (also when there is no interval)."""
        if self.low > 0:
            return "improved"
        if self.high < 0:
            return "worse"
        return "no significant change"

    def text(self) -> str:
        if math.isnan(self.low):
            return f"Δ {self.estimate:+.2f} (n={self.n}; {self.method})"
        p = "" if math.isnan(self.p_value) else f", p={self.p_value:.3g}"
        return f"Δ {self.estimate:+.2f} [95% {self.low:+.2f}, {self.high:+.2f}] (n={self.n}{p}; {self.method})"


def t975(df: int) -> float:
    """Two-sided 95% t quantile: tabulated to df 30, then 1.96 + 2.4/df (within 0.003)."""
    if df < 1:
        return math.nan
    return T975[df - 1] if df <= len(T975) else 1.96 + 2.4 / df


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _none(estimate: float, n: int, why: str) -> Interval:
    return Interval(estimate, math.nan, math.nan, n, math.nan, why)


# ---- one run: paired over items ---------------------------------------------------------------------------------


def wilson(x: np.ndarray, n: np.ndarray | float, z: float = Z975) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of x successes in n trials (vectorised)."""
    p = x / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def newcombe_paired(both: np.ndarray, base_only: np.ndarray, final_only: np.ndarray, neither: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Δ, low, high) of p_final − p_base, as proportions, from the 2×2 counts of paired right/wrong items
    (Newcombe 1998, method 10, with his continuity-corrected correlation). Vectorised over arrays of tables."""
    a, b, c, d = (np.asarray(v, dtype=float) for v in (both, base_only, final_only, neither))
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n)
    l2, u2 = wilson(a + c, n)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    num = a * d - b * c
    num = np.where(num > n / 2, num - n / 2, np.where(num > 0, 0.0, num))
    phi = np.divide(num, np.sqrt(margins), out=np.zeros_like(num), where=margins > 0)
    delta = p2 - p1
    low = delta - np.sqrt(np.maximum((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0))
    high = delta + np.sqrt(np.maximum((u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2, 0))
    return delta, low, high


def mcnemar_exact_p(base_only: int, final_only: int) -> float:
    """Two-sided exact McNemar p-value: the discordant items split as Binomial(b + c, 1/2) under no change."""
    k, m = min(base_only, final_only), base_only + final_only
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2**m
    return min(1.0, 2 * tail)


def paired_item_interval(base: Sequence[float], final: Sequence[float], n_boot: int = 4000,
                         seed: int = 0) -> Interval:
    """95% interval of one run's Δ (points) from the base model's and the final pick's scores on the same items.

    Right/wrong items (every score 0 or 1): Newcombe's paired score interval and the exact McNemar p-value.
    Graded items: paired bootstrap over items (expanded percentile) and a sign-flip p-value.
    """
    x, y = np.asarray(base, dtype=float), np.asarray(final, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired items differ in number: {len(x)} base, {len(y)} final")
    n = len(x)
    if n == 0:
        return _none(math.nan, 0, "no item-level results")
    if np.isin(x, (0.0, 1.0)).all() and np.isin(y, (0.0, 1.0)).all():
        a, b = int(((x == 1) & (y == 1)).sum()), int(((x == 1) & (y == 0)).sum())
        c, d = int(((x == 0) & (y == 1)).sum()), int(((x == 0) & (y == 0)).sum())
        delta, low, high = (float(v[0]) for v in newcombe_paired(*(np.array([v]) for v in (a, b, c, d))))
        return Interval(100 * delta, 100 * low, 100 * high, n, mcnemar_exact_p(b, c),
                        f"paired over items, Newcombe score interval; exact McNemar ({b} lost, {c} gained)")
    diff = y - x
    low, high = expanded_bootstrap(diff, n_boot=n_boot, seed=seed)
    return Interval(100 * float(diff.mean()), 100 * low, 100 * high, n, sign_flip_pvalue(diff),
                    "paired bootstrap over items; sign-flip test")


def expanded_bootstrap(values: np.ndarray, n_boot: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean by the expanded percentile bootstrap (Hesterberg 2015): percentile levels
    widened so that the interval matches the t-interval's width at small n. Fixed seed: reproducible."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    if n < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    alpha = _phi(-math.sqrt(n / (n - 1)) * t975(n - 1))
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


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


# ---- over seeds ---------------------------------------------------------------------------------------------------


def seeds_interval(deltas: Sequence[float]) -> Interval:
    """Student t-interval of the mean Δ over the seeds of one setting, with the one-sample t-test's p-value
    (normal approximation of the t tail beyond df 30). n < 2: the mean alone, and `method` says why."""
    d = np.asarray([v for v in deltas if v is not None and not math.isnan(v)], dtype=float)
    n = len(d)
    if n == 0:
        return _none(math.nan, 0, "no runs")
    mean = float(d.mean())
    if n < MIN_SEEDS:
        return _none(mean, n, f"n = {n}: no interval (needs {MIN_SEEDS}+ seeds)")
    se = float(d.std(ddof=1)) / math.sqrt(n)
    half = t975(n - 1) * se
    p = (1.0 if mean == 0 else 0.0) if se == 0 else _t_pvalue(mean / se, n - 1)
    return Interval(mean, mean - half, mean + half, n, p, "t-interval over seeds")


def _t_pvalue(t: float, df: int) -> float:
    """Two-sided p of a t statistic, from the regularized incomplete beta by continued fraction (no scipy)."""
    x = df / (df + t * t)
    return _betainc(df / 2, 0.5, x)


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1 - x)
    # Lentz's continued fraction (Numerical Recipes §6.4).
    f, c, dd = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        dd = 1.0 + num * dd
        dd = 1e-30 if abs(dd) < 1e-30 else dd
        dd = 1.0 / dd
        c = 1.0 + num / c
        c = 1e-30 if abs(c) < 1e-30 else c
        f *= c * dd
        if abs(1.0 - c * dd) < 1e-12:
            break
    return front * (f - 1.0) / a


def pooled_item_interval(item_ids: Sequence[str], base: Sequence[float], final: Sequence[float],
                         n_boot: int = 4000, seed: int = 0) -> Interval:
    """Δ pooled over the seeds of a setting that share items: each item's mean paired difference over the
    seeds that scored it, bootstrapped over items (so items, not runs, are the unit of resampling)."""
    import pandas as pd

    frame = pd.DataFrame({"item": list(item_ids), "diff": np.asarray(final, float) - np.asarray(base, float)})
    per_item = frame.groupby("item", sort=True)["diff"].mean().to_numpy()
    n = len(per_item)
    if n < 2:
        return _none(100 * float(per_item.mean()) if n else math.nan, n, "fewer than 2 shared items")
    if np.ptp(per_item) == 0:  # every item moved alike (often: none moved): resampling items says nothing
        return _none(100 * float(per_item[0]), n, "every item changed alike: no spread to resample")
    low, high = expanded_bootstrap(per_item, n_boot=n_boot, seed=seed)
    return Interval(100 * float(per_item.mean()), 100 * low, 100 * high, n, sign_flip_pvalue(per_item),
                    "pooled over seeds, bootstrap over shared items")


# ---- noise --------------------------------------------------------------------------------------------------------


def baseline_se(scores: Sequence[float]) -> float:
    """The base model's item-level standard error in points: Agresti-Coull for right/wrong items (never 0, even
    at 0 of n), sd/sqrt(n) of graded item scores (the bootstrap SE of their mean) otherwise."""
    s = np.asarray(scores, dtype=float)
    n = len(s)
    if n == 0:
        return math.nan
    if np.isin(s, (0.0, 1.0)).all():
        return binomial_se(100 * float(s.mean()), n)
    return 100 * float(s.std()) / math.sqrt(n)


def binomial_se(score: float, n: int) -> float:
    """Agresti-Coull standard error (points) of a 0-100 score on n items; the store's `binomial_se` macro."""
    if not n:
        return math.nan
    p = (score / 100 * n + 2) / (n + 4)
    return 100 * math.sqrt(p * (1 - p) / (n + 4))
