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

from a2rl.run_options import DEFAULT_RESULTS, resolve_results
from a2rl.store import ResultsStore
from analysis.figures import (
    heatmap_figure,
    leaderboard_figure,
    pass_at_k_figure,
    save_png,
    scaling_figure,
    selection_gap_figure,
)
from analysis.html import Section, write_report
from analysis.tables import PASS_AT_K, AnalysisTables, load_tables

DEFAULT_OUT = Path("results/analysis")
FIGURES = {
    "heatmap": (heatmap_figure, "matrix"),
    "leaderboard": (leaderboard_figure, "leaderboard"),
    "scaling": (scaling_figure, "scaling"),
    "pass_at_k": (pass_at_k_figure, "pass_at_k"),
    "selection_gap": (selection_gap_figure, "selection_runs"),
}


def run_analysis(
    results_path: Path | str,
    out_dir: Path | str,
    n_boot: int = 2000,
    compare: tuple[str, str] | None = None,
) -> list[Path]:
    """Write figures/*.png, tables/*.csv, summary.json and report.html under `out_dir`; return their paths.

    Args:
        results_path: an existing DuckDB results file.
        out_dir: created if missing; earlier outputs of the same names are replaced.
        n_boot: bootstrap resamples per confidence interval.
        compare: the two agents of the paired comparison (default: the two with the most runs).
    """
    results_path = Path(results_path)
    if not results_path.exists():
        raise FileNotFoundError(f"no results store at {results_path}")
    out = Path(out_dir)
    tables = load_tables(ResultsStore(results_path), n_boot=n_boot, compare=compare)
    figures = [save_png(fn(getattr(tables, attr)), out / "figures" / f"{name}.png", name)
               for name, (fn, attr) in FIGURES.items()]  # fmt: skip
    csvs = []
    for name in ("matrix", "leaderboard", "pass_at_k", "scaling", "noise", "paired", "selection", "routes", "failures"):
        path = out / "tables" / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        getattr(tables, name).to_csv(path, index=False)
        csvs.append(path)
    summary = {
        "results": str(results_path.resolve()),
        "completed_runs": len(tables.runs),
        "tasks": sorted(tables.runs["task"].unique().tolist()),
        "agents": sorted(tables.runs["agent"].unique().tolist()),
        "notes": tables.notes,
        "figures": [{"name": f.name, "path": str(f.path), "width": f.width, "height": f.height, "title": f.title}
                    for f in figures],  # fmt: skip
        "tables": {p.stem: str(p) for p in csvs},
    }
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2))
    html_path = write_report(out / "report.html", "a2rl analysis", _sections(tables, {f.name: f.path for f in figures}),
                             tables.notes, str(results_path.resolve()))  # fmt: skip
    return [f.path for f in figures] + csvs + [summary_path, html_path]


