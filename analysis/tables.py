"""The analysis tables, read from a results store's views and finished with `a2rl_bench.analysis.stats`.

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

from a2rl_bench.protocol.feedback import feedback_split
from a2rl_bench.summary.intervals import binomial_var, paired_item_interval, seeds_interval, shared_items_interval
from a2rl_bench.setting import SETTING_KEY
from a2rl_bench.analysis.compare import compare_field, item_values, marks, rl_helped, rl_share_over_seeds
from a2rl_bench.analysis.stats import pass_at_k, selection_gap_summary

SETTING = ["setting_id", *SETTING_KEY, "variant_label"]
"""What defines one leaderboard row (`a2rl_bench.setting.SETTING_KEY`): runs that differ only in seed are repeats of
it."""
PANEL_KEY = ["task", "variant"]
"""One panel of a figure: a task and its data variant; the settings inside it are its series."""
SERIES_FIELDS = [c for c in SETTING_KEY if c not in PANEL_KEY]
AGENT_SETTING = [c for c in SETTING_KEY if c != "mode"]
"""Everything but the mode (and the seed): the modes of one agent setting are compared in the mode × task matrix."""
PASS_AT_K = (1, 3, 5, 10)
AXES = {
    "time": ("agent_elapsed_s", "agent time (s, grading excluded)"),
    "tokens": ("cum_tokens", "cumulative LLM tokens (input + output + cache)"),
    "submissions": ("submission_id", "submissions"),
}
PAPER_VIEWS = ("system_task_scores", "budget_deltas", "run_costs", "final_routes", "mode_breaches", "stage_shares")


@dataclass
class AnalysisTables:
    runs: pd.DataFrame
    """Runs the analysis counts (`analysed_runs`: completed, not an infrastructure failure), one row each."""
    excluded: pd.DataFrame
    """Runs left out, counted by reason (`excluded_runs`)."""
    matrix: pd.DataFrame
    """mode × task cells: the leaderboard's rows with best/worst mode flags per agent setting."""
    leaderboard: pd.DataFrame
    """One row per setting: mean Δ with its one 95% interval (over seeds and shared items), p-value and verdict,
    the noise floor beside it; is_best / is_worst of its task panel only where the comparison with the runner-up
    leaves 0 out (`mark_note` says so, or "no detectable difference")."""
    run_intervals: pd.DataFrame
    """One run's Δ with its paired item-level interval and verdict (runs with per-item results)."""
    pass_at_k: pd.DataFrame
    """Expected best Δ of k runs per setting and k (long format)."""
    scaling: pd.DataFrame
    """Median and IQR of best-so-far improvement over seeds per setting, axis and grid point."""
    noise: pd.DataFrame
    paired: pd.DataFrame
    """Settings that differ in one field (`a2rl_bench.analysis.compare`: paired by seed and item), B − A per row."""
    selection: pd.DataFrame
    selection_runs: pd.DataFrame
    routes: pd.DataFrame
    failures: pd.DataFrame
    paper: dict[str, pd.DataFrame] = field(default_factory=dict)
    """The paper's tables, one per view in `PAPER_VIEWS`."""
    submissions: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Submissions of the analysed runs, for the per-run drill-down."""
    rl_modes: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Did the RL stage help: every mode against `sft-only`, per task and agent setting
    (`a2rl_bench.analysis.compare`)."""
    rl_shares: pd.DataFrame = field(default_factory=pd.DataFrame)
    """RL's share per setting over seeds and shared items (the stage shares combined like Δ)."""
    notes: list[str] = field(default_factory=list)

    @property
    def exclusion_note(self) -> str:
        """"N runs excluded: ..." for every figure and table (or that none were)."""
        return exclusion_note(self.excluded)


def as_text(frame: pd.DataFrame | pd.Series) -> pd.DataFrame | pd.Series:
    """Cells as text for keys and labels, a missing value (None, NaN, NA: a store's NULL) as `?`."""
    def one(v: Any) -> str:
        return "?" if v is None or (not isinstance(v, (str, list, tuple)) and pd.isna(v)) else str(v)

    return frame.map(one)


