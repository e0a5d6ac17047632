"""95% intervals that hold their promise: one run's Δ over its items, and a setting's Δ over seeds and items.

Each comparison gets one test, and its interval and p-value agree: the interval excludes 0 exactly when p < 0.05,
and the verdict (`improved` / `worse` / `no significant change`) is read from the interval. Bounds are clipped
to what a score can be (a Δ within [-100, 100], a score within [0, 100]).

- One run (`paired_item_interval`): the final pick and the base model answered the same hidden-test items.
  Right/wrong items: the exact McNemar test decides; the interval is Newcombe's paired score interval (method 10,
  Stat. Med. 1998), widened to reach 0 where the exact test does not reject (so a superset of Newcombe's, with
  at least its coverage). Graded items: the item-level t-interval below with k = 1.
- A setting over k seeds that share the hidden items (`seeds_items_interval`, the normal case: every seed is
  scored on the same test set): the items are a sample too, and shared by every seed, so a t-interval over the
  seeds' Δ misses their sampling error. The k × n table of item values is treated as a crossed design (seeds ×
  items): the variance of its mean is split into an item part (the spread of per-item means over seeds) and a seed
  part (the spread of per-seed means, / k, with k - 1 degrees of freedom), each taken with its own t quantile:
  half-width = sqrt((t_items · se_items)² + (t_seeds · se_seeds)²), where t_seeds carries a small-sample factor
  (1 + 2/k) for the skew of bounded Δs over few seeds (`seed_quantile`). Every seed gets two pseudo-items with the
  extreme values (±1 for a Δ, 0 and 1 for a score; in the spirit of Agresti-Caffo), so the item part is over
  n + 2 items with n + 1 degrees of freedom and never collapses when nothing varies: tied seeds never give a
  zero-width interval or p = 0. The sum of the two parts over-counts the seed × item noise once, which keeps the
  interval on the safe side. Coverage is checked by simulation in `tests/test_analysis.py` and
  `bench/bench_coverage.py` (BENCHMARKS.md).
- Seeds without shared per-item results (`seeds_interval`): the t-interval over seeds, plus, where the number of
  items is known, a binomial bound for the items' sampling error; seeds that agree exactly get no interval.
- Noise: the baseline's item-level standard error (Agresti-Coull binomial, or sd/sqrt(n) of graded items).

All scores are on the 0-100 scale of the task's metric; item values are 0-1 (right/wrong, or graded). The store keeps
these intervals per setting, computed by these functions (`a2rl_bench.store.derived_intervals`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# Two-sided 95% Student t quantiles for df = 1..30 (the store's `t975` macro held the same table, to schema 11).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z975 = 1.959964
Z975_PRINTED = 1.96
"""The rounded z the store's Baseline row has always been computed with (kept, so that its numbers stay put)."""
MIN_SEEDS = 2
"""The fewest seeds for an interval over seeds."""
DELTA_PSEUDO = (-1.0, 1.0)
"""Pseudo-items added to every seed for a Δ (one item lost, one gained)."""
SCORE_PSEUDO = (0.0, 1.0)
"""Pseudo-items added to every seed for a score (one item wrong, one right)."""


class Interval(NamedTuple):
    """An estimate (points, 0-100 scale) with its 95% interval; low/high are NaN when there is none (`method`
    says why)."""

    estimate: float
    low: float
    high: float
    n: int
    """Items for one run's interval, seeds for an interval over seeds."""
    p_value: float
    method: str
    n_items: int = 0
    """Items per seed behind an interval over seeds (0: no per-item results)."""

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


def _none(estimate: float, n: int, why: str, n_items: int = 0) -> Interval:
    return Interval(estimate, math.nan, math.nan, n, math.nan, why, n_items)


def _clip(value: float, lo: float, hi: float) -> float:
    return float(min(max(value, lo), hi))


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


