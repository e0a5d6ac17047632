"""Coverage of a2rl's 95% intervals by simulation, with a hidden test set shared by every seed.

The model (one scenario = base rate, true Δ, item correlation, seed spread):
- items are drawn from a population: item i has a latent ease z_i ~ N(0, 1); the base model (greedy) gets it
  right iff z_i > θ_b, the same answer in every run, so P(right) = p_base over the population;
- seed s of the setting trains a model whose quality shifts by u_s ~ N(0, τ²) (probit scale); it gets item i right
  iff ρ z_i + sqrt(1 - ρ²) e_is + u_s > θ_f, e_is ~ N(0, 1) (items that are easy for the base model stay easier);
- θ_f is set so that the setting's Δ over the item and seed populations is the scenario's Δ exactly; one run's
  own Δ (the target of its item-level interval) is Φ(θ_b) - Φ(θ_f - u_s).
Every seed is scored on the same n items (the normal case: one hidden test set), so a t-interval over the seeds'
Δ misses the items' sampling error. `bench/bench_coverage.py` writes the table of BENCHMARKS.md from these
functions; `tests/test_analysis.py` checks the coverage of the project's intervals with them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from a2rl_bench.summary.intervals import crossed, mcnemar_interval

_N01 = NormalDist()


@dataclass(frozen=True)
class Scenario:
    p_base: float
    """Share of the item population the base model gets right."""
    delta: float
    """True Δ of the setting (proportion, -1..1) over the item and seed populations."""
    rho: float = 0.9
    """How much an item's ease for the base model carries over to the trained model."""
    tau: float = 0.3
    """Seed-to-seed spread of the trained model's quality (probit scale; 0.3 ≈ 8-10 points of Δ)."""


@dataclass
class Draw:
    base: np.ndarray
    """(reps, 1, n) right/wrong of the base model on each replication's items (shared by the seeds)."""
    final: np.ndarray
    """(reps, k, n) right/wrong of each seed's final model on the same items."""
    run_truth: np.ndarray
    """(reps, k) each seed's own Δ over the item population."""


def scenarios(p_base=(0.02, 0.3, 0.6, 0.95), deltas=(0.0, 0.03, 0.1, -0.1), rho=(0.5, 0.9),
              tau=(0.0, 0.15, 0.3)) -> list[Scenario]:  # fmt: skip
    """The grid of feasible scenarios (base rate + Δ strictly inside 0..1)."""
    return [Scenario(p, d, r, t) for p, d, r, t in itertools.product(p_base, deltas, rho, tau) if 0.001 < p + d < 0.999]


def simulate(rng: np.random.Generator, reps: int, k: int, n: int, s: Scenario) -> Draw:
    """`reps` replications of one setting: k seeds scored on the same n items drawn afresh per replication."""
    theta_b = _N01.inv_cdf(1 - s.p_base)
    theta_f = _N01.inv_cdf(1 - (s.p_base + s.delta)) * math.sqrt(1 + s.tau**2)
    z = rng.standard_normal((reps, 1, n))
    u = rng.normal(0.0, s.tau, (reps, k, 1)) if s.tau else np.zeros((reps, k, 1))
    final = s.rho * z + math.sqrt(1 - s.rho**2) * rng.standard_normal((reps, k, n)) + u > theta_f
    run_truth = _N01.cdf(theta_b) - np.vectorize(_N01.cdf)(theta_f - u[..., 0])
    return Draw((z > theta_b).astype(float), final.astype(float), run_truth)


def covers(low: np.ndarray, high: np.ndarray, truth: np.ndarray | float) -> np.ndarray:
    return (low <= truth + 1e-12) & (truth <= high + 1e-12)


def seeds_items_bounds(d: Draw) -> tuple[np.ndarray, np.ndarray]:
    """The setting's interval (`a2rl_bench.summary.intervals.seeds_items_interval`, vectorised), as proportions."""
    c = crossed(d.final - d.base)
    return np.clip(c.centre - c.half, -1, 1), np.clip(c.centre + c.half, -1, 1)


def single_run_bounds(d: Draw) -> tuple[np.ndarray, np.ndarray]:
    """Each seed's own item-level interval (`paired_item_interval` for right/wrong items), as proportions."""
    base = np.broadcast_to(d.base, d.final.shape).astype(bool)
    final = d.final.astype(bool)
    counts = [(base & final).sum(-1), (base & ~final).sum(-1), (~base & final).sum(-1), (~base & ~final).sum(-1)]
    _, low, high, _ = mcnemar_interval(*counts)
    return low, high


def t_over_seeds_bounds(d: Draw) -> tuple[np.ndarray, np.ndarray]:
    """The t-interval over the seeds' Δ that the leaderboard used at 2d3f374 (for comparison only)."""
    from a2rl_bench.summary.intervals import t975

    deltas = (d.final - d.base).mean(axis=-1)
    k = deltas.shape[-1]
    half = t975(k - 1) * deltas.std(axis=-1, ddof=1) / math.sqrt(k)
    return deltas.mean(axis=-1) - half, deltas.mean(axis=-1) + half


def simulate_comparison(rng: np.random.Generator, reps: int, k: int, n: int, a: Scenario, b: Scenario
                        ) -> tuple[np.ndarray, float]:
    """`reps` replications of comparing two settings (same base model, same n hidden items drawn afresh per
    replication, k seeds each, paired by seed number): the (reps, k, n) table of B's item Δ − A's item Δ (what
    `a2rl_bench.analysis.compare.compare_items` takes) and the true difference B − A (proportion)."""
    if a.p_base != b.p_base:
        raise ValueError("the two settings share one base model: give them the same p_base")
    z = rng.standard_normal((reps, 1, n))

    def finals(s: Scenario) -> np.ndarray:
        theta_f = _N01.inv_cdf(1 - (s.p_base + s.delta)) * math.sqrt(1 + s.tau**2)
        u = rng.normal(0.0, s.tau, (reps, k, 1)) if s.tau else np.zeros((reps, k, 1))
        return (s.rho * z + math.sqrt(1 - s.rho**2) * rng.standard_normal((reps, k, n)) + u > theta_f).astype(float)

    return finals(b) - finals(a), b.delta - a.delta


def simulate_gap(rng: np.random.Generator, reps: int, k: int, n_val: int, n_test: int, s: Scenario
                 ) -> tuple[np.ndarray, np.ndarray]:
    """`reps` replications of a setting's selection gap when there is none: each seed's one model gains on a
    validation set and a hidden test set drawn from the same item population (items shared by the seeds). Returns
    the (reps, k, n_val) and (reps, k, n_test) tables of item gains (final − base); the true gap is 0."""
    theta_b = _N01.inv_cdf(1 - s.p_base)
    theta_f = _N01.inv_cdf(1 - (s.p_base + s.delta)) * math.sqrt(1 + s.tau**2)
    u = rng.normal(0.0, s.tau, (reps, k, 1)) if s.tau else np.zeros((reps, k, 1))

    def gains(n: int) -> np.ndarray:
        z = rng.standard_normal((reps, 1, n))
        final = s.rho * z + math.sqrt(1 - s.rho**2) * rng.standard_normal((reps, k, n)) + u > theta_f
        return final.astype(float) - (z > theta_b).astype(float)

    return gains(n_val), gains(n_test)