def key_of(frame: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """One text key per row from `columns` (NULLs included), e.g. to group by a setting's fields."""
    if frame.empty:
        return pd.Series([], dtype=object, index=frame.index)
    return as_text(frame[list(columns)]).agg("|".join, axis=1)


def exclusion_note(excluded: pd.DataFrame) -> str:
    total = int(excluded["n_runs"].sum()) if len(excluded) else 0
    if not total:
        return "No runs excluded."
    parts = ", ".join(f"{int(n)} {reason}" for reason, n in zip(excluded["reason"], excluded["n_runs"]))
    return f"{total} run{'s' if total != 1 else ''} excluded (not agent results): {parts}."


def setting_labels(board: pd.DataFrame) -> dict[str, str]:
    """A short, honest, unique name per setting within its panel (task and variant): the agent, plus whichever
    other setting fields vary among the panel's settings. Two settings that differ in anything get two names (the
    setting id is appended if their fields print alike). The same system keeps its name, and colour, across tasks."""
    labels: dict[str, str] = {}
    if board.empty:
        return labels
    for _, panel in board.groupby(PANEL_KEY, dropna=False, sort=False):
        varying = [f for f in SERIES_FIELDS if as_text(panel[f]).nunique() > 1]
        names = {row["setting_id"]: _label(row, varying) for _, row in panel.iterrows()}
        counts = pd.Series(list(names.values())).value_counts()
        labels |= {sid: name if counts[name] == 1 else f"{name} #{sid[:6]}" for sid, name in names.items()}
    return labels


def _label(row: Any, varying: Sequence[str]) -> str:
    parts = [str(row["agent"])]
    for f in varying:
        v = row[f]
        if f == "agent":
            continue
        if f == "protocol" and v == "paper":
            parts.append("paper protocol: test-selected")
        elif f == "budget_s":
            parts.append("budget ?" if v is None or v != v else f"{float(v):g} s")
        elif f == "item_selection":
            parts.append(f"items {v}")
        elif f == "evaluator_id":
            parts.append(f"evaluator {v}")
        elif f == "base_model":
            parts.append(f"base {v}")
        elif not (f == "driver" and v == "none"):
            parts.append(str(v))
    return " · ".join(parts)


def load_tables(store: Any, compare: Sequence[str] | None = None, scaling_points: int = 40) -> AnalysisTables:
    """Read the views and compute every table of the analysis report.

    Args:
        store: an `a2rl_bench.store.results.ResultsStore`.
        compare: what the comparison table compares (`a2rl_bench.analysis.compare`): (FIELD,) every pair of values of
            one setting field; (FIELD, A, B) only those two; (AGENT_A, AGENT_B) two agents. Default: every setting field
            with two or more values.
        scaling_points: grid points per scaling curve.
    """
    runs = store.query("SELECT * EXCLUDE (config_json, phase_seconds_json) FROM analysed_runs ORDER BY run_id")
    runs = runs.merge(store.query(ITEM_COUNTS), on="run_id", how="left")
    excluded = store.query("SELECT * FROM excluded_runs")
    noise = store.query("SELECT * FROM noise_floor WHERE split = 'test' ORDER BY task, variant, item_selection")
    notes = _notes(runs, excluded)

    board = store.query("SELECT * FROM leaderboard_ci ORDER BY task, variant, mean_delta DESC, setting_id")
    labels = setting_labels(board)
    board["series"] = board["setting_id"].map(labels)
    pairs = store.query("SELECT p.*, r.setting_id FROM item_pairs p JOIN analysed_runs r USING (run_id)")
    board = _within_noise(with_intervals(board, runs, pairs))
    values = item_values(runs, pairs)
    matrix = mode_matrix(board, runs, values)
    board = marks(board, runs, values, key_of(board, PANEL_KEY), "series")  # ★/▲ within a task panel
    pak = _pass_at_k(board)
    board = board.drop(columns=["deltas", "seeds"])
    run_intervals = _run_intervals(runs, pairs)

    curve = store.query(
        "SELECT run_id, submission_id, agent_elapsed_s, cum_tokens, improvement_so_far FROM scaling_curve"
    )
    scaling = scaling_curves(runs, curve, scaling_points)
    scaling["series"] = scaling["setting_id"].map(labels)
    scaling["headline_delta"] = scaling["setting_id"].map(board.set_index("setting_id")["mean_delta"])

    paired = _paired(runs, pairs, compare)
    if paired.empty:
        notes.append("Comparisons skipped: no two settings differ in one field only.")
    gaps = store.query("SELECT * FROM selection_gap ORDER BY setting_id, seed, run_id")
    gaps = gaps.merge(runs[["run_id", "val_n", "test_n", "best_val", "baseline_val", "final_test", "baseline_test"]],
                      on="run_id", how="left")
    gaps["series"] = gaps["setting_id"].map(labels)
    gap_items = pd.concat([store.query(VALIDATION_GAINS), values.assign(split="test")], ignore_index=True)
    selection = selection_gap_summary(gaps, gap_items, by=[*SETTING, "series"]) if len(gaps) else pd.DataFrame()
    paper = {name: store.query(f"SELECT * FROM {name}") for name in PAPER_VIEWS}
    subs = store.query("SELECT s.run_id, s.submission_id, s.agent_elapsed_s, s.stage, s.split, s.status, s.score, "
                       "t.test_score AS hidden_test_posthoc, s.route, s.cached, s.error FROM submissions s "
                       "JOIN analysed_runs USING (run_id) LEFT JOIN submission_tests t USING (run_id, submission_id) "
                       "ORDER BY 1, 2")  # fmt: skip
    order = "task, variant, setting_id"
    return AnalysisTables(
        runs=runs, excluded=excluded, matrix=matrix, leaderboard=board, run_intervals=run_intervals, pass_at_k=pak,
        scaling=scaling, noise=noise, paired=paired, selection=selection, selection_runs=gaps,
        routes=store.query(f"SELECT * FROM route_distribution ORDER BY {order}, route"),
        failures=store.query(f"SELECT * FROM failure_classes ORDER BY {order}, status, failure_class"),
        paper=paper, submissions=subs, notes=notes, rl_modes=rl_helped(runs, pairs),
        rl_shares=_rl_shares(store, paper["stage_shares"], labels),
    )  # fmt: skip


ITEM_COUNTS = """
    SELECT run_id, max(n) FILTER (WHERE kind = 'final' AND split = 'test') AS test_n,
           max(n) FILTER (WHERE kind = 'baseline' AND split = 'validation') AS val_n
    FROM evaluations GROUP BY run_id"""
"""Items behind each run's final test score and its validation baseline (for the bounds without per-item results)."""
VALIDATION_GAINS = """
    WITH base AS (SELECT run_id, min(eval_key) AS eval_key FROM evaluations
                  WHERE kind = 'baseline' AND split = 'validation' GROUP BY run_id)
    SELECT r.run_id, s.item_id, 'validation' AS split, s.score - b.score AS value
    FROM analysed_runs r JOIN base USING (run_id)
    JOIN item_results s ON s.run_id = r.run_id AND s.eval_key = 'submission-' || r.best_submission_id || '-validation'
    JOIN item_results b ON b.run_id = r.run_id AND b.eval_key = base.eval_key AND b.item_id = s.item_id
    WHERE r.protocol = 'heldout'"""
"""Per run and validation item: the best submission's gain over the base model (the selection gap's first part)."""


def _paired(runs: pd.DataFrame, pairs: pd.DataFrame, compare: Sequence[str] | None) -> pd.DataFrame:
    """The comparison table: `compare` as in `load_tables`; by default every setting field with two values or more."""
    if compare and len(compare) == 2:
        return compare_field(runs, pairs, "agent", (compare[0], compare[1]))
    if compare:
        return compare_field(runs, pairs, compare[0], tuple(compare[1:3]) if len(compare) == 3 else None)
    fields = [f for f in SETTING_KEY if f in runs.columns and runs[f].nunique(dropna=False) > 1]
    frames = [f for f in (compare_field(runs, pairs, f) for f in fields) if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _rl_shares(store: Any, shares: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """RL's share over seeds per setting, from the post-hoc per-item results of each run's two checkpoints."""
    items = store.query("SELECT i.run_id, i.eval_key, i.item_id, i.score FROM item_results i JOIN stage_shares s "
                        "USING (run_id) WHERE i.eval_key LIKE 'posthoc-%-test'") if len(shares) else pd.DataFrame()
    out = rl_share_over_seeds(shares, items)
    out.insert(1, "series", out["setting_id"].map(labels))
    return out


def _within_noise(frame: pd.DataFrame) -> pd.DataFrame:
    """|mean Δ| below the noise floor of its task and item selection (2 × the baseline's item-level SE)."""
    mean = frame["mean_delta"].astype(float)
    frame["within_noise"] = (mean.abs() < frame["noise_floor"].astype(float)).fillna(False).astype(bool)
    return frame


def with_intervals(board: pd.DataFrame, runs: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Each setting's one interval, p-value and verdict (`a2rl_bench.summary.intervals`): over its seeds and the
    hidden-test items they share (a seeds × items table); one seed: that run's exact paired interval; no shared per-item
    results: the t-interval over seeds plus a binomial bound for the items."""
    by_setting = dict(tuple(pairs.groupby("setting_id", sort=False))) if len(pairs) else {}
    deltas = runs.groupby("setting_id")["delta_test"].apply(list).to_dict() if len(runs) else {}
    rows = [setting_interval(by_setting.get(r.setting_id), deltas.get(r.setting_id, []), r) for r in
            board.itertuples(index=False)]  # fmt: skip
    out = board.copy()
    for col in ("ci_low", "ci_high", "p_value", "interval", "verdict", "n_items", "design"):
        out[col] = [row[col] for row in rows] if rows else pd.Series(dtype=object)
    return out


def setting_interval(pairs: pd.DataFrame | None, deltas: Sequence[float], row: Any) -> dict[str, Any]:
    """The interval of one leaderboard row (`row`: its `n`, `mean_final_test`, `mean_baseline_test` and
    `noise_n_items`) from its runs' item pairs and Δs."""
    k = int(row.n)
    shared, why = None, ""
    if pairs is not None and len(pairs):
        diff = pairs.assign(d=pairs["final_score"] - pairs["base_score"])  # a NULL score: no score, left out
        table = diff.pivot_table(index="run_id", columns="item_id", values="d", aggfunc="first", dropna=False)
        shared = shared_items_interval(table.to_numpy(dtype=float)) if len(table) == k else None
        why = (f"{k - len(table)} of {k} runs without item rows" if len(table) < k
               else "no item scored by every seed")  # fmt: skip
    if shared is not None and k == 1:
        g = pairs.dropna(subset=["base_score", "final_score"])
        iv = paired_item_interval(g["base_score"], g["final_score"])
        iv = iv._replace(n=1, method="1 seed: that run's item-level interval (seed-to-seed spread not measured); "
                         + iv.method)
        design = "1 seed × items"
    elif shared is not None:
        iv, design = shared
    else:
        n_items = int(_number(row.noise_n_items, 0))
        final, base = _number(row.mean_final_test), _number(row.mean_baseline_test)
        var = binomial_var(final, n_items) + binomial_var(base, n_items) if n_items > 1 and final == final else None
        iv, design = seeds_interval(deltas, var, n_items), "seeds"
        iv = iv._replace(method=iv.method + (f"; {why}" if why else ""))
    return {"ci_low": iv.low, "ci_high": iv.high, "p_value": iv.p_value, "interval": iv.method,
            "verdict": iv.label(), "n_items": iv.n_items, "design": design}


def _number(value: Any, missing: float = math.nan) -> float:
    """A float from a store cell that may be None, NaN or pandas' NA."""
    return missing if value is None or pd.isna(value) else float(value)


def mode_matrix(board: pd.DataFrame, runs: pd.DataFrame, values: pd.DataFrame) -> pd.DataFrame:
    """The mode × task heatmap's cells: the leaderboard's rows, with the best (★) and worst (▲) mode of each agent
    setting (everything but the mode) only where the comparison with the runner-up leaves 0 out
    (`a2rl_bench.analysis.compare.marks`; `mark_note` says which, or "no detectable difference (± half-width)")."""
    matrix = board.drop(columns=[c for c in ("deltas", "seeds") if c in board])
    if board.empty:
        return matrix.assign(is_best=pd.Series(dtype=bool), is_worst=pd.Series(dtype=bool),
                             mark_note=pd.Series(dtype=object))
    return marks(matrix, runs, values, key_of(matrix, AGENT_SETTING), "mode")


def _run_intervals(runs: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    cols = ["run_id", "setting_id", "task", "agent", "driver", "mode", "seed", "delta_test", "n_items", "ci_low",
            "ci_high", "p_value", "method", "verdict"]
    info = runs.set_index("run_id")
    rows = []
    for run_id, g in pairs.groupby("run_id", sort=True):
        if run_id not in info.index:
            continue
        iv = paired_item_interval(g["base_score"], g["final_score"])
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
    the grid point. At 0 (nothing spent yet), before a run's first submission, and for a run that never submitted,
    the base model stands: improvement 0 (a submission made before the first LLM call shows from the next grid
    point). The grid runs from 0 to the setting's extent (the budget for time, else the largest value reached).
    `split` says which scores the gains are on: validation, or the test set under protocol `paper`. Vectorised:
    one sorted search over all runs instead of a join per grid point.

    Args:
        runs: completed runs with the `SETTING` columns, `run_id`, `protocol` and `budget_s`.
        curve: rows of the `scaling_curve` view (`run_id`, `submission_id`, the axis columns,
            `improvement_so_far`).
    """
    columns = SETTING + ["split", "i", "x", "n_runs", "q25", "median", "q75", "axis"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    runs = runs.reset_index(drop=True)
    setting_id, _ = pd.factorize(runs["setting_id"], sort=True)
    settings = (runs.assign(sid=setting_id).groupby("sid", sort=True)[SETTING].first()
                .assign(split=lambda f: f["protocol"].map(feedback_split)))  # fmt: skip
    n_settings = len(settings)
    curve_run = pd.Index(runs["run_id"]).get_indexer(curve["run_id"])
    curve = curve[curve_run >= 0]
    curve_run = curve_run[curve_run >= 0]
    by_setting = np.argsort(setting_id, kind="stable")
    runs_per_setting = np.bincount(setting_id, minlength=n_settings)
    grid_frac = np.arange(points + 1) / points
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
            np.fmax.at(extent, setting_id, runs["budget_s"].to_numpy(dtype=float))  # a NULL budget: the data's extent
        values = np.zeros((len(runs), points + 1))
        if len(ridx):  # a store where no run submitted has nothing to search: every curve is the base model's 0
            scale = extent[setting_id]
            # Position on one line: run r occupies [4r, 4r + 1] (fraction of its setting's extent).
            frac = np.divide(key, scale[ridx], out=np.zeros_like(key), where=scale[ridx] > 0)
            line = ridx * 4.0 + np.minimum(frac, 1.0)
            probe = (np.arange(len(runs))[:, None] * 4.0 + grid_frac[None, :]).ravel()
            pos = np.searchsorted(line, probe, side="right") - 1
            probe_run = np.repeat(np.arange(len(runs)), points + 1)
            hit = (pos >= 0) & (ridx[np.maximum(pos, 0)] == probe_run) & np.tile(grid_frac > 0, len(runs))
            values = np.where(hit, value[np.maximum(pos, 0)], 0.0).reshape(len(runs), points + 1)
        # Runs grouped by setting: one (runs × grid points) block per setting, quantiles down its columns.
        blocks = np.split(values[by_setting], np.cumsum(runs_per_setting)[:-1])
        q = np.stack([np.quantile(b, [0.25, 0.5, 0.75], axis=0) for b in blocks])  # settings × 3 × points
        frame = settings.loc[np.repeat(np.arange(n_settings), points + 1)].reset_index(drop=True)
        i = np.tile(np.arange(points + 1), n_settings)
        frame["i"] = i
        frame["x"] = np.repeat(extent, points + 1) * i / points
        frame["n_runs"] = np.repeat(runs_per_setting, points + 1)
        frame["q25"], frame["median"], frame["q75"] = (q[:, j, :].ravel() for j in range(3))
        frame["axis"] = axis
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)[columns]


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
