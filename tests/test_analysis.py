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

from a2rl.store import MIGRATIONS, SCHEMA_VERSION, ResultsStore
from analysis.stats import bootstrap_ci, noise_floor, paired_comparison, pass_at_k, pass_at_k_curve, sign_flip_pvalue
from analysis.synthetic import VARIANT_LABEL, SyntheticSpec, write_synthetic_store
from analysis.tables import load_tables

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


def test_bootstrap_ci_width_shrinks_with_n_and_covers_the_mean():
    rng = np.random.default_rng(0)
    widths = []
    for n in (10, 100, 1000):
        x = rng.normal(2.0, 3.0, size=n)
        ci = bootstrap_ci(x, n_boot=1000)
        assert ci.low < ci.estimate < ci.high and ci.n == n
        assert ci.estimate == pytest.approx(x.mean())
        widths.append(ci.high - ci.low)
    assert widths[0] > widths[1] > widths[2]
    assert widths[2] == pytest.approx(2 * 1.96 * 3.0 / math.sqrt(1000), rel=0.2)  # close to the normal width
    one = bootstrap_ci([4.0])
    assert one.estimate == 4.0 and math.isnan(one.low) and math.isnan(one.high)
    assert bootstrap_ci([1.0, 2.0, 3.0], seed=5) == bootstrap_ci([1.0, 2.0, 3.0], seed=5)  # reproducible


def test_noise_floor_uses_reevaluations_and_labels_the_binomial_fallback():
    nf = noise_floor([50.0, 51.0, 49.0, 50.0])
    assert nf.value == pytest.approx(2 * np.std([50, 51, 49, 50], ddof=1)) and nf.source.startswith("re-eval")
    fallback = noise_floor([50.0], n_items=100)
    assert fallback.value == pytest.approx(2 * 100 * math.sqrt(0.25 / 100)) and fallback.source.startswith("binomial")
    assert math.isnan(noise_floor([]).value)


def test_sign_flip_pvalue_is_exact_for_small_samples():
    assert sign_flip_pvalue([1.0] * 5) == pytest.approx(2 / 32)
    assert sign_flip_pvalue([1.0, -1.0]) == 1.0


def test_paired_comparison_pairs_runs_by_seed_and_mode():
    runs = pd.DataFrame({
        "task": "t", "variant": "offline", "protocol": "heldout", "status": "completed", "base_model": "m",
        "agent": ["a"] * 3 + ["b"] * 3 + ["b"], "mode": "free", "seed": [0, 1, 2, 0, 1, 2, 9],
        "delta_test": [1.0, 2.0, 3.0, 2.0, 4.0, 3.0, 100.0],  # seed 9 of b has no partner
    })  # fmt: skip
    row = paired_comparison(runs, "a", "b", n_boot=200).iloc[0]
    assert row["n_pairs"] == 3 and row["mean_diff"] == pytest.approx(1.0)
    assert (row["wins_b"], row["losses_b"], row["ties"]) == (2, 0, 1)


# ---- the store and its views ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("synthetic") / "results.duckdb"
    data = write_synthetic_store(path, SPEC)
    return path, data, load_tables(ResultsStore(path), n_boot=500)


def test_mode_task_matrix_matches_the_runs_and_marks_the_known_best_and_worst_modes(synthetic):
    _, data, tables = synthetic
    runs = data.frames["runs"]
    expected = runs.groupby(["task", "agent", "mode"])["delta_test"].agg(["mean", "count"])
    m = tables.matrix.set_index(["task", "agent", "mode"])
    assert len(m) == len(expected)
    np.testing.assert_allclose(m.loc[expected.index, "mean_delta"], expected["mean"])
    assert (m.loc[expected.index, "n"].to_numpy() == expected["count"].to_numpy()).all()
    for (task, agent), cells in tables.matrix.groupby(["task", "agent"]):
        assert cells.loc[cells["is_best"], "mode"].tolist() == [data.truth["best_mode"][task]]
        assert cells.loc[cells["is_worst"], "mode"].tolist() == [data.truth["worst_mode"][task]]


def test_noise_floor_view_counts_only_fresh_baseline_evaluations(synthetic):
    _, data, tables = synthetic
    ev = data.frames["evaluations"]
    runs = data.frames["runs"].set_index("run_id")
    fresh = ev[(ev["kind"] == "baseline") & (ev["split"] == "test") & ~ev["cached"]]
    for task, group in fresh.groupby(runs.loc[fresh["run_id"], "task"].to_numpy()):
        row = tables.noise.set_index("task").loc[task]
        assert row["k_reevaluations"] == len(group)
        assert row["noise_floor"] == pytest.approx(2 * group["score"].std(ddof=1))
        assert row["noise_floor_source"] == "re-evaluations (2 sd)"
    # within_noise is |mean Δ| below the floor of its task
    board = tables.leaderboard
    assert (board["within_noise"] == (board["mean_delta"].abs() < board["noise_floor"])).all()


