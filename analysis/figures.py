"""Figures of the analysis report. Each function returns a matplotlib `Figure`; `save_png` writes it.

Rules every figure keeps (tests/test_analysis.py renders them at 1 run and at ~1,000 runs and checks that no two
texts overlap):
- constrained layout, legends outside the axes, the footnote as the figure's x label (so layout makes room);
- nothing dropped silently: small multiples per task, and where a panel shows only the top N of M series or a
  figure the top N of M panels, the panel or footnote says so (every row is in the CSV tables);
- one colour per setting across every panel and figure (`Palette`), and the footnote counts the excluded runs.

Figures are built on `matplotlib.figure.Figure` (no pyplot state), so they are safe to draw from worker threads.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from analysis.tables import AXES  # noqa: E402

MODE_ORDER = ("free", "sft-only", "rl-only", "multi")
MAX_PANELS = 6
MAX_SERIES = 8
MAX_ROWS = 12
DPI = 100
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "fontsize": 7, "borderaxespad": 0.0}


class FigureFile(NamedTuple):
    name: str
    path: Path
    width: int
    height: int
    title: str


class Palette:
    """A fixed colour (and line style past 10 settings) per series name, the same in every panel and figure."""

    def __init__(self, names: Iterable[str]) -> None:
        colours = matplotlib.colormaps["tab10"].colors
        styles = itertools.product(("-", "--", ":", "-."), colours)
        self._style = {name: style for name, style in zip(sorted(set(map(str, names))), itertools.cycle(styles))}

    def colour(self, name: str) -> tuple:
        return self._style.get(str(name), ("-", (0.4, 0.4, 0.4)))[1]

    def line(self, name: str) -> str:
        return self._style.get(str(name), ("-", None))[0]


def save_png(fig: Figure, path: Path | str, name: str | None = None) -> FigureFile:
    """Write `fig` as a PNG at 100 dpi; the pixel size is exactly figsize × 100."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    w, h = fig.get_size_inches()
    title = fig.get_suptitle() or path.stem
    return FigureFile(name or path.stem, path, round(w * DPI), round(h * DPI), title)


def text_overlaps(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of drawn, non-empty texts whose boxes overlap (for the render tests). Tick labels are taken from the
    ticks each axis draws (those inside its view limits), not from the Tick objects it keeps around undrawn."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    tick_texts = {id(t.label1) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                  for t in axis.majorTicks + axis.minorTicks} | {
                 id(t.label2) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                  for t in axis.majorTicks + axis.minorTicks}  # fmt: skip
    hidden = {id(t) for ax in fig.axes if not ax.get_visible() for t in ax.findobj(Text)}
    texts = [t for t in fig.findobj(Text) if id(t) not in tick_texts | hidden]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis in (ax.xaxis, ax.yaxis):
            drawn = axis._update_ticks()  # the ticks inside the view limits: those that are drawn
            texts += [label for t in drawn for label in (t.label1, t.label2) if label.get_visible()]
    boxes = []
    for t in texts:
        if t.get_visible() and t.get_text().strip():
            box = t.get_window_extent(renderer)
            if box.width > 0 and box.height > 0:
                boxes.append((t.get_text(), box))
    return [(ta, tb) for (ta, a), (tb, b) in itertools.combinations(boxes, 2)
            if a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1]


def _wrap(text: str, width: int = 60) -> str:
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)


def _finish(fig: Figure, title: str, notes: Sequence[str], width_chars: int) -> Figure:
    """Title on top; the footnote (what is shown, what was left out and why) as the figure's x label."""
    fig.suptitle(title)
    text = " ".join(n for n in notes if n)
    if text:
        fig.supxlabel(_wrap(text, width_chars), fontsize=8, ha="left", x=0.01)
    return fig


def _chars(fig_width_in: float) -> int:
    return max(60, int(fig_width_in * 15))  # characters of 8-pt text per line that fit the figure's width


def _empty(title: str, message: str, note: str = "") -> Figure:
    fig = Figure(figsize=(8, 3), layout="constrained")
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="grey")
    return _finish(fig, title, [note], _chars(8))


def _task_title(task: str, variant_label: str) -> str:
    return f"{task} — " + _wrap(variant_label, 70)


def _tasks(frame: pd.DataFrame) -> tuple[list[tuple[str, str]], str]:
    """(task, variant label) panels to draw, at most MAX_PANELS, and a note when some are left out."""
    pairs = frame[["task", "variant_label"]].drop_duplicates().sort_values(["task", "variant_label"])
    pairs = list(pairs.itertuples(index=False, name=None))
    note = (f"Showing {MAX_PANELS} of {len(pairs)} tasks (alphabetical); every task is in the CSV tables."
            if len(pairs) > MAX_PANELS else "")
    return pairs[:MAX_PANELS], note


