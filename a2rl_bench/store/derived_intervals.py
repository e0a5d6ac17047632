"""The intervals across the runs of a setting, computed once in Python by `a2rl_bench.summary.intervals` and stored for
the views to select: a setting's Δ and hidden-test score over its seeds (and the items they share), the best gain within
each share of the budget, the base model's noise (its item-level standard error) and the Baseline row of the paper's
System × task table.

They are numbers over a group of runs: the runs that share task, variant, item selection and base model (every
setting, noise row and Baseline row lies in one such group). A write of a run's rows recomputes the group the run is
in now and the one it was in before (`interval_runs` keeps each run's group as last computed), in the transaction of
the write, after the run's own derived rows (`a2rl_bench.store.derived`), which the budget gains come from.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import duckdb
import numpy as np

from a2rl_bench.store.derived import BUDGET_FRACTIONS, insert_rows
from a2rl_bench.summary.intervals import (DELTA_PSEUDO, SCORE_PSEUDO, Z975_PRINTED, agresti_coull_score, binomial_var,
                                    binomial_se, item_se, mean_se, seeds_interval, seeds_items_interval,
                                    shared_items_interval)  # fmt: skip

GROUP = ("task", "variant", "item_selection", "base_model")

# The stored tables (the schema's migration 12 creates them) and their columns, in order.
INTERVAL_COLUMNS: dict[str, tuple[str, ...]] = {
    "interval_runs": ("run_id", *GROUP),
    "noise_derived": (*GROUP, "evaluator_id", "split", "n_rows", "k_reevaluations", "mean_baseline",
                      "range_baseline", "n_items", "is_binary", "sd_item", "noise_se", "noise_floor",
                      "noise_floor_source"),  # fmt: skip
    "setting_derived": (*GROUP, "setting_id", "metric", "budget_fraction", "design", "n", "n_items", "estimate", "se",
                        "ci_low", "ci_high", "interval", "verdict"),  # fmt: skip
    "baseline_derived": (*GROUP, "evaluator_id", "n_items", "ci_low", "ci_high", "interval"),
}

NO_INTERVAL = "n = 1: no interval"
TIED = "the seeds agree exactly: no interval"


def refresh(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str] | None = None) -> None:
    """Recompute the stored intervals of the groups `run_ids` are in, or were in (every group when None)."""
    ids = None if run_ids is None else sorted({str(r) for r in run_ids if r is not None})
    if ids == []:
        return
    cols = ", ".join(GROUP)
    run_sql = ("SELECT run_id, task, variant, item_selection, base_model, evaluator_id, setting_id, "
               "excluded_because IS NULL AS analysed, delta_test, final_test, baseline_test FROM run_settings")
    if ids is None:
        where, params, runs = "", [], con.execute(run_sql).fetchall()
    else:  # the runs of the groups `ids` are in now or were in, in one pass over the view
        match = " AND ".join(f"rs.{c} IS NOT DISTINCT FROM g.{c}" for c in GROUP)
        runs = con.execute(f"WITH rs AS MATERIALIZED ({run_sql}), g AS ("
                           f"SELECT {cols} FROM rs WHERE list_contains(?::VARCHAR[], run_id) UNION "
                           f"SELECT {cols} FROM interval_runs WHERE list_contains(?::VARCHAR[], run_id)) "
                           f"SELECT rs.* FROM rs SEMI JOIN g ON {match}", [ids, ids]).fetchall()  # fmt: skip
        groups = {r[1:5] for r in runs} | set(con.execute(
            f"SELECT {cols} FROM interval_runs WHERE list_contains(?::VARCHAR[], run_id)", [ids]).fetchall())
        if not groups:
            return
        where = "WHERE " + " OR ".join(f"({' AND '.join(f'{c} IS NOT DISTINCT FROM ?' for c in GROUP)})"
                                       for _ in groups)  # fmt: skip
        params = [v for g in sorted(groups, key=repr) for v in g]
    for table in INTERVAL_COLUMNS:
        con.execute(f"DELETE FROM {table} {where}", params)
    analysed = [r for r in runs if r[7]]
    noise = _noise_rows(con, {r[0]: r[1:5] for r in runs})
    pairs: dict[str, list[tuple[Any, Any, Any]]] = defaultdict(list)
    gains: dict[tuple[str, float], float] = {}
    if analysed:
        a_ids = [r[0] for r in analysed]
        for run_id, item_id, base, final in con.execute(
                "SELECT run_id, item_id, base_score, final_score FROM item_pairs "
                "WHERE list_contains(?::VARCHAR[], run_id) ORDER BY run_id, item_id", [a_ids]).fetchall():
            pairs[run_id].append((item_id, base, final))
        gains = {(r, float(f)): g for r, f, g in con.execute(
            "SELECT run_id, budget_fraction, best_gain FROM budget_gains WHERE list_contains(?::VARCHAR[], run_id)",
            [a_ids]).fetchall()}  # fmt: skip
    # (the views matched noise rows by a row of keys, where missing keys match each other, but by USING for the
    # Baseline row, where they match nothing: `_baseline_rows` keeps that)
    test_noise = {tuple(row[:5]): row for row in noise if row[5] == "test"}
    insert_rows(con, "interval_runs", INTERVAL_COLUMNS["interval_runs"], [r[:5] for r in runs])
    insert_rows(con, "noise_derived", INTERVAL_COLUMNS["noise_derived"], noise)
    insert_rows(con, "setting_derived", INTERVAL_COLUMNS["setting_derived"],
                _setting_rows(analysed, pairs, gains, test_noise))
    insert_rows(con, "baseline_derived", INTERVAL_COLUMNS["baseline_derived"],
                _baseline_rows(analysed, pairs, test_noise))


def refresh_missing(con: duckdb.DuckDBPyConnection) -> None:
    """Store the intervals of the groups of runs written without them (by raw SQL, or before this schema)."""
    missing = con.execute("SELECT run_id FROM runs ANTI JOIN interval_runs USING (run_id)").fetchall()
    refresh(con, [r for (r,) in missing])


def _noise_rows(con: duckdb.DuckDBPyConnection, group_of: dict[str, tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The base model's baseline evaluations per group, evaluator and split, with their item-level noise. A greedy
    evaluator's re-evaluations repeat themselves and say nothing about item sampling, so they are only counted."""
    if not group_of:
        return []
    ids = sorted(group_of)
    evals: dict[tuple[Any, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for run_id, evaluator_id, split, *row in con.execute("""
            WITH items AS (
                SELECT run_id, eval_key, count(*)::BIGINT AS n_items, stddev_pop(score) AS sd_item,
                       bool_and(score IN (0, 1)) AS is_binary
                FROM item_results WHERE list_contains(?::VARCHAR[], run_id) GROUP BY run_id, eval_key
            )
            SELECT e.run_id, e.evaluator_id, e.split, e.score, coalesce(e.cached, false),
                   coalesce(i.n_items, e.n), coalesce(i.is_binary, true), i.sd_item
            FROM evaluations e LEFT JOIN items i USING (run_id, eval_key)
            WHERE e.kind = 'baseline' AND e.score IS NOT NULL AND list_contains(?::VARCHAR[], e.run_id)""",
                                                         [ids, ids]).fetchall():  # fmt: skip
        evals[(*group_of[run_id], evaluator_id, split)].append(row)
    out = []
    for key, rows in evals.items():
        scores = [r[0] for r in rows]
        ns, sds = [r[2] for r in rows if r[2] is not None], [r[4] for r in rows if r[4] is not None]
        mean, n_items, is_binary = sum(scores) / len(scores), max(ns, default=None), all(r[3] for r in rows)
        if is_binary:
            se = binomial_se(mean, n_items) if n_items is not None else None
        else:  # (SQL's greatest(n, 1) took a missing n for 1)
            se = item_se(sum(sds) / len(sds), n_items or 1) if sds else None
        out.append((*key, len(rows), sum(not r[1] for r in rows), mean, max(scores) - min(scores), n_items, is_binary,
                    sum(sds) / len(sds) if sds else None, _num(se), _num(2 * se) if _num(se) is not None else None,
                    "binomial SE of the baseline (Agresti-Coull), x2" if is_binary
                    else "bootstrap SE of the baseline item scores, x2"))  # fmt: skip
    return out


def _setting_rows(analysed: list[tuple[Any, ...]], pairs: dict[str, list[tuple[Any, Any, Any]]],
                  gains: dict[tuple[str, float], float], test_noise: dict[tuple[Any, ...], tuple[Any, ...]]
                  ) -> list[tuple[Any, ...]]:
    """Per setting: its Δ and score intervals (`setting_intervals`), the Δ's standard error over seeds, and the
    interval of the best gain at each share of the budget (`budget_deltas`)."""
    settings: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for r in analysed:
        settings[r[6]].append(r)
    out: list[tuple[Any, ...]] = []
    for setting_id, runs in sorted(settings.items()):
        group, k = runs[0][1:5], len(runs)
        deltas = [r[8] for r in runs]
        se = mean_se(_var(deltas), k) if k > 1 else None
        tables = _item_tables(runs, pairs)
        diff = tables[1] - tables[0] if tables is not None else None
        for metric in ("delta", "score"):
            # the score on the same items as the Δ: an item whose base score is NULL is left out of both
            shared = (None if diff is None else shared_items_interval(diff, p_value=False) if metric == "delta"
                      else shared_items_interval(np.where(np.isnan(diff), np.nan, tables[1]), SCORE_PSEUDO,
                                                 bounds=(0.0, 100.0), p_value=False))  # fmt: skip
            if shared is not None and metric == "delta" and k < 2:
                continue  # one seed's Δ: the run's own paired test (item_pairs) speaks for it
            if shared is not None:
                i, design = shared
                row = (design, i.n_items, i.estimate, i.low, i.high, i.method)
            else:
                row = _seeds_row(metric, runs, test_noise.get((*group, runs[0][5])), _no_table_reason(diff))
            design, n_items, estimate, low, high, text = row
            verdict = (None if metric == "score" else "improved" if low is not None and low > 0
                       else "worse" if high is not None and high < 0 else "no significant change")  # fmt: skip
            out.append((*group, setting_id, metric, None, design, k, n_items, _num(estimate),
                        _num(se) if metric == "delta" else None, _num(low), _num(high), text, verdict))  # fmt: skip
        for f in BUDGET_FRACTIONS:
            g = [gains.get((r[0], f), 0.0) for r in runs]
            i = seeds_interval(g, bounds=(0.0, 100.0))
            text = (NO_INTERVAL if k < 2 else TIED if len(set(g)) == 1
                    else "t-interval over seeds (the feedback items are not resampled)")  # fmt: skip
            low, high = (i.low, i.high) if text.startswith("t-") else (None, None)
            out.append((*group, setting_id, "best_gain", f, "seeds", k, 0, i.estimate, None, _num(low), _num(high),
                        text, None))  # fmt: skip
    return out


def _item_tables(runs: list[tuple[Any, ...]], pairs: dict[str, list[tuple[Any, Any, Any]]]
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """(base, final) item tables, k seeds × every item any seed scored, NaN where a seed has no score (no row, or a
    NULL score written by SQL: counted and left out, never a NaN interval); None without per-item results."""
    items = sorted({p[0] for r in runs for p in pairs[r[0]]})
    if not items:
        return None
    col = {item: j for j, item in enumerate(items)}
    base, final = np.full((len(runs), len(items)), np.nan), np.full((len(runs), len(items)), np.nan)
    for i, r in enumerate(runs):
        for item, b, f in pairs[r[0]]:
            base[i, col[item]], final[i, col[item]] = _nan(b), _nan(f)
    return base, final


def _no_table_reason(diff: np.ndarray | None) -> str:
    """Why a setting falls back to the design over seeds: said in its interval's text."""
    if diff is None:
        return ""  # (the design `seeds` and its text say so already)
    bare = int(np.isnan(diff).all(axis=1).sum())
    return (f"{bare} of {len(diff)} runs without item rows" if bare else "no item scored by every seed")


def _seeds_row(metric: str, runs: list[tuple[Any, ...]], noise: tuple[Any, ...] | None, why: str
               ) -> tuple[Any, ...]:
    """Without shared per-item results (`why` says so in the text): the t-interval over seeds, plus a binomial bound
    for the items' sampling error where the number of the base model's hidden-test items is known
    (`seeds_interval`)."""
    k = len(runs)
    values = [r[8] if metric == "delta" else r[9] for r in runs]
    known = [v for v in values if v is not None]
    estimate = sum(known) / len(known) if known else None
    n_items = noise[10] if noise is not None else None
    finals, bases = [r[9] for r in runs if r[9] is not None], [r[10] for r in runs if r[10] is not None]
    var_items: float | None = 0.0
    if n_items is not None and n_items > 1:
        mean_final = sum(finals) / len(finals) if finals else None
        mean_base = sum(bases) / len(bases) if bases else None
        parts = [mean_final] + ([mean_base] if metric == "delta" else [])
        var_items = None if None in parts else sum(binomial_var(p, n_items) for p in parts)
    var_seeds = _var(known) / k if len(known) > 1 else None
    n_items = n_items or 0
    if k < 2:
        return "seeds", n_items, estimate, None, None, NO_INTERVAL
    if var_seeds is None or var_items is None:
        return "seeds", n_items, estimate, None, None, _seeds_text(var_items, n_items) + (f"; {why}" if why else "")
    if var_seeds + var_items == 0:
        return ("seeds", n_items, estimate, None, None,
                f"the seeds agree exactly and no per-item results say how much items vary: no interval"
                + (f"; {why}" if why else ""))
    i = seeds_interval(known, items_var=var_items or None, n_items=n_items,
                       bounds=(-100.0, 100.0) if metric == "delta" else (0.0, 100.0))
    return "seeds", n_items, estimate, i.low, i.high, _seeds_text(var_items, n_items) + (f"; {why}" if why else "")


def _seeds_text(var_items: float | None, n_items: int) -> str:
    return (f"t-interval over seeds + binomial bound for {n_items} items" if var_items
            else "t-interval over seeds (no per-item results: item sampling not included)")  # fmt: skip


def _baseline_rows(analysed: list[tuple[Any, ...]], pairs: dict[str, list[tuple[Any, Any, Any]]],
                   test_noise: dict[tuple[Any, ...], tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The Baseline row of the System × task table per group and evaluator: the t-interval over the base model's
    items (their scores averaged over the runs, two pseudo-items), or where no run kept per-item results, the
    Agresti-Coull interval of its mean score; clipped to 0..100."""
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for r in analysed:
        groups[tuple(r[1:6])].append(r)
    out = []
    for key, runs in groups.items():
        items: dict[Any, list[float]] = defaultdict(list)
        for r in runs:
            for item_id, base, _ in pairs[r[0]]:
                items[item_id].append(base)
        noise = test_noise.get(key) if None not in key else None
        if items and None not in key:
            i = seeds_items_interval(np.array([[sum(v) / len(v) for v in items.values()]]), SCORE_PSEUDO,
                                     bounds=(0.0, 100.0), p_value=False)
            low, high, n_items = i.low, i.high, len(items)
            text = f"the base model on {n_items} items: t over items (+2 pseudo-items), in 0..100"
        else:
            se, n_items = (noise[13], noise[10]) if noise is not None else (None, None)
            centre = agresti_coull_score(noise[8], n_items) if se is not None and n_items is not None else None
            low, high = ((max(centre - Z975_PRINTED * se, 0.0), min(centre + Z975_PRINTED * se, 100.0))
                         if centre is not None else (0.0, 100.0) if se is not None else (None, None))  # fmt: skip
            text = "the base model: Agresti-Coull, in 0..100"
        out.append((*key, n_items, _num(low), _num(high), text))
    return out


def _var(values: list[float]) -> float:
    """Sample variance; exactly 0 for equal values (as SQL's var_samp, where numpy's mean can leave a rounding)."""
    return 0.0 if len(set(values)) == 1 else float(np.var(values, ddof=1))


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def _num(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