def mcnemar_interval(both: np.ndarray, base_only: np.ndarray, final_only: np.ndarray, neither: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Δ, low, high, p) as proportions for arrays of 2×2 tables: the exact McNemar p-value and Newcombe's interval,
    widened to reach 0 wherever the exact test does not reject at 5% (one test, one verdict).

    The exact test is the stricter of the two: on every table of up to 200 items (and 300, 500) that Newcombe's
    interval leaves 0 out of where p >= 0.05, never the other way round (`tests/test_analysis.py` checks all tables
    up to 64 items). Should a table ever reject with an interval that holds 0, the bound on the side of the
    estimate is put just past 0, so that the interval still says what the test says.
    """
    b, c = np.asarray(base_only, dtype=int), np.asarray(final_only, dtype=int)
    delta, low, high = newcombe_paired(both, base_only, final_only, neither)
    p = np.vectorize(mcnemar_exact_p, otypes=[float])(b, c)
    keep = p >= 0.05
    low = np.where(keep, np.minimum(low, 0.0), np.where((c > b) & (low <= 0), np.finfo(float).tiny, low))
    high = np.where(keep, np.maximum(high, 0.0), np.where((c < b) & (high >= 0), -np.finfo(float).tiny, high))
    return delta, np.clip(low, -1, 1), np.clip(high, -1, 1), p


def paired_item_interval(base: Sequence[float], final: Sequence[float]) -> Interval:
    """95% interval of one run's Δ (points) from the base model's and the final pick's scores on the same items.

    Right/wrong items (every score 0 or 1): exact McNemar with its matching interval (`mcnemar_interval`).
    Graded items: the item-level t-interval of the paired differences (`seeds_items_interval` with one seed).
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
        delta, low, high, p = (float(v[0]) for v in mcnemar_interval(*(np.array([v]) for v in (a, b, c, d))))
        return Interval(100 * delta, 100 * low, 100 * high, n, p,
                        f"paired over items: exact McNemar ({b} lost, {c} gained), Newcombe's interval reaching 0 "
                        "where the test does not reject", n)  # fmt: skip
    one = seeds_items_interval((y - x)[None, :])
    return one._replace(n=n, method="paired over items: t-interval of the item differences (+2 pseudo-items)")


# ---- over seeds that share the hidden items: seeds × items ----------------------------------------------------------


class Crossed(NamedTuple):
    """The parts of the seeds × items interval, item units (vectorised over leading axes)."""

    estimate: np.ndarray
    """Plain mean of the k × n values."""
    centre: np.ndarray
    """Mean with the two pseudo-items: the interval's centre and the test's statistic."""
    var_items: np.ndarray
    var_seeds: np.ndarray
    half: np.ndarray
    n_items: int
    n_seeds: int


def seed_quantile(k: int) -> float:
    """The seed part's quantile for k seeds: t975(k - 1) × (1 + 2/k), a small-sample correction. A seed's Δ is
    bounded, so where seeds spread widely or a score sits near 0 or 100% their Δs are skewed and a few seeds
    understate the spread: the plain t quantile then covered 0.89–0.93 and called up to 7% false differences
    (BENCHMARKS.md, issue 47); with the factor every simulated cell of k = 2..10 covers ≥ 0.93 with ≤ 5%."""
    return t975(k - 1) * (1 + 2 / k)


def crossed(values: np.ndarray, pseudo: tuple[float, float] = DELTA_PSEUDO) -> Crossed:
    """The seeds × items interval's parts for `values` of shape (..., k seeds, n items): every seed scored every
    item. Each seed gets the two pseudo-items; var_items = spread of the per-item means / (n + 2), var_seeds =
    spread of the per-seed means / k (0 for one seed); half = sqrt(t975(n+1)² var_items + seed_quantile(k)²
    var_seeds)."""
    v = np.asarray(values, dtype=float)
    k, n = v.shape[-2:]
    pad = np.broadcast_to(np.asarray(pseudo, dtype=float), v.shape[:-1] + (2,))
    x = np.concatenate([v, pad], axis=-1)
    size = n + 2
    var_items = x.mean(axis=-2).var(axis=-1, ddof=1) / size
    var_seeds = x.mean(axis=-1).var(axis=-1, ddof=1) / k if k > 1 else np.zeros(v.shape[:-2])
    half = np.sqrt(t975(size - 1) ** 2 * var_items + (seed_quantile(k) ** 2 * var_seeds if k > 1 else 0.0))
    return Crossed(v.mean(axis=(-1, -2)), x.mean(axis=(-1, -2)), var_items, var_seeds, half, n, k)