def _top(frame: pd.DataFrame, weight: str, limit: int, what: str = "series") -> tuple[list[str], str]:
    """The `limit` series with the largest `weight` (ties by name), and a 'top N of M' label when some are left out."""
    order = frame.groupby("series")[weight].max().reset_index().sort_values([weight, "series"],
                                                                            ascending=[False, True])
    names = order["series"].tolist()
    label = f" (top {limit} of {len(names)} {what} by {weight})" if len(names) > limit else ""
    return names[:limit], label


def _mode_key(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def _fmt_ci(low: float, high: float) -> str:
    return "no CI (n=1)" if not np.isfinite(low) else f"[{low:+.1f}, {high:+.1f}]"


# ---- heatmap --------------------------------------------------------------------------------------------------------


def heatmap_figure(matrix: pd.DataFrame, note: str = "") -> Figure:
    """Mode × task heatmap of mean Δ test with its 95% t-interval and n per cell, one panel per agent setting.
    Colours are scaled per task column (Δ over the column's largest |Δ|), so small tasks are not washed out."""
    title = "Δ test (final − base) by mode and task: mean [95% t-interval over seeds]"
    if matrix.empty:
        return _empty(title, "no completed runs with a Δ", note)
    keys = ["agent", "driver", "base_model", "protocol", "budget_s"]
    sizes = matrix.groupby(keys, dropna=False)["n"].sum().reset_index().sort_values(["n", *keys],
                                                                                    ascending=[False] + [True] * 5)
    settings = [tuple(r) for r in sizes[keys].itertuples(index=False, name=None)][:MAX_PANELS]
    columns = matrix[["task", "item_selection"]].drop_duplicates().sort_values(["task", "item_selection"])
    columns = list(columns.itertuples(index=False, name=None))
    modes = sorted(matrix["mode"].unique(), key=_mode_key)
    scale = matrix.assign(a=matrix["mean_delta"].abs()).groupby(["task", "item_selection"])["a"].max()
    width = max(8.0, 2.4 + 2.0 * len(columns))
    fig = Figure(figsize=(width, 0.95 * len(modes) * len(settings) + 0.9 * len(settings) + 2.2), layout="constrained")
    axes = fig.subplots(len(settings), 1, squeeze=False)[:, 0]
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#eeeeee")
    image = None
    for ax, setting in zip(axes, settings):
        cells = matrix[(matrix[keys].astype(str) == pd.Series(setting, index=keys).astype(str)).all(axis=1)]
        grid = np.full((len(modes), len(columns)), np.nan)
        for c in cells.itertuples(index=False):
            col, row = columns.index((c.task, c.item_selection)), modes.index(c.mode)
            top = float(scale.loc[(c.task, c.item_selection)]) or 1.0
            grid[row, col] = c.mean_delta / top
            marks = ("★" if c.is_best else "") + ("▲" if c.is_worst else "") + ("†" if c.within_noise else "")
            ax.text(col, row, f"{c.mean_delta:+.1f}{marks}\n{_fmt_ci(c.ci_low, c.ci_high)}\nn={c.n}", ha="center",
                    va="center", fontsize=7, color="white" if abs(grid[row, col]) > 0.6 else "black")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-1, vmax=1, aspect="auto")
        ax.set_xticks(range(len(columns)), [f"{t}\n{_wrap(s, 18)}" for t, s in columns], fontsize=7)
        ax.set_yticks(range(len(modes)), modes, fontsize=8)
        agent, driver, base, protocol, budget = setting
        name = agent + ("" if driver == "none" else f" · {driver}")
        suffix = " · paper protocol (test-selected)" if protocol == "paper" else ""
        ax.set_title(_wrap(f"{name} · base {base} · budget {float(budget):g} s{suffix}", int(width * 12)), fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="Δ / largest |Δ| of its task column", shrink=0.8)
    more = (f"Showing {len(settings)} of {len(sizes)} agent settings (most runs first); all cells are in "
            "tables/matrix.csv." if len(sizes) > len(settings) else "")
    legend = ("Cell: mean Δ (points) [95% t-interval], n = seeds. ★ best / ▲ worst mode of the task for that agent "
              "setting; † |Δ| below the noise floor (2 × the baseline's item-level SE). Colour is scaled per task "
              "column.")
    return _finish(fig, title, [legend, more, note], _chars(width))


