"""The analysis on stores built to break it: settings that differ in one field each (twins), a store without a
submission (what `make run` leaves when the agent made none), tied seeds, more settings than colours, and random
valid stores. Every table, view and figure must key by the setting, and `a2rl analyze` must never crash."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from a2rl_bench.store.results import ResultsStore
from a2rl_bench.analysis.tables import load_tables
from tests.analysis_stores import (
    BASE_SETTING,
    TWIN_CHANGES,
    RunSpec,
    random_specs,
    twin_specs,
    write_store,
    zero_submission_specs,
)

ANALYSED_TWINS = 1 + len(TWIN_CHANGES)  # the base setting and one twin per field; the broken runs never count


def _figures(tables) -> dict:
    from a2rl_bench.flows.analysis_flow import draw_figures

    return draw_figures(tables)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    path = write_store(tmp_path_factory.mktemp("twins") / "results.duckdb", twin_specs())
    return path, load_tables(ResultsStore(path))


@pytest.fixture(scope="module")
def twin_figures(twins):
    return _figures(twins[1])


def _panel_axes(fig, title_part: str) -> list:
    return [ax for ax in fig.axes if title_part in (ax.get_title() + ax.get_title(loc="left")).replace("\n", " ")]


# ---- every table and view keys by the setting ------------------------------------------------------------------------


def test_every_table_and_view_keys_by_the_setting(twins):
    path, t = twins
    settings = set(t.runs["setting_id"])
    assert len(settings) == ANALYSED_TWINS and len(t.leaderboard) == ANALYSED_TWINS
    one_row_each = {
        "leaderboard": t.leaderboard, "matrix": t.matrix, "pass@1": t.pass_at_k[t.pass_at_k["k"] == 1],
        "scaling": t.scaling[(t.scaling["axis"] == "time") & (t.scaling["i"] == 0)],
        "run_costs": t.paper["run_costs"], "mode_breaches": t.paper["mode_breaches"],
        "budget_deltas at 100%": t.paper["budget_deltas"][t.paper["budget_deltas"]["budget_fraction"] == 1.0],
        "system_task_scores": t.paper["system_task_scores"].query("row_kind == 'system'"),
    }  # fmt: skip
    for name, frame in one_row_each.items():
        assert sorted(frame["setting_id"]) == sorted(settings), name
    heldout = set(t.runs.loc[t.runs["protocol"] == "heldout", "setting_id"])
    assert set(t.selection["setting_id"]) == heldout and len(t.selection) == len(heldout)
    for name, frame in {"final_routes": t.paper["final_routes"], "routes": t.routes}.items():
        assert set(frame["setting_id"]) == settings, name
        assert frame.groupby("setting_id")["n_runs"].sum().le(3).all(), name  # never two settings' runs in one row
    assert set(t.failures["setting_id"]) >= settings  # failure classes count the excluded runs too


def test_system_task_table_gives_every_setting_its_own_cell_and_each_base_model_its_baseline(twins):
    from a2rl_bench.flows.analysis_flow import _paper_sections

    _, t = twins
    section = next(s for s in _paper_sections(t) if s.title == "Paper tables")
    wide = dict(section.tables)["System × task scores"].set_index("system")
    scores = t.paper["system_task_scores"].query("row_kind == 'system'")
    cells = [c for c in wide.drop(index=[i for i in wide.index if i.startswith("Baseline")]).to_numpy().ravel()
             if isinstance(c, str) and c not in ("–", "")]  # fmt: skip
    expected = sorted(f"{m:.1f}" for m in scores["mean_score"])
    assert sorted(c.split(" ")[0] for c in cells) == expected  # every setting once, none dropped or merged
    baselines = {i: [c for c in row if isinstance(c, str) and c not in ("–", "")] for i, row in wide.iterrows()
                 if i.startswith("Baseline")}  # fmt: skip
    two_bases = [i for i in baselines if "tiny-2" in i]
    assert len(two_bases) == 1 and len(baselines) == 2
    assert all(c.startswith("18.8 ") for c in baselines[two_bases[0]])  # 6 of 32 right: its own baseline
    assert all(c.startswith("0.0 ") for i, row in baselines.items() if i not in two_bases for c in row)


# ---- figures: one cell, panel, colour per setting ---------------------------------------------------------------------


def test_heatmap_draws_each_setting_in_its_own_cell(twins, twin_figures):
    _, t = twins
    fig = twin_figures["heatmap"]
    cells = []
    for ax in fig.axes:
        texts = [x for x in ax.texts if "n=" in x.get_text()]
        positions = [tuple(x.get_position()) for x in texts]
        assert len(positions) == len(set(positions)), f"two settings drawn into one cell of {ax.get_title()}"
        cells += [x.get_text().split("\n")[0] for x in texts]
    assert len(cells) == ANALYSED_TWINS
    assert sorted(float(re.match(r"[+-][\d.]+", c).group()) for c in cells) == pytest.approx(
        sorted(round(v, 1) for v in t.leaderboard["mean_delta"]))


def test_leaderboard_figure_gives_each_variant_its_own_panel(twin_figures):
    fig = twin_figures["leaderboard"]
    v2 = _panel_axes(fig, "offline-v2: offline")
    v1 = [ax for ax in _panel_axes(fig, "gsm8k") if ax not in v2]
    assert len(v1) == 1 and len(v2) == 1
    rows = {name: {t.get_text() for t in ax.get_yticklabels()} for name, [ax] in (("v1", v1), ("v2", v2))}
    assert len(rows["v2"]) == 1 and len(rows["v1"]) == ANALYSED_TWINS - 1 and not rows["v1"] & rows["v2"]


def test_selection_gap_figure_tells_settings_apart(twins, twin_figures):
    _, t = twins
    ax = max(_panel_axes(twin_figures["selection_gap"], "gsm8k"), key=lambda a: len(a.collections))
    points = [c for c in ax.collections if len(c.get_offsets())]
    panel = t.selection_runs[t.selection_runs["variant"] == "offline"]  # the biggest panel
    assert len(points) == panel["setting_id"].nunique() > 2
    styles = {(tuple(np.round(c.get_facecolor()[0][:3], 3)), c.get_paths()[0].vertices.tobytes()) for c in points}
    assert len(styles) == len(points)  # each setting its own colour and marker


def test_mode_breaches_and_routes_count_analysed_runs_only(twins):
    path, t = twins
    breaches = t.paper["mode_breaches"]
    assert breaches["n_breaches"].sum() == 2 and breaches["runs_with_breaches"].sum() == 1  # the sft-only twin's
    assert "agent-broken" not in set(breaches["agent"]) | set(t.routes["agent"]) | set(t.paper["final_routes"]["agent"])
    assert breaches["n_runs"].sum() == len(t.runs)


def test_budget_table_says_its_split_floors_and_sits_beside_the_headline(twins):
    _, t = twins
    budget = t.paper["budget_deltas"]
    paper = set(t.runs.loc[t.runs["protocol"] == "paper", "setting_id"])
    assert (budget["split"] == np.where(budget["setting_id"].isin(paper), "test", "validation")).all()
    assert budget["floored_at_0"].all() and (budget["mean_best_gain"] >= 0).all()
    assert (budget["ci_low"].dropna() >= 0).all() and (budget["ci_high"].dropna() <= 100).all()
    headline = t.leaderboard.set_index("setting_id")["mean_delta"]
    assert np.allclose(budget["headline_delta_test"], budget["setting_id"].map(headline))


def test_baseline_interval_stays_within_what_a_score_can_be(twins):
    _, t = twins
    scores = t.paper["system_task_scores"]
    base = scores[scores["row_kind"] == "baseline"]
    assert (base["ci_low"] >= 0).all() and (base["ci_high"] <= 100).all() and (base["ci_high"] > base["ci_low"]).all()
    zero = base[base["mean_score"] == 0]
    assert len(zero) and (zero["ci_low"] == 0).all() and (zero["ci_high"] > 0).all()  # 0 of 32: [0, +x], not ±x
    assert (scores["ci_low"].dropna() >= 0).all() and (scores["ci_high"].dropna() <= 100).all()


def test_every_section_that_counts_runs_says_how_many_were_excluded(twins, tmp_path):
    from a2rl_bench.flows.analysis_flow import _sections

    _, t = twins
    note = t.exclusion_note
    assert note.startswith("4 runs excluded")
    figs = {name: tmp_path / f"{name}.png" for name in ("heatmap", "leaderboard", "scaling", "pass_at_k",
                                                          "selection_gap")}  # fmt: skip
    sections = {s.title: s for s in _sections(t, figs)}
    for title in ("Δ at fixed agent-time budgets", "Cost", "Final routes and mode breaches", "Leaderboard",
                  "Mode × task", "Scaling", "One run at a time"):
        assert note in sections[title].text, title


def test_sql_and_python_give_the_same_intervals(twins):
    """The store's `setting_intervals` view (what README's SQL reads) and the analysis's Python agree."""
    from a2rl_bench.summary.intervals import SCORE_PSEUDO, seeds_items_interval

    path, t = twins
    sql = ResultsStore(path).query("SELECT * FROM setting_intervals").set_index(["setting_id", "metric"])
    pairs = ResultsStore(path).query("SELECT p.*, r.setting_id FROM item_pairs p JOIN analysed_runs r USING (run_id)")
    for row in t.leaderboard.itertuples(index=False):
        delta = sql.loc[(row.setting_id, "delta")]
        assert (delta["ci_low"], delta["ci_high"]) == pytest.approx((row.ci_low, row.ci_high), abs=1e-9)
        assert delta["verdict"] == row.verdict
        g = pairs[pairs["setting_id"] == row.setting_id]
        finals = g.pivot(index="run_id", columns="item_id", values="final_score").to_numpy()
        score = seeds_items_interval(finals, SCORE_PSEUDO, (0.0, 100.0))
        got = sql.loc[(row.setting_id, "score")]
        assert (got["ci_low"], got["ci_high"]) == pytest.approx((score.low, score.high), abs=1e-9)