def seeds_items_interval(values: np.ndarray, pseudo: tuple[float, float] = DELTA_PSEUDO,
                         bounds: tuple[float, float] = (-100.0, 100.0), p_value: bool = True) -> Interval:
    """95% interval (points) of the mean over k seeds × n shared items, from their item values (k × n; item
    differences in [-1, 1] for a Δ, item scores in [0, 1] with `pseudo=SCORE_PSEUDO`, `bounds=(0, 100)` for a
    score). Its p-value is the test the interval inverts, so p < 0.05 exactly when the interval leaves 0 out
    (`p_value=False` leaves it NaN: the store, which keeps no p-value, skips its root search on every write)."""
    v = np.atleast_2d(np.asarray(values, dtype=float))
    k, n = v.shape
    if n == 0:
        return _none(math.nan, k, "no item-level results")
    c = crossed(v, pseudo)
    centre, half = float(c.centre), float(c.half)
    se = math.sqrt(float(c.var_items) + float(c.var_seeds))
    p = _combined_p(abs(centre) / se, half / se) if p_value else math.nan
    what = (f"seeds × items: {k} seeds sharing {n} items, t-intervals of both parts combined (+2 pseudo-items)"
            if k > 1 else f"t over {n} items (+2 pseudo-items)")
    return Interval(100 * float(c.estimate), _clip(100 * (centre - half), *bounds), _clip(100 * (centre + half), *bounds),
                    k, p, what, n)  # fmt: skip



class SharedItems(NamedTuple):
    """The items every seed scored, out of a seeds × items table with NaN where a seed has no score (not scored, or
    a NULL score), and what was left out."""

    values: np.ndarray
    """k seeds × n shared items."""
    left_out: int
    """Items some seed scored and another did not: left out and counted."""
    scored: int
    """Items any seed scored."""

    @property
    def design(self) -> str:
        """`seeds × items` (every seed scored every item) or `seeds × shared items` (some were left out)."""
        return "seeds × shared items" if self.left_out else "seeds × items"

    def note(self) -> str:
        """What the shared-items table left out, for an interval's method ("" when nothing was)."""
        return (f"; {self.left_out} of {self.scored} items not scored by every seed, left out" if self.left_out
                else "")


def shared_items(values: np.ndarray) -> SharedItems:
    """The seeds × items table cut to the items every seed scored (NaN: no score). A comparison or a setting uses
    these before falling back to the wider design over seeds: dropping a few items costs a little width, the
    fallback's binomial bound (which ignores the pairing with the base model) about doubles it."""
    v = np.atleast_2d(np.asarray(values, dtype=float))
    missing = np.isnan(v)
    shared, scored = ~missing.any(axis=0), ~missing.all(axis=0)
    return SharedItems(v[:, shared], int(scored.sum() - shared.sum()), int(scored.sum()))


def shared_items_interval(values: np.ndarray, pseudo: tuple[float, float] = DELTA_PSEUDO,
                          bounds: tuple[float, float] = (-100.0, 100.0), p_value: bool = True
                          ) -> tuple[Interval, str] | None:
    """`seeds_items_interval` over the items every seed scored (`shared_items`; NaN: no score), with its design
    (`seeds × items` or `seeds × shared items`) and what it left out in its method; None when no item is shared."""
    shared = shared_items(values)
    if not shared.values.shape[1]:
        return None
    iv = seeds_items_interval(shared.values, pseudo, bounds, p_value)
    return iv._replace(method=iv.method + shared.note()), shared.design


def two_tables_interval(first: np.ndarray, second: np.ndarray, bounds: tuple[float, float] = (-200.0, 200.0)
                        ) -> Interval:
    """95% interval (points) of mean(first) − mean(second), two k × n tables of item values of the same k seeds on
    two different item sets (e.g. validation and hidden test: the selection gap). Each table's item part as in
    `seeds_items_interval` (its own pseudo-items and t quantile; the item sets are independent, so the parts add);
    the seed part from the spread of the seeds' own differences. p from the same test, as there."""
    a, b = np.atleast_2d(np.asarray(first, dtype=float)), np.atleast_2d(np.asarray(second, dtype=float))
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"the two tables have different seeds: {a.shape[0]} and {b.shape[0]}")
    k, na, nb = a.shape[0], a.shape[1], b.shape[1]
    if na == 0 or nb == 0:
        return _none(math.nan, k, "no item-level results")
    ca, cb = crossed(a), crossed(b)
    per_seed = (np.concatenate([a, np.broadcast_to(DELTA_PSEUDO, (k, 2))], axis=1).mean(axis=1)
                - np.concatenate([b, np.broadcast_to(DELTA_PSEUDO, (k, 2))], axis=1).mean(axis=1))
    var_seeds = float(per_seed.var(ddof=1)) / k if k > 1 else 0.0
    var_items = float(ca.var_items) + float(cb.var_items)
    half = math.sqrt(t975(na + 1) ** 2 * float(ca.var_items) + t975(nb + 1) ** 2 * float(cb.var_items)
                     + (seed_quantile(k) ** 2 * var_seeds if k > 1 else 0.0))
    centre = float(ca.centre) - float(cb.centre)
    se = math.sqrt(var_items + var_seeds)
    what = (f"seeds × items on two item sets: {k} seeds, {na} and {nb} items, item parts added, seed part from the "
            "seeds' own differences (+2 pseudo-items per seed and set)")
    return Interval(100 * (float(ca.estimate) - float(cb.estimate)), _clip(100 * (centre - half), *bounds),
                    _clip(100 * (centre + half), *bounds), k, _combined_p(abs(centre) / se, half / se), what,
                    min(na, nb))  # fmt: skip


