"""The one comparison model (`a2rl_bench.analysis.compare`): its coverage and false verdicts by simulation with a shared
test set, interval and p agreeing on every table, and the eight-run "did RL help?" store of issue 34."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from a2rl_bench.store.results import ResultsStore
from a2rl_bench.summary.intervals import crossed, seeds_items_interval
from a2rl_bench.analysis.compare import compare_items
from a2rl_bench.analysis.coverage import Scenario, covers, simulate_comparison
from a2rl_bench.analysis.synthetic import StageStudySpec, stage_study_sheets, write_stage_study
from a2rl_bench.analysis.tables import load_tables

# Deterministic training: a seed changes (almost) nothing; noisy: seeds differ by ~8-10 points and items churn.
TRAINING = {"deterministic": dict(rho=0.99, tau=0.0), "noisy": dict(rho=0.7, tau=0.3)}


def _bounds(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = crossed(table)  # the comparison's interval (compare_items → seeds_items_interval), vectorised
    return c.centre - c.half, c.centre + c.half


@pytest.mark.parametrize("k", [2, 3, 5, 10])
@pytest.mark.parametrize("training", sorted(TRAINING))
def test_comparisons_cover_and_rarely_give_false_verdicts_with_a_shared_test_set(k: int, training: str):
    rng = np.random.default_rng(k)
    kw = TRAINING[training]
    reps, n = 400, 64
    for p_base in (0.3, 0.6):
        for delta_a, delta_b in ((0.1, 0.1), (0.0, 0.0), (0.05, 0.15)):
            table, truth = simulate_comparison(rng, reps, k, n, Scenario(p_base, delta_a, **kw),
                                               Scenario(p_base, delta_b, **kw))
            low, high = _bounds(table)
            where = (training, k, p_base, delta_a, delta_b)
            assert covers(low, high, truth).mean() >= 0.93, where  # measured: ≥ 0.965 on every scenario
            if truth == 0:
                assert ((low > 0) | (high < 0)).mean() <= 0.06, where  # measured: ≤ 0.03

def test_interval_and_p_agree_on_every_comparison_table_tried():
    rng = np.random.default_rng(7)
    disagree = 0
    for _ in range(3000):
        k, n = int(rng.integers(1, 11)), int(rng.integers(1, 60))
        # Item differences of right/wrong items: -1, 0, +1, with seed-specific drifts.
        p = rng.dirichlet((1, 2, 1), size=(k, 1)).repeat(n, axis=1)
        u = rng.random((k, n))
        table = np.where(u < p[..., 0], -1.0, np.where(u < p[..., 0] + p[..., 1], 0.0, 1.0))
        iv = seeds_items_interval(table, bounds=(-200, 200))
        disagree += (iv.p_value < 0.05) != (iv.low > 0 or iv.high < 0)
    assert disagree == 0


def test_unpaired_seeds_are_left_out_and_counted():
    a = pd.DataFrame({"seed": [0, 0, 1, 1], "item_id": ["x", "y"] * 2, "value": [0.0, 1.0, 1.0, 0.0]})
    b = pd.DataFrame({"seed": [1, 1, 2, 2], "item_id": ["x", "y"] * 2, "value": [1.0, 1.0, 0.0, 0.0]})
    c = compare_items(a, b)
    assert (c.interval.n, c.unpaired_seeds, c.interval.n_items) == (1, 2, 2)
    assert c.interval.estimate == pytest.approx(50.0)
    none = compare_items(a, b.assign(seed=[5, 5, 6, 6]))
    assert none.interval.low != none.interval.low and "no seed in common" in none.interval.method


def test_marks_fall_on_the_known_best_and_worst_modes_when_the_difference_is_detectable(tmp_path: Path):
    from a2rl_bench.analysis.synthetic import SyntheticSpec, write_synthetic_store

    spec = SyntheticSpec(tasks=("gsm8k", "humaneval"), agents=("agent-a",), n_seeds=4, mode_step=25.0, n_items=64)
    data = write_synthetic_store(tmp_path / "s.duckdb", spec)
    matrix = load_tables(ResultsStore(tmp_path / "s.duckdb")).matrix
    for task, cells in matrix.groupby("task"):
        assert cells.loc[cells["is_best"], "mode"].tolist() == [data.truth["best_mode"][task]], cells["mark_note"]
        assert cells.loc[cells["is_worst"], "mode"].tolist() == [data.truth["worst_mode"][task]], cells["mark_note"]
        assert cells["mark_note"].str.contains("★ .* best: \\+[0-9.]+ over .*; ▲ .* worst", regex=True).all()


# ---- issue 34's eight-run store: did the RL stage help? ------------------------------------------------------------


@pytest.fixture(scope="module")
def stage_study(tmp_path_factory):
    path = tmp_path_factory.mktemp("study") / "results.duckdb"
    write_stage_study(path)
    return path


def test_the_stage_study_store_is_built_to_its_spec():
    spec, sheets = StageStudySpec(), stage_study_sheets()
    diff = (sheets["free_rl"] - sheets["sft_only"])
    assert diff.sum(axis=1).tolist() == list(spec.mode_nets)
    assert (sheets["free_rl"] - sheets["free_sft"]).sum(axis=1).tolist() == list(spec.share_nets)
    for name in ("sft_only", "free_sft", "free_rl"):
        assert set(np.unique(sheets[name])) <= {0, 1}, name


def test_did_rl_help_reads_the_numbers_of_issue_34_and_marks_no_mode(stage_study: Path, tmp_path: Path):
    t = load_tables(ResultsStore(stage_study))
    modes = t.rl_modes
    assert len(modes) == 1
    row = modes.iloc[0]
    assert (row["a"], row["b"], row["n_seeds"], row["n_items"]) == ("sft-only", "free", 4, 134)
    assert (round(row["mean_diff"], 2), round(row["ci_low"], 1), round(row["ci_high"], 1)) == (0.19, -11.3, 11.7)
    assert row["verdict"] == "no detectable difference"
    share = t.rl_shares.iloc[0]
    assert (share["n_seeds"], share["n_items"]) == (4, 134)
    assert (round(share["mean_diff"], 1), round(share["ci_low"], 1), round(share["ci_high"], 1),
            round(share["p_value"], 2)) == (2.6, -13.8, 19.0, 0.58)
    # One seed's own share is significant (+12.7, 20 gained, 3 lost); over seeds it is not.
    per_run = t.paper["stage_shares"]
    assert round(per_run["rl_share"].max(), 1) == 12.7 and per_run["p_value"].min() < 0.05
    assert not t.matrix["is_best"].any() and not t.matrix["is_worst"].any()
    assert t.matrix["mark_note"].str.fullmatch(r"no detectable difference \(± 11\.5\)").all()
    assert not t.leaderboard["is_best"].any() and not t.leaderboard["is_worst"].any()
    assert t.leaderboard["mark_note"].str.startswith("no detectable difference").all()

    from a2rl_bench.flows.analysis_flow import run_analysis

    run_analysis(stage_study, tmp_path / "out")
    text = (tmp_path / "out" / "report.html").read_text()
    assert ("alfworld, reference-sft-grpo: free − sft-only = +0.19 [95% -11.30, +11.67], p = 0.95, n = 4 seeds × 134 "
            "items: no detectable difference (design: seed pairs × items)") in text
    assert ("RL&#x27;s share over seeds = +2.61 [95% -13.84, +18.99], p = 0.58, n = 4 seeds × 134 items: no detectable "
            "difference (design: seed pairs × items)") in text
    paired = pd.read_csv(tmp_path / "out" / "tables" / "paired.csv")
    assert set(paired["compared"]) == {"mode"} and "sign-flip" not in paired.to_csv()


# ---- a run's failure explanation -----------------------------------------------------------------------------------


def _run_metrics(n_val: int, gained: int, **kw):
    from a2rl_bench.summary.intervals import paired_item_interval
    from a2rl_bench.summary.metrics import RunMetrics

    val = paired_item_interval([0.0] * n_val, [1.0] * gained + [0.0] * (n_val - gained))
    test = paired_item_interval([0.0] * 67 + [1.0] * 67, [0.0] * 67 + [1.0] * 67)
    return RunMetrics(**{
        "n_submissions": 2, "n_scored": 2, "submission_ids": [1, 2], "scored_submission_ids": [1, 2],
        "score_trajectory": [0.0, val.estimate], "feedback_split": "validation", "baseline_feedback": 0.0,
        "best_feedback": val.estimate, "improvement_feedback": val.estimate,
        "improvement_feedback_ci_low": val.low, "improvement_feedback_ci_high": val.high,
        "improvement_feedback_n_items": n_val, "delta_test": 0.0, "delta_test_ci_low": test.low,
        "delta_test_ci_high": test.high, "delta_test_n_items": 134} | kw)  # fmt: skip


def test_a_one_item_validation_set_is_never_called_a_design_failure():
    from a2rl_bench.summary.verdicts import explain_failure

    one = explain_failure(_run_metrics(1, 1), {1: "SFT", 2: "GRPO"}, {})
    assert one.label == "inconclusive", one.reason
    for number in ("best validation score 100.00", "baseline 0.00", "n=1 items", "hidden test Δ +0.00", "n=134 items"):
        assert number in one.reason, (number, one.reason)
    # A validation set large enough to show the models stayed near the baseline: the design failure, with its numbers.
    many = explain_failure(_run_metrics(64, 1), {1: "SFT", 2: "GRPO"}, {})
    assert many.label == "reward/data design failure", many.reason
    assert "best validation score 1.56, baseline 0.00, gain +1.56 [95%" in many.reason and "n=64 items" in many.reason


# ---- the selection gap ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_selection_gap_interval_covers_a_zero_gap_from_the_shared_items(k: int):
    from a2rl_bench.summary.intervals import two_tables_interval
    from a2rl_bench.analysis.coverage import simulate_gap

    rng = np.random.default_rng(10 + k)
    for s in (Scenario(0.3, 0.1, rho=0.99, tau=0.0), Scenario(0.5, 0.05, rho=0.7, tau=0.3)):
        val, test = simulate_gap(rng, 300, k, 32, 64, s)
        ivs = [two_tables_interval(v, t) for v, t in zip(val, test)]
        false = np.mean([iv.low > 0 or iv.high < 0 for iv in ivs])
        assert false <= 0.06, (k, s, false)  # the old bootstrap over runs: about 0.3
        assert all((iv.p_value < 0.05) == (iv.low > 0 or iv.high < 0) for iv in ivs)


def test_tied_seeds_give_the_selection_gap_a_real_width():
    from a2rl_bench.summary.intervals import two_tables_interval

    val = np.tile([1.0] + [0.0] * 31, (3, 1))  # three seeds, each +1 of 32 validation items, the same one
    test = np.zeros((3, 64))
    iv = two_tables_interval(val, test)
    assert iv.estimate == pytest.approx(3.125)
    assert iv.low < 0 < iv.high and iv.high - iv.low > 5 and iv.p_value > 0.05


def test_the_selection_table_uses_the_validation_items_where_the_store_has_them(tmp_path: Path):
    from a2rl_bench.analysis.synthetic import _write, stage_study_frames

    data = stage_study_frames()
    runs = data.frames["runs"]
    rows = []
    for r in runs.itertuples(index=False):  # 16 validation items: the base gets 4 right, every pick 6
        for key, right in (("baseline-0-validation", 4), (f"submission-{r.best_submission_id}-validation", 6)):
            rows.append(pd.DataFrame({"run_id": r.run_id, "eval_key": key, "split": "validation",
                                      "item_id": [f"v{i}" for i in range(16)], "score": [1.0] * right + [0.0] * (16 - right),
                                      "correct": [True] * right + [False] * (16 - right), "tokens": 64}))
    frames = data.frames | {"item_results": pd.concat([data.frames["item_results"], *rows], ignore_index=True)}
    _write(tmp_path / "s.duckdb", frames)
    selection = load_tables(ResultsStore(tmp_path / "s.duckdb")).selection
    assert len(selection) == 2 and selection["interval"].str.startswith("seeds × items on two item sets").all()
    assert (selection["n"] == 4).all() and (selection["n_val_items"] == 16).all() and (selection["n_test_items"] == 134).all()
    assert ((selection["p_value"] < 0.05) == ((selection["gap_ci_low"] > 0) | (selection["gap_ci_high"] < 0))).all()