# ---- tied seeds, ceilings, README's SQL ----------------------------------------------------------------------------


def _tied_store(path: Path, gained: list[int], seeds: int = 3, n: int = 32) -> Path:
    """`seeds` seeds of one setting, the base model 0 of n right, each seed's final pick right on `gained`."""
    base = [0.0] * n
    sub = [{"agent_elapsed_s": 30.0, "score": 6.25, "status": "scored", "route": "SFT"}]
    specs = [RunSpec(f"tie-{s}", BASE_SETTING, s, base, [1.0 if i in gained else 0.0 for i in range(n)], sub)
             for s in range(seeds)]  # fmt: skip
    return write_store(path, specs)


def test_tied_seeds_never_give_a_zero_width_interval_or_p_0(tmp_path):
    """Three seeds that each get the same 1 item of 32 right (the base model none): Δ = +3.1 every time. The
    interval must still hold the items' sampling error: it includes 0, has width, and p is not 0 — in the
    leaderboard, the heatmap cells and the SQL view README queries."""
    path = _tied_store(tmp_path / "tied.duckdb", gained=[0])
    t = load_tables(ResultsStore(path))
    for name, frame in (("leaderboard", t.leaderboard), ("heatmap cells", t.matrix)):
        row = frame.iloc[0]
        assert row["mean_delta"] == pytest.approx(3.125), name
        assert row["ci_low"] < 0 < row["ci_high"] and row["ci_high"] - row["ci_low"] > 5, name
    assert t.leaderboard.iloc[0]["p_value"] > 0.05 and t.leaderboard.iloc[0]["verdict"] == "no significant change"
    sql = ResultsStore(path).query("SELECT mean_delta, ci_low, ci_high FROM leaderboard").iloc[0]
    assert sql["ci_low"] < 0 < sql["ci_high"]