# ---- leaderboard ----------------------------------------------------------------------------------------------------


def leaderboard_figure(board: pd.DataFrame, palette: Palette | None = None, note: str = "") -> Figure:
    """Mean Δ test per setting with its 95% t-interval over seeds (thick) and the item-level interval pooled over
    seeds (thin); the grey band is the task's noise floor (± 2 × the baseline's item-level SE)."""
    title = "Leaderboard: mean Δ test with 95% intervals"
    if board.empty:
        return _empty(title, "no completed runs with a Δ", note)
    palette = palette or Palette(board["series"])
    tasks, task_note = _tasks(board)
    counts = [len(board[board["task"] == t]) for t, _ in tasks]
    shown = [min(n, MAX_ROWS) for n in counts]
    longest = max(len(str(s)) for s in board["series"]) + 18
    width = min(16.0, 6.5 + 0.075 * longest)
    fig = Figure(figsize=(width, sum(0.34 * n + 1.5 for n in shown) + 1.6), layout="constrained")
    axes = fig.subplots(len(tasks), 1, squeeze=False, height_ratios=[n + 3 for n in shown])[:, 0]
    for ax, (task, label), n, total in zip(axes, tasks, shown, counts):
        sub = board[board["task"] == task].sort_values(["mean_delta", "series"]).tail(n)
        y = np.arange(len(sub))
        for yi, row in zip(y, sub.itertuples(index=False)):
            colour = palette.colour(row.series)
            if np.isfinite(row.ci_low):
                ax.plot([row.ci_low, row.ci_high], [yi, yi], color=colour, lw=3, alpha=0.8, solid_capstyle="butt")
            if np.isfinite(getattr(row, "pooled_low", np.nan)):
                ax.plot([row.pooled_low, row.pooled_high], [yi - 0.22] * 2, color=colour, lw=1)
            ax.plot(row.mean_delta, yi, "o", color=colour, ms=5)
        floor = sub["noise_floor"].dropna()
        if len(floor):
            ax.axvspan(-float(floor.iloc[0]), float(floor.iloc[0]), color="grey", alpha=0.18, lw=0)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(y, [f"{s} (n={k}{', no CI' if k < 2 else ''})" for s, k in zip(sub["series"], sub["n"])],
                      fontsize=7)
        ax.set_ylim(-0.7, len(sub) - 0.3)
        more = f" — top {n} of {total} settings by mean Δ" if total > n else ""
        ax.set_title(_wrap(_task_title(task, label) + more, int(width * 11)), fontsize=8)
        ax.set_xlabel("Δ test (points)", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    handles = [matplotlib.lines.Line2D([], [], color="k", lw=3, label="95% t-interval over seeds"),
               matplotlib.lines.Line2D([], [], color="k", lw=1, label="95% item-level, pooled over seeds"),
               matplotlib.patches.Patch(color="grey", alpha=0.3, label="noise floor (± 2 × baseline SE)")]
    axes[0].legend(handles=handles, **LEGEND)
    return _finish(fig, title, [task_note, note], _chars(width))


# ---- scaling ----------------------------------------------------------------------------------------------------------


def scaling_figure(scaling: pd.DataFrame, palette: Palette | None = None, note: str = "",
                   axes_order: Sequence[str] = ("time", "tokens", "submissions")) -> Figure:
    """Best-so-far improvement (median and IQR over seeds) against agent time, LLM tokens and submissions. The base
    model is always a candidate, so every curve starts at 0 and never falls below it."""
    title = "Best-so-far improvement over the base model (feedback split): median and IQR over seeds"
    if scaling.empty:
        return _empty(title, "no submissions in completed runs", note)
    palette = palette or Palette(scaling["series"])
    tasks, task_note = _tasks(scaling)
    fig = Figure(figsize=(16, 3.2 * len(tasks) + 1.6), layout="constrained")
    grid = fig.subplots(len(tasks), len(axes_order), squeeze=False)
    for r, (task, label) in enumerate(tasks):
        sub = scaling[scaling["task"] == task]
        names, more = _top(sub, "n_runs", MAX_SERIES)
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
            for name in names:
                line = data[data["series"] == name].sort_values("x")
                if line.empty or (axis == "tokens" and float(line["x"].max()) == 0):
                    continue
                x = line["x"].to_numpy(dtype=float) / scale
                colour = palette.colour(name)
                ax.plot(x, line["median"], color=colour, ls=palette.line(name), drawstyle="steps-post",
                        label=_wrap(f"{name} (n={int(line['n_runs'].max())})", 45))
                ax.fill_between(x, line["q25"], line["q75"], color=colour, alpha=0.15, step="post")
            ax.axhline(0, color="grey", lw=0.8, ls="--")
            ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
            ax.set_xlabel(AXES[axis][1] + unit, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("Δ best-so-far (points)", fontsize=8)
                ax.set_title(_wrap(_task_title(task, label) + more, 60), fontsize=8, loc="left")
            if c == len(axes_order) - 1 and ax.get_legend_handles_labels()[0]:
                ax.legend(**LEGEND)
    return _finish(fig, title, [task_note, note], _chars(16))


# ---- pass@k -----------------------------------------------------------------------------------------------------------


def pass_at_k_figure(pak: pd.DataFrame, palette: Palette | None = None, note: str = "") -> Figure:
    """Expected best Δ among k runs (unbiased estimator over the n runs of each setting)."""
    title = "pass@k: expected best Δ test among k runs"
    if pak.empty:
        return _empty(title, "no completed runs with a Δ", note)
    palette = palette or Palette(pak["series"])
    tasks, task_note = _tasks(pak)
    fig = Figure(figsize=(11, 3.4 * len(tasks) + 1.4), layout="constrained")
    axes = fig.subplots(len(tasks), 1, squeeze=False)[:, 0]
    for ax, (task, label) in zip(axes, tasks):
        sub = pak[pak["task"] == task]
        names, more = _top(sub, "n", MAX_SERIES)
        for name in names:
            line = sub[sub["series"] == name].sort_values("k")
            ax.plot(line["k"], line["expected_best_delta"], "o", ls=palette.line(name), color=palette.colour(name),
                    ms=4, label=_wrap(f"{name} (n={int(line['n'].max())})", 45))
        ax.axhline(0, color="grey", lw=0.8, ls="--")
        ax.set_title(_wrap(_task_title(task, label) + more, 90), fontsize=8, loc="left")
        ax.set_xlabel("k (runs)", fontsize=8)
        ax.set_ylabel("E[max Δ test over k runs]", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(**LEGEND)
    estimator = "Sort Δ ascending; E[max of k] = Σ_{i=k..n} C(i−1,k−1)/C(n,k)·Δ_(i); k = 1 is the mean."
    return _finish(fig, title, [estimator, task_note, note], _chars(11))


# ---- selection gap ---------------------------------------------------------------------------------------------------


def selection_gap_figure(gaps: pd.DataFrame, note: str = "") -> Figure:
    """Heldout runs: validation gain of the best submission against the hidden-test gain of the final pick."""
    title = "Selection gap (heldout protocol): validation gain vs hidden-test gain per run"
    if gaps.empty:
        return _empty(title, "no heldout runs with validation and test scores", note)
    palette = Palette(gaps["agent"])
    tasks = sorted(gaps["task"].unique())
    shown = tasks[:MAX_PANELS]
    cols = min(2, len(shown))
    rows = -(-len(shown) // cols)
    fig = Figure(figsize=(6.2 * cols + 1.8, 4.2 * rows + 1.3), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, task in zip(axes, shown):
        sub = gaps[gaps["task"] == task]
        agents = sub.groupby("agent").size().reset_index(name="runs").sort_values(["runs", "agent"],
                                                                                   ascending=[False, True])
        more = f" (top {MAX_SERIES} of {len(agents)} agents)" if len(agents) > MAX_SERIES else ""
        for agent in agents["agent"][:MAX_SERIES]:
            g = sub[sub["agent"] == agent]
            pts = g.sample(min(len(g), 2000), random_state=0)  # a readable cloud, whatever the run count
            ax.scatter(pts["val_gain"], pts["test_gain"], s=10, alpha=0.5, color=palette.colour(agent),
                       label=f"{agent} (n={len(g)})")
        lo = float(min(sub["val_gain"].min(), sub["test_gain"].min()))
        hi = float(max(sub["val_gain"].max(), sub["test_gain"].max()))
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=0.8, label="no gap (y = x)")
        label = sub["variant_label"].iloc[0] if "variant_label" in sub else ""
        ax.set_title(_wrap(_task_title(task, label) + more, 55), fontsize=8, loc="left")
        ax.set_xlabel("validation gain of the best submission", fontsize=8)
        ax.set_ylabel("Δ test of the final pick", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(**LEGEND)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    more = (f"Showing {len(shown)} of {len(tasks)} tasks (alphabetical); every run is in tables/selection_runs.csv."
            if len(tasks) > len(shown) else "")
    return _finish(fig, title, ["Points: runs; both gains in points.", more, note], _chars(6.2 * cols + 1.8))
