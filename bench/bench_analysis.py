"""Results store at scale: bulk ingest, view queries, analysis tables and figures on a synthetic store.

Usage (from the repository root):  python bench/bench_analysis.py --runs 100000 --subs-per-run 10
Default size: 100k runs (6 tasks × 8 agents × 3 modes × seeds) and 1M submissions, 400k LLM calls.
Writes `<out>/bench_analysis.json` and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from a2rl_bench.store.results import ResultsStore
from a2rl_bench.analysis.figures import (
    heatmap_figure,
    leaderboard_figure,
    pass_at_k_figure,
    save_png,
    scaling_figure,
    selection_gap_figure,
)
from a2rl_bench.analysis.html import Section, write_html_report
from a2rl_bench.analysis.synthetic import SyntheticSpec, synthetic_frames
from a2rl_bench.analysis.tables import load_tables

QUERIES = {
    "leaderboard_ci": "SELECT * FROM leaderboard_ci",
    "mode_task_matrix": "SELECT * FROM mode_task_matrix",
    "noise_floor": "SELECT * FROM noise_floor",
    "selection_gap (one row per run)": "SELECT * FROM selection_gap",
    "scaling_curve, all rows (window + ASOF join)": "SELECT count(*) AS n, avg(improvement_so_far) FROM scaling_curve",
    "one run's submissions": "SELECT * FROM submissions WHERE run_id = 'run-4242' ORDER BY submission_id",
    "route_distribution": "SELECT * FROM route_distribution",
}


def timed(fn, repeat: int = 1):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--subs-per-run", type=int, default=10)
    parser.add_argument("--out", default=None, help="directory for the store and outputs (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="a2rl-bench-analysis-"))
    out.mkdir(parents=True, exist_ok=True)
    db = out / "results.duckdb"
    db.unlink(missing_ok=True)
    spec = SyntheticSpec(tasks=("gsm8k", "humaneval", "alpacaeval", "alfworld", "webshop", "deepsearchqa"),
                         agents=tuple(f"agent-{i}" for i in range(8)), n_runs=args.runs,
                         subs_per_run=args.subs_per_run)  # fmt: skip
    report: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                "load_avg_1m": round(os.getloadavg()[0], 2)}}  # fmt: skip

    data, report["generate_frames_s"] = timed(lambda: synthetic_frames(spec))
    rows = {t: len(f) for t, f in data.frames.items()}
    report["rows"] = rows
    store = ResultsStore(db)
    ingest = {}
    for table, frame in data.frames.items():
        _, seconds = timed(lambda: store.bulk_write(table, frame))
        ingest[table] = {"seconds": seconds, "rows_per_s": round(len(frame) / seconds)}
    report["ingest"] = ingest
    report["ingest_total_s"] = round(sum(v["seconds"] for v in ingest.values()), 3)
    _, report["reingest_submissions_s (every key already stored)"] = timed(
        lambda: store.bulk_write("submissions", data.frames["submissions"]))
    assert store.query("SELECT count(*) AS n FROM submissions")["n"][0] == rows["submissions"]
    report["store_mb"] = round(db.stat().st_size / 1e6, 1)

    report["queries_s (median of 3)"] = {
        name: timed(lambda: store.query(sql), repeat=3)[1] for name, sql in QUERIES.items()
    }
    tables, report["load_tables_s"] = timed(lambda: load_tables(store))
    figures = {}
    paths = {}
    drawings = [
        ("heatmap", heatmap_figure, tables.matrix), ("leaderboard", leaderboard_figure, tables.leaderboard),
        ("scaling", scaling_figure, tables.scaling), ("pass_at_k", pass_at_k_figure, tables.pass_at_k),
        ("selection_gap", selection_gap_figure, tables.selection_runs),
    ]  # fmt: skip
    for name, fn, frame in drawings:
        f, figures[name] = timed(lambda: save_png(fn(frame), out / "figures" / f"{name}.png"))
        paths[name] = f.path
    report["figures_s"] = figures
    report["figures_total_s"] = round(sum(figures.values()), 3)
    _, report["html_s"] = timed(lambda: write_html_report(
        out / "report.html", "a2rl analysis (benchmark)", [Section("Figures", figures=list(paths.items())),
                                                          Section("Leaderboard", tables=[("lb", tables.leaderboard)])],
        tables.notes, str(db)))  # fmt: skip
    report["out"] = str(out)
    (out / "bench_analysis.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
