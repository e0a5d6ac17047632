"""The `analysis` flow: results store → figures (PNG), tables (CSV), one HTML report, Prefect artifacts.

`run_analysis` is the plain function (used by `a2rl analyze`); the flow wraps it in a task and publishes
the leaderboard, the notes and the figures as artifacts.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from a2rl_bench.safetext import cells
from a2rl_bench.run_options import DEFAULT_RESULTS, resolve_results
from a2rl_bench.store.results import ResultsStore
from matplotlib.figure import Figure

from a2rl_bench.analysis.figures import (
    Palette,
    heatmap_figure,
    leaderboard_figure,
    pass_at_k_figure,
    save_png,
    scaling_figure,
    selection_gap_figure,
)
from a2rl_bench.analysis.html import Section, write_html_report
from a2rl_bench.analysis.paper_tables import budget_table, system_task_table
from a2rl_bench.analysis.tables import PASS_AT_K, AnalysisTables, load_tables

DEFAULT_OUT = Path("results/analysis")
FIGURES = ("heatmap", "leaderboard", "scaling", "pass_at_k", "selection_gap")
TABLES = ("matrix", "leaderboard", "run_intervals", "pass_at_k", "scaling", "noise", "paired", "rl_modes", "rl_shares",
          "selection", "selection_runs", "routes", "failures", "excluded", "submissions")
DRILL_DOWN_RUNS = 30


def draw_figures(t: AnalysisTables) -> dict[str, Figure]:
    """Every figure of the report, with one colour per setting across them and the exclusion count on each."""
    palette = Palette(t.leaderboard["series"]) if len(t.leaderboard) else Palette([])
    note = t.exclusion_note
    return {
        "heatmap": heatmap_figure(t.matrix, note),
        "leaderboard": leaderboard_figure(t.leaderboard, palette, note),
        "scaling": scaling_figure(t.scaling, palette, note),
        "pass_at_k": pass_at_k_figure(t.pass_at_k, palette, note),
        "selection_gap": selection_gap_figure(t.selection_runs, palette, note),
    }


def run_analysis(
    results_path: Path | str,
    out_dir: Path | str,
    compare: tuple[str, ...] | None = None,
) -> list[Path]:
    """Write figures/*.png, tables/*.csv, summary.json and report.html under `out_dir`; return their paths.

    Args:
        results_path: an existing DuckDB results file.
        out_dir: created if missing; earlier outputs of the same names are replaced.
        compare: what the comparison table compares: (FIELD,), (FIELD, A, B) or (AGENT_A, AGENT_B) (`load_tables`;
            default: every setting field with two values or more).
    """
    results_path = Path(results_path)
    if not results_path.exists():
        raise FileNotFoundError(f"no results store at {results_path}")
    out = Path(out_dir)
    tables = load_tables(ResultsStore(results_path), compare=compare)
    figures = [save_png(fig, out / "figures" / f"{name}.png", name) for name, fig in draw_figures(tables).items()]
    csvs = []
    frames = {name: getattr(tables, name) for name in TABLES} | tables.paper
    for name, frame in frames.items():
        path = out / "tables" / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(path, index=False)
        csvs.append(path)
    summary = {
        "results": str(results_path.resolve()),
        "completed_runs": len(tables.runs),
        "excluded_runs": dict(zip(tables.excluded["reason"], tables.excluded["n_runs"].astype(int).tolist())),
        "tasks": sorted(tables.runs["task"].unique().tolist()),
        "agents": sorted(tables.runs["agent"].unique().tolist()),
        "notes": tables.notes,
        "figures": [{"name": f.name, "path": str(f.path), "width": f.width, "height": f.height, "title": f.title}
                    for f in figures],  # fmt: skip
        "tables": {p.stem: str(p) for p in csvs},
    }
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2))
    sections = _sections(tables, {f.name: f.path for f in figures})
    html_path = write_html_report(out / "report.html", "a2rl analysis", sections, tables.notes,
                                  str(results_path.resolve()))  # fmt: skip
    return [f.path for f in figures] + csvs + [summary_path, html_path]


def _sections(t: AnalysisTables, fig: dict[str, Path]) -> list[Section]:
    board_cols = ["task", "variant", "item_selection", "series", "n", "n_items", "mean_delta", "ci_low", "ci_high",
                  "p_value", "verdict", "design", "interval", "noise_se", "noise_floor", "within_noise", "is_best", "is_worst",
                  "mark_note", "n_mode_breaches", "setting_id"]
    matrix_cols = ["task", "variant", "item_selection", "evaluator_id", "agent", "driver", "base_model", "protocol",
                   "budget_s", "mode", "n", "mean_delta", "ci_low", "ci_high", "verdict", "noise_floor", "is_best",
                   "is_worst", "mark_note", "within_noise", "setting_id"]
    pak = t.pass_at_k[t.pass_at_k["k"].isin(PASS_AT_K)]
    pak_wide = (pak.pivot_table(index=["task", "variant", "series", "setting_id", "n"], columns="k",
                                values="expected_best_delta").rename(columns=lambda k: f"pass@{k}").reset_index()
                if len(pak) else pak)  # fmt: skip
    excluded = t.exclusion_note
    interval = ("One 95% interval per setting, over its seeds and the hidden-test items they share (seeds × items; "
                "items some seed did not score are left out and counted: seeds × shared items; one seed: that run's "
                "exact paired interval; without per-item results: the t-interval over seeds, with the reason), with "
                "its p-value and verdict from the same test; the column design says which; see "
                "docs/reading-numbers.md. ")
    return [
        Section("Overview", f"{len(t.runs)} runs analysed, {t.runs['task'].nunique()} tasks, "
                f"{t.runs['agent'].nunique()} agents, {len(t.leaderboard)} settings. A setting is everything but the "
                "seed: task, variant, item selection, base model, agent, driver, mode, protocol, budget and evaluator "
                "(decoding included); every table and figure keys by it, and its n is its number of seeds. Δ = "
                "hidden-test score of the final pick − score of the base model on the same items: the headline. "
                f"{excluded}",
                tables=[("Runs left out of every figure and table, by reason", t.excluded)]),
        *_paper_sections(t),
        _rl_section(t),
        Section("Mode × task", "Mean Δ per cell (one setting) with its 95% interval; ★ best and ▲ worst mode per task "
                "within one agent setting only where the comparison with the runner-up (paired by seed and item) leaves "
                "0 out, otherwise mark_note says \"no detectable difference\" with the interval's half-width; † |Δ| "
                "below the noise floor. Colour: Δ in units of the noise floor, one "
                "scale for every cell. " + interval + excluded,
                tables=[("Mode × task cells", _cols(t.matrix, matrix_cols))],
                figures=[("Mode × task heatmap", fig["heatmap"])]),
        Section("Leaderboard", interval + "noise_se: the base model's item-level standard error on these items "
                "(binomial, or bootstrap for graded items); noise_floor = 2 × noise_se. " + excluded,
                tables=[("Leaderboard", _cols(t.leaderboard, board_cols))],
                figures=[("Leaderboard", fig["leaderboard"])]),
        Section("One run at a time", "Each run's Δ with a 95% interval from the paired per-item comparison with the "
                "base model on the same hidden-test items: for right/wrong items the exact McNemar test, and "
                "Newcombe's interval reaching 0 wherever that test does not reject; for graded items the t-interval "
                "of the item differences. `improved` only where the interval excludes 0 (exactly where p < 0.05). "
                + excluded,
                tables=[("Runs with per-item results", t.run_intervals)]),
        Section("Scaling", "Best-so-far gain over the base model on the feedback split — validation under `heldout`, "
                "the test set under `paper`; not the headline, which is the hidden-test Δ of the final pick (◆) — "
                "against agent time (grading excluded), cumulative LLM tokens and submissions. The base model is "
                "always a candidate, so a curve starts at 0 and never falls below it; lines are medians over seeds, "
                "bands the IQR; every axis starts at 0. " + excluded,
                figures=[("Scaling curves", fig["scaling"])]),
        Section("pass@k", "Expected best Δ among k runs drawn without replacement from the n runs of a setting: "
                "sort Δ ascending, E[max of k] = Σ_{i=k..n} C(i−1,k−1)/C(n,k)·Δ_(i). " + excluded,
                tables=[("pass@k", pak_wide)], figures=[("pass@k", fig["pass_at_k"])]),
        Section("Noise floor", "The base model's item-level sampling error per task, item selection and evaluator: "
                "re-evaluating a greedy evaluator repeats itself, so fresh re-evaluations (k_reevaluations) are only "
                "counted. " + excluded, tables=[("Noise floor (test split)", t.noise)]),
        Section("Comparisons", "Settings that differ in one field only (column compared; `a2rl analyze --compare FIELD` "
                "picks the field): B − A, " + COMPARISON + excluded,
                tables=[("Comparisons (B − A)", t.paired)]),
        Section("Selection gap", "heldout runs: validation gain of the best submission minus the hidden-test gain of "
                "the final pick, per setting. A positive gap is optimism from selecting on validation. Its 95% interval "
                "is over the seeds and the items they share on each split, like Δ's (without per-item results: the "
                "t-interval over seeds plus binomial bounds of the four scores). " + excluded,
                tables=[("Selection gap by setting", t.selection)],
                figures=[("Selection gap", fig["selection_gap"])]),
        Section("Routes and failure classes", "Routes count the submissions of analysed runs, per setting. Failure "
                "classes count every run, the excluded ones included (column counted_as says which). " + excluded,
                tables=[("Route labels of submissions", t.routes), ("Failure classes of runs", t.failures)]),
        _drill_down(t),
    ]  # fmt: skip


COMPARISON = ("paired by seed number and by hidden-test item: per seed pair and shared item, B's Δ on the item minus "
              "A's, combined over seeds and items with the same seeds × items interval as a setting's Δ; p from the "
              "same test, so the interval leaves 0 out exactly when p < 0.05. Seeds only one side ran are left out "
              "(unpaired_seeds), and so are items not scored by every paired run (dropped_items) and runs without item rows "
              "where the others have them (runs_without_items); the column design says which design each row used "
              "(seed pairs × items, seed pairs × shared items, or seeds without per-item results). ")


def _rl_section(t: AnalysisTables) -> Section:
    """"Did the RL stage help?": every mode against SFT only, and RL's share over seeds, each with its verdict."""
    lines = []
    for r in t.rl_modes.itertuples(index=False):
        lines.append(f"{r.task}, {r.agent}: {r.b} − sft-only = {_comparison_text(r)}.")
    for r in t.rl_shares.itertuples(index=False):
        lines.append(f"{r.task}, {r.series}: RL's share over seeds = {_comparison_text(r)}.")
    text = (" ".join(lines) if lines else "No two settings differ only in mode `sft-only` against another mode, and no "
            "run has an SFT-then-RL pair of post-hoc hidden-test evaluations.")
    return Section("Did the RL stage help?", "SFT only (mode sft-only) against each other mode, per task and agent "
                   "setting, B − A = that mode − sft-only; " + COMPARISON + "RL's share: the last RL checkpoint − the SFT "
                   "checkpoint it started from on the hidden test (runs made with --test-every-submission), combined "
                   "over seeds and shared items the same way. " + text + " " + t.exclusion_note,
                   tables=[("Each mode against SFT only", t.rl_modes), ("RL's share over seeds", t.rl_shares)])


def _comparison_text(r) -> str:
    """"+0.19 [95% −7.92, +8.30], p = 0.96, n = 4 seeds × 134 items: no detectable difference"."""
    if r.ci_low != r.ci_low:
        return f"{r.mean_diff:+.2f} (n = {r.n_seeds} seeds; {r.interval}; design: {r.design})"
    return (f"{r.mean_diff:+.2f} [95% {r.ci_low:+.2f}, {r.ci_high:+.2f}], p = {r.p_value:.2g}, n = {r.n_seeds} "
            f"seeds × {r.n_items} items: {r.verdict} (design: {r.design}"
            + (f"; {r.interval.rsplit('; ', 1)[-1]}" if r.runs_without_items else "") + ")")


def _paper_sections(t: AnalysisTables) -> list[Section]:
    p = t.paper
    excluded = t.exclusion_note
    return [
        Section("Paper tables", "System × task absolute hidden-test scores: each cell is one setting, mean [95% "
                "interval over seeds and the shared items] n = seeds; the Baseline rows (one per base model) give the "
                "base model's item-level interval, in 0..100. " + excluded,
                tables=[("System × task scores", system_task_table(p["system_task_scores"])),
                        ("System × task scores (long, every setting column)", p["system_task_scores"])]),
        Section("Δ at fixed agent-time budgets", "Best gain on the feedback split (column split: validation under "
                "`heldout`) reached within 25%, 50% and 100% of the agent-time budget, from the submission timeline. "
                "It is floored at 0 (the base model counts as a candidate) and is not the headline: "
                "headline_delta_test beside it is the hidden-test Δ of the final pick. " + excluded,
                tables=[("Δ at 25/50/100% of the budget", budget_table(p["budget_deltas"]))]),
        Section("Cost", "Driver-LLM cost per run and Δ per dollar (mean Δ test / mean cost; none for free runs), per "
                "setting. " + excluded,
                tables=[("Cost per run and Δ per dollar", p["run_costs"])]),
        Section("Final routes and mode breaches", "Which route produced the final pick, per setting, and the "
                "submissions whose route broke the run's mode (analysed runs only). " + excluded,
                tables=[("Final-pick route per setting", p["final_routes"]), ("Mode breaches", p["mode_breaches"])]),
        Section("What RL added (hidden test, post hoc)", "Runs made with `--test-every-submission`: every submission "
                "was also evaluated on the hidden test after the session (never shown to the agent; the final pick and "
                "Δ do not use it). RL's share = the last RL checkpoint's hidden-test score − that of the SFT checkpoint "
                "RL started from (the best SFT submission on validation before the first RL one; stages as the agent "
                "labelled its submissions), with the paired 95% interval over the same items. The drill-down's "
                "submissions carry each one's post-hoc score. " + excluded,
                tables=[("RL's share per run", p["stage_shares"])]),
    ]  # fmt: skip


def _drill_down(t: AnalysisTables) -> Section:
    """Per run: its submissions, its per-item comparison, and where its transcript is (the first runs, the rest in
    the CSVs)."""
    runs = t.runs.head(DRILL_DOWN_RUNS)
    tables = []
    items = t.run_intervals.set_index("run_id") if len(t.run_intervals) else pd.DataFrame()
    for r in runs.itertuples(index=False):
        harness = Path(str(r.harness_dir)) if isinstance(r.harness_dir, str) else None
        transcript = harness / "transcript.jsonl" if harness and (harness / "transcript.jsonl").exists() else None
        iv = items.loc[r.run_id] if r.run_id in items.index else None
        head = pd.DataFrame([{
            "run_id": r.run_id, "setting_id": r.setting_id, "seed": r.seed, "Δ test": r.delta_test,
            "95% item-level": f"[{iv['ci_low']:+.2f}, {iv['ci_high']:+.2f}] p={iv['p_value']:.3g} ({iv['verdict']})"
            if iv is not None else "no per-item results",
            "failure class": r.failure_class, "transcript": f"file://{transcript}" if transcript else "not recorded",
        }])  # fmt: skip
        tables.append((f"Run {r.run_id}", head))
        tables.append((f"Run {r.run_id}: submissions", t.submissions[t.submissions["run_id"] == r.run_id]))
    more = (f"The first {len(runs)} of {len(t.runs)} runs; every run's rows are in tables/submissions.csv and "
            "tables/run_intervals.csv." if len(t.runs) > len(runs) else "")
    return Section("Per-run drill-down", f"Submissions, per-item comparison and transcript of each run. {more}",
                   tables=tables)


def _cols(frame: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return frame[[c for c in cols if c in frame.columns]]


@task(name="build-analysis", cache_policy=NO_CACHE)
def build_analysis(results: Path, out_dir: Path, compare: tuple[str, ...] | None) -> list[Path]:
    """Figures, tables and the HTML report from the results store."""
    return run_analysis(results, out_dir, compare=compare)


@task(name="publish-analysis-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(out_dir: Path) -> None:
    """The leaderboard as a table, the notes as markdown, each figure as an image (data URL)."""
    summary = json.loads((out_dir / "summary.json").read_text())
    board = pd.read_csv(out_dir / "tables" / "leaderboard.csv")
    wanted = ("task", "variant", "item_selection", "series", "n", "mean_delta", "ci_low", "ci_high", "p_value",
              "verdict", "noise_floor", "within_noise")
    cols = [c for c in wanted if c in board]
    rows = board[cols].round(3).astype(object).where(board[cols].notna(), None).to_dict("records")
    create_table_artifact(cells(rows) or [{"task": None}], key="analysis-leaderboard",
                          description="mean Δ test with its 95% interval over seeds and shared items")
    lines = [f"# a2rl analysis of `{summary['results']}`", "",
             f"{summary['completed_runs']} runs analysed ({sum(summary['excluded_runs'].values())} excluded); tasks {', '.join(summary['tasks']) or '-'}; "
             f"agents {', '.join(summary['agents']) or '-'}.", "", f"HTML report: `{out_dir / 'report.html'}`", ""]
    lines += [f"- {n}" for n in summary["notes"]]
    lines += ["", board[cols].to_markdown(index=False, floatfmt=".2f") if len(board) else "_no completed runs_"]
    create_markdown_artifact("\n".join(lines), key="analysis-report", description="a2rl analysis summary")
    for f in summary["figures"]:
        data = base64.b64encode(Path(f["path"]).read_bytes()).decode("ascii")
        key = "analysis-figure-" + f["name"].replace("_", "-")  # distinct from the table keys
        create_image_artifact(image_url=f"data:image/png;base64,{data}", key=key, description=f["title"])


@flow(name="analysis", log_prints=True)
def analysis(
    results: Path = DEFAULT_RESULTS,
    out_dir: Path = DEFAULT_OUT,
    compare: list[str] | None = None,
) -> list[Path]:
    """Figures, tables, an HTML report and Prefect artifacts for every completed run in a results store."""
    results, out_dir = resolve_results(results), resolve_results(out_dir)  # a deployment's relative defaults
    paths = build_analysis(Path(results), Path(out_dir), tuple(compare) if compare else None)
    publish_artifacts(Path(out_dir))
    get_run_logger().info("analysis written to %s (%d files)", out_dir, len(paths))
    return paths
