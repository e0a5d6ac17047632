"""The `a2rl` command line: the top layer, the one part of `a2rl` that may import `flows`, `tasks`, `agents`,
`blocks`, `benchmarks` and `analysis` (tests/test_layers.py). `a2rl_bench.cli.catalog` lists agents and drivers,
`a2rl_bench.cli.display` draws a run's progress."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from a2rl_bench.run_options import DEFAULT_RESULTS


def _quiet_defaults() -> None:
    """Settings that make a local run work offline and start reliably on a small machine."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")  # Prefect's client-side telemetry, and its notice on a terminal
    # Prefect's 20 s is too short on a small machine; `a2rl run` scales this with the load (a2rl_bench.cli.starting).
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MPLBACKEND", "Agg")
    # Training and grading share the CPU: busy-waiting OpenMP threads would slow both several-fold.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; `argv` (when given) lets commands other than `run` skip importing every agent."""
    from a2rl_bench.cli.catalog import add_driver_parsers, agents_help
    from a2rl_bench.cli.errors import DefaultsHelpFormatter, OneLineParser
    from a2rl_bench.records import RunConfig
    from a2rl_bench.run_options import add_config_options

    d = RunConfig()
    parser = OneLineParser(
        prog="a2rl",
        description="a2rl: does an LLM agent's post-training (SFT, GRPO, ...) improve a base model? "
        "Runs Agent² RL-Bench-style benchmark runs as Prefect flows, results in DuckDB.",
    )
    sub = parser.add_subparsers(dest="command")  # none: the help

    run = sub.add_parser(
        "run",
        help=f"run one benchmark run (defaults: {d.task} {d.variant}, {d.agent} agent, SmolLM2-135M, {d.budget_s:.0f} s)",
        description="Run one benchmark run: provision a workspace, start the grading service, let the agent "
        "train and submit checkpoints under its budget, evaluate the final pick on the hidden test set, "
        "write a report and record everything in the DuckDB results file. Uses an ephemeral Prefect server "
        "unless PREFECT_API_URL is set.",
        formatter_class=DefaultsHelpFormatter,
    )
    # The agents' list imports every adapter (and the grading service): only where `run`'s help can show it.
    listed = agents_help() if argv is None or "run" in argv else ""
    add_config_options(run, help_extra={"agent": f": {listed}" if listed else ""})
    run.add_argument("--results", default=str(DEFAULT_RESULTS), help="DuckDB results file (created if missing)")
    run.add_argument("--runs-dir", default=None, help="where run directories go (default: <results dir>/runs)")
    run.add_argument("--log-level", default="off", choices=LOG_LEVELS,
                     help="Prefect's log lines on the terminal (they always go to the run's harness/run.log)")
    run.add_argument("--debug", action="store_true", default=debug_enabled(),
                     help="show tracebacks (also: A2RL_DEBUG=1)")

    # "tasks" are the benchmark tasks here (benchmarks/*/task.py), not the Prefect steps in tasks/
    tasks = sub.add_parser("tasks", help="list the benchmark tasks, or show one (its splits, sources, evaluator)")
    tasks.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    tasks.add_argument("task_id", nargs="?", help="a benchmark task id, for `show` (e.g. gsm8k)")

    results = sub.add_parser("results", help="show the latest runs in a results file")
    results.add_argument("--results", default=str(DEFAULT_RESULTS))
    results.add_argument("--limit", type=int, default=10)

    analyze = sub.add_parser(
        "analyze",
        help="figures, tables and an HTML report from a results file",
        description="Analyse the completed runs of a results file, grouped by setting (everything but the seed; "
        "failed, interrupted and infrastructure-failure runs left out and counted): mode×task heatmap, leaderboard "
        "with 95% intervals and the noise floor, scaling curves, pass@k, comparisons of settings one field "
        "apart (--compare), did the RL stage help, selection gap, the paper's tables and a per-run drill-down. Writes PNGs, CSVs, summary.json "
        "and report.html (self-contained) under --out.",
        formatter_class=DefaultsHelpFormatter,
    )
    analyze.add_argument("--results", default=str(DEFAULT_RESULTS), help="DuckDB results file")
    analyze.add_argument("--out", default="results/analysis", help="output directory")
    analyze.add_argument("--compare", nargs="+", metavar="FIELD", default=None,
                         help="compare settings that differ only in this setting field (mode, agent, driver, budget, "
                         "base_model, ...): FIELD for every pair of its values, FIELD A B for one pair (B − A, paired "
                         "by seed and hidden-test item), or AGENT_A AGENT_B (default: every field that varies)")
    analyze.add_argument("--synthetic", type=int, metavar="RUNS", default=None,
                         help="first write a synthetic store of about RUNS runs (failed, interrupted and infrastructure "
                         "failures included; offline stand-in data, labelled so) at --results, which must not exist")
    sub.add_parser("agents", help="list the agents and what each needs (driver API, CLI, key)")
    add_driver_parsers(sub)
    add_ops_parsers(sub)
    from a2rl_bench.cli.store_cmd import add_store_parsers

    add_store_parsers(sub)
    return parser


