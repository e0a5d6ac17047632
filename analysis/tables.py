"""The analysis tables, read from a results store's views and finished with `analysis.stats`.

One `load_tables` call opens the store read-only a few times (the store locks per call) and returns
plain DataFrames for the figures, the HTML report and the Prefect artifacts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from a2rl.summary.intervals import paired_item_interval, pooled_item_interval
from a2rl.setting import SETTING_KEY
from analysis.stats import paired_comparison, pass_at_k, selection_gap_summary

SETTING = ["setting_id", *SETTING_KEY, "variant_label"]
"""What defines one leaderboard row (`a2rl.setting.SETTING_KEY`): runs that differ only in seed are repeats of it."""
SERIES_FIELDS = [c for c in SETTING_KEY if c not in ("task", "variant")]
PASS_AT_K = (1, 3, 5, 10)
AXES = {
    "time": ("agent_elapsed_s", "agent time (s, grading excluded)"),
    "tokens": ("cum_tokens", "cumulative LLM tokens (input + output + cache)"),
    "submissions": ("submission_id", "submissions"),
}
PAPER_VIEWS = ("system_task_scores", "budget_deltas", "run_costs", "final_routes", "mode_breaches")


@dataclass
class AnalysisTables:
    runs: pd.DataFrame
    """Runs the analysis counts (`analysed_runs`: completed, not an infrastructure failure), one row each."""
    excluded: pd.DataFrame
    """Runs left out, counted by reason (`excluded_runs`)."""
    matrix: pd.DataFrame
    """mode × task cells: mean Δ with its t-interval, n, best/worst mode flags, within_noise."""
    leaderboard: pd.DataFrame
    """Mean Δ ± 95% t-interval over seeds per setting, the pooled item-level interval, the noise floor."""
    run_intervals: pd.DataFrame
    """One run's Δ with its paired item-level interval and verdict (runs with per-item results)."""
    pass_at_k: pd.DataFrame
    """Expected best Δ of k runs per setting and k (long format)."""
    scaling: pd.DataFrame
    """Median and IQR of best-so-far improvement over seeds per setting, axis and grid point."""
    noise: pd.DataFrame
    paired: pd.DataFrame
    """Agent-level (drivers averaged) and driver-level (same agent) paired comparisons."""
    selection: pd.DataFrame
    selection_runs: pd.DataFrame
    routes: pd.DataFrame
    failures: pd.DataFrame
    paper: dict[str, pd.DataFrame] = field(default_factory=dict)
    """The paper's tables, one per view in `PAPER_VIEWS`."""
    submissions: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Submissions of the analysed runs, for the per-run drill-down."""
    notes: list[str] = field(default_factory=list)

    @property
    def exclusion_note(self) -> str:
        """"N runs excluded: ..." for every figure and table (or that none were)."""
        return exclusion_note(self.excluded)


def exclusion_note(excluded: pd.DataFrame) -> str:
    total = int(excluded["n_runs"].sum()) if len(excluded) else 0
    if not total:
        return "No runs excluded."
    parts = ", ".join(f"{int(n)} {reason}" for reason, n in zip(excluded["reason"], excluded["n_runs"]))
    return f"{total} run{'s' if total != 1 else ''} excluded (not agent results): {parts}."


def series_labels(frame: pd.DataFrame, varying: Sequence[str]) -> pd.Series:
    """Short, honest names for settings: the agent, plus whichever other setting fields vary in the data."""
    def label(row: Any) -> str:
        parts = [str(row["agent"])]
        for f in varying:
            if f == "agent":
                continue
            v = row[f]
            if f == "protocol" and v == "paper":
                parts.append("paper protocol: test-selected")
            elif f == "budget_s":
                parts.append(f"{float(v):g} s")
            elif f == "item_selection":
                parts.append(f"items {v}")
            elif not (f == "driver" and v == "none"):
                parts.append(str(v))
        return " · ".join(parts)

    if frame.empty:
        return pd.Series([], dtype=object, index=frame.index)
    return frame.apply(label, axis=1)


def load_tables(store: Any, n_boot: int = 2000, compare: tuple[str, str] | None = None,
                scaling_points: int = 40) -> AnalysisTables:
    """Read the views and compute every table of the analysis report.

    Args:
        store: an `a2rl.store.results.ResultsStore`.
        n_boot: bootstrap resamples per interval.
        compare: the two agents of the agent-level paired comparison; default the two with the most runs.
        scaling_points: grid points per scaling curve.
    """
    runs = store.query("SELECT * EXCLUDE (config_json, phase_seconds_json) FROM analysed_runs ORDER BY run_id")
    excluded = store.query("SELECT * FROM excluded_runs")
    # Fields that vary within one task name the series (an evaluator id that only changes with the task does not).
    varying = [f for f in SERIES_FIELDS if len(runs) and runs.groupby("task")[f].nunique(dropna=False).max() > 1]
    noise = store.query("SELECT * FROM noise_floor WHERE split = 'test' ORDER BY task, variant, item_selection")
    notes = _notes(runs, excluded)

    matrix = _within_noise(store.query("SELECT * EXCLUDE (seeds, deltas) FROM mode_task_matrix "
                                       "ORDER BY task, agent, driver, base_model, mode"))
    board = store.query("SELECT * FROM leaderboard_ci ORDER BY task, mean_delta DESC")
    board["series"] = series_labels(board, varying)
    agree = (board["n"] >= 2) & (board["sd_delta"] == 0)  # a zero-width t-interval is no certainty: say so
    board.loc[agree, "interval"] = "t-interval over seeds (the seeds agree exactly: read the item-level interval)"
    pairs = store.query("SELECT p.*, r.setting_id FROM item_pairs p JOIN analysed_runs r USING (run_id)")
    board = _with_pooled(_within_noise(board), pairs, n_boot)
    pak = _pass_at_k(board)
    board = board.drop(columns=["deltas", "seeds"])
    run_intervals = _run_intervals(runs, pairs, n_boot)

    curve = store.query(
        "SELECT run_id, submission_id, agent_elapsed_s, cum_tokens, improvement_so_far FROM scaling_curve"
    )
    scaling = scaling_curves(runs, curve, scaling_points)
    if not scaling.empty:
        scaling["series"] = series_labels(scaling, varying)

    paired = _paired(runs, compare)
    if paired.empty:
        notes.append("Paired comparisons skipped: no two agents (or two drivers of one agent) share settings and "
                     "seeds.")
    gaps = store.query("SELECT * FROM selection_gap")
    selection = selection_gap_summary(gaps, n_boot=n_boot) if len(gaps) else pd.DataFrame()
    paper = {name: store.query(f"SELECT * FROM {name}") for name in PAPER_VIEWS}
    subs = store.query("SELECT s.run_id, s.submission_id, s.agent_elapsed_s, s.split, s.status, s.score, s.route, "
                       "s.cached, s.error FROM submissions s JOIN analysed_runs USING (run_id) ORDER BY 1, 2")
    return AnalysisTables(
        runs=runs, excluded=excluded, matrix=matrix, leaderboard=board, run_intervals=run_intervals, pass_at_k=pak,
        scaling=scaling, noise=noise, paired=paired, selection=selection, selection_runs=gaps,
        routes=store.query("SELECT * FROM route_distribution ORDER BY task, agent, mode, route"),
        failures=store.query("SELECT * FROM failure_classes ORDER BY task, agent, mode, status, failure_class"),
        paper=paper, submissions=subs, notes=notes,
    )  # fmt: skip


def _paired(runs: pd.DataFrame, compare: tuple[str, str] | None) -> pd.DataFrame:
    """Agent level (the two agents with the most runs, drivers averaged) and, for every agent run with two or more
    drivers, driver level (its two drivers with the most runs)."""
    frames = []
    agents = runs["agent"].value_counts()
    pair = compare or (tuple(sorted(agents.index[:2])) if len(agents) >= 2 else None)
    if pair:
        frames.append(paired_comparison(runs, "agent", *pair, averaged=("driver",)))
    for agent, g in runs.groupby("agent"):
        drivers = g["driver"].value_counts()
        if len(drivers) >= 2:
            frames.append(paired_comparison(g, "driver", *sorted(drivers.index[:2])))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _within_noise(frame: pd.DataFrame) -> pd.DataFrame:
    """|mean Δ| below the noise floor of its task and item selection (2 × the baseline's item-level SE)."""
    mean = frame["mean_delta"].astype(float)
    frame["within_noise"] = (mean.abs() < frame["noise_floor"].astype(float)).fillna(False).astype(bool)
    return frame


def _with_pooled(board: pd.DataFrame, pairs: pd.DataFrame, n_boot: int) -> pd.DataFrame:
    """The item-level interval of each setting, pooled over its seeds (where they scored the same items)."""
    def interval(g: pd.DataFrame):
        if g["run_id"].nunique() == 1:  # one seed: its own paired interval (exact for right/wrong items)
            return paired_item_interval(g["base_score"], g["final_score"], n_boot=n_boot)
        return pooled_item_interval(g["item_id"], g["base_score"], g["final_score"], n_boot=n_boot)

    pooled = {sid: interval(g) for sid, g in pairs.groupby("setting_id")}
    board["pooled_low"] = [pooled[s].low if s in pooled else math.nan for s in board["setting_id"]]
    board["pooled_high"] = [pooled[s].high if s in pooled else math.nan for s in board["setting_id"]]
    board["pooled_items"] = [pooled[s].n if s in pooled else 0 for s in board["setting_id"]]
    return board


def _run_intervals(runs: pd.DataFrame, pairs: pd.DataFrame, n_boot: int) -> pd.DataFrame:
    cols = ["run_id", "setting_id", "task", "agent", "driver", "mode", "seed", "delta_test", "n_items", "ci_low",
            "ci_high", "p_value", "method", "verdict"]
    info = runs.set_index("run_id")
    rows = []
    for run_id, g in pairs.groupby("run_id", sort=True):
        if run_id not in info.index:
            continue
        iv = paired_item_interval(g["base_score"], g["final_score"], n_boot=n_boot)
        r = info.loc[run_id]
        rows.append({"run_id": run_id, "setting_id": r["setting_id"], "task": r["task"], "agent": r["agent"],
                     "driver": r["driver"], "mode": r["mode"], "seed": r["seed"], "delta_test": r["delta_test"],
                     "n_items": iv.n, "ci_low": iv.low, "ci_high": iv.high, "p_value": iv.p_value,
                     "method": iv.method, "verdict": iv.label()})  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def _pass_at_k(board: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, row in board.iterrows():
        deltas = [float(d) for d in row["deltas"]]
        for k in range(1, min(len(deltas), max(PASS_AT_K)) + 1):
            rows.append({c: row[c] for c in SETTING + ["series"]} | {"k": k, "n": len(deltas),
                                                                   "expected_best_delta": pass_at_k(deltas, k)})
    return pd.DataFrame(rows, columns=SETTING + ["series", "k", "n", "expected_best_delta"])


def scaling_curves(runs: pd.DataFrame, curve: pd.DataFrame, points: int = 40) -> pd.DataFrame:
    """Best-so-far improvement at `points + 1` grid points per setting and axis: median and IQR over runs.

    Each run's curve is a step function of the axis: it holds the value of its last submission at or before
    the grid point; before its first submission (and for a run that never submitted) the base model stands,
    improvement 0. The grid runs from 0 to the setting's extent (the budget for time, else the largest value
    reached). Vectorised: one sorted search over all runs instead of a join per grid point.

    Args:
        runs: completed runs with the `SETTING` columns, `run_id` and `budget_s`.
        curve: rows of the `scaling_curve` view (`run_id`, `submission_id`, the axis columns,
            `improvement_so_far`).
    """
    if runs.empty:
        return pd.DataFrame(columns=SETTING + ["i", "x", "n_runs", "q25", "median", "q75", "axis"])
    runs = runs.reset_index(drop=True)
    setting_id = runs.groupby(SETTING, dropna=False, sort=True).ngroup().to_numpy()
    settings = runs[SETTING].drop_duplicates().assign(sid=lambda f: setting_id[f.index]).set_index("sid").sort_index()
    n_settings = len(settings)
    curve_run = pd.Index(runs["run_id"]).get_indexer(curve["run_id"])
    curve = curve[curve_run >= 0]
    curve_run = curve_run[curve_run >= 0]
    by_setting = np.argsort(setting_id, kind="stable")
    runs_per_setting = np.bincount(setting_id, minlength=n_settings)
    frames = []
    for axis, (col, _) in AXES.items():
        keep = curve[col].notna().to_numpy()
        ridx = curve_run[keep]
        key = curve[col].to_numpy(dtype=float)[keep]
        # Several submissions can share a key (e.g. no LLM call between them): the last one holds.
        order = np.lexsort((curve["submission_id"].to_numpy()[keep], key, ridx))
        ridx, key, value = ridx[order], key[order], curve["improvement_so_far"].to_numpy(dtype=float)[keep][order]
        last = np.ones(len(ridx), dtype=bool)
        last[:-1] = (ridx[1:] != ridx[:-1]) | (key[1:] != key[:-1])
        ridx, key, value = ridx[last], key[last], value[last]
        run_max = np.zeros(len(runs))
        np.maximum.at(run_max, ridx, key)
        extent = np.zeros(n_settings)
        np.maximum.at(extent, setting_id, run_max)
        if axis == "time":
            np.maximum.at(extent, setting_id, runs["budget_s"].to_numpy(dtype=float))
        scale = extent[setting_id]
        # Position on one line: run r occupies [4r, 4r + 1] (fraction of its setting's extent).
        frac = np.divide(key, scale[ridx], out=np.zeros_like(key), where=scale[ridx] > 0)
        line = ridx * 4.0 + np.minimum(frac, 1.0)
        grid_frac = np.arange(points + 1) / points
        probe = (np.arange(len(runs))[:, None] * 4.0 + grid_frac[None, :]).ravel()
        pos = np.searchsorted(line, probe, side="right") - 1
        probe_run = np.repeat(np.arange(len(runs)), points + 1)
        hit = (pos >= 0) & (ridx[np.maximum(pos, 0)] == probe_run)
        values = np.where(hit, value[np.maximum(pos, 0)], 0.0).reshape(len(runs), points + 1)[by_setting]
        # Runs grouped by setting: one (runs × grid points) block per setting, quantiles down its columns.
        blocks = np.split(values, np.cumsum(runs_per_setting)[:-1])
        q = np.stack([np.quantile(b, [0.25, 0.5, 0.75], axis=0) for b in blocks])  # settings × 3 × points
        frame = settings.loc[np.repeat(np.arange(n_settings), points + 1)].reset_index(drop=True)
        i = np.tile(np.arange(points + 1), n_settings)
        frame["i"] = i
        frame["x"] = np.repeat(extent, points + 1) * i / points
        frame["n_runs"] = np.repeat(runs_per_setting, points + 1)
        frame["q25"], frame["median"], frame["q75"] = (q[:, j, :].ravel() for j in range(3))
        frame["axis"] = axis
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _notes(runs: pd.DataFrame, excluded: pd.DataFrame) -> list[str]:
    notes = [exclusion_note(excluded)]
    for variant, labels in runs.groupby("variant")["variant_label"].unique().items():
        notes.append(f"Data variant `{variant}`: {'; '.join(sorted(map(str, labels)))}.")
    if (runs["protocol"] == "paper").any():
        notes.append("Some runs use protocol `paper`: every submission was scored on the test set and the best kept "
                     "(selection on the test set, optimistic); they are labelled so.")
    notes.append("A seed does not fix an outcome: it sets data order and sampling, and the same setting and seed can "
                 "give different Δ. Every Δ is reported with n and a 95% interval.")
    return notes
