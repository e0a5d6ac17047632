"""Length-controlled win rate: the win rate a model would have if its outputs were as long as the reference.

AlpacaEval 2 debiases judge preferences for length with a logistic GLM whose length term is
`tanh(length difference / its standard deviation)`, and reports the GLM's prediction with that term set
to zero. This is the small version of that idea, for one model against one reference:

    P(model preferred on item i) = sigmoid(a + b * tanh((len_model_i - len_reference_i) / s))

with `s` the standard deviation of the length differences (characters). Targets are the judged values
(1 win, 0.5 split between the two orders, 0 loss), fitted by Newton's method on the binomial
log-likelihood with a small L2 penalty (which keeps the fit finite when length separates wins from
losses perfectly). The LC win rate is `100 * sigmoid(a)`. AlpacaEval's per-instruction difficulty term
is left out: with one model and one reference it is not identifiable.

When lengths carry no signal (all differences equal) the length term is constant, and the LC win rate
equals the raw win rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

L2_PENALTY = 1e-2
"""On both coefficients; small next to the n ≥ 16 items of any split here."""


class WinRates(NamedTuple):
    win_rate: float
    """Mean judged value ×100 over items with a verdict."""
    lc_win_rate: float
    """Length-controlled win rate ×100 (the task's metric)."""
    n_judged: int
    intercept: float
    length_slope: float
    """`b`: > 0 means the judge prefers the longer output."""
    length_scale: float
    """`s`, in characters."""


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free form


def fit_length_glm(
    values: np.ndarray, length_diff: np.ndarray, penalty: float = L2_PENALTY
) -> tuple[float, float, float]:
    """(a, b, s) of the GLM above, by penalised Newton-Raphson."""
    scale = float(np.std(length_diff))
    if scale == 0.0:
        scale = 1.0
    features = np.column_stack([np.ones_like(length_diff), np.tanh(length_diff / scale)])
    coef = np.zeros(2)
    ridge = penalty * np.eye(2)
    for _ in range(100):
        p = _sigmoid(features @ coef)
        gradient = features.T @ (values - p) - ridge @ coef
        hessian = features.T @ (features * (p * (1 - p))[:, None]) + ridge
        step = np.linalg.solve(hessian, gradient)
        coef += step
        if np.max(np.abs(step)) < 1e-10:
            break
    return float(coef[0]), float(coef[1]), scale


def win_rates(
    values: Sequence[float | None], model_lengths: Sequence[int], reference_lengths: Sequence[int]
) -> WinRates:
    """Raw and length-controlled win rates; items whose value is None (no verdict) are left out."""
    rows = [(v, m, r) for v, m, r in zip(values, model_lengths, reference_lengths, strict=True) if v is not None]
    if not rows:
        raise ValueError("no judged items: a win rate needs at least one verdict")
    v = np.array([r[0] for r in rows], dtype=float)
    diff = np.array([r[1] - r[2] for r in rows], dtype=float)
    a, b, scale = fit_length_glm(v, diff)
    return WinRates(
        win_rate=100.0 * float(v.mean()),
        lc_win_rate=100.0 * float(_sigmoid(np.array(a))),
        n_judged=len(rows),
        intercept=a,
        length_slope=b,
        length_scale=scale,
    )
