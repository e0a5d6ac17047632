"""Figures of the analysis report. Each function returns a matplotlib `Figure`; `save_png` writes it.

Figures are built on `matplotlib.figure.Figure` (no pyplot state), so they are safe to draw from worker
threads. Panel titles carry the task's data-variant label and any `paper`-protocol runs say so.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis.tables import AXES  # noqa: E402

MODE_ORDER = ("free", "sft-only", "rl-only", "multi")
MAX_PANELS = 6
MAX_SERIES = 8
DPI = 100


class FigureFile(NamedTuple):
    name: str
    path: Path
    width: int
    height: int
    title: str


def save_png(fig: Figure, path: Path | str, name: str | None = None) -> FigureFile:
    """Write `fig` as a PNG at 100 dpi; the pixel size is exactly figsize × 100."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    w, h = fig.get_size_inches()
    title = fig.get_suptitle() or path.stem
    return FigureFile(name or path.stem, path, round(w * DPI), round(h * DPI), title)


def _wrap(text: str, width: int = 60) -> str:
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)


def _task_title(task: str, variant_label: str) -> str:
    return f"{task}\n" + _wrap(variant_label, 48)


def _empty(title: str, message: str) -> Figure:
    fig = Figure(figsize=(8, 3))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="grey")
    fig.suptitle(title)
    return fig


def _tasks(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(task, variant label) pairs to draw, one panel each, at most MAX_PANELS."""
    pairs = frame[["task", "variant_label"]].drop_duplicates().sort_values(["task", "variant_label"])
    return list(pairs.itertuples(index=False, name=None))[:MAX_PANELS]


def _mode_key(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def heatmap_figure(matrix: pd.DataFrame) -> Figure:
    """Mode × task heatmap of mean Δ test, one panel per agent setting; ★ best and ▲ worst mode per task,
    n per cell, † where |Δ| is below the task's noise floor."""
    title = "Δ test (final − base) by mode and task"
    if matrix.empty:
        return _empty(title, "no completed runs with a Δ")
    keys = ["agent", "driver", "base_model", "protocol"]
    sizes = matrix.groupby(keys, dropna=False)["n"].sum().sort_values(ascending=False)
    settings = list(sizes.index[:MAX_PANELS])
    tasks = matrix[["task", "variant"]].drop_duplicates().sort_values(["task", "variant"]).to_records(index=False)
    modes = sorted(matrix["mode"].unique(), key=_mode_key)
    limit = float(np.nanmax(np.abs(matrix["mean_delta"].to_numpy(dtype=float)))) or 1.0
    fig = Figure(figsize=(max(7.0, 2.2 + 1.7 * len(tasks)), (0.75 * len(modes) + 1.3) * len(settings) + 1.4))
    axes = fig.subplots(len(settings), 1, squeeze=False, gridspec_kw={"hspace": 0.65})[:, 0]
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd")
    image = None
    for ax, setting in zip(axes, settings):
        cells = matrix[(matrix[keys].astype(str) == pd.Series(setting, index=keys).astype(str)).all(axis=1)]
        grid = np.full((len(modes), len(tasks)), np.nan)
        for _, c in cells.iterrows():
            col = next(i for i, t in enumerate(tasks) if (t[0], t[1]) == (c["task"], c["variant"]))
            row = modes.index(c["mode"])
            grid[row, col] = c["mean_delta"]
            marks = ("  ★" if c["is_best"] else "") + ("  ▲" if c["is_worst"] else "")
            dagger = "†" if c.get("within_noise") else ""
            strong = abs(c["mean_delta"]) > 0.6 * limit
            ax.text(col, row, f"{c['mean_delta']:+.1f}{dagger}{marks}\nn={c['n']}", ha="center", va="center",
                    fontsize=9, color="white" if strong else "black")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-limit, vmax=limit, aspect="auto")
        ax.set_xticks(range(len(tasks)), [f"{t}\n({v})" for t, v in tasks], fontsize=9)
        ax.set_yticks(range(len(modes)), modes, fontsize=9)
        agent, driver, base, protocol = setting
        name = agent + ("" if driver == "none" else f" · {driver}")
        suffix = " · paper protocol (test-selected)" if protocol == "paper" else ""
        ax.set_title(f"{name} · base {base}{suffix}", fontsize=10)
        ax.set_ylabel("mode")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="mean Δ test (points)", shrink=0.8)
    labels = "; ".join(sorted(set(f"{v}: {lbl}" for v, lbl in zip(matrix["variant"], matrix["variant_label"]))))
    more = f" Showing {len(settings)} of {len(sizes)} agent settings." if len(sizes) > len(settings) else ""
    note = (f"Mean over seeds; n = runs per cell. ★ best / ▲ worst mode per task. † |Δ| below the task's noise "
            f"floor. Data: {labels}.{more}")
    fig.text(0.01, 0.005, _wrap(note, 130), fontsize=8, va="bottom")
    fig.suptitle(title)
    return fig