def test_seeds_at_the_ceiling_get_an_interval_within_100(tmp_path):
    path = _tied_store(tmp_path / "ceiling.duckdb", gained=list(range(32)))
    row = load_tables(ResultsStore(path)).leaderboard.iloc[0]
    assert row["mean_delta"] == 100 and 80 < row["ci_low"] < row["ci_high"] <= 100
    assert row["verdict"] == "improved" and 0 < row["p_value"] < 0.05


def test_readme_leaderboard_sql_shows_no_zero_width_interval_for_tied_seeds(tmp_path):
    """README's leaderboard query, as written, against a store of tied seeds."""
    import duckdb

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    query = next(q for q in re.findall(r'con\.sql\("""(.*?)"""\)', readme, re.S) if "FROM leaderboard" in q)
    path = _tied_store(tmp_path / "a2rl.duckdb", gained=[0])
    with duckdb.connect(str(path), read_only=True) as con:
        row = con.sql(query).df().iloc[0]
    assert row["mean_delta"] == pytest.approx(3.125, abs=0.01) and row["lo"] < 0 < row["hi"]


# ---- colours, token axes, picks, heatmap colours ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def twelve(tmp_path_factory):
    """12 settings of one task (agents agent-00 .. agent-11), one seed each: Δ grows with the agent's number, so
    alphabetical order and the order by Δ disagree; agent-11 submits before its first LLM call."""
    specs = []
    for a in range(12):
        base = [0.0] * 32
        final = [1.0 if i < a + 1 else 0.0 for i in range(32)]
        subs = [{"agent_elapsed_s": 2.0, "score": 10.0 + a, "status": "scored", "route": "SFT"},
                {"agent_elapsed_s": 50.0, "score": 20.0 + a, "status": "scored", "route": "SFT"}]
        calls = [(10.0, 2000), (40.0, 3000)]  # the first submission (2 s) precedes the first call (10 s)
        specs.append(RunSpec(f"a{a}", BASE_SETTING | {"agent": f"agent-{a:02d}"}, 0, base, final, subs, calls))
    path = write_store(tmp_path_factory.mktemp("twelve") / "results.duckdb", specs)
    tables = load_tables(ResultsStore(path))
    return tables, _figures(tables)


