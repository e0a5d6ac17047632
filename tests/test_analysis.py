"""Analysis on a synthetic results store with known answers: statistics, views, figures, HTML, flow."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from a2rl_bench.store.schema import MIGRATIONS, SCHEMA_VERSION
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.summary.intervals import (
    SCORE_PSEUDO,
    baseline_se,
    binomial_var,
    crossed,
    mcnemar_exact_p,
    mcnemar_interval,
    paired_item_interval,
    seeds_interval,
    seeds_items_interval,
    t975,
)
from a2rl_bench.analysis.compare import compare_field
from a2rl_bench.analysis.stats import pass_at_k, pass_at_k_curve
from a2rl_bench.analysis.synthetic import VARIANT_LABEL, SyntheticSpec, demo_spec, write_synthetic_store
from a2rl_bench.analysis.tables import load_tables

SPEC = SyntheticSpec(n_seeds=5, subs_per_run=5)
SMALL = SyntheticSpec(tasks=("gsm8k", "humaneval"), modes=("free", "rl-only"), n_seeds=3, subs_per_run=4)
TINY = SyntheticSpec(tasks=("gsm8k",), modes=("free",), n_seeds=2, subs_per_run=2, llm_calls_per_run=1)


# ---- statistics ----------------------------------------------------------------------------------------------


def brute_force_expected_max(deltas: list[float], k: int) -> float:
    subsets = list(itertools.combinations(deltas, k))
    return sum(max(s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_the_brute_force_mean_over_all_k_subsets():
    rng = np.random.default_rng(1)
    deltas = list(rng.normal(0, 5, size=8).round(2)) + [1.0, 1.0]  # ties too
    for k in range(1, len(deltas) + 1):
        assert pass_at_k(deltas, k) == pytest.approx(brute_force_expected_max(deltas, k), abs=1e-9)
    assert pass_at_k(deltas, 1) == pytest.approx(np.mean(deltas))
    assert pass_at_k(deltas, len(deltas)) == pytest.approx(max(deltas))
    assert list(pass_at_k_curve(deltas, [1, 3, 5, 99])) == [1, 3, 5]
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(deltas, 0)


def test_pass_at_k_stays_exact_for_many_runs():
    deltas = list(np.linspace(-3, 3, 400))
    assert pass_at_k(deltas, 400) == pytest.approx(3.0)
    assert pass_at_k(deltas, 1) == pytest.approx(0.0, abs=1e-12)
    assert pass_at_k(deltas, 2) == pytest.approx(brute_force_expected_max(deltas[:40], 2) * 0 + pass_at_k(deltas, 2))
    assert pass_at_k(deltas, 5) > pass_at_k(deltas, 3) > pass_at_k(deltas, 1)


def test_baseline_se_is_binomial_for_right_wrong_items_and_never_zero():
    assert baseline_se([1.0] * 16 + [0.0] * 16) == pytest.approx(100 * math.sqrt(0.5 * 0.5 / 36))
    assert baseline_se([0.0] * 32) > 3  # 0 of 32 right: the old floor read 0 here
    graded = [0.0, 0.5, 1.0, 0.5]
    assert baseline_se(graded) == pytest.approx(100 * np.std(graded) / 2)
    assert math.isnan(baseline_se([]))


# ---- coverage of the intervals, by simulation (fixed seed, vectorised) ------------------------------------------------


@pytest.mark.parametrize("n, cells", [
    (32, (0.20, 0.05, 0.175, 0.575)),   # base 25% → final 37.5%, correlated items
    (32, (0.00, 0.03, 0.03, 0.94)),     # rare successes, no true change: the 1-of-32 case
    (16, (0.10, 0.10, 0.10, 0.70)),
    (200, (0.30, 0.10, 0.15, 0.45)),
])  # fmt: skip
def test_single_run_item_level_interval_covers_the_true_delta(n, cells):
    """One run's paired interval on n right/wrong items (exact McNemar's, Newcombe's reaching 0 where the test does
    not reject): coverage >= 93% at nominal 95%."""
    rng = np.random.default_rng(7)
    counts = rng.multinomial(n, cells, size=4000).T
    _, low, high, _ = mcnemar_interval(*counts)
    truth = cells[2] - cells[1]
    assert ((low <= truth + 1e-12) & (truth <= high + 1e-12)).mean() >= 0.93


def test_single_run_interval_covers_graded_items():
    """Graded items (a judge's 0 / 0.5 / 1) on 40 items: the item-level t-interval (one seed of the seeds × items
    interval, as `paired_item_interval` uses it) covers >= 93% at nominal 95%."""
    rng = np.random.default_rng(3)
    reps, n = 3000, 40
    base = rng.choice([0.0, 0.5, 1.0], size=(reps, n), p=[0.5, 0.2, 0.3])
    final = np.clip(base + rng.choice([-0.5, 0.0, 0.5], size=(reps, n), p=[0.15, 0.6, 0.25]), 0, 1)
    # E[final − base]: from 0 only up (+0.5 × 0.25), from 0.5 both ways, from 1 only down (−0.5 × 0.15).
    truth = 0.5 * 0.125 + 0.2 * (0.5 * 0.25 - 0.5 * 0.15) + 0.3 * (-0.075)
    c = crossed((final - base)[:, None, :])
    assert ((c.centre - c.half <= truth) & (truth <= c.centre + c.half)).mean() >= 0.93
    one = paired_item_interval(base[0], final[0])  # the function is the vectorised formula
    assert (one.low, one.high) == pytest.approx((100 * (c.centre[0] - c.half[0]), 100 * (c.centre[0] + c.half[0])))


@pytest.mark.parametrize("n_seeds", [2, 3, 5])
def test_t_interval_over_seeds_covers_the_mean_delta(n_seeds):
    """Seeds that each draw their own items (no shared test set): the t-interval over seeds >= 93% at n = 2, 3, 5."""
    rng = np.random.default_rng(n_seeds)
    reps, true = 4000, 2.0
    x = true + rng.normal(0, 1.5, (reps, n_seeds)) + (rng.binomial(32, 0.4, (reps, n_seeds)) / 32 - 0.4) * 100
    half = t975(n_seeds - 1) * x.std(axis=1, ddof=1) / math.sqrt(n_seeds)
    assert (np.abs(x.mean(axis=1) - true) <= half).mean() >= 0.93
    one = seeds_interval(x[0])  # the function is the formula above
    assert one.low == pytest.approx(x[0].mean() - half[0]) and one.method.startswith("t-interval over seeds")


COVERAGE_REPS = 2000
"""Replications per scenario: the Monte Carlo standard error of a coverage near 95% is 0.5 points."""


@pytest.mark.parametrize("n_seeds", [2, 3, 5])
def test_seeds_items_interval_covers_with_a_shared_test_set(n_seeds):
    """Every seed scored on the same hidden items (`a2rl_bench.analysis.coverage`: items drawn from a population, the
    base model greedy, seeds spread by τ): the setting's interval covers the true Δ in >= 93% of replications, in
    every scenario of a grid spanning the floor (2%), the middle and the ceiling (95%), Δ = 0 and Δ ≠ 0, at 16, 32
    and 134 items, seed spreads τ = 0 and 0.3. Fixed RNG; 2,000 replications a scenario (MC SE 0.5 points)."""
    from a2rl_bench.analysis.coverage import covers, scenarios, seeds_items_bounds, simulate

    rng = np.random.default_rng(100 + n_seeds)
    worst = 1.0
    for n in (16, 32, 134):
        for s in scenarios(p_base=(0.02, 0.3, 0.95), deltas=(0.0, 0.1, -0.1), rho=(0.9,), tau=(0.0, 0.3)):
            d = simulate(rng, COVERAGE_REPS, n_seeds, n, s)
            low, high = seeds_items_bounds(d)
            worst = min(worst, covers(low, high, s.delta).mean())
            if s.delta == 0:  # a verdict on a true Δ of 0 is an error: at most the 5% the interval allows
                assert ((low > 0) | (high < 0)).mean() <= 0.07, (n, s)
    assert worst >= 0.93
    one = seeds_items_interval(d.final[0] - d.base[0])  # the function is the vectorised formula
    assert (one.low / 100, one.high / 100) == pytest.approx((low[0], high[0]))


def test_one_run_coverage_with_a_shared_test_set():
    """k = 1: each run's own interval covers that run's Δ over the item population (the same simulation)."""
    from a2rl_bench.analysis.coverage import covers, scenarios, simulate, single_run_bounds

    rng = np.random.default_rng(11)
    for n in (16, 32, 134):
        for s in scenarios(p_base=(0.02, 0.3, 0.95), deltas=(0.0, 0.1), rho=(0.9,), tau=(0.3,)):
            d = simulate(rng, COVERAGE_REPS, 1, n, s)
            low, high = single_run_bounds(d)
            assert covers(low, high, d.run_truth).mean() >= 0.93, (n, s)


def test_one_test_one_verdict_for_every_table_of_right_wrong_items():
    """For every 2×2 table of up to 64 paired items: the interval leaves 0 out exactly when the printed exact
    McNemar p is below 0.05 (5 gained, 0 lost of 32: p = 0.0625, no significant change)."""
    for n in range(1, 65):
        b, c, a = (g.ravel() for g in np.meshgrid(np.arange(n + 1), np.arange(n + 1), np.arange(n + 1)))
        keep = a + b + c <= n
        a, b, c = a[keep], b[keep], c[keep]
        _, low, high, p = mcnemar_interval(a, b, c, n - a - b - c)
        assert ((low > 0) | (high < 0)).tolist() == (p < 0.05).tolist(), n
        assert (low < high).all() and (low >= -1).all() and (high <= 1).all()
    five = paired_item_interval([0.0] * 32, [1.0] * 5 + [0.0] * 27)
    assert five.p_value == pytest.approx(0.0625) and five.low <= 0 < five.high
    assert five.label() == "no significant change"
    for n in (16, 32):  # and the function a run's report uses, on every table of 16 and 32 items
        for b in range(n + 1):
            for c in range(n + 1 - b):
                iv = paired_item_interval([1.0] * b + [0.0] * (n - b), [0.0] * b + [1.0] * c + [0.0] * (n - b - c))
                assert iv.excludes_zero == (iv.p_value < 0.05) and iv.p_value == mcnemar_exact_p(b, c), (n, b, c)


def test_seeds_items_interval_and_its_p_value_agree():
    rng = np.random.default_rng(5)
    for _ in range(300):
        k, n = int(rng.integers(1, 6)), int(rng.integers(2, 40))
        v = (rng.random((k, n)) < rng.random()) * 1.0 - (rng.random((k, n)) < 0.5 * rng.random())
        iv = seeds_items_interval(v)
        assert iv.excludes_zero == (iv.p_value < 0.05) and -100 <= iv.low < iv.high <= 100


def test_one_seed_has_no_interval_over_seeds_and_says_so():
    one = seeds_interval([3.0])
    assert one.estimate == 3.0 and math.isnan(one.low) and "no interval" in one.method
    assert one.label() == "no significant change"


def test_tied_seeds_never_give_a_zero_width_interval_or_p_0():
    tied = seeds_interval([3.125, 3.125, 3.125])  # the old t-interval gave [+3.1, +3.1] and p = 0
    assert math.isnan(tied.low) and "agree exactly" in tied.method
    bounded = seeds_interval([3.125] * 3, binomial_var(3.125, 32) + binomial_var(0.0, 32), 32)
    assert bounded.low < 0 < bounded.high and bounded.p_value > 0.05
    same_item = np.zeros((3, 32))
    same_item[:, 0] = 1  # three seeds, each 1 of 32 right where the base model had none
    iv = seeds_items_interval(same_item)
    assert iv.estimate == pytest.approx(3.125) and iv.low < 0 < iv.high and 0.05 < iv.p_value < 1
    nothing = seeds_items_interval(np.zeros((3, 32)))
    assert nothing.low < 0 < nothing.high and nothing.p_value == pytest.approx(1.0)  # nothing moved: still a width
    full = seeds_items_interval(np.ones((3, 32)))
    assert full.high == 100 and full.low > 80  # clipped to what a Δ can be
    score = seeds_items_interval(np.zeros((1, 32)), SCORE_PSEUDO, (0.0, 100.0))
    assert score.low == 0 < score.high  # a score of 0 of 32: [0, +x], never below 0


def test_paired_item_interval_on_one_item_of_32_is_not_significant():
    one = paired_item_interval([0.0] * 32, [1.0] + [0.0] * 31)
    assert one.estimate == pytest.approx(3.125) and one.low < 0 < one.high and one.p_value == 1.0
    assert one.label() == "no significant change"
    many = paired_item_interval([0.0] * 32, [1.0] * 12 + [0.0] * 20)
    assert many.low > 0 and many.p_value == pytest.approx(2 / 2**12) and many.label() == "improved"


def test_comparison_pairs_runs_by_seed_and_item_and_counts_unpaired_seeds():
    runs = pd.DataFrame({
        "run_id": [f"r{i}" for i in range(7)], "task": "t", "variant": "offline", "protocol": "heldout",
        "base_model": "m", "driver": "none", "item_selection": "val:16 test:4", "budget_s": 60.0, "evaluator_id": "e",
        "agent": ["a"] * 3 + ["b"] * 4, "mode": "free", "seed": [0, 1, 2, 0, 1, 2, 9],
        "delta_test": [0.0, 25.0, 25.0, 25.0, 50.0, 25.0, 100.0],  # seed 9 of b has no partner
    })  # fmt: skip
    finals = {"r0": [0, 0, 0, 0], "r1": [1, 0, 0, 0], "r2": [0, 1, 0, 0], "r3": [1, 0, 0, 0], "r4": [1, 1, 0, 0],
              "r5": [0, 1, 0, 0], "r6": [1, 1, 1, 1]}
    pairs = pd.DataFrame([{"run_id": r, "item_id": f"i{j}", "base_score": 0.0, "final_score": float(v)}
                          for r, vals in finals.items() for j, v in enumerate(vals)])
    row = compare_field(runs, pairs, "agent").iloc[0]
    assert (row["a"], row["b"], row["n_seeds"], row["unpaired_seeds"], row["n_items"]) == ("a", "b", 3, 1, 4)
    expected = seeds_items_interval(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=float),
                                    bounds=(-200, 200))
    assert row["mean_diff"] == pytest.approx(2 / 12 * 100)
    assert (row["ci_low"], row["ci_high"], row["p_value"]) == pytest.approx((expected.low, expected.high,
                                                                           expected.p_value))
    # A different budget is a different setting: nothing to compare.
    other = runs.assign(budget_s=np.where(runs["agent"] == "b", 120.0, 60.0))
    assert compare_field(other, pairs, "agent").empty
    # ... unless the budget is what is compared.
    by_budget = compare_field(other, pairs, "budget")
    assert len(by_budget) == 0  # agents differ too: still not one field apart
    assert len(compare_field(other[other["agent"] == "b"].assign(budget_s=[60.0, 120.0, 60.0, 120.0]), pairs,
                             "budget")) == 1
    with pytest.raises(ValueError, match="setting field"):
        compare_field(runs, pairs, "colour")


# ---- the store and its views ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("synthetic") / "results.duckdb"
    data = write_synthetic_store(path, SPEC)
    return path, data, load_tables(ResultsStore(path))


def test_mode_task_matrix_matches_the_runs_and_marks_the_known_best_and_worst_modes(synthetic):
    _, data, tables = synthetic
    runs = data.frames["runs"]
    expected = runs.groupby(["task", "agent", "mode"])["delta_test"].agg(["mean", "count"])
    m = tables.matrix.set_index(["task", "agent", "mode"])
    assert len(m) == len(expected)
    np.testing.assert_allclose(m.loc[expected.index, "mean_delta"], expected["mean"])
    assert (m.loc[expected.index, "n"].to_numpy() == expected["count"].to_numpy()).all()
    for (task, agent), cells in tables.matrix.groupby(["task", "agent"]):
        # Marked only where the comparison with the runner-up leaves 0 out; never the wrong mode.
        assert set(cells.loc[cells["is_best"], "mode"]) <= {data.truth["best_mode"][task]}
        assert set(cells.loc[cells["is_worst"], "mode"]) <= {data.truth["worst_mode"][task]}
        if not cells["is_best"].any() and not cells["is_worst"].any():
            assert cells["mark_note"].str.startswith("no detectable difference (± ").all()


def test_noise_floor_view_is_the_baselines_item_level_error_and_counts_fresh_evaluations(synthetic):
    _, data, tables = synthetic
    ev = data.frames["evaluations"]
    runs = data.frames["runs"].set_index("run_id")
    base = ev[(ev["kind"] == "baseline") & (ev["split"] == "test")]
    for task, group in base.groupby(runs.loc[base["run_id"], "task"].to_numpy()):
        row = tables.noise.set_index("task").loc[task]
        assert row["k_reevaluations"] == (~group["cached"]).sum()
        score = group["score"].mean()
        p = (score / 100 * 200 + 2) / 204
        assert row["noise_se"] == pytest.approx(100 * math.sqrt(p * (1 - p) / 204))
        assert row["noise_floor"] == pytest.approx(2 * row["noise_se"]) and row["noise_floor_source"].startswith("binom")
    board = tables.leaderboard
    assert (board["within_noise"] == (board["mean_delta"].abs() < board["noise_floor"])).all()
    assert board["noise_se"].notna().all()  # beside every Δ


def test_leaderboard_intervals_and_pass_at_k_come_from_the_seed_deltas(synthetic):
    _, data, tables = synthetic
    board = tables.leaderboard
    assert (board["n"] == SPEC.n_seeds).all()
    assert ((board["ci_low"] <= board["mean_delta"]) & (board["mean_delta"] <= board["ci_high"])).all()
    runs = data.frames["runs"]
    one = board.iloc[0]
    mine = runs[(runs["task"] == one["task"]) & (runs["agent"] == one["agent"]) & (runs["mode"] == one["mode"])]
    # no per-item results in SPEC: the t-interval over seeds plus the binomial bound for its 200 test items
    items_var = binomial_var(mine["final_test"].mean(), 200) + binomial_var(mine["baseline_test"].mean(), 200)
    expected = seeds_interval(mine["delta_test"].tolist(), items_var, 200)
    assert (one["ci_low"], one["ci_high"]) == pytest.approx((expected.low, expected.high), abs=2e-3)
    deltas = runs[(runs["task"] == one["task"]) & (runs["agent"] == one["agent"]) & (runs["mode"] == one["mode"])]
    pak = tables.pass_at_k
    sel = pak[(pak["task"] == one["task"]) & (pak["agent"] == one["agent"]) & (pak["mode"] == one["mode"])]
    for k, value in zip(sel["k"], sel["expected_best_delta"]):
        assert value == pytest.approx(brute_force_expected_max(deltas["delta_test"].tolist(), k))
    assert sel["k"].max() == SPEC.n_seeds


def test_paired_comparison_recovers_the_known_agent_difference(synthetic):
    _, data, tables = synthetic
    paired = tables.paired[tables.paired["compared"] == "agent"]
    assert len(paired) == len(SPEC.tasks) * len(SPEC.modes)  # one per task and mode: settings one field apart
    assert (paired["n_seeds"] == SPEC.n_seeds).all() and (paired["unpaired_seeds"] == 0).all()
    np.testing.assert_allclose(paired["mean_diff"], data.truth["paired_diff"]["agent-b"])
    assert ((paired["ci_low"] < paired["mean_diff"]) & (paired["mean_diff"] < paired["ci_high"])).all()
    assert ((paired["p_value"] < 0.05) == ((paired["ci_low"] > 0) | (paired["ci_high"] < 0))).all()


def test_selection_gap_and_scaling_end_points_match_the_submissions(synthetic):
    _, data, tables = synthetic
    runs = data.frames["runs"]
    gap = (runs["best_val"] - runs["baseline_val"]) - runs["delta_test"]
    expected = gap.groupby([runs["task"], runs["agent"], runs["mode"]]).mean()  # one row per setting
    got = tables.selection.set_index(["task", "agent", "mode"])["mean_gap"]
    np.testing.assert_allclose(got.loc[expected.index], expected)
    # At the end of the time axis the best-so-far is the run's best validation gain, or 0 where nothing beat the
    # base model (it is always a candidate: the curve never goes below 0).
    gain = runs.assign(gain=(runs["best_val"] - runs["baseline_val"]).clip(lower=0))
    final = gain.groupby(["task", "agent", "mode"])["gain"].median()
    for axis in ("time", "submissions", "tokens"):
        s = tables.scaling[tables.scaling["axis"] == axis]
        last = s[s["i"] == s["i"].max()].set_index(["task", "agent", "mode"])["median"]
        np.testing.assert_allclose(last.loc[final.index], final, err_msg=axis)
    first = tables.scaling[tables.scaling["i"] == 0]
    assert (first[first["axis"] != "tokens"]["median"] == 0).all()  # nothing submitted yet: the base model stands


def test_scaling_curves_hold_the_last_value_and_count_runs_without_submissions():
    from a2rl_bench.analysis.tables import SETTING, scaling_curves

    setting = {c: "x" for c in SETTING}
    runs = pd.DataFrame([setting | {"run_id": "a", "budget_s": 40.0}, setting | {"run_id": "b", "budget_s": 40.0}])
    curve = pd.DataFrame({
        "run_id": ["a", "a", "a"], "submission_id": [1, 2, 3], "agent_elapsed_s": [10.0, 30.0, 30.0],
        "cum_tokens": [0, 500, 500], "improvement_so_far": [1.0, 2.0, 3.0],
    })  # fmt: skip
    out = scaling_curves(runs, curve, points=4)
    time = out[out["axis"] == "time"]
    assert time["x"].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    # run a: 0, 1, 1, 3 (the last of two submissions at t=30), 3; run b never submitted: 0 throughout
    assert time["median"].tolist() == [0.0, 0.5, 0.5, 1.5, 1.5] and (time["n_runs"] == 2).all()
    assert time["q75"].tolist() == [0.0, 0.75, 0.75, 2.25, 2.25]
    tokens = out[out["axis"] == "tokens"]
    assert tokens["x"].tolist() == [0.0, 125.0, 250.0, 375.0, 500.0] and tokens["median"].tolist()[:2] == [0.0, 0.5]
    # (run a's first submission came before any token was spent: at 0 the base model stands, the gain shows next)
    subs = out[out["axis"] == "submissions"]
    assert subs["median"].tolist()[-1] == 1.5


def test_bulk_write_twice_changes_nothing(synthetic, tmp_path: Path):
    _, data, _ = synthetic
    store = ResultsStore(tmp_path / "r.duckdb")
    for _ in range(2):
        assert store.bulk_write("submissions", data.frames["submissions"]) == len(data.frames["submissions"])
    assert store.query("SELECT count(*) AS n FROM submissions")["n"][0] == len(data.frames["submissions"])
    # A frame with some columns updates those and keeps the rest.
    routes = data.frames["submissions"][["run_id", "submission_id"]].assign(route="DPO")
    store.bulk_write("submissions", routes)
    after = store.query("SELECT count(*), count(score), min(route), max(route) FROM submissions")
    assert after.iloc[0].tolist() == [len(routes), data.frames["submissions"]["score"].notna().sum(), "DPO", "DPO"]
    with pytest.raises(ValueError, match="unknown table"):
        store.bulk_write("runs; DROP TABLE runs", data.frames["runs"])


def test_a_version_1_store_migrates_and_keeps_its_rows(tmp_path: Path):
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ)")
        con.execute(MIGRATIONS[0])
        con.execute("INSERT INTO schema_version VALUES (1, now())")
        con.execute("INSERT INTO runs (run_id, task, status) VALUES ('old', 'gsm8k', 'completed')")
        con.execute("INSERT INTO submissions (run_id, submission_id, score) VALUES ('old', 1, 5.0)")
    store = ResultsStore(path)
    assert store.query("SELECT max(version) AS v FROM schema_version")["v"][0] == SCHEMA_VERSION >= 2
    run = store.get_run("old")
    assert run["task"] == "gsm8k" and run["failure_class"] is None
    store.record_routes("old", {1: "SFT"}, {1: "abc"})
    assert store.query("SELECT route, code_sha, score FROM submissions").iloc[0].tolist() == ["SFT", "abc", 5.0]


# ---- figures and the HTML report ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    from a2rl_bench.cli import main

    root = tmp_path_factory.mktemp("analysed")  # 250 runs, failed, interrupted and infrastructure failures included
    assert main(["analyze", "--synthetic", "250", "--results", str(root / "results.duckdb"), "--out",
                 str(root / "out")]) == 0
    return root / "out"


def test_every_figure_is_a_readable_png_of_the_expected_size(analysed: Path):
    from PIL import Image

    summary = json.loads((analysed / "summary.json").read_text())
    names = {f["name"] for f in summary["figures"]}
    assert names == {"heatmap", "leaderboard", "scaling", "pass_at_k", "selection_gap"}
    for f in summary["figures"]:
        with Image.open(f["path"]) as img:
            img.load()
            assert img.format == "PNG" and img.size == (f["width"], f["height"]), f["name"]
            assert img.size[0] >= 700 and img.size[1] >= 450, f["name"]
            pixels = np.asarray(img.convert("L"))
        assert pixels.std() > 10, f"{f['name']} looks blank"  # something is drawn
        assert f["title"] and f["title"] != f["name"]


def test_html_report_is_self_contained_and_labels_the_data_variant(analysed: Path):
    text = (analysed / "report.html").read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert text.count('src="data:image/png;base64,') == 5
    assert "http://" not in text and "https://" not in text and "<script" not in text
    assert VARIANT_LABEL in text and "Comparisons (B − A)" in text and "Did the RL stage help?" in text and "pass@3" in text
    assert {p.stem for p in (analysed / "tables").glob("*.csv")} >= {"leaderboard", "matrix", "pass_at_k", "noise"}


def test_analysis_of_an_empty_store_draws_placeholders(tmp_path: Path):
    from a2rl_bench.flows.analysis_flow import run_analysis

    ResultsStore(tmp_path / "empty.duckdb")
    paths = run_analysis(tmp_path / "empty.duckdb", tmp_path / "out")
    assert sum(p.suffix == ".png" for p in paths) == 5 and (tmp_path / "out" / "report.html").exists()
    with pytest.raises(FileNotFoundError):
        run_analysis(tmp_path / "missing.duckdb", tmp_path / "out")


def test_analysis_flow_publishes_artifacts(prefect_harness, tmp_path: Path):
    from prefect.artifacts import Artifact

    from a2rl_bench.flows.analysis_flow import analysis

    write_synthetic_store(tmp_path / "results.duckdb", TINY)
    paths = analysis(results=tmp_path / "results.duckdb", out_dir=tmp_path / "out")
    assert any(p.name == "report.html" for p in paths)
    board = Artifact.get("analysis-leaderboard")
    assert board is not None and board.type == "table"
    assert Artifact.get("analysis-report").type == "markdown"
    assert Artifact.get("analysis-figure-heatmap").type == "image"


# ---- what the report promises: exclusions, no overlapping text, no silently dropped series ---------------------------


def test_the_report_excludes_broken_runs_and_carries_the_papers_tables(analysed: Path):
    summary = json.loads((analysed / "summary.json").read_text())
    assert summary["completed_runs"] + sum(summary["excluded_runs"].values()) == 250
    assert set(summary["excluded_runs"]) == {"run failed", "run interrupted", "run running", "infrastructure failure"}
    board = pd.read_csv(analysed / "tables" / "leaderboard.csv")
    assert board["n"].sum() == summary["completed_runs"]  # nothing excluded reaches a leaderboard row
    text = (analysed / "report.html").read_text()
    excluded = sum(summary["excluded_runs"].values())
    assert text.count(f"{excluded} runs excluded (not agent results)") >= 6
    for caption in ("System × task scores", "Δ at 25/50/100% of the budget", "Cost per run and Δ per dollar",
                    "Final-pick route per setting", "Mode breaches", "Per-run drill-down", "Run run-0: submissions"):
        assert caption in text, caption
    assert "<td class=\"text\">Baseline</td>" in text
    paired = pd.read_csv(analysed / "tables" / "paired.csv")
    assert set(paired["compared"]) == {"agent", "driver", "mode"}  # every field that varies, by default
    assert ((paired["p_value"] < 0.05) == ((paired["ci_low"] > 0) | (paired["ci_high"] < 0))).all()
    assert not paired["interval"].str.contains("t-interval over seed pairs|sign-flip").any()
    scaling = pd.read_csv(analysed / "tables" / "scaling.csv")
    start = scaling[(scaling["i"] == 0) & (scaling["axis"] != "tokens")]  # before any submission: the base model
    assert (scaling["median"] >= 0).all() and (start["median"] == 0).all()


def _figures_of(path: Path) -> dict:
    from a2rl_bench.flows.analysis_flow import draw_figures

    return draw_figures(load_tables(ResultsStore(path)))


def test_figures_of_a_single_run_have_no_overlapping_text(tmp_path: Path):
    from a2rl_bench.analysis.figures import text_overlaps

    write_synthetic_store(tmp_path / "one.duckdb", SyntheticSpec(tasks=("gsm8k",), agents=("agent-a",),
                                                                 modes=("free",), n_runs=1, n_items=32))
    for name, fig in _figures_of(tmp_path / "one.duckdb").items():
        assert text_overlaps(fig) == [], name
        assert "No runs excluded." in fig.get_supxlabel(), name


def test_figures_of_a_thousand_runs_have_no_overlapping_text_and_say_what_they_leave_out(tmp_path: Path):
    """~1,000 runs (6 tasks × 8 agents × 3 modes × 7 seeds, broken runs included): the slowest test here (~25 s)
    because it draws every figure at full size, which is what it checks."""
    from a2rl_bench.analysis.figures import MAX_ROWS, MAX_SERIES, text_overlaps

    spec = SyntheticSpec(tasks=("gsm8k", "humaneval", "alfworld", "webshop", "alpacaeval", "deepsearchqa"),
                         agents=tuple(f"agent-{c}" for c in "abcdefgh"), n_seeds=7, n_items=16, broken_every=25)
    write_synthetic_store(tmp_path / "many.duckdb", spec)
    figures = _figures_of(tmp_path / "many.duckdb")
    for name, fig in figures.items():
        assert text_overlaps(fig) == [], name
        assert "runs excluded (not agent results)" in fig.get_supxlabel(), name
    titles = [ax.get_title(loc=loc) for ax in figures["leaderboard"].axes for loc in ("center", "left")]
    assert any(f"top {MAX_ROWS} of 24 settings" in t for t in titles)
    titles = [ax.get_title(loc="left") for ax in figures["scaling"].axes]
    assert any(f"top {MAX_SERIES} of 24" in t.replace("\n", " ") for t in titles)
    assert "Showing 6 of 8 agent settings" in figures["heatmap"].get_supxlabel().replace("\n", " ")


def test_driver_level_comparison_recovers_the_known_driver_effect(tmp_path: Path):
    spec = SyntheticSpec(tasks=("gsm8k",), agents=("agent-a",), drivers=("driver-x", "driver-y"), n_seeds=4)
    data = write_synthetic_store(tmp_path / "d.duckdb", spec)
    paired = load_tables(ResultsStore(tmp_path / "d.duckdb")).paired
    rows = paired[paired["compared"] == "driver"]
    assert len(rows) == len(spec.modes)
    row = rows.iloc[0]
    assert (row["a"], row["b"], row["agent"]) == ("driver-x", "driver-y", "agent-a")
    assert row["mean_diff"] == pytest.approx(data.truth["driver_diff"]["driver-y"])
    assert row["n_seeds"] == spec.n_seeds and row["ci_low"] < row["mean_diff"] < row["ci_high"]
