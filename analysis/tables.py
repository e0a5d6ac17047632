"""The analysis tables, read from a results store's views and finished with `analysis.stats`.

One `load_tables` call opens the store read-only a few times (the store locks per call) and returns
plain DataFrames for the figures, the HTML report and the Prefect artifacts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import bootstrap_ci, paired_comparison, pass_at_k, selection_gap_summary

SETTING = ["task", "variant", "variant_label", "protocol", "agent", "driver", "mode", "base_model"]
"""What defines one leaderboard row: runs that differ only in seed are repeats of it."""
SERIES_FIELDS = ["agent", "driver", "mode", "base_model", "protocol"]
PASS_AT_K = (1, 3, 5, 10)
AXES = {
    "time": ("agent_elapsed_s", "agent time (s, grading excluded)"),
    "tokens": ("cum_tokens", "cumulative LLM tokens (input + output + cache)"),
    "submissions": ("submission_id", "submissions"),
}


@dataclass
class AnalysisTables:
    runs: pd.DataFrame
    """Completed runs (one row each)."""
    matrix: pd.DataFrame
    """mode × task cells: mean Δ, n, best/worst mode flags, within_noise."""
    leaderboard: pd.DataFrame
    """Mean Δ ± 95% bootstrap CI per setting, with the task's noise floor."""
    pass_at_k: pd.DataFrame
    """Expected best Δ of k runs per setting and k (long format)."""
    scaling: pd.DataFrame
    """Median and IQR of best-so-far improvement over seeds per setting, axis and grid point."""
    noise: pd.DataFrame
    paired: pd.DataFrame
    selection: pd.DataFrame
    selection_runs: pd.DataFrame
    routes: pd.DataFrame
    failures: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def series_labels(frame: pd.DataFrame, varying: Sequence[str]) -> pd.Series:
    """Short, honest names for settings: the agent, plus whichever other fields vary in the data."""
    def label(row: Any) -> str:
        parts = [str(row["agent"])]
        for f in varying:
            if f == "agent":
                continue
            v = row[f]
            if f == "protocol" and v == "paper":
                parts.append("paper protocol: test-selected")
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
        store: an `a2rl.store.ResultsStore`.
        n_boot: bootstrap resamples per interval.
        compare: the two agents of the paired comparison; default the two with the most completed runs.
        scaling_points: grid points per scaling curve.
    """
    runs = store.query(
        "SELECT run_id, task, variant, variant_label, protocol, agent, driver, mode, base_model, seed, budget_s, "
        "baseline_val, baseline_test, best_val, final_test, delta_test, n_submissions, failure_class, status "
        "FROM runs WHERE status = 'completed'"
    )
    varying = [f for f in SERIES_FIELDS if runs[f].nunique(dropna=False) > 1]
    noise = _noise(store)
    notes = _notes(runs, noise)

    matrix = store.query("SELECT * FROM mode_task_matrix ORDER BY task, agent, driver, base_model, mode")
    matrix = _with_noise(matrix, noise)

    board = store.query("SELECT * FROM leaderboard_ci WHERE n > 0 ORDER BY task, mean_delta DESC")
    cis = [bootstrap_ci(np.asarray(d, dtype=float), n_boot=n_boot) for d in board["deltas"]]
    board["ci_low"] = [c.low for c in cis]
    board["ci_high"] = [c.high for c in cis]
    board["series"] = series_labels(board, varying)
    board = _with_noise(board, noise)
    pak = _pass_at_k(board)
    board = board.drop(columns=["deltas"])

    curve = store.query(
        "SELECT run_id, submission_id, agent_elapsed_s, cum_tokens, improvement_so_far FROM scaling_curve"
    )
    scaling = scaling_curves(runs, curve, scaling_points)
    if not scaling.empty:
        scaling["series"] = series_labels(scaling, varying)

    agents = runs["agent"].value_counts()
    compare = compare or (tuple(sorted(agents.index[:2])) if len(agents) >= 2 else None)
    paired = paired_comparison(runs, *compare, n_boot=n_boot) if compare else pd.DataFrame()
    if not compare:
        notes.append("Paired comparison skipped: fewer than two agents have completed runs.")

    gaps = store.query("SELECT * FROM selection_gap")
    selection = selection_gap_summary(gaps, n_boot=n_boot) if len(gaps) else pd.DataFrame()
    return AnalysisTables(
        runs=runs, matrix=matrix, leaderboard=board, pass_at_k=pak, scaling=scaling, noise=noise, paired=paired,
        selection=selection, selection_runs=gaps,
        routes=store.query("SELECT * FROM route_distribution ORDER BY task, agent, mode, route"),
        failures=store.query("SELECT * FROM failure_classes ORDER BY task, agent, mode, failure_class"),
        notes=notes,
    )  # fmt: skip


def _noise(store: Any) -> pd.DataFrame:
    """The test-split noise floor per (task, variant, base model), from its most-used evaluator."""
    noise = store.query(
        "SELECT * FROM noise_floor WHERE split = 'test' "
        "QUALIFY row_number() OVER (PARTITION BY task, variant, base_model ORDER BY n_rows DESC, evaluator_id) = 1"
    )
    return noise.sort_values(["task", "variant", "base_model"]).reset_index(drop=True)


def _with_noise(frame: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    cols = ["task", "variant", "base_model"]
    out = frame.merge(noise[cols + ["noise_floor", "noise_floor_source"]], on=cols, how="left")
    mean = out["mean_delta"].astype(float)
    out["within_noise"] = (mean.abs() < out["noise_floor"].astype(float)).fillna(False).astype(bool)
    return out


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


def _notes(runs: pd.DataFrame, noise: pd.DataFrame) -> list[str]:
    notes = []
    for variant, labels in runs.groupby("variant")["variant_label"].unique().items():
        notes.append(f"Data variant `{variant}`: {'; '.join(sorted(map(str, labels)))}.")
    if (runs["protocol"] == "paper").any():
        notes.append("Some runs use protocol `paper`: every submission was scored on the test set and the best kept "
                     "(selection on the test set, optimistic); they are labelled so.")
    binomial = noise[noise["noise_floor_source"].str.startswith("binomial")] if len(noise) else noise
    if len(binomial):
        notes.append("Noise floor from a binomial approximation (fewer than two fresh baseline evaluations) for: "
                     + ", ".join(sorted(set(binomial["task"]))) + ".")
    return notes