def test_twelve_settings_in_one_panel_get_twelve_styles(twelve):
    tables, figs = twelve
    [ax] = [a for a in figs["leaderboard"].axes if a.get_yticklabels()]
    marks = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 1 and ln.get_marker() not in ("None", "")]
    assert len(marks) == 12
    styles = {(tuple(np.round(matplotlib_rgb(ln.get_color()), 3)), ln.get_marker()) for ln in marks}
    assert len(styles) == 12


def matplotlib_rgb(colour) -> tuple:
    from matplotlib.colors import to_rgb

    return to_rgb(colour)


def test_palette_keeps_colour_and_line_style_distinct_up_to_its_maximum():
    from a2rl_bench.analysis.figures import MAX_STYLES, Palette

    names = [f"s{i:02d}" for i in range(MAX_STYLES)]
    palette = Palette(names)
    assert len({(palette.colour(n), palette.line(n)) for n in names}) == MAX_STYLES and palette.note == ""
    assert str(MAX_STYLES) in Palette(names + ["one more"]).note


def test_curves_start_at_0_on_every_axis_even_when_a_submission_precedes_the_first_llm_call(twelve):
    tables, figs = twelve
    start = tables.scaling[tables.scaling["i"] == 0]
    assert (start["median"] == 0).all() and (start["x"] == 0).all()
    tokens = tables.scaling[(tables.scaling["axis"] == "tokens") & (tables.scaling["i"] == 1)]
    assert (tokens["median"] > 0).all()  # the pre-call submission shows from the first step on
    for ax in figs["scaling"].axes:
        if ax.get_xlabel():
            assert ax.get_xlim()[0] == 0, ax.get_xlabel()


def test_scaling_picks_its_top_8_by_a_stated_rule_not_by_name(twelve):
    tables, figs = twelve
    [ax] = [a for a in figs["scaling"].axes if "top 8 of 12" in a.get_title(loc="left").replace("\n", " ")]
    title = ax.get_title(loc="left").replace("\n", " ")
    assert "ties by headline delta" in title
    legend = next(a.get_legend() for a in figs["scaling"].axes if a.get_legend())
    shown = {t.get_text().split(" ")[0] for t in legend.get_texts()}
    best = tables.leaderboard.nlargest(8, "mean_delta")["agent"]
    assert shown == set(best) and "agent-00" not in shown  # alphabetically first, but the smallest Δ


def test_heatmap_colour_leaves_a_lone_within_noise_cell_pale(tmp_path):
    """humaneval's only cell is +3.1 (1 item of 32, within its noise floor of ~9): it must not look as strong as
    gsm8k's +50."""
    specs = [RunSpec(f"g{s}", BASE_SETTING, s, [0.0] * 32, [1.0] * 16 + [0.0] * 16) for s in range(2)]
    humaneval = BASE_SETTING | {"task": "humaneval", "evaluator_id": "humaneval-v1"}
    specs += [RunSpec(f"h{s}", humaneval, s, [0.0] * 32, [1.0] + [0.0] * 31) for s in range(2)]
    path = write_store(tmp_path / "noise.duckdb", specs)
    t = load_tables(ResultsStore(path))
    from a2rl_bench.analysis.figures import heatmap_figure

    [ax] = [a for a in heatmap_figure(t.matrix).axes if a.images]
    grid = np.ma.filled(ax.images[0].get_array(), np.nan)
    tasks = [label.get_text().split("\n")[0] for label in ax.get_xticklabels()]
    lone, strong = grid[0, tasks.index("humaneval")], grid[0, tasks.index("gsm8k")]
    assert t.matrix.set_index("task").loc["humaneval", "within_noise"]
    assert abs(lone) < 0.5 * abs(strong) and abs(lone) < 0.4


# ---- never crash on a valid store -------------------------------------------------------------------------------------