def _combined_p(t: float, critical: float) -> float:
    """Two-sided p of the statistic `t` = centre / se, referred to the t distribution whose 97.5% point is
    `critical` (= half-width / se): its degrees of freedom are solved for, so p < 0.05 exactly when t > critical."""
    if critical <= Z975:
        return math.erfc(t / math.sqrt(2))
    lo, hi = math.log(0.05), math.log(1e7)  # log df; the two-sided p at `critical` falls as df grows
    if _t_pvalue(critical, math.exp(hi)) > 0.05:
        return math.erfc(t / math.sqrt(2))
    for _ in range(60):
        mid = (lo + hi) / 2
        if _t_pvalue(critical, math.exp(mid)) > 0.05:
            lo = mid
        else:
            hi = mid
    return _t_pvalue(t, math.exp((lo + hi) / 2))


# ---- over seeds without shared per-item results ----------------------------------------------------------------------


def seeds_interval(deltas: Sequence[float], items_var: float | None = None, n_items: int = 0,
                   bounds: tuple[float, float] = (-100.0, 100.0)) -> Interval:
    """Mean over seeds (points) with a 95% interval: the t-interval over seeds, and where `items_var` (the item
    sampling variance of the mean, points²) is given, that part added as in `seeds_items_interval` (t quantile
    of n_items - 1). One seed, or seeds that agree exactly with nothing else known, give no interval."""
    d = np.asarray([v for v in deltas if v is not None and not math.isnan(v)], dtype=float)
    k = len(d)
    if k == 0:
        return _none(math.nan, 0, "no runs")
    mean = float(d.mean())
    if k < MIN_SEEDS:
        return _none(mean, k, f"n = {k}: no interval (needs {MIN_SEEDS}+ seeds)")
    var_seeds = float(d.var(ddof=1)) / k
    var_items = items_var if items_var is not None and items_var == items_var and n_items > 1 else 0.0
    if var_seeds + var_items == 0:
        return _none(mean, k, "the seeds agree exactly and no per-item results say how much items vary: no interval")
    half = math.sqrt(t975(k - 1) ** 2 * var_seeds + (t975(n_items - 1) ** 2 * var_items if var_items else 0.0))
    se = math.sqrt(var_seeds + var_items)
    what = "t-interval over seeds" + (f" + binomial bound for {n_items} items" if var_items else
                                      " (no per-item results: item sampling not included)")
    return Interval(mean, _clip(mean - half, *bounds), _clip(mean + half, *bounds), k,
                    _combined_p(abs(mean) / se, half / se), what, n_items)  # fmt: skip


def binomial_var(score: float, n: int) -> float:
    """Agresti-Coull variance (points²) of a 0-100 score's mean over n items: never 0; at most p(1-p)/n for any
    item values in [0, 1], so a bound for graded items too."""
    return binomial_se(score, n) ** 2 if n else math.nan


def _t_pvalue(t: float, df: float) -> float:
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
    return item_se(float(s.std()), n)


def mean_se(variance: float, n: int) -> float:
    """Standard error of a mean over n values whose sample variance is `variance` (e.g. a setting's Δ over seeds)."""
    return math.sqrt(variance / n)


def item_se(sd: float, n: int) -> float:
    """Standard error (points) of a mean over n graded items whose scores (0-1) have population sd `sd`: the
    bootstrap SE of their mean."""
    return 100 * sd / math.sqrt(max(n, 1))


def agresti_coull_score(score: float, n: int) -> float:
    """The Agresti-Coull centre (points) of a 0-100 score on n items: two right and two wrong items added."""
    return 100 * (score / 100 * n + 2) / (n + 4)


def binomial_se(score: float, n: int) -> float:
    """Agresti-Coull standard error (points) of a 0-100 score on n items."""
    if not n:
        return math.nan
    p = agresti_coull_score(score, n) / 100
    return 100 * math.sqrt(p * (1 - p) / (n + 4))
