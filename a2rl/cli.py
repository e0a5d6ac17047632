"""The `a2rl` command line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_RESULTS = "results/a2rl.duckdb"


def _quiet_defaults() -> None:
    """Settings that make a local run work offline and start reliably on a small machine."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MPLBACKEND", "Agg")
    # Training and grading share the CPU: busy-waiting OpenMP threads would slow both several-fold.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_parser() -> argparse.ArgumentParser:
    from a2rl.records import RunConfig

    d = RunConfig()
    parser = argparse.ArgumentParser(
        prog="a2rl",
        description="a2rl: does an LLM agent's post-training (SFT, GRPO, ...) improve a base model? "
        "Runs Agent² RL-Bench-style benchmark runs as Prefect flows, results in DuckDB.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help=f"run one benchmark run (defaults: {d.task} {d.variant}, {d.agent} agent, SmolLM2-135M, {d.budget_s:.0f} s)",
        description="Run one benchmark run: provision a workspace, start the grading service, let the agent "
        "train and submit checkpoints under its budget, evaluate the final pick on the hidden test set, "
        "write a report and record everything in the DuckDB results file. Uses an ephemeral Prefect server "
        "unless PREFECT_API_URL is set.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run.add_argument("--task", default=d.task, help="benchmark task id (see `a2rl tasks`)")
    run.add_argument("--agent", default=d.agent, help="agent under test")
    run.add_argument("--budget", type=float, default=d.budget_s, help="agent wall-clock budget in seconds (grading excluded)")
    run.add_argument("--seed", type=int, default=d.seed, help="seed given to the agent")
    run.add_argument("--results", default=DEFAULT_RESULTS, help="DuckDB results file (created if missing)")
    run.add_argument("--runs-dir", default=None, help="where run directories go (default: <results dir>/runs)")
    run.add_argument("--variant", default="offline", choices=["offline", "full"],
                     help="task data: offline (ships in pinned packages) or full (the paper's data; needs internet)")
    run.add_argument("--base-model", default=d.base_model,
                     help="base model: a registry key, a local HF checkpoint dir, or an HF id (needs internet)")
    run.add_argument("--protocol", default="heldout", choices=["heldout", "paper"],
                     help="heldout: validation feedback, one hidden-test evaluation; paper: test feedback")
    run.add_argument("--mode", default="free", choices=["free", "sft-only", "rl-only"], help="training mode")
    run.add_argument("--val-limit", type=int, default=d.val_limit, help="evaluate the first N validation items (0 = all)")
    run.add_argument("--test-limit", type=int, default=d.test_limit, help="evaluate the first N hidden-test items (0 = all)")
    run.add_argument("--max-submissions", type=int, default=d.max_submissions, help="submission cap")

    tasks = sub.add_parser("tasks", help="list the benchmark tasks")
    tasks.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    tasks.add_argument("task_id", nargs="?")

    results = sub.add_parser("results", help="show the latest runs in a results file")
    results.add_argument("--results", default=DEFAULT_RESULTS)
    results.add_argument("--limit", type=int, default=10)

    analyze = sub.add_parser(
        "analyze",
        help="figures, tables and an HTML report from a results file",
        description="Analyse every completed run in a results file: mode×task heatmap, leaderboard with bootstrap "
        "CIs, scaling curves, pass@k, noise floor, paired comparison, selection gap. Writes PNGs, CSVs, "
        "summary.json and report.html (self-contained) under --out.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    analyze.add_argument("--results", default=DEFAULT_RESULTS, help="DuckDB results file")
    analyze.add_argument("--out", default="results/analysis", help="output directory")
    analyze.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples per confidence interval")
    analyze.add_argument("--compare", nargs=2, metavar=("AGENT_A", "AGENT_B"), default=None,
                         help="agents of the paired comparison (default: the two with the most runs)")
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from agents import get_agent
    from benchmarks import get_task

    get_task(args.task), get_agent(args.agent)  # unknown ids fail here, before anything starts
    from flows.benchmark_run import benchmark_run

    start = time.perf_counter()
    summary = benchmark_run(
        task=args.task, agent=args.agent, budget_s=args.budget, seed=args.seed, results=Path(args.results),
        runs_dir=Path(args.runs_dir) if args.runs_dir else None, variant=args.variant, base_model=args.base_model,
        protocol=args.protocol, mode=args.mode, val_limit=args.val_limit or None, test_limit=args.test_limit or None,
        max_submissions=args.max_submissions,
    )  # fmt: skip
    print(render_summary(summary, args.results, time.perf_counter() - start))
    return 0 if summary.status == "completed" else 1


def render_summary(s, results: str, wall_s: float) -> str:
    def f(x):
        return "n/a" if x is None else f"{x:.2f}"

    harness = Path(results).parent / "runs" / s.run_id / "harness"
    return "\n".join([
        "",
        f"== a2rl run {s.run_id}: {s.status}",
        f"   task {s.config.task} ({s.variant_label}), agent {s.config.agent}, protocol {s.protocol}",
        f"   baseline   validation {f(s.baseline_val)}   hidden test {f(s.baseline_test)}",
        f"   best validation {f(s.best_val)} (submission {s.best_submission_id or '-'})",
        f"   final hidden test {f(s.final_test)}   Δ test {f(s.delta_test)}",
        f"   submissions {s.n_submissions} ({s.n_scored} scored); agent time {s.agent_seconds:.0f} / "
        f"{s.config.budget_s:.0f} s; grading {s.grading_seconds:.0f} s; wall {wall_s:.0f} s",
        f"   report  {harness / 'report.md'}",
        f"   results {results}  (try: a2rl results --results {results})",
    ])  # fmt: skip


def cmd_tasks(args: argparse.Namespace) -> int:
    from benchmarks import get_task, list_tasks

    if args.action == "show":
        if not args.task_id:
            print("usage: a2rl tasks show TASK_ID", file=sys.stderr)
            return 2
        t = get_task(args.task_id)
        print(f"{t.id} ({t.level}): {t.title}\nmetric: {t.metric}\nevaluator: {t.evaluator_id()}")
        for variant, label in t.variant_labels.items():
            print(f"variant {variant}: {label}")
        return 0
    for t in list_tasks():
        print(f"{t.id:14} {t.level}  {t.title}  [{', '.join(t.variant_labels)}]")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from a2rl.store import ResultsStore

    if not Path(args.results).exists():
        print(f"no results file at {args.results}; run `a2rl run` first", file=sys.stderr)
        return 1
    df = ResultsStore(Path(args.results)).query(
        "SELECT run_id, task, agent, status, baseline_test, best_val, final_test, delta_test, n_submissions, "
        "started_at FROM runs ORDER BY started_at DESC LIMIT ?", [args.limit]
    )
    print(df.to_string(index=False))
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from flows.analysis import run_analysis

    if not Path(args.results).exists():
        print(f"no results file at {args.results}; run `a2rl run` first", file=sys.stderr)
        return 1
    paths = run_analysis(Path(args.results), Path(args.out), n_boot=args.n_boot,
                         compare=tuple(args.compare) if args.compare else None)
    report = next(p for p in paths if p.name == "report.html")
    print(f"{len(paths)} files under {args.out}; open {report}")
    return 0


def main(argv: list[str] | None = None) -> int:
    _quiet_defaults()
    args = build_parser().parse_args(argv)
    handlers = {"run": cmd_run, "tasks": cmd_tasks, "results": cmd_results, "analyze": cmd_analyze}
    try:
        return handlers[args.command](args)
    except KeyError as e:
        print(f"a2rl: {e.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