def command_lines(parser: argparse.ArgumentParser) -> list[list[str]]:
    """Every command line the parser knows, as `[command[, action]]` from the top (`[]`): what `--help` is
    measured and checked on (bench/bench_cli_help.py, tests/test_cli_startup.py)."""
    lines: list[list[str]] = [[]]

    def walk(node: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in node._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    lines.append([*prefix, name])
                    walk(child, [*prefix, name])

    walk(parser, [])
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    """Check everything that can be checked (exit 2, one line, no server started), then run the flow under a
    progress display. A failed run gives one line with its phase, report and log, and exit code 1."""
    from a2rl_bench.cli.display import set_prefect_console_level
    from a2rl_bench.cli.errors import validation_line
    from a2rl_bench.run_options import config_from_args, option_name
    from a2rl_bench.tasks.preflight import PreflightError, check_run

    set_prefect_console_level(args.log_level)  # the checks may load Prefect (saved drivers): its exit notices too
    try:
        config = config_from_args(args)
    except ValueError as e:
        raise PreflightError(validation_line(e, option_name)) from e
    results, runs_dir = Path(args.results), Path(args.runs_dir) if args.runs_dir else None
    check_run(config, results, runs_dir)
    return _run_flow(args, config, results, runs_dir)


def _run_flow(args: argparse.Namespace, config, results: Path, runs_dir: Path | None) -> int:
    import logging
    import shutil
    import tempfile

    from a2rl_bench.cli.display import RunDisplay, set_prefect_console_level
    from a2rl_bench.cli.errors import interrupted_how, stops_deferred
    from a2rl_bench.cli.starting import start_failure, start_prefect, starts_server
    from a2rl_bench.ops.progress import ANNOUNCE_ENV, read_announced

    announce = Path(tempfile.mkdtemp(prefix="a2rl-run-")) / "announce.json"
    os.environ[ANNOUNCE_ENV] = str(announce)
    start = time.perf_counter()
    try:
        with RunDisplay(announce) as display:  # from the start: every wait has its word
            display.waiting("loading Prefect and the pipeline")
            with stops_deferred():  # a stop here is raised after the imports, never lost inside one
                set_prefect_console_level(args.log_level)
                from a2rl_bench.flows.benchmark_run import benchmark_run

            set_prefect_console_level(args.log_level)
            logging.captureWarnings(True)  # library warnings go to the run's log, not between the display's lines
            from a2rl_bench.base_models.registry import convert_ahead

            convert_ahead(config.base_model)  # a first run's model conversion overlaps the server's start
            if starts_server():  # and so does the baseline's evaluation (the run's step takes its results)
                from a2rl_bench.tasks import baseline_ahead

                baseline_ahead.start(config, announce.parent)
            start_prefect(display.waiting)
            display.waiting("opening the run (its row, its directories)")
            from a2rl_bench.ops import stopping
            from a2rl_bench.run_options import RunOptions

            options = RunOptions(results=results.resolve(), runs_dir=runs_dir.resolve() if runs_dir else None)
            with stopping.armed():  # a stop after the row is final waits for the flow run's end; said below
                summary = benchmark_run(config, options)
    except KeyboardInterrupt as e:
        return _stopped(*interrupted_how(e), time.perf_counter() - start, read_announced(announce), args)
    except Exception as e:
        if _ended_cancelled(e):  # a stop inside the flow: the run recorded it interrupted, its flow run Cancelled
            from a2rl_bench.ops import stopping

            return _stopped(*stopping.signal_words(stopping.last_signal()), time.perf_counter() - start,
                            read_announced(announce), args)  # fmt: skip
        if args.debug:
            import traceback

            traceback.print_exc()
        run = read_announced(announce)
        if run is None:  # it broke before the run had a row (e.g. the Prefect server did not start)
            places = [results.parent, runs_dir or results.parent / "runs"]
            print(f"a2rl: {start_failure(e, places)}", file=sys.stderr)
            return 1
        from a2rl_bench.ops.progress import PROGRESS_FILE, read_snapshot

        snap = read_snapshot(run.harness_dir / PROGRESS_FILE)
        error = snap.progress.error if snap and snap.progress.error else f"{type(e).__name__}: {_one_line(e)}"
        print(f"a2rl: run {run.run_id} failed ({error}); recorded as 'failed' in {args.results}; report "
              f"{run.report}; log {run.log}", file=sys.stderr)  # fmt: skip
        return 1
    finally:
        os.environ.pop(ANNOUNCE_ENV, None)
        shutil.rmtree(announce.parent, ignore_errors=True)  # every `a2rl run` left its folder in /tmp
    print(render_summary(summary, args.results, time.perf_counter() - start))
    if summary.status != "completed":
        print(f"a2rl: run {summary.run_id} {summary.status}: {summary.error}", file=sys.stderr)
    elif (held := _held_stop()) is not None:
        print(f"a2rl: {held} came after the run was recorded 'completed': it completed, nothing was cut short",
              file=sys.stderr)  # fmt: skip
    return 0 if summary.status == "completed" else 1


def _held_stop() -> str | None:
    from a2rl_bench.ops import stopping

    held = stopping.held()
    return None if held is None else stopping.signal_words(held)[0]


def _stopped(how: str, code: int, seconds: float, run, args: argparse.Namespace) -> int:
    """One line for a run stopped by a signal (`how`), and its exit code by the shell's rule. What it says the
    run is recorded as is read from the run's row: a stop after the row was final does not make it interrupted."""
    if run is None:
        print(f"\na2rl: stopped by {how} after {seconds:.0f} s, before the run had a row: nothing was recorded",
              file=sys.stderr)  # fmt: skip
        return code
    status = _row_status(Path(args.results), run.run_id) or "interrupted"
    # the flow has written the run's row and its ledger; no traceback
    print(f"\na2rl: stopped by {how} after {seconds:.0f} s; the run is recorded as '{status}' in "
          f"{args.results} (see: a2rl results --results {args.results})", file=sys.stderr)  # fmt: skip
    return 0 if status == "completed" else code


def _row_status(results: Path, run_id: str) -> str | None:
    """The run's status as its row has it, or None where the store cannot be read."""
    try:
        from a2rl_bench.store.results import ResultsStore

        rows = ResultsStore(results).query("SELECT status FROM runs WHERE run_id = ?", [run_id])
    except Exception:  # noqa: BLE001 - the line still names the store to look in
        return None
    return str(rows["status"].iloc[0]) if len(rows) else None


def _ended_cancelled(e: Exception) -> bool:
    """The flow ended its run Cancelled (a stop on request, recorded as interrupted): Prefect raises that to the
    caller of a flow as CancelledRun."""
    from prefect.exceptions import CancelledRun

    return isinstance(e, CancelledRun)


def _one_line(e: object) -> str:
    return " ".join(str(e).split())


def _delta_interval(harness: Path) -> str:
    """' [95% lo, hi] over n items, p=…: verdict' from the run's process.json, or '' when it has none."""
    from a2rl_bench.summary.metrics import RunMetrics  # the CLI imports lazily: `a2rl --help` stays fast

    try:
        m = RunMetrics.model_validate(json.loads((harness / "process.json").read_text())["metrics"])
        low, high = m.ci("delta_test")
        return (f" [95% {low:+.2f}, {high:+.2f}; paired over {m.delta_test_n_items} items, "
                f"p={m.delta_test_p_value:.2g}: {m.verdict}]")
    except (OSError, ValueError, KeyError, TypeError):
        return " (no per-item results: no interval)"


def render_summary(s, results: str, wall_s: float) -> str:
    def f(x):
        return "n/a" if x is None else f"{x:.2f}"

    harness = Path(results).parent / "runs" / s.run_id / "harness"
    if s.n_submissions == 0:  # say why, in one line: "best validation n/a" alone explains nothing
        from a2rl_bench.ops.progress import why_no_submission

        best = f"   NO SUBMISSION: {why_no_submission(harness, s.config.budget_s)}"
    else:
        best = f"   best validation {f(s.best_val)} (submission {s.best_submission_id or '-'})"
    return "\n".join([
        "",
        f"== a2rl run {s.run_id}: {s.status}",
        f"   task {s.config.task} ({s.variant_label}), agent {s.config.agent}, protocol {s.protocol}",
        f"   baseline   validation {f(s.baseline_val)}   hidden test {f(s.baseline_test)}",
        best,
        f"   final hidden test {f(s.final_test)}   Δ test {f(s.delta_test)}{_delta_interval(harness)}",
        "   one seed: the same config and seed can give another Δ (data order and sampling), so read the interval",
        f"   mode {s.config.mode}{' (strict)' if s.config.strict_mode else ''}: "
        + (f"{s.mode_breaches} of {s.n_submissions} submissions BROKE THE MODE" if s.mode_breaches else "no breach"),
        f"   submissions {s.n_submissions} ({s.n_scored} scored); agent time {s.agent_seconds:.0f} / "
        f"{s.config.budget_s:.0f} s; grading {s.grading_seconds:.0f} s; wall {wall_s:.0f} s",
        f"   report  {harness / 'report.md'}",
        f"   results {results}  (try: a2rl results --results {results})",
    ])  # fmt: skip


def cmd_tasks(args: argparse.Namespace) -> int:
    from a2rl_bench.benchmarks import list_tasks

    if args.action == "show":
        from a2rl_bench.benchmarks.describe import describe_task

        if not args.task_id:
            print("usage: a2rl tasks show TASK_ID (a benchmark task id: `a2rl tasks` lists them)", file=sys.stderr)
            return 2
        print(describe_task(args.task_id))
        return 0
    for t in list_tasks():
        print(f"{t.id:14} {t.level}  {t.title}  [{', '.join(t.variant_labels)}]")
    from a2rl_bench.benchmarks import TASKS

    for name, problem in TASKS.clashes().items():
        print(f"{name:14} not usable: {problem}")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from a2rl_bench.store.results import ResultsStore

    if not Path(args.results).exists():  # nothing run yet is not an error
        print(f"no results yet: {args.results} does not exist; `make run` (or `a2rl run`) makes the first run")
        return 0
    _check_store(Path(args.results))
    store = ResultsStore(Path(args.results))
    df = store.query(
        "SELECT run_id, task, variant, agent, status, baseline_test, best_val, final_test, delta_test, n_submissions, "
        "started_at FROM runs ORDER BY started_at DESC LIMIT ?", [args.limit]
    )
    print(df.to_string(index=False))
    shown = list(df["run_id"])
    for warning in (_mixed_numerics_warning(store, shown), _gpu_sharing_warning(store, shown)):
        if warning:
            print(warning)
    return 0


def _mixed_numerics_warning(store, run_ids: list[str]) -> str | None:
    """A line when these runs were graded on more than one numeric path (`a2rl_bench.inference.numerics`)."""
    from a2rl_bench.inference.numerics import mixed_paths

    if not run_ids:
        return None
    marks = ", ".join("?" * len(run_ids))
    ids = store.query(f"SELECT DISTINCT evaluator_id FROM evaluations WHERE run_id IN ({marks})", run_ids)
    if not (paths := mixed_paths(ids["evaluator_id"].dropna())):
        return None
    return (f"warning: these runs were graded on different numeric paths ({', '.join(paths)}): their scores are "
            "not comparable (another path gives other answers); A2RL_CPU_EVAL_DTYPE picks the CPU path")


def _gpu_sharing_warning(store, run_ids: list[str]) -> str | None:
    """A line when these runs shared their GPUs with different numbers of other processes (the run metric
    `gpu_shared_procs_median`): on a card shared with seven other runs an RL update took 4-6x as long, so the same
    wall-clock budget bought less."""
    if not run_ids:
        return None
    marks = ", ".join("?" * len(run_ids))
    shares = store.query(f"SELECT run_id, value FROM metrics WHERE name = 'gpu_shared_procs_median' "
                         f"AND value IS NOT NULL AND run_id IN ({marks})", run_ids)  # fmt: skip
    values = sorted({int(v) for v in shares["value"]})
    if len(values) < 2:
        return None
    return (f"warning: these runs shared their GPUs differently (other processes on the card, median per run: "
            f"{values[0]} to {values[-1]}): a wall-clock budget on a shared card buys less; compare runs that "
            "shared alike (metric gpu_shared_procs_median)")


def _check_store(results: Path) -> None:
    """A results file that is no DuckDB store (a text file, a torn copy) is a mistake: one line, exit 2."""
    from a2rl_bench.tasks.preflight import check_results_file

    if results.is_file() and results.stat().st_size > 0:
        check_results_file(results)


def cmd_analyze(args: argparse.Namespace) -> int:
    from a2rl_bench.cli.display import Waiting

    with Waiting("loading the analysis (pandas, matplotlib, Prefect)"):
        from a2rl_bench.flows.analysis_flow import run_analysis

    if args.synthetic is not None:
        from a2rl_bench.analysis.synthetic import demo_spec, write_synthetic_store

        if Path(args.results).exists():
            print(f"--synthetic writes a new store, and {args.results} exists; name another --results", file=sys.stderr)
            return 2
        with Waiting(f"writing a synthetic store of about {args.synthetic} runs at {args.results}"):
            write_synthetic_store(args.results, demo_spec(args.synthetic))
    if not Path(args.results).exists():
        print(f"no results file at {args.results}; run `a2rl run` first", file=sys.stderr)
        return 1
    _check_store(Path(args.results))
    from a2rl_bench.setting import SETTING_KEY
    from a2rl_bench.analysis.compare import setting_field

    compare = tuple(args.compare) if args.compare else None
    if compare and (len(compare) > 3 or (len(compare) != 2 and setting_field(compare[0]) is None)):
        print(f"--compare takes FIELD, FIELD A B or AGENT_A AGENT_B (FIELD one of {', '.join(SETTING_KEY)}, or "
              f"budget); got {' '.join(compare)}", file=sys.stderr)
        return 2
    if compare and len(compare) != 2:
        compare = (setting_field(compare[0]), *compare[1:])
    with Waiting(f"analysing {args.results} into {args.out} (figures, tables, report.html)"):
        paths = run_analysis(Path(args.results), Path(args.out), compare=compare)
    report = next(p for p in paths if p.name == "report.html")
    print(f"{len(paths)} files under {args.out}; open {report}")
    from a2rl_bench.store.results import ResultsStore

    store = ResultsStore(Path(args.results))
    if warning := _gpu_sharing_warning(store, list(store.query("SELECT run_id FROM analysed_runs")["run_id"])):
        print(warning)
    return 0


# ---- operations: server, deploy, sweep, status ---------------------------------------------------------


def add_ops_parsers(sub) -> None:
    """`a2rl server`, `a2rl deploy`, `a2rl sweep`, `a2rl retry`, `a2rl status`."""
    from a2rl_bench.ops import prefect_local
    from a2rl_bench.run_options import add_config_options

    fmt = argparse.ArgumentDefaultsHelpFormatter
    server = sub.add_parser(
        "server", help="start/stop/inspect a local Prefect server and a process worker",
        description="A Prefect server on 127.0.0.1 (SQLite under PREFECT_HOME, analytics off) and a process worker "
        f"on the work pool {prefect_local.DEFAULT_POOL!r} (created if missing), as background processes with state files "
        "under PREFECT_HOME. Point other shells at it with PREFECT_API_URL (printed by `start`).",
        formatter_class=fmt,
    )  # fmt: skip
    server.add_argument("action", choices=["start", "stop", "status"])
    server.add_argument("--host", default=prefect_local.DEFAULT_HOST, help="interface to listen on (keep it local)")
    server.add_argument("--port", type=int, default=None,
                        help=f"port to listen on (start: default {prefect_local.DEFAULT_PORT}); stop and status: only "
                        "the server on this port")  # fmt: skip
    server.add_argument("--pool", default=prefect_local.DEFAULT_POOL, help="process work pool of the worker")
    server.add_argument("--database", default=None,
                        help="the server's database, e.g. postgresql+asyncpg://prefect:PASSWORD@db-host:5432/prefect "
                             "(several hosts' workers need PostgreSQL; default: SQLite under PREFECT_HOME, or "
                             f"{prefect_local.DATABASE_ENV})")
    server.add_argument("--no-worker", action="store_true", help="start the server only")
    server.add_argument("--worker-limit", type=int, default=None,
                        help="most benchmark runs at once on the pool (a limit on its `default` queue; sweeps, on "
                             "the `sweeps` queue, are not counted, so a sweep never holds the place its runs need)")

    deploy = sub.add_parser(
        "deploy", help="register the deployments of prefect.yaml on the server",
        description="`prefect --no-prompt deploy --all` from the repository root (or only --name ones), after "
        "creating the work pool. Needs a server: `a2rl server start`, or PREFECT_API_URL.",
        formatter_class=fmt,
    )  # fmt: skip
    deploy.add_argument("--name", action="append", default=None, help="deploy only this one (repeatable)")
    deploy.add_argument("--pool", default=prefect_local.DEFAULT_POOL)
    deploy.add_argument("--auto-retry", type=int, default=None, metavar="N",
                        help="also retry crashed benchmark runs automatically, up to N times per run (a Prefect "
                             "automation; 0 removes it; default: leave it as it is, i.e. off unless set)")

    sweep = sub.add_parser(
        "sweep", help="run a matrix of benchmark runs (tasks × agents × drivers × modes × seeds)",
        description="Expand the matrix, skip configurations already completed in the results store (unless "
        "--force), and run the rest: here, one after another (default), or with --deployment as separate flow "
        "runs of the `benchmark-run` deployment on the server's workers, GPU sessions limited by --gpu-slots.",
        formatter_class=fmt,
    )  # fmt: skip
    add_config_options(sweep, matrix=True)
    sweep.add_argument("--results", default=str(DEFAULT_RESULTS))
    sweep.add_argument("--runs-dir", default=None)
    sweep.add_argument("--force", action="store_true", help="also run configurations already completed")
    sweep.add_argument("--deployment", action="store_true",
                       help="fan out through the server (each run its own flow run, retryable in the UI)")
    sweep.add_argument("--gpu-slots", type=int, default=1, help="agent sessions at once (with --deployment)")
    sweep.add_argument("--no-wait", action="store_true", help="with --deployment: start the runs and return")
    sweep.add_argument("--dry-run", action="store_true", help="show what would run and what is skipped")

    retry = sub.add_parser(
        "retry", help="retry a crashed/failed/cancelled flow run, or one whose process is gone, and check it took",
        formatter_class=fmt,
    )  # fmt: skip
    retry.add_argument("flow_run_id", help="the flow run's id (UI, or `a2rl status`)")
    retry.add_argument("--settle", type=float, default=0.0,
                       help="seconds the crashed state must be unchanged first (only against a server and worker "
                            "a2rl did not start: theirs may still report the crash late)")

    status = sub.add_parser("status", help="server, recent flow runs and the latest runs in the results store")
    status.add_argument("--results", default=str(DEFAULT_RESULTS))
    status.add_argument("--limit", type=int, default=8,
                        help="the newest N flow runs and store rows (every run of the last sweep is listed too)")


def cmd_server(args: argparse.Namespace) -> int:
    from a2rl_bench.ops import prefect_local

    if args.action == "stop":
        return _stop_server(args.port)
    if args.action == "status":
        return _print_server_status(port=args.port)
    port = args.port or prefect_local.DEFAULT_PORT
    if warning := prefect_local.exposure_warning(args.host, port):
        print(f"a2rl: warning: {warning}", file=sys.stderr)
    sqlite = not (args.database or os.environ.get(prefect_local.DATABASE_ENV))
    if sqlite and (users := prefect_local.database_users(prefect_local.prefect_home())):
        # a second server on one SQLite file meets 'database is locked' while the other writes: refused, not warned
        raise prefect_local.OpsError(f"server not started: {users}")
    print(f"starting a Prefect server on {args.host}:{port} (PREFECT_HOME={prefect_local.prefect_home()}) ...",
          flush=True)  # fmt: skip
    server = prefect_local.start_server(args.host, port, database=args.database)
    print(f"server up: {server.url} (pid {server.pid}, log {server.log}; database: "
          f"{prefect_local.database_label(args.database or os.environ.get(prefect_local.DATABASE_ENV))})")
    from a2rl_bench.ops import gpu_slots

    if freed := gpu_slots.reconcile(server.url, prefect_local.prefect_home()):
        print(f"freed {freed} GPU slot(s) that no live lease held (left by a server stopped during a run)")
    if not args.no_worker:
        worker = prefect_local.start_worker(server.url, pool=args.pool, run_limit=args.worker_limit)
        print(f"worker polling pool {args.pool!r} (pid {worker.pid}, log {worker.log})")
    ui = prefect_local.ui_env(args.host, port)["PREFECT_UI_API_URL"].removesuffix("/api")
    print(f"UI: {ui}\nin other shells: export PREFECT_API_URL={server.url}")
    return 0


def _stop_server(port: int | None) -> int:
    """Stop the server (and worker) this PREFECT_HOME started; with `port`, only if that is the one on `port`.
    Says which it stopped, and names a server that answers on `port` from elsewhere instead of "not running"."""
    from a2rl_bench.ops import prefect_local

    home = prefect_local.prefect_home()
    ours = prefect_local.read_state(prefect_local.SERVER_STATE, home)
    ours = ours if ours is not None and ours.alive() else None
    if port is not None and (ours is None or prefect_local.url_port(ours.url) != port):
        elsewhere = prefect_local.answering_on(port)
        mine = f"; the one started from it is on {ours.url}, left running" if ours else ""
        print(f"no server on port {port} was started from PREFECT_HOME={home}{mine}"
              + (f"; {elsewhere} answers there: stop it from the PREFECT_HOME that started it" if elsewhere else ""))
        return 1 if elsewhere else 0
    print(f"stopping: the worker's flow runs first (each records 'interrupted' with its report; up to "
          f"{prefect_local.FLOW_RUN_GRACE_S:.0f} s), then the worker and the server ...", flush=True)
    worker, server = prefect_local.stop_worker(), prefect_local.stop_server()
    said = {True: "stopped", False: "was not running"}
    which = f" ({ours.url}, pid {ours.pid})" if ours is not None and server else ""
    print(f"worker {said[worker]}; server{which} {said[server]}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from a2rl_bench.ops import prefect_local

    url = _require_api_url()
    from a2rl_bench.cli.display import Waiting

    what = ", ".join(args.name) if args.name else "all deployments of prefect.yaml"
    with Waiting(f"deploying {what} to {url} (`prefect deploy` imports each flow)"):
        out = prefect_local.deploy(url, names=args.name, pool=args.pool)
    created = deployed(out)
    print("\n".join(f"deployed {name}: id {uid}" for name, uid in created) or out)
    if args.auto_retry is not None:
        from a2rl_bench.ops.auto_retry import set_auto_retry

        print(set_auto_retry(url, prefect_local.RUN_DEPLOYMENT, args.auto_retry))
    return 0


def deployed(out: str) -> list[tuple[str, str]]:
    """(flow/deployment, full id) of each deployment `prefect deploy` reports created. It says so in a box that
    wraps at the terminal's width, cutting the id onto the next line: the box is read as one text."""
    import re

    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())
    return re.findall(r"Deployment '([^']+)' successfully created with id '([0-9a-fA-F-]{36})'", text)


def cmd_sweep(args: argparse.Namespace) -> int:
    from a2rl_bench.ops import prefect_local

    url = _require_api_url() if args.deployment else prefect_local.resolve_api_url()
    if args.deployment and not prefect_local.deployment_exists(url, prefect_local.RUN_DEPLOYMENT):
        print(f"a2rl: deploy first: a2rl deploy (no deployment {prefect_local.RUN_DEPLOYMENT!r} on {url})", file=sys.stderr)
        return 2
    if url:
        os.environ["PREFECT_API_URL"] = url
    from a2rl_bench.records import RunConfig
    from a2rl_bench.run_options import MATRIX_FIELDS, RunOptions, common_from_args
    from a2rl_bench.flows.sweep import SweepConfig, SweepMatrix, completed_hashes, plan_sweep, sweep

    from a2rl_bench.tasks.preflight import check_sweep

    config = SweepConfig(
        run=RunConfig(**common_from_args(args)),  # the matrix's axes vary the rest
        matrix=SweepMatrix(**{name + "s": getattr(args, name) for name in MATRIX_FIELDS}),
        # Absolute paths: with --deployment the runs start in the deployment's directory, not this one.
        options=RunOptions(results=Path(args.results).resolve(),
                           runs_dir=Path(args.runs_dir).resolve() if args.runs_dir else None),
        local=not args.deployment, force=args.force, gpu_slots=args.gpu_slots, wait=not args.no_wait,
    )  # fmt: skip
    configs = config.configs()
    check_sweep(configs, Path(args.results), Path(args.runs_dir) if args.runs_dir else None)  # before any run starts
    if args.dry_run:
        items = plan_sweep(configs, completed_hashes(Path(args.results)), args.force, config.options)
        for item in items:
            print(f"{'skip' if item.status == 'skipped' else 'run ':4}  {item.config.config_hash()}  {item.label}")
        n_skipped = sum(i.status == "skipped" for i in items)
        print(f"{len(items) - n_skipped} to run, {n_skipped} skipped")
        return 0
    where = f"through {url}" if args.deployment else f"here, one run after another ({url or 'ephemeral Prefect'})"
    print(f"sweep {where}; progress below (one line per run and state change)", flush=True)
    state = sweep(config, return_state=True)
    if not state.is_completed():
        print(f"a2rl: sweep {state.name.lower()}: {state.message}", file=sys.stderr)
        return 1
    _print_sweep(state.result())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Server and worker, the flow runs an operator started, sweeps' runs included (flow / name, true state,
    elapsed, next step), GPU slots and their holders, the next scheduled runs, and the latest store rows with the
    state their flow run is really in."""
    rc = _print_server_status(none_is_error=False)  # no lasting server is normal: each run starts its own
    from a2rl_bench.ops import gpu_slots, prefect_local, status

    flow_runs: dict[str, status.FlowRunRow] = {}
    results = Path(args.results)
    if results.exists():
        _check_store(results)
    rows = latest_store_rows(results, args.limit) if results.exists() else []
    if (url := prefect_local.resolve_api_url()) and rc == 0:
        def read() -> tuple:
            return (status.operator_flow_runs(url, args.limit), status.scheduled_flow_runs(url, 3),
                    gpu_slots.describe(url, prefect_local.prefect_home(), status.flow_run_label(url)),
                    status.flow_runs_by_suffix(url, [status.run_id_suffix(r["run_id"]) for r in rows]))  # fmt: skip

        try:
            runs, upcoming, slots, flow_runs = with_read_retries(read)
        except httpx_errors() as e:  # the server may be starting or going; the store below is still worth showing
            print(f"cannot list flow runs: {type(e).__name__}: {_one_line(e)}")
        else:
            _print_table(f"flow runs on {url} (newest first; a run's own subflows not listed)",
                         ["flow / flow run", "state", "start (UTC)", "elapsed", "next step", "id"],
                         [r.cells(status.next_step(r)) for r in runs])  # fmt: skip
            print("\n".join(slots))
            for r in upcoming:
                print(f"scheduled: {r.flow} / {r.name} at {r.start} UTC ({r.state})")
    if not results.exists():
        print(f"no results yet: {results.resolve()} does not exist; `make run` (or `a2rl run`) makes the first run")
        return rc
    from a2rl_bench.ops.progress import running_label

    for row in rows:  # `running`: still on it, waiting for a slot, crashed, or died without a trace?
        fr = flow_runs.get(status.run_id_suffix(row["run_id"]))
        row["status"] = status.true_status(row["status"], fr, running_label(row.pop("harness_dir")))
    columns = list(rows[0]) if rows else ["run_id", "status"]
    _print_table(f"latest runs in {results.resolve()}", columns,
                 [["-" if v is None or v != v else str(v) for v in row.values()] for row in rows])
    return rc


def latest_store_rows(results: Path, limit: int) -> list[dict]:
    """The `limit` runs of the store started last, as `a2rl status` lists them (with each run's harness folder)."""
    from a2rl_bench.store.results import ResultsStore

    df = ResultsStore(results).query(
        "SELECT run_id, status, task, agent, mode, (SELECT count(*) FROM mode_violations v "
        "WHERE v.run_id = runs.run_id) AS mode_breaches, seed, round(delta_test, 2) AS delta_test, "
        "strftime(started_at, '%Y-%m-%d %H:%M') AS started, harness_dir FROM runs ORDER BY started_at DESC LIMIT ?",
        [limit],
    )
    return df.to_dict("records")


STATUS_READ_WAITS_S = (2.0, 5.0)
"""`a2rl status`: a read the server answered too late (a sweep keeps it busy) is asked again after each wait."""


def with_read_retries(read, waits_s: tuple[float, ...] = STATUS_READ_WAITS_S):
    """`read()`, asked again after each of `waits_s` while it times out (a busy server, not a gone one: a refused
    connection is answered at once); a note on stderr says so."""
    import httpx

    for wait_s in waits_s:
        try:
            return read()
        except httpx.TimeoutException as e:
            print(f"the server answered too late ({type(e).__name__}); asking again in {wait_s:g} s", file=sys.stderr)
            time.sleep(wait_s)
    return read()


def httpx_errors() -> tuple[type[Exception], ...]:
    import httpx

    return (httpx.HTTPError, ValueError, KeyError)


def cmd_retry(args: argparse.Namespace) -> int:
    from a2rl_bench.ops import prefect_local

    url = _require_api_url()
    run = prefect_local._read_flow_run(url, args.flow_run_id)
    if not run.get("deployment_id"):  # `a2rl run`'s own flow run: no worker will ever pick up a retry
        raise prefect_local.OpsError(_no_worker_retry(run))
    print(f"retrying flow run {args.flow_run_id} ...", flush=True)
    state = prefect_local.retry_flow_run(url, args.flow_run_id, settle_s=args.settle)
    print(f"flow run {args.flow_run_id}: {state}; a worker on its pool picks it up (`a2rl status`)")
    return 0


def _no_worker_retry(run: dict) -> str:
    """What to do instead of retrying a flow run no worker can pick up: the `a2rl run` line that starts it again."""
    from a2rl_bench.records import RunConfig
    from a2rl_bench.run_options import option_name

    params = run.get("parameters") or {}
    defaults = RunConfig().model_dump(mode="json")
    flags = [f"{option_name(k)} {v}" for k, v in (params.get("config") or {}).items()
             if k in defaults and v != defaults[k] and not isinstance(v, (dict, list, bool))]  # fmt: skip
    results = (params.get("options") or {}).get("results")
    command = " ".join(["a2rl run", *flags, *([f"--results {results}"] if results else [])])
    return (f"flow run {run.get('name', '?')} was started by `a2rl run` (no deployment): no worker can pick up a "
            f"retry; start it again here: {command}  (or run it as a deployment: `a2rl deploy`, `a2rl sweep`)")


def _print_server_status(none_is_error: bool = True, port: int | None = None) -> int:
    from a2rl_bench.ops import prefect_local

    url = prefect_local.resolve_api_url()
    if port is not None and (url is None or prefect_local.url_port(url) != port):
        # the port asked about, not this PREFECT_HOME's server (another home's may answer there)
        url = f"http://127.0.0.1:{port}/api"
    for name, state in (("server", prefect_local.SERVER_STATE), ("worker", prefect_local.WORKER_STATE)):
        proc = prefect_local.read_state(state)
        if proc:
            print(f"{name}: pid {proc.pid} {'running' if proc.alive() else 'NOT running'} (log {proc.log})")
    if not url:
        print("server: none (start one with `a2rl server start`, or set PREFECT_API_URL)")
        return 1 if none_is_error else 0
    if not prefect_local.server_healthy(url):
        print(f"server {url}: DOWN")
        return 1
    if problem := prefect_local.database_problem(url):
        print(f"server {url}: the server is up but its database is not answering ({problem})")
        return 1
    print(f"server {url}: up, its database answers")
    return 0


def _print_sweep(items) -> None:
    _print_table("sweep", ["run", "config_hash", "status", "state", "detail"],
                 [[i.label, i.config.config_hash(), i.status, i.state or "-", i.detail or ""] for i in items])


def _print_table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from a2rl_bench.safetext import terminal

    print(title)  # not a table title: rich would pad it to the console's width
    table = Table()
    for c in columns:
        table.add_column(c)
    for row in rows:  # cells are text, never markup or terminal control (one rule: `a2rl_bench.safetext`)
        table.add_row(*[Text(terminal(v, 400)) for v in row])
    Console(width=None if sys.stdout.isatty() else 1000).print(table)  # a log file gets whole lines, unwrapped


def _require_api_url() -> str:
    from a2rl_bench.ops import prefect_local

    url = prefect_local.resolve_api_url()
    if not url:
        raise SystemExit("a2rl: no Prefect server; start one with `a2rl server start` or set PREFECT_API_URL")
    if not prefect_local.server_healthy(url):
        raise SystemExit(f"a2rl: the Prefect server at {url} does not answer (`a2rl server status`)")
    return url


OPS_HANDLERS = {"server": cmd_server, "deploy": cmd_deploy, "sweep": cmd_sweep, "status": cmd_status,
                "retry": cmd_retry}


LOG_LEVELS = ["off", "error", "warning", "info", "debug"]


def debug_enabled() -> bool:
    return os.environ.get("A2RL_DEBUG", "").lower() in ("1", "true", "yes", "on")


def main(argv: list[str] | None = None) -> int:
    """Every mistake a user can make answers with one line on stderr: exit 2 for a setting that cannot work,
    1 for a failure; the traceback only with --debug or A2RL_DEBUG=1. SIGTERM is answered like Ctrl-C."""
    import signal
    import threading

    from pydantic import ValidationError

    from a2rl_bench.cli.catalog import cmd_agents, cmd_drivers
    from a2rl_bench.cli.errors import interrupted_how, terminate_like_ctrl_c, validation_line
    from a2rl_bench.ops.prefect_local import OpsError
    from a2rl_bench.tasks.preflight import PreflightError

    _quiet_defaults()
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from a2rl_bench.cli.store_cmd import cmd_store

    handlers = {"run": cmd_run, "tasks": cmd_tasks, "results": cmd_results, "analyze": cmd_analyze,
                "agents": cmd_agents, "drivers": cmd_drivers, "store": cmd_store, **OPS_HANDLERS}
    debug = getattr(args, "debug", False) or debug_enabled()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    previous_int = signal.getsignal(signal.SIGINT) if main_thread else None
    if main_thread:
        terminate_like_ctrl_c()
    try:
        return handlers[args.command](args)
    except (KeyError, PreflightError) as e:
        _traceback_if(debug)
        print(f"a2rl: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except ValidationError as e:  # a value the settings refuse (a sweep's, a driver's): named by its option
        from a2rl_bench.run_options import option_name

        _traceback_if(debug)
        print(f"a2rl: {validation_line(e, option_name)}", file=sys.stderr)
        return 2
    except OpsError as e:  # server, worker, deployment or retry: the message says what to do
        _traceback_if(debug)
        print(f"a2rl: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # outside a run's flow (a run answers its own): before it, or another command
        how, code = interrupted_how(e)
        print(f"\na2rl: stopped by {how}", file=sys.stderr)
        return code
    except Exception as e:
        _traceback_if(debug)
        hint = "" if debug else " (A2RL_DEBUG=1 shows the traceback)"
        print(f"a2rl: {type(e).__name__}: {_one_line(e)}{hint}", file=sys.stderr)
        return 1
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if main_thread and previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def _traceback_if(debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()

