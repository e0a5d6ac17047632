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

from a2rl_bench.analysis.tables import AXES, as_text, key_of  # noqa: E402

MODE_ORDER = ("free", "sft-only", "rl-only", "multi")
MAX_PANELS = 6
MAX_SERIES = 8
MAX_ROWS = 12
DPI = 100
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "fontsize": 7, "borderaxespad": 0.0}
COLOURS = matplotlib.colormaps["tab10"].colors
LINES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")
MAX_STYLES = len(COLOURS) * len(LINES)
"""Settings with a distinct (colour, line style, marker) style; beyond it styles repeat, and the figures say so."""
HEAT_CLIP = 3.0
"""The heatmap's colour runs over Δ in units of its noise floor, clipped at ± this."""


class FigureFile(NamedTuple):
    name: str
    path: Path
    width: int
    height: int
    title: str


class Style(NamedTuple):
    colour: tuple
    line: str
    marker: str


class Palette:
    """One style per series name, the same in every panel and figure: 10 colours, then the same colours with the
    next line style and marker, so that up to `MAX_STYLES` names get distinct (colour, line style) pairs. Names are
    taken in sorted order (a stable assignment: the same store gives the same styles)."""

    def __init__(self, names: Iterable[str]) -> None:
        unique = sorted(set(map(str, names)))
        self._style = {name: Style(COLOURS[i % len(COLOURS)], LINES[(i // len(COLOURS)) % len(LINES)],
                                   MARKERS[(i // len(COLOURS)) % len(MARKERS)]) for i, name in enumerate(unique)}
        self.note = (f"Colours and line styles repeat beyond {MAX_STYLES} settings ({len(unique)} here): read the "
                     "legend." if len(unique) > MAX_STYLES else "")

    def style(self, name: str) -> Style:
        return self._style.get(str(name), Style((0.4, 0.4, 0.4), "-", "o"))

    def colour(self, name: str) -> tuple:
        return self.style(name).colour

    def line(self, name: str) -> str:
        return self.style(name).line

    def marker(self, name: str) -> str:
        return self.style(name).marker


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


class Panel(NamedTuple):
    task: str
    variant: str
    label: str

    def rows(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame[(as_text(frame["task"]) == self.task) & (as_text(frame["variant"]) == self.variant)]


def _panels(frame: pd.DataFrame) -> tuple[list[Panel], str]:
    """(task, variant) panels to draw, at most MAX_PANELS in alphabetical order of task then variant, and a note
    when some are left out. Two variants of a task are two panels."""
    keys = as_text(frame[["task", "variant", "variant_label"]]).drop_duplicates(["task", "variant"])
    panels = [Panel(*k) for k in keys.sort_values(["task", "variant"]).itertuples(index=False, name=None)]
    note = (f"Showing {MAX_PANELS} of {len(panels)} task panels (alphabetical by task, then variant); every panel "
            "is in the CSV tables." if len(panels) > MAX_PANELS else "")
    return panels[:MAX_PANELS], note


def _top(frame: pd.DataFrame, weight: str, limit: int, tiebreak: str, what: str = "settings"
         ) -> tuple[list[str], str]:
    """The `limit` series with the largest `weight`, ties broken by the larger `tiebreak` (then by setting id, so
    the pick never depends on the names), and a 'top N of M' label that states the order when some are left out."""
    order = (frame.groupby("series").agg(w=(weight, "max"), t=(tiebreak, "max"), sid=("setting_id", "first"))
             .reset_index().fillna({"t": -np.inf}).sort_values(["w", "t", "sid"], ascending=[False, False, True]))
    names = order["series"].tolist()
    label = (f" (top {limit} of {len(names)} {what} by {weight.replace('_', ' ')}, ties by "
             f"{tiebreak.replace('_', ' ')})" if len(names) > limit else "")
    return names[:limit], label


def _mode_key(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def _fmt_ci(low: float, high: float) -> str:
    return "no CI" if not np.isfinite(low) else f"[{low:+.1f}, {high:+.1f}]"


def _budget(v: object) -> str:
    try:
        return f"budget {float(v):g} s"
    except (TypeError, ValueError):
        return "budget ?"


# ---- heatmap --------------------------------------------------------------------------------------------------------

HEAT_PANEL = ("agent", "driver", "base_model", "protocol", "budget_s")
HEAT_COLUMN = ("task", "variant", "item_selection", "evaluator_id")
"""A cell is a setting: panel (agent setting) × column (task, variant, items, evaluator) × row (mode)."""


def heatmap_figure(matrix: pd.DataFrame, note: str = "") -> Figure:
    """Mode × task heatmap of mean Δ test with its 95% interval and n per cell, one panel per agent setting.
    Colour = Δ in units of the cell's noise floor (clipped at ±HEAT_CLIP), the same scale in every column, so a
    Δ within the noise is pale wherever it is."""
    title = "Δ test (final − base) by mode and task: mean [95% interval over seeds and items]"
    if matrix.empty:
        return _empty(title, "no completed runs with a Δ", note)
    keys = list(HEAT_PANEL)
    sizes = (as_text(matrix[keys]).assign(n=matrix["n"], panel_key=key_of(matrix, keys))
             .groupby("panel_key", sort=False).agg(n=("n", "sum"), **{c: (c, "first") for c in keys}).reset_index()
             .sort_values(["n", "panel_key"], ascending=[False, True]))  # fmt: skip
    settings = sizes.head(MAX_PANELS)
    columns = as_text(matrix[list(HEAT_COLUMN)]).drop_duplicates().sort_values(list(HEAT_COLUMN))
    columns = list(columns.itertuples(index=False, name=None))
    task_count = pd.Series([c[0] for c in columns]).value_counts()
    modes = sorted(as_text(matrix["mode"]).unique(), key=_mode_key)
    width = max(8.0, 2.4 + 2.0 * len(columns))
    fig = Figure(figsize=(width, 0.95 * len(modes) * len(settings) + 0.9 * len(settings) + 2.2), layout="constrained")
    axes = fig.subplots(len(settings), 1, squeeze=False)[:, 0]
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#eeeeee")
    image = None
    column_of = {c: j for j, c in enumerate(columns)}
    for ax, setting in zip(axes, settings.itertuples(index=False)):
        cells = matrix[key_of(matrix, keys) == setting.panel_key]
        grid = np.full((len(modes), len(columns)), np.nan)
        undetected: dict[int, str] = {}
        for c in cells.itertuples(index=False):
            col = column_of[tuple(as_text(pd.Series([getattr(c, f) for f in HEAT_COLUMN])))]
            if str(getattr(c, "mark_note", "")).startswith("no detectable"):
                undetected[col] = str(c.mark_note).replace("no detectable difference", "modes: no detectable diff.")
            row = modes.index(as_text(pd.Series([c.mode]))[0])
            floor = float(c.noise_floor) if c.noise_floor == c.noise_floor and c.noise_floor else np.nan
            grid[row, col] = np.clip(c.mean_delta / floor, -HEAT_CLIP, HEAT_CLIP) / HEAT_CLIP
            marks = ("★" if c.is_best else "") + ("▲" if c.is_worst else "") + ("†" if c.within_noise else "")
            shade = grid[row, col]
            ax.text(col, row, f"{c.mean_delta:+.1f}{marks}\n{_fmt_ci(c.ci_low, c.ci_high)}\nn={c.n}", ha="center",
                    va="center", fontsize=7, color="white" if abs(shade) > 0.6 else "black")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-1, vmax=1, aspect="auto")
        labels = []
        for j, (task, variant, items, evaluator) in enumerate(columns):
            extra = f"\n{_wrap(variant, 18)}\n{_wrap(evaluator, 18)}" if task_count[task] > 1 else ""
            extra += f"\n{_wrap(undetected[j], 18)}" if j in undetected else ""
            labels.append(f"{task}\n{_wrap(items, 18)}{extra}")
        ax.set_xticks(range(len(columns)), labels, fontsize=7)
        ax.set_yticks(range(len(modes)), modes, fontsize=8)
        name = setting.agent + ("" if setting.driver == "none" else f" · {setting.driver}")
        suffix = " · paper protocol (test-selected)" if setting.protocol == "paper" else ""
        ax.set_title(_wrap(f"{name} · base {setting.base_model} · {_budget(setting.budget_s)}{suffix}",
                           int(width * 12)), fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=f"Δ / noise floor, clipped at ±{HEAT_CLIP:g}", shrink=0.8,
                     ticks=[-1, -1 / HEAT_CLIP, 0, 1 / HEAT_CLIP, 1]).ax.set_yticklabels(
            [f"−{HEAT_CLIP:g}", "−1", "0", "+1", f"+{HEAT_CLIP:g}"])
    more = (f"Showing {len(settings)} of {len(sizes)} agent settings (most runs first, ties in alphabetical order "
            "of agent, driver, base model, protocol, budget); all cells are in tables/matrix.csv."
            if len(sizes) > len(settings) else "")
    legend = ("Cell: mean Δ (points) [95% interval over seeds and shared items], n = seeds. ★ best / ▲ worst mode "
              "of the task for that agent setting, only where its difference from the runner-up (paired by seed and "
              "item) has a 95% interval without 0; else the column says \"no detectable diff. (± half-width)\"; † |Δ| below the noise floor (2 × the baseline's item-level SE). "
              "Colour: Δ in noise floors, the same scale everywhere (grey: no noise floor).")
    return _finish(fig, title, [legend, more, note], _chars(width))


# ---- leaderboard ----------------------------------------------------------------------------------------------------


def leaderboard_figure(board: pd.DataFrame, palette: Palette | None = None, note: str = "") -> Figure:
    """Mean Δ test per setting with its one 95% interval (over seeds and the items they share); the grey band
    beside each row is its noise floor (± 2 × the baseline's item-level SE). One panel per task and variant."""
    title = "Leaderboard: mean Δ test with 95% intervals (★ best / ▲ worst only where the gap to the next is detectable)"
    if board.empty:
        return _empty(title, "no completed runs with a Δ", note)
    palette = palette or Palette(board["series"])
    panels, task_note = _panels(board)
    counts = [len(p.rows(board)) for p in panels]
    shown = [min(n, MAX_ROWS) for n in counts]
    longest = max(len(str(s)) for s in board["series"]) + 18
    width = min(16.0, 6.5 + 0.075 * longest)
    fig = Figure(figsize=(width, sum(0.34 * n + 1.5 for n in shown) + 1.6), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=[n + 3 for n in shown])[:, 0]
    for ax, panel, n, total in zip(axes, panels, shown, counts):
        sub = panel.rows(board).sort_values(["mean_delta", "setting_id"], ascending=[True, False]).tail(n)
        y = np.arange(len(sub))
        for yi, row in zip(y, sub.itertuples(index=False)):
            style = palette.style(row.series)
            floor = float(row.noise_floor) if row.noise_floor == row.noise_floor else np.nan
            if np.isfinite(floor):
                ax.fill_betweenx([yi - 0.4, yi + 0.4], -floor, floor, color="grey", alpha=0.18, lw=0)
            if np.isfinite(row.ci_low):
                ax.plot([row.ci_low, row.ci_high], [yi, yi], color=style.colour, ls=style.line, lw=2.5, alpha=0.9,
                        solid_capstyle="butt")
            ax.plot(row.mean_delta, yi, style.marker, color=style.colour, ms=5)
        ax.axvline(0, color="grey", lw=0.8)
        flags = [("★ " if b else "") + ("▲ " if w else "") for b, w in
                 zip(sub.get("is_best", [False] * len(sub)), sub.get("is_worst", [False] * len(sub)))]
        ax.set_yticks(y, [f"{f}{s} (n={k}{', no CI' if not np.isfinite(lo) else ''})"
                          for f, s, k, lo in zip(flags, sub["series"], sub["n"], sub["ci_low"])], fontsize=7)
        ax.set_ylim(-0.7, len(sub) - 0.3)
        more = f" — top {n} of {total} settings by mean Δ (ties by setting id)" if total > n else ""
        notes = panel.rows(board)["mark_note"] if "mark_note" in board else pd.Series(dtype=object)
        if len(notes) and str(notes.iloc[0]).startswith("no detectable"):
            more += f" — best / worst: {notes.iloc[0]}"
        ax.set_title(_wrap(_task_title(panel.task, panel.label) + more, int(width * 11)), fontsize=8)
        ax.set_xlabel("Δ test (points)", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    handles = [matplotlib.lines.Line2D([], [], color="k", lw=2.5, label="95% interval (seeds × items)"),
               matplotlib.patches.Patch(color="grey", alpha=0.3, label="noise floor (± 2 × baseline SE)")]
    axes[0].legend(handles=handles, **LEGEND)
    return _finish(fig, title, [task_note, palette.note, note], _chars(width))


# ---- scaling ----------------------------------------------------------------------------------------------------------


def _splits(frame: pd.DataFrame) -> str:
    splits = sorted(set(as_text(frame["split"]))) if "split" in frame and len(frame) else ["validation"]
    return " / ".join("test (protocol paper)" if s == "test" else s for s in splits)


def scaling_figure(scaling: pd.DataFrame, palette: Palette | None = None, note: str = "",
                   axes_order: Sequence[str] = ("time", "tokens", "submissions")) -> Figure:
    """Best-so-far improvement (median and IQR over seeds) against agent time, LLM tokens and submissions, on the
    split the agent got feedback on (validation; test under protocol `paper`), which the y label names. The base
    model is always a candidate, so every curve starts at 0 and never falls below it; ◆ marks the headline, the
    mean hidden-test Δ of the final pick. Every axis starts at 0."""
    title = "Best-so-far gain over the base model on the feedback split: median and IQR over seeds"
    if scaling.empty:
        return _empty(title, "no completed runs", note)
    palette = palette or Palette(scaling["series"])
    panels, task_note = _panels(scaling)
    fig = Figure(figsize=(16, 3.2 * len(panels) + 1.6), layout="constrained")
    grid = fig.subplots(len(panels), len(axes_order), squeeze=False)
    for r, panel in enumerate(panels):
        sub = panel.rows(scaling)
        tiebreak = "headline_delta" if "headline_delta" in sub else "n_runs"
        names, more = _top(sub, "n_runs", MAX_SERIES, tiebreak)
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
            if axis == "submissions" and (data.empty or float(data["x"].max()) == 0):
                ax.text(0.5, 0.5, "no submissions in these runs:\nthe base model stands", transform=ax.transAxes,
                        ha="center", va="center", color="grey")
            for name in names:
                line = data[data["series"] == name].sort_values("x")
                if line.empty or float(line["x"].max()) == 0:
                    continue
                x = line["x"].to_numpy(dtype=float) / scale
                style = palette.style(name)
                ax.plot(x, line["median"], color=style.colour, ls=style.line, drawstyle="steps-post",
                        label=_wrap(f"{name} (n={int(line['n_runs'].max())})", 45))
                ax.fill_between(x, line["q25"], line["q75"], color=style.colour, alpha=0.15, step="post")
                headline = line["headline_delta"].iloc[0] if "headline_delta" in line else np.nan
                if axis == "time" and headline == headline:
                    ax.plot(x[-1], headline, "D", color=style.colour, ms=5, mec="black", mew=0.6)
            ax.axhline(0, color="grey", lw=0.8, ls="--")
            ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
            ax.set_xlim(left=0.0)
            ax.set_xlabel(AXES[axis][1] + unit, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel(f"best-so-far gain on {_splits(sub)} (points)", fontsize=8)
                ax.set_title(_wrap(_task_title(panel.task, panel.label) + more, 60), fontsize=8, loc="left")
            if c == len(axes_order) - 1 and ax.get_legend_handles_labels()[0]:
                ax.legend(**LEGEND)
    legend = ("Lines: median over seeds of the best score so far on the feedback split minus the base model's (0 "
              "before the first submission); bands: IQR. ◆ at the end of the time axis: the headline, the mean "
              "hidden-test Δ of the final pick.")
    return _finish(fig, title, [note, legend, task_note, palette.note], _chars(16))


# ---- pass@k -----------------------------------------------------------------------------------------------------------


def pass_at_k_figure(pak: pd.DataFrame, palette: Palette | None = None, note: str = "") -> Figure:
    """Expected best Δ among k runs (unbiased estimator over the n runs of each setting)."""
    title = "pass@k: expected best Δ test among k runs"
    if pak.empty:
        return _empty(title, "no completed runs with a Δ", note)
    palette = palette or Palette(pak["series"])
    panels, task_note = _panels(pak)
    fig = Figure(figsize=(11, 3.4 * len(panels) + 1.4), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    mean = pak[pak["k"] == 1].set_index("setting_id")["expected_best_delta"]
    for ax, panel in zip(axes, panels):
        sub = panel.rows(pak).assign(mean_delta=lambda f: f["setting_id"].map(mean))
        names, more = _top(sub, "n", MAX_SERIES, "mean_delta")
        for name in names:
            line = sub[sub["series"] == name].sort_values("k")
            style = palette.style(name)
            ax.plot(line["k"], line["expected_best_delta"], style.marker, ls=style.line, color=style.colour,
                    ms=4, label=_wrap(f"{name} (n={int(line['n'].max())})", 45))
        ax.axhline(0, color="grey", lw=0.8, ls="--")
        ax.set_title(_wrap(_task_title(panel.task, panel.label) + more, 90), fontsize=8, loc="left")
        ax.set_xlabel("k (runs)", fontsize=8)
        ax.set_ylabel("E[max Δ test over k runs]", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(**LEGEND)
    estimator = "Sort Δ ascending; E[max of k] = Σ_{i=k..n} C(i−1,k−1)/C(n,k)·Δ_(i); k = 1 is the mean."
    return _finish(fig, title, [estimator, task_note, palette.note, note], _chars(11))


# ---- selection gap ---------------------------------------------------------------------------------------------------


def selection_gap_figure(gaps: pd.DataFrame, palette: Palette | None = None, note: str = "") -> Figure:
    """Heldout runs: validation gain of the best submission against the hidden-test gain of the final pick, one
    point per run, coloured and marked by its setting."""
    title = "Selection gap (heldout protocol): validation gain vs hidden-test gain per run"
    if gaps.empty:
        return _empty(title, "no heldout runs with validation and test scores", note)
    if "series" not in gaps:
        gaps = gaps.assign(series=gaps["setting_id"])
    palette = palette or Palette(gaps["series"])
    panels, task_note = _panels(gaps)
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(6.2 * cols + 1.8, 4.2 * rows + 1.3), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        sub = panel.rows(gaps)
        counted = sub.assign(runs=sub.groupby("setting_id")["run_id"].transform("count"),
                             mean_test_gain=sub.groupby("setting_id")["test_gain"].transform("mean"))
        names, more = _top(counted, "runs", MAX_SERIES, "mean_test_gain")
        for name in names:
            g = sub[sub["series"] == name]
            pts = g.sample(min(len(g), 2000), random_state=0)  # a readable cloud, whatever the run count
            style = palette.style(name)
            ax.scatter(pts["val_gain"], pts["test_gain"], s=12, alpha=0.6, color=style.colour, marker=style.marker,
                       label=_wrap(f"{name} (n={len(g)})", 40))
        lo = float(min(sub["val_gain"].min(), sub["test_gain"].min()))
        hi = float(max(sub["val_gain"].max(), sub["test_gain"].max()))
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=0.8, label="no gap (y = x)")
        ax.set_title(_wrap(_task_title(panel.task, panel.label) + more, 55), fontsize=8, loc="left")
        ax.set_xlabel("validation gain of the best submission", fontsize=8)
        ax.set_ylabel("Δ test of the final pick", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(**LEGEND)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _finish(fig, title, ["Points: runs; both gains in points.", task_note, palette.note, note],
                   _chars(6.2 * cols + 1.8))