def test_leaderboard_intervals_and_pass_at_k_come_from_the_seed_deltas(synthetic):
    _, data, tables = synthetic
    board = tables.leaderboard
    assert (board["n"] == SPEC.n_seeds).all()
    assert ((board["ci_low"] <= board["mean_delta"]) & (board["mean_delta"] <= board["ci_high"])).all()
    runs = data.frames["runs"]
    one = board.iloc[0]
    deltas = runs[(runs["task"] == one["task"]) & (runs["agent"] == one["agent"]) & (runs["mode"] == one["mode"])]
    pak = tables.pass_at_k
    sel = pak[(pak["task"] == one["task"]) & (pak["agent"] == one["agent"]) & (pak["mode"] == one["mode"])]
    for k, value in zip(sel["k"], sel["expected_best_delta"]):
        assert value == pytest.approx(brute_force_expected_max(deltas["delta_test"].tolist(), k))
    assert sel["k"].max() == SPEC.n_seeds


def test_paired_comparison_recovers_the_known_agent_difference(synthetic):
    _, data, tables = synthetic
    paired = tables.paired
    assert len(paired) == len(SPEC.tasks)
    assert (paired["n_pairs"] == len(SPEC.modes) * SPEC.n_seeds).all()
    np.testing.assert_allclose(paired["mean_diff"], data.truth["paired_diff"]["agent-b"])
    assert (paired["wins_b"] == paired["n_pairs"]).all()


def test_selection_gap_and_scaling_end_points_match_the_submissions(synthetic):
    _, data, tables = synthetic
    runs = data.frames["runs"]
    gap = (runs["best_val"] - runs["baseline_val"]) - runs["delta_test"]
    expected = gap.groupby([runs["task"], runs["agent"]]).mean()
    got = tables.selection.set_index(["task", "agent"])["mean_gap"]
    np.testing.assert_allclose(got.loc[expected.index], expected)
    # At the end of the time axis the best-so-far is the run's best validation gain.
    gain = runs.assign(gain=runs["best_val"] - runs["baseline_val"])
    final = gain.groupby(["task", "agent", "mode"])["gain"].median()
    for axis in ("time", "submissions", "tokens"):
        s = tables.scaling[tables.scaling["axis"] == axis]
        last = s[s["i"] == s["i"].max()].set_index(["task", "agent", "mode"])["median"]
        np.testing.assert_allclose(last.loc[final.index], final, err_msg=axis)
    first = tables.scaling[tables.scaling["i"] == 0]
    assert (first[first["axis"] != "tokens"]["median"] == 0).all()  # nothing submitted yet: the base model stands


def test_scaling_curves_hold_the_last_value_and_count_runs_without_submissions():
    from analysis.tables import SETTING, scaling_curves

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
    assert tokens["x"].tolist() == [0.0, 125.0, 250.0, 375.0, 500.0] and tokens["median"].tolist()[0] == 0.5
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
    from a2rl.cli import main

    root = tmp_path_factory.mktemp("analysed")
    write_synthetic_store(root / "results.duckdb", SMALL)
    assert main(["analyze", "--results", str(root / "results.duckdb"), "--out", str(root / "out"),
                 "--n-boot", "200"]) == 0
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
    assert VARIANT_LABEL in text and "Paired comparison" in text and "pass@3" in text
    assert {p.stem for p in (analysed / "tables").glob("*.csv")} >= {"leaderboard", "matrix", "pass_at_k", "noise"}


def test_analysis_of_an_empty_store_draws_placeholders(tmp_path: Path):
    from flows.analysis import run_analysis

    ResultsStore(tmp_path / "empty.duckdb")
    paths = run_analysis(tmp_path / "empty.duckdb", tmp_path / "out", n_boot=100)
    assert sum(p.suffix == ".png" for p in paths) == 5 and (tmp_path / "out" / "report.html").exists()
    with pytest.raises(FileNotFoundError):
        run_analysis(tmp_path / "missing.duckdb", tmp_path / "out")


def test_analysis_flow_publishes_artifacts(prefect_harness, tmp_path: Path):
    from prefect.artifacts import Artifact

    from flows.analysis import analysis

    write_synthetic_store(tmp_path / "results.duckdb", TINY)
    paths = analysis(results=tmp_path / "results.duckdb", out_dir=tmp_path / "out", n_boot=100)
    assert any(p.name == "report.html" for p in paths)
    board = Artifact.get("analysis-leaderboard")
    assert board is not None and board.type == "table"
    assert Artifact.get("analysis-report").type == "markdown"
    assert Artifact.get("analysis-figure-heatmap").type == "image"