def _sections(t: AnalysisTables, fig: dict[str, Path]) -> list[Section]:
    board_cols = ["task", "variant", "series", "n", "mean_delta", "ci_low", "ci_high", "improve_rate", "noise_floor",
                  "within_noise"]
    matrix_cols = ["task", "variant", "agent", "driver", "base_model", "mode", "n", "mean_delta", "median_delta",
                   "is_best", "is_worst", "within_noise"]
    pak = t.pass_at_k[t.pass_at_k["k"].isin(PASS_AT_K)]
    pak_wide = (pak.pivot_table(index=["task", "variant", "series", "n"], columns="k", values="expected_best_delta")
                .rename(columns=lambda k: f"pass@{k}").reset_index()) if len(pak) else pak  # fmt: skip
    n_settings = len(t.leaderboard)
    return [
        Section("Overview", f"{len(t.runs)} completed runs, {t.runs['task'].nunique()} tasks, "
                f"{t.runs['agent'].nunique()} agents, {n_settings} settings (task × variant × protocol × agent × "
                "driver × mode × base model). Δ = hidden-test score of the final pick − score of the base model; "
                "runs of one setting differ only in seed."),
        Section("Mode × task", "Mean Δ per cell over seeds; ★ best and ▲ worst mode per task within one agent "
                "setting; † marks |Δ| below the task's noise floor.",
                tables=[("Mode × task cells", _cols(t.matrix, matrix_cols))],
                figures=[("Mode × task heatmap", fig["heatmap"])]),
        Section("Leaderboard", "Mean Δ with a 95% percentile-bootstrap interval over seeds (no interval with one "
                "seed). within_noise: |mean Δ| is below the task's noise floor.",
                tables=[("Leaderboard", _cols(t.leaderboard, board_cols))],
                figures=[("Leaderboard", fig["leaderboard"])]),
        Section("Scaling", "Best-so-far improvement over the baseline on the feedback split (validation under "
                "`heldout`), against agent time (grading excluded), cumulative LLM tokens and submissions. Each "
                "run's curve holds its value between submissions; lines are medians over seeds, bands the IQR.",
                figures=[("Scaling curves", fig["scaling"])]),
        Section("pass@k", "Expected best Δ among k runs drawn without replacement from the n runs of a setting: "
                "sort Δ ascending, E[max of k] = Σ_{i=k..n} C(i−1,k−1)/C(n,k)·Δ_(i).",
                tables=[("pass@k", pak_wide)], figures=[("pass@k", fig["pass_at_k"])]),
        Section("Noise floor", "Baseline evaluations of one base model with one evaluator across runs; cached "
                "evaluations repeat a stored score and are not counted as re-evaluations.",
                tables=[("Noise floor (test split)", t.noise)]),
        Section("Paired comparison", "Δ of agent B minus Δ of agent A on runs with the same task, mode, base model "
                "and seed; bootstrap CI and a sign-flip randomisation p-value.",
                tables=[("Paired comparison", t.paired)]),
        Section("Selection gap", "heldout runs: validation gain of the best submission minus the hidden-test gain of "
                "the final pick. A positive gap is optimism from selecting on validation.",
                tables=[("Selection gap by task and agent", t.selection)],
                figures=[("Selection gap", fig["selection_gap"])]),
        Section("Routes and failure classes", tables=[("Route labels of submissions", t.routes),
                                                       ("Failure classes of runs", t.failures)]),
    ]  # fmt: skip


def _cols(frame: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return frame[[c for c in cols if c in frame.columns]]


@task(name="build-analysis", cache_policy=NO_CACHE)
def build_analysis(results: Path, out_dir: Path, n_boot: int, compare: tuple[str, str] | None) -> list[Path]:
    """Figures, tables and the HTML report from the results store."""
    return run_analysis(results, out_dir, n_boot=n_boot, compare=compare)


@task(name="publish-analysis-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(out_dir: Path) -> None:
    """The leaderboard as a table, the notes as markdown, each figure as an image (data URL)."""
    summary = json.loads((out_dir / "summary.json").read_text())
    board = pd.read_csv(out_dir / "tables" / "leaderboard.csv")
    wanted = ("task", "variant", "series", "n", "mean_delta", "ci_low", "ci_high", "within_noise")
    cols = [c for c in wanted if c in board]
    rows = board[cols].round(3).astype(object).where(board[cols].notna(), None).to_dict("records")
    create_table_artifact(rows or [{"task": None}], key="analysis-leaderboard",
                          description="mean Δ test ± 95% bootstrap CI")
    lines = [f"# a2rl analysis of `{summary['results']}`", "",
             f"{summary['completed_runs']} completed runs; tasks {', '.join(summary['tasks']) or '-'}; "
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
    n_boot: int = 2000,
    compare: list[str] | None = None,
) -> list[Path]:
    """Figures, tables, an HTML report and Prefect artifacts for every completed run in a results store."""
    pair = (compare[0], compare[1]) if compare and len(compare) == 2 else None
    results, out_dir = resolve_results(results), resolve_results(out_dir)  # a deployment's relative defaults
    paths = build_analysis(Path(results), Path(out_dir), n_boot, pair)
    publish_artifacts(Path(out_dir))
    get_run_logger().info("analysis written to %s (%d files)", out_dir, len(paths))
    return paths
