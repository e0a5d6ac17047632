"""The paper's tables shaped for reading: the system × task grid of absolute hidden-test scores and the budget table.

Each cell is one setting (a row key and a column key that together are `a2rl_bench.setting.SETTING_KEY`), so no two
settings can share a cell; the Baseline rows are per base model. Columns added later (e.g. per-submission test
scores) go in as more `CELL_PARTS` or more views; the shape code does not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

ROW_KEY = ("base_model", "agent", "driver", "mode", "protocol", "budget_s")
COLUMN_KEY = ("task", "variant", "item_selection", "evaluator_id")


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "?"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _varying(frame: pd.DataFrame, fields: Sequence[str]) -> list[str]:
    return [f for f in fields if frame[f].map(_text).nunique() > 1]


def _row_label(row: pd.Series, varying: Sequence[str]) -> str:
    if row["row_kind"] == "baseline":
        return "Baseline" + (f" · base {row['base_model']}" if "base_model" in varying else "")
    parts = [str(row["agent"])]
    for f in varying:
        v = row[f]
        if f == "agent" or (f == "driver" and v == "none"):
            continue
        parts.append({"base_model": f"base {_text(v)}", "budget_s": f"{_text(v)} s",
                      "protocol": "paper protocol" if v == "paper" else f"protocol {_text(v)}"}.get(f, _text(v)))
    return " · ".join(parts)


def _column_label(row: pd.Series, varying_by_task: dict[str, list[str]]) -> str:
    extra = [f"{f.replace('_', ' ')} {_text(row[f])}" for f in varying_by_task.get(row["task"], [])]
    return " · ".join([str(row["task"]), *extra])


def _cell(kind: str, mean: float, low: float, high: float, n: int, n_items: object) -> str:
    if mean != mean:
        return "–"
    size = f"{_text(n_items)} items" if kind == "baseline" else f"n={n}"
    return f"{mean:.1f} [{low:.1f}, {high:.1f}] {size}" if high == high else f"{mean:.1f} ({size}, no CI)"


def system_task_table(scores: pd.DataFrame) -> pd.DataFrame:
    """The wide System × task table from the `system_task_scores` view: one row per system (everything in
    `ROW_KEY` that varies, the agent always), one column per task (plus whichever of variant, item selection and
    evaluator vary within it), Baseline rows first. Every setting has its own cell."""
    if scores.empty:
        return pd.DataFrame()
    systems = scores[scores["row_kind"] == "system"]
    row_varying = _varying(systems, ROW_KEY[1:]) + (["base_model"] if _varying(scores, ["base_model"]) else [])
    by_task = {t: _varying(g.drop_duplicates(list(COLUMN_KEY)), COLUMN_KEY[1:]) for t, g in scores.groupby("task")}
    frame = scores.assign(
        system=scores.apply(_row_label, axis=1, varying=row_varying),
        column=scores.apply(_column_label, axis=1, varying_by_task=by_task),
        cell=[_cell(*v) for v in zip(scores["row_kind"], scores["mean_score"], scores["ci_low"], scores["ci_high"],
                                     scores["n"], scores["n_items"])])
    clash = frame.duplicated(["system", "column"], keep=False)
    if clash.any():  # labels that print alike: name the settings outright rather than drop one
        frame.loc[clash, "system"] += " #" + frame.loc[clash, "setting_id"].fillna("base").astype(str).str[:6]
    wide = frame.pivot(index="system", columns="column", values="cell")
    base = sorted(s for s in wide.index if s.startswith("Baseline"))
    wide = wide.loc[base + sorted(s for s in wide.index if s not in base)].fillna("–")
    wide.columns.name = None
    return wide.reset_index()


def budget_table(budget: pd.DataFrame) -> pd.DataFrame:
    """The `budget_deltas` view with a readable budget share and the split spelled out beside the headline."""
    if budget.empty:
        return budget
    return budget.assign(
        budget=budget["budget_fraction"].map(lambda f: f"{f:.0%} of budget"),
        gain=[f"best {s} gain, floored at 0 (the base model counts)" for s in budget["split"]])