def test_analyze_a_store_without_a_submission(tmp_path):
    """The store `make run` leaves when its agent made no submission in its budget: `a2rl analyze` works."""
    from a2rl_bench.cli import main

    path = write_store(tmp_path / "results.duckdb", zero_submission_specs())
    assert main(["analyze", "--results", str(path), "--out", str(tmp_path / "out")]) == 0
    assert len(list((tmp_path / "out" / "figures").glob("*.png"))) == 5
    scaling = pd.read_csv(tmp_path / "out" / "tables" / "scaling.csv")
    assert len(scaling) and (scaling["median"] == 0).all()
    board = pd.read_csv(tmp_path / "out" / "tables" / "leaderboard.csv")
    assert board["mean_delta"].tolist() == [0.0] and board["ci_low"][0] < 0 < board["ci_high"][0]


def test_analyze_says_when_the_analysed_runs_shared_their_gpus_differently(tmp_path, capsys):
    """Runs that shared their card with different numbers of other processes ran on different budgets in effect:
    `a2rl analyze` says so under its output (the run metric `gpu_shared_procs_median`)."""
    from a2rl_bench.cli import main

    specs = [RunSpec(f"g{s}", BASE_SETTING, s, [0.0] * 32, [1.0] * 16 + [0.0] * 16) for s in range(2)]
    path = write_store(tmp_path / "results.duckdb", specs)
    store = ResultsStore(path)
    first, second = store.query("SELECT run_id FROM analysed_runs ORDER BY run_id")["run_id"]
    store.record_metrics(first, {"gpu_shared_procs_median": 0})
    store.record_metrics(second, {"gpu_shared_procs_median": 7})
    assert main(["analyze", "--results", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "shared their GPUs differently (other processes on the card, median per run: 0 to 7)" in \
        capsys.readouterr().out
    store.record_metrics(second, {"gpu_shared_procs_median": 0})
    assert main(["analyze", "--results", str(path), "--out", str(tmp_path / "again")]) == 0
    assert "shared their GPUs" not in capsys.readouterr().out


@pytest.mark.parametrize("seed", range(6))
def test_analyze_never_crashes_on_a_valid_store(seed, tmp_path):
    """Random valid stores (any mix of statuses, graded items, no submissions, no LLM calls, variants, protocols,
    unshared items): the whole analysis runs and writes its report."""
    from a2rl_bench.flows.analysis_flow import run_analysis

    rng = np.random.default_rng(seed)
    specs = random_specs(rng)
    path = write_store(tmp_path / "results.duckdb", specs)
    paths = run_analysis(path, tmp_path / "out")
    assert sum(p.suffix == ".png" for p in paths) == 5 and (tmp_path / "out" / "report.html").exists()
    board = pd.read_csv(tmp_path / "out" / "tables" / "leaderboard.csv") if len(specs) else pd.DataFrame()
    for row in board.itertuples(index=False) if len(board) else []:
        if not math.isnan(row.ci_low):
            assert -100 <= row.ci_low <= row.mean_delta <= row.ci_high <= 100
            assert row.ci_high > row.ci_low


def test_analyze_a_hand_built_store_with_nulls(tmp_path):
    """Rows with only some columns (an old or hand-built store): NULL task, budget, driver, mode, seed, scores."""
    import duckdb

    from a2rl_bench.flows.analysis_flow import run_analysis

    path = tmp_path / "results.duckdb"
    ResultsStore(path)
    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO runs (run_id, task, status, baseline_test, final_test, delta_test, seed) VALUES "
                    "('a', 'gsm8k', 'completed', 10, 12, 2, 0), ('b', 'gsm8k', 'completed', 10, 14, 4, 1), "
                    "('c', NULL, 'completed', NULL, 5, NULL, 0), ('d', 'x', 'completed', 0, 0, 0, NULL)")
        con.execute("INSERT INTO submissions (run_id, submission_id, score, status) VALUES ('a', 1, 5.0, 'scored'), "
                    "('d', 1, NULL, 'error')")
    paths = run_analysis(path, tmp_path / "out")
    assert sum(p.suffix == ".png" for p in paths) == 5
    board = pd.read_csv(tmp_path / "out" / "tables" / "leaderboard.csv")
    assert sorted(board["n"]) == [1, 2] and "no per-item results" in " ".join(board["interval"])


def test_the_docs_say_how_to_read_the_numbers():
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "reading-numbers.md").read_text()
    for topic in ("what n is", "The two intervals", "The noise floor", "When a verdict appears", "What is excluded"):
        assert topic.lower() in page.lower(), topic
    assert "docs/reading-numbers.md" in (root / "README.md").read_text()
    assert "Interval coverage with a shared hidden test set" in (root / "BENCHMARKS.md").read_text()