def _series(frame: pd.DataFrame, weight: str) -> list[str]:
    order = frame.groupby("series")[weight].max().sort_values(ascending=False)
    return list(order.index[:MAX_SERIES])


def scaling_figure(scaling: pd.DataFrame, axes_order: Sequence[str] = ("time", "tokens", "submissions")) -> Figure:
    """Best-so-far improvement (median and IQR over seeds) against agent time, LLM tokens and submissions."""
    title = "Best-so-far improvement over the baseline (feedback split): median and IQR over seeds"
    if scaling.empty:
        return _empty(title, "no submissions in completed runs")
    tasks = _tasks(scaling)
    fig = Figure(figsize=(15, 3.3 * len(tasks) + 1.0))
    grid = fig.subplots(len(tasks), len(axes_order), squeeze=False)
    colours = matplotlib.colormaps["tab10"]
    for r, (task, label) in enumerate(tasks):
        sub = scaling[scaling["task"] == task]
        names = _series(sub, "n_runs")
        for c, axis in enumerate(axes_order):
            ax = grid[r, c]
            data = sub[sub["axis"] == axis]
            scale, unit = 1.0, ""
            if axis == "tokens":
                top = float(data["x"].max()) if len(data) else 0.0
                scale, unit = (1e6, " (millions)") if top >= 1e6 else (1e3, " (thousands)") if top >= 1e3 else (1.0, "")
                if top == 0:
                    ax.text(0.5, 0.5, "no LLM token data\n(scripted agents)", transform=ax.transAxes, ha="center",
                            va="center", color="grey")
            for k, name in enumerate(names):
                line = data[data["series"] == name].sort_values("x")
                if line.empty or (axis == "tokens" and float(line["x"].max()) == 0):
                    continue
                x = line["x"].to_numpy(dtype=float) / scale
                ax.plot(x, line["median"], color=colours(k), label=f"{name} (n={int(line['n_runs'].max())})",
                        drawstyle="steps-post")
                ax.fill_between(x, line["q25"], line["q75"], color=colours(k), alpha=0.2, step="post")
            ax.axhline(0, color="grey", lw=0.8, ls="--")
            ax.set_xlabel(AXES[axis][1] + unit, fontsize=9)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel(_task_title(task, label) + "\nΔ best-so-far (points)", fontsize=8)
                ax.legend(fontsize=7, loc="best")
            if r == 0:
                ax.set_title(f"vs {axis}", fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def pass_at_k_figure(pak: pd.DataFrame) -> Figure:
    """Expected best Δ among k runs (unbiased estimator over the n runs of each setting)."""
    title = "pass@k: expected best Δ test among k runs"
    if pak.empty:
        return _empty(title, "no completed runs with a Δ")
    tasks = _tasks(pak)
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig = Figure(figsize=(5.2 * cols, 4.0 * rows + 0.9))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colours = matplotlib.colormaps["tab10"]
    for ax, (task, label) in zip(axes, tasks):
        sub = pak[pak["task"] == task]
        for k, name in enumerate(_series(sub, "n")):
            line = sub[sub["series"] == name].sort_values("k")
            ax.plot(line["k"], line["expected_best_delta"], "o-", color=colours(k), ms=4,
                    label=f"{name} (n={int(line['n'].max())})")
        ax.axhline(0, color="grey", lw=0.8, ls="--")
        ax.set_title(_task_title(task, label), fontsize=9)
        ax.set_xlabel("k (runs)")
        ax.set_ylabel("E[max Δ test over k runs] (points)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(tasks):]:
        ax.axis("off")
    estimator = "Sort Δ ascending; E[max of k] = Σ_{i=k..n} C(i−1,k−1)/C(n,k)·Δ_(i); k = 1 is the mean."
    fig.text(0.01, 0.005, estimator, fontsize=8, va="bottom")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def leaderboard_figure(board: pd.DataFrame) -> Figure:
    """Mean Δ test per setting with its 95% bootstrap CI; the grey band is the task's noise floor (±)."""
    title = "Leaderboard: mean Δ test ± 95% bootstrap CI over seeds"
    if board.empty:
        return _empty(title, "no completed runs with a Δ")
    tasks = _tasks(board)
    n_rows = [min(len(board[board["task"] == t]), 12) for t, _ in tasks]
    fig = Figure(figsize=(10, sum(0.42 * n + 1.4 for n in n_rows) + 0.6))
    axes = fig.subplots(len(tasks), 1, squeeze=False, height_ratios=[n + 2 for n in n_rows])[:, 0]
    for ax, (task, label), n in zip(axes, tasks, n_rows):
        sub = board[board["task"] == task].sort_values("mean_delta").tail(n)
        y = np.arange(len(sub))
        mean = sub["mean_delta"].to_numpy(dtype=float)
        low = np.nan_to_num(mean - sub["ci_low"].to_numpy(dtype=float))
        high = np.nan_to_num(sub["ci_high"].to_numpy(dtype=float) - mean)
        ax.errorbar(mean, y, xerr=[low, high], fmt="o", color="tab:blue", ecolor="tab:blue", capsize=3)
        floor = sub["noise_floor"].dropna()
        if len(floor):
            nf = float(floor.iloc[0])
            source = sub["noise_floor_source"].iloc[0]
            ax.axvspan(-nf, nf, color="grey", alpha=0.2, label=f"noise floor ±{nf:.2f} ({source})")
            ax.legend(fontsize=7, loc="lower right")
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(y, [f"{s} (n={k}{', no CI' if k < 2 else ''})" for s, k in zip(sub["series"], sub["n"])],
                      fontsize=8)
        ax.set_title(_task_title(task, label).replace("\n", " — ", 1), fontsize=9)
        ax.set_xlabel("Δ test (points)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def selection_gap_figure(gaps: pd.DataFrame) -> Figure:
    """Heldout runs: validation gain of the best submission against the hidden-test gain of the final pick."""
    title = "Selection gap (heldout protocol): validation gain vs hidden-test gain per run"
    if gaps.empty:
        return _empty(title, "no heldout runs with validation and test scores")
    tasks = sorted(gaps["task"].unique())[:MAX_PANELS]
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig = Figure(figsize=(5.0 * cols, 4.4 * rows + 0.5))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colours = matplotlib.colormaps["tab10"]
    for ax, task in zip(axes, tasks):
        sub = gaps[gaps["task"] == task]
        for k, (agent, g) in enumerate(sorted(sub.groupby("agent"), key=lambda kv: -len(kv[1]))[:MAX_SERIES]):
            pts = g.sample(min(len(g), 2000), random_state=0)  # a readable cloud, whatever the run count
            ax.scatter(pts["val_gain"], pts["test_gain"], s=10, alpha=0.5, color=colours(k),
                       label=f"{agent} (n={len(g)})")
        lo = float(min(sub["val_gain"].min(), sub["test_gain"].min()))
        hi = float(max(sub["val_gain"].max(), sub["test_gain"].max()))
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=0.8, label="no gap (y = x)")
        label = sub["variant_label"].iloc[0] if "variant_label" in sub else ""
        ax.set_title(_task_title(task, label), fontsize=9)
        ax.set_xlabel("validation gain of the best submission (points)")
        ax.set_ylabel("Δ test of the final pick (points)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(tasks):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
