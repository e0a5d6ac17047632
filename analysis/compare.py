"""The one comparison model: every "A against B" of the analysis (modes, agents, drivers, budgets, any setting field;
the RL stage over SFT; the best and worst marks) is made here, the same way.

Model. A and B are two sets of runs that differ in one thing. Their runs are **paired by seed number**; within each
seed pair, by **hidden-test item**: the value of an item is B's Δ on it minus A's Δ on it (Δ = final − base model, so
with one base model the base cancels and it is B's answer minus A's). The k seed pairs × n shared items table of
these differences is a crossed design, and its mean gets the seeds × items interval of
`a2rl_bench.summary.intervals.seeds_items_interval` (the same one as a setting's Δ): an item part and a seed part, each
with its own t quantile, two pseudo-items (±1) per seed pair so that tied seeds never give zero width. The p-value is
the test that same interval inverts (its t statistic referred to the t distribution whose 97.5% point the interval
used), so **the interval leaves 0 out exactly when p < 0.05**, on every table.

What is left out, and said:
- seeds that only one side ran are dropped and counted (`unpaired_seeds`); with none in common there is no
  interval (pairing seeds of different numbers would pretend a pairing that is not there);
- items not scored by every paired run are dropped and counted (`dropped_items`; design `seed pairs × shared items`);
- runs without item rows, where other runs have them, are dropped and counted (`runs_without_items`);
- several runs of one side with the same seed (a rerun) are averaged per item;
- only where one side has no per-item results at all (older runs): the paired seeds' Δ differences get the t-interval
  over seed pairs plus a binomial bound for the items where their number is known (`seeds_interval`; design
  `seeds (no per-item results)`).
Every row names its design (`design`), and its mean Δs are over the paired seeds only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from a2rl_bench.setting import SETTING_KEY
from a2rl_bench.summary.intervals import Interval, binomial_var, seeds_interval, seeds_items_interval

DIFF_BOUNDS = (-200.0, 200.0)
"""A difference of two Δs (points) can be anything in ±200; one base model keeps it within ±100."""
SFT_ONLY = "sft-only"
"""The mode without reinforcement learning: "did the RL stage help?" compares every other mode with it."""


@dataclass(frozen=True)
class Comparison:
    """B − A (points) with its 95% interval, its p-value (from the same test) and what it rests on."""

    interval: Interval
    unpaired_seeds: int = 0
    """Seeds one side ran and the other did not: left out."""
    dropped_items: int = 0
    """Items some paired run was not scored on: left out."""
    design: str = "no interval"
    """`seed pairs × items`, `seed pairs × shared items` (some items left out) or `seeds (no per-item results)`."""
    runs_without_items: int = 0
    """Runs without item rows, left out where the other runs have them (said in `interval`)."""
    seeds: tuple = ()
    """The paired seeds the comparison rests on."""

    @property
    def half_width(self) -> float:
        iv = self.interval
        return (iv.high - iv.low) / 2 if iv.low == iv.low else math.nan

    @property
    def verdict(self) -> str:
        """`B better`, `B worse` or `no detectable difference` (also when there is no interval)."""
        label = self.interval.label()
        return {"improved": "B better", "worse": "B worse"}.get(label, "no detectable difference")

    def row(self) -> dict:
        iv = self.interval
        return {"n_seeds": iv.n, "unpaired_seeds": self.unpaired_seeds, "n_items": iv.n_items,
                "dropped_items": self.dropped_items, "runs_without_items": self.runs_without_items,
                "design": self.design, "mean_diff": iv.estimate, "ci_low": iv.low, "ci_high": iv.high,
                "half_width": self.half_width, "p_value": iv.p_value, "verdict": self.verdict, "interval": iv.method}


def compare_items(a: pd.DataFrame, b: pd.DataFrame, without_items: tuple[int, int] = (0, 0)) -> Comparison:
    """B − A from per-item values: frames with columns `seed`, `item_id`, `value` (a run's Δ on that item, in
    item units: -1..1 for right/wrong items). Paired by seed, then by item (module docstring)."""
    codes, items = pd.factorize(pd.concat([a["item_id"], b["item_id"]], ignore_index=True))
    return compare_tables(_seed_table(a["seed"], codes[:len(a)], a["value"], len(items)),
                          _seed_table(b["seed"], codes[len(a):], b["value"], len(items)), without_items)


SeedTable = tuple[np.ndarray, np.ndarray]
"""(sorted seeds, seeds × items values with NaN where a seed has no value), items aligned between the two sides."""


def _seed_table(seed: pd.Series, item_code: np.ndarray, value: pd.Series, n_items: int) -> SeedTable:
    """Per seed and item the mean value (reruns of a seed averaged); numpy, as hundreds of pivots are too slow."""
    seeds, seed_code = np.unique(seed.to_numpy(), return_inverse=True)
    total, count = np.zeros((len(seeds), n_items)), np.zeros((len(seeds), n_items))
    v = value.to_numpy(dtype=float)
    ok = ~np.isnan(v)
    np.add.at(total, (seed_code[ok], item_code[ok]), v[ok])
    np.add.at(count, (seed_code[ok], item_code[ok]), 1.0)
    return seeds, np.divide(total, count, out=np.full_like(total, np.nan), where=count > 0)


def compare_tables(a: SeedTable, b: SeedTable, without_items: tuple[int, int] = (0, 0)) -> Comparison:
    """B − A from the two sides' seed tables: paired by seed, then by the items every paired seed scored.
    `without_items`: (runs the caller left out for having no item rows, runs in all), counted and said."""
    (sa, ta), (sb, tb) = a, b
    runs_without_items = without_items[0]
    left = f"; {without_items[0]} of {without_items[1]} runs without item rows, left out" if without_items[0] else ""
    seeds = np.intersect1d(sa, sb)
    unpaired = len(np.union1d(sa, sb)) - len(seeds)
    if len(seeds) == 0:
        return Comparison(_no_interval(f"no seed in common ({unpaired} unpaired seeds): no paired comparison{left}"),
                          unpaired, runs_without_items=runs_without_items)
    ta, tb = ta[np.searchsorted(sa, seeds)], tb[np.searchsorted(sb, seeds)]
    scored = ~np.isnan(a[1]).all(axis=0) | ~np.isnan(b[1]).all(axis=0)
    shared = ~np.isnan(ta).any(axis=0) & ~np.isnan(tb).any(axis=0)
    dropped = int(scored.sum() - shared.sum())
    if not shared.any():
        return Comparison(_no_interval(f"no hidden-test item scored by every paired run{left}"), unpaired, dropped,
                          runs_without_items=runs_without_items, seeds=tuple(seeds.tolist()))
    n = int(shared.sum())
    iv = seeds_items_interval(tb[:, shared] - ta[:, shared], bounds=DIFF_BOUNDS)
    method = (f"paired by seed ({len(seeds)} pairs) and item ({n} shared): seeds × items interval of the item "
              "differences (+2 pseudo-items per seed)" if len(seeds) > 1 else
              f"1 seed pair, {n} shared items: t over the item differences (+2 pseudo-items); seed-to-seed spread not "
              "measured")
    method += (f"; {dropped} of {dropped + n} items not scored by every paired run, left out" if dropped else "")
    design = "seed pairs × shared items" if dropped else "seed pairs × items"
    return Comparison(iv._replace(method=method + left), unpaired, dropped, design, runs_without_items,
                      tuple(seeds.tolist()))


class RunItems:
    """Per-run item values as one runs × items matrix (NaN: not scored), built once for many comparisons."""

    def __init__(self, values: pd.DataFrame):
        run_code, runs = pd.factorize(values["run_id"])
        item_code, items = pd.factorize(values["item_id"])
        self.matrix = np.full((len(runs), len(items)), np.nan)
        self.matrix[run_code, item_code] = values["value"].to_numpy(dtype=float)
        self.row = {r: i for i, r in enumerate(runs)}

    def table(self, runs: pd.DataFrame) -> tuple[SeedTable, int] | None:
        """The seed table of the runs with per-item values, and how many runs have none (left out, counted); None
        when no run has any."""
        rows = [self.row.get(r) for r in runs["run_id"]]
        have = [i for i, r in enumerate(rows) if r is not None and not np.isnan(self.matrix[r]).all()]
        if not have:
            return None
        m = self.matrix[[rows[i] for i in have]]
        n_items = m.shape[1]
        item_code = np.tile(np.arange(n_items), len(have))
        seeds = runs["seed"].iloc[have]
        return _seed_table(seeds.repeat(n_items), item_code, pd.Series(m.ravel()), n_items), len(rows) - len(have)


def compare_deltas(a: pd.DataFrame, b: pd.DataFrame, n_items: int = 0) -> Comparison:
    """B − A without per-item results: frames with `seed`, `delta_test` (and `final_test`, `baseline_test` for the
    items' binomial bound over `n_items`). The t-interval over seed pairs plus that bound, labelled so."""
    da, db = (f.groupby("seed")["delta_test"].mean() for f in (a, b))
    seeds = da.index.intersection(db.index)
    unpaired = len(da.index.union(db.index)) - len(seeds)
    if len(seeds) == 0:
        return Comparison(_no_interval(f"no seed in common ({unpaired} unpaired seeds): no paired comparison"),
                          unpaired)
    var = None
    if n_items > 1 and {"final_test", "baseline_test"} <= set(a.columns) & set(b.columns):
        # Both sides' final scores vary over items; the base model's cancels when it is one model on one item set.
        # The seeds share the items, so this part does not shrink with more seeds (as for a setting's Δ).
        var = sum(binomial_var(float(f.loc[f["seed"].isin(seeds), "final_test"].mean()), n_items) for f in (a, b))
    iv = seeds_interval((db.loc[seeds] - da.loc[seeds]).tolist(), var, n_items, bounds=DIFF_BOUNDS)
    method = f"no per-item results: paired by seed ({len(seeds)} pairs), {iv.method}"
    return Comparison(iv._replace(method=method), unpaired, design="seeds (no per-item results)",
                      seeds=tuple(seeds.tolist()))


def _no_interval(why: str) -> Interval:
    return Interval(math.nan, math.nan, math.nan, 0, math.nan, why, 0)


# ---- settings that differ in one field ------------------------------------------------------------------------------


def item_values(runs: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Per run and hidden-test item: its Δ on the item (final − base, item units), with the run's seed."""
    if pairs.empty:
        return pd.DataFrame(columns=["run_id", "seed", "item_id", "value"])
    v = pairs.assign(value=pairs["final_score"].astype(float) - pairs["base_score"].astype(float))
    return v.merge(runs[["run_id", "seed"]], on="run_id")[["run_id", "seed", "item_id", "value"]]


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, items: RunItems) -> Comparison:
    """B − A for two sets of runs (rows of `analysed_runs`), from the per-item values of the runs that have them (the
    others left out and counted); from the runs' Δs only where one side has none at all."""
    ta, tb = items.table(a), items.table(b)
    if ta is not None and tb is not None:
        return compare_tables(ta[0], tb[0], (ta[1] + tb[1], len(a) + len(b)))
    return compare_deltas(a, b, _n_items(a, b))


def _n_items(a: pd.DataFrame, b: pd.DataFrame) -> int:
    col = "test_n" if "test_n" in a.columns else None
    if col is None:
        return 0
    n = pd.concat([a[col], b[col]]).dropna()
    return int(n.min()) if len(n) and n.nunique() == 1 else 0


def setting_field(name: str) -> str | None:
    """The setting field a user named (`budget` for `budget_s`, `-` for `_`), or None if it is none."""
    name = {"budget": "budget_s"}.get(name, name.replace("-", "_"))
    return name if name in SETTING_KEY else None


def compare_field(runs: pd.DataFrame, pairs: pd.DataFrame, field: str,
                  pair: tuple[str, str] | None = None) -> pd.DataFrame:
    """Every comparison of two settings that differ only in `field` (any setting field: mode, agent, driver,
    budget_s, ...): one row per group of the other fields and pair of `field` values (B − A, A the first in sorted
    order; or only `pair` = (A, B))."""
    name = setting_field(field)
    if name is None:
        raise ValueError(f"--compare takes a setting field ({', '.join(SETTING_KEY)}), not {field!r}")
    field = name
    fixed = [c for c in SETTING_KEY if c != field and c in runs.columns]
    values = item_values(runs, pairs)
    done = runs[runs["delta_test"].notna()]
    rows = []
    for group, g in done.groupby(fixed, dropna=False, sort=True):
        mine = RunItems(values[values["run_id"].isin(g["run_id"])])  # once per group, for its every comparison
        levels = sorted(g[field].dropna().unique().tolist(), key=str)
        todo = [pair] if pair else [(x, y) for i, x in enumerate(levels) for y in levels[i + 1:]]
        for a, b in todo:
            ga, gb = g[g[field].astype(str) == str(a)], g[g[field].astype(str) == str(b)]
            if ga.empty or gb.empty:
                continue
            c = compare_runs(ga, gb, mine)
            rows.append(dict(zip(fixed, group)) | {
                "compared": field, "a": a, "b": b, "mean_delta_a": _paired_mean(ga, c.seeds),
                "mean_delta_b": _paired_mean(gb, c.seeds)} | c.row())  # fmt: skip
    columns = ["compared", "a", "b", *fixed, "mean_delta_a", "mean_delta_b", *COMPARISON_COLUMNS]
    return pd.DataFrame(rows, columns=columns)


COMPARISON_COLUMNS = ["n_seeds", "unpaired_seeds", "n_items", "dropped_items", "runs_without_items", "design",
                      "mean_diff", "ci_low", "ci_high", "half_width", "p_value", "verdict", "interval"]
"""The columns of `Comparison.row`, in every comparison table."""


def _paired_mean(runs: pd.DataFrame, seeds: tuple) -> float:
    """Mean Δ over the seeds the comparison paired (reruns of a seed averaged first, as the comparison does), so
    that mean_delta_b − mean_delta_a is the Δ difference of the same seeds as mean_diff; NaN without any."""
    per_seed = runs.groupby("seed")["delta_test"].mean()
    per_seed = per_seed[per_seed.index.isin(list(seeds))]
    return float(per_seed.mean()) if len(per_seed) else math.nan


def rl_helped(runs: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """"Did the RL stage help?", part one: per task (and every other setting field), each mode against `sft-only`
    (B − A with A = sft-only)."""
    others = sorted(set(runs["mode"].dropna()) - {SFT_ONLY}) if SFT_ONLY in set(runs["mode"]) else []
    if not others:
        return compare_field(runs.iloc[:0], pairs.iloc[:0], "mode")
    out = pd.concat([compare_field(runs, pairs, "mode", (SFT_ONLY, m)) for m in others], ignore_index=True)
    return out.sort_values(["task", "variant", "b"], kind="stable").reset_index(drop=True)


# ---- RL's share over seeds ------------------------------------------------------------------------------------------


def rl_share_over_seeds(shares: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """"Did the RL stage help?", part two: per setting, RL's share (last RL checkpoint − the SFT checkpoint it
    started from, on the hidden test; `a2rl_bench.summary.stages`) combined over seeds × shared items like Δ.

    Args:
        shares: rows of the `stage_shares` view (setting fields, `seed`, `run_id`, `rl_share`, `submissions` =
            "[sft id, rl id]").
        items: `item_results` rows of the post-hoc evaluations (`run_id`, `eval_key` = posthoc-<id>-test,
            `item_id`, `score`).
    """
    key = [c for c in ["setting_id", *SETTING_KEY] if c in shares.columns]
    columns = [*key, "n_runs", "mean_rl_share", *COMPARISON_COLUMNS]
    if shares.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for group, g in shares.groupby(key, dropna=False, sort=True):
        sft, rl = _share_items(g, items)
        with_items = set(sft["run_id"]) & set(rl["run_id"])
        if with_items:  # the runs with both checkpoints' item rows; the others left out and counted
            keep = sft["run_id"].isin(with_items), rl["run_id"].isin(with_items)
            c = compare_items(sft[keep[0]], rl[keep[1]], (len(g) - len(with_items), len(g)))
        else:  # no run has per-item post-hoc results: the runs' shares over seeds, said so
            iv = seeds_interval(g["rl_share"].astype(float).tolist())
            c = Comparison(iv._replace(method=f"no per-item post-hoc results ({len(g)} of {len(g)} runs without item "
                                              f"rows): {iv.method}"), design="seeds (no per-item results)",
                           runs_without_items=len(g))
        rows.append(dict(zip(key, group)) | {"n_runs": len(g), "mean_rl_share": float(g["rl_share"].mean())}
                    | c.row())
    return pd.DataFrame(rows, columns=columns)


def _share_items(g: pd.DataFrame, items: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-item hidden-test scores of each run's SFT start and last RL checkpoint, as `compare_items` frames."""
    out: tuple[list, list] = ([], [])
    for r in g.itertuples(index=False):
        ids = _submission_ids(r.submissions)
        if ids is None:
            continue
        for side, sid in zip(out, ids):
            mine = items[(items["run_id"] == r.run_id) & (items["eval_key"] == f"posthoc-{sid}-test")]
            side.append(pd.DataFrame({"run_id": r.run_id, "seed": r.seed, "item_id": mine["item_id"],
                                      "value": mine["score"].astype(float)}))
    empty = pd.DataFrame(columns=["run_id", "seed", "item_id", "value"])
    return tuple(pd.concat(side, ignore_index=True) if side else empty for side in out)  # type: ignore[return-value]


def _submission_ids(text: object) -> tuple[int, int] | None:
    try:
        ids = json.loads(str(text))
        return int(ids[0]), int(ids[1])
    except (ValueError, TypeError, IndexError, KeyError):
        return None


# ---- marks: best and worst only where detectable --------------------------------------------------------------------


def marks(cells: pd.DataFrame, runs: pd.DataFrame, values: pd.DataFrame, groups: pd.Series, field: str
          ) -> pd.DataFrame:
    """Best (★) and worst (▲) of the cells (settings) within each of `groups` (one key per cell) that differ in
    `field` — only where the
    comparison with the runner-up (best − second best; second worst − worst) leaves 0 out. Columns added:
    is_best, is_worst, mark_note ("★ best: …", or "no detectable difference (± half-width)")."""
    out = cells.assign(is_best=False, is_worst=False, mark_note="")
    if cells.empty:
        return out
    items = RunItems(values)
    for _, g in out.groupby(groups, sort=False):
        if len(g) < 2:
            continue
        order = g.sort_values(["mean_delta", "setting_id"], ascending=[False, True])
        best, second = order.iloc[0], order.iloc[1]
        worst, next_worst = order.iloc[-1], order.iloc[-2]
        top = compare_runs(_runs_of(runs, second), _runs_of(runs, best), items)
        bottom = compare_runs(_runs_of(runs, worst), _runs_of(runs, next_worst), items)
        notes = []
        if top.interval.low > 0:
            out.loc[best.name, "is_best"] = True
            notes.append(f"★ {best[field]} best: +{top.interval.estimate:.2f} over {second[field]} "
                         f"[{top.interval.low:+.2f}, {top.interval.high:+.2f}]")
        if bottom.interval.low > 0:
            out.loc[worst.name, "is_worst"] = True
            notes.append(f"▲ {worst[field]} worst: {-bottom.interval.estimate:+.2f} below {next_worst[field]} "
                         f"[{-bottom.interval.high:+.2f}, {-bottom.interval.low:+.2f}]")
        if not notes:
            half = max(top.half_width, bottom.half_width)
            notes.append("no detectable difference" + (f" (± {half:.1f})" if half == half else " (no interval)"))
        out.loc[g.index, "mark_note"] = "; ".join(notes)
    return out


def _runs_of(runs: pd.DataFrame, cell: pd.Series) -> pd.DataFrame:
    return runs[runs["setting_id"] == cell["setting_id"]]

