"""The summary steps of a run, as plain functions: the report, the leak audit, the process summary and the final
results row, and the record of a run that failed. Plain, not Prefect tasks: they must also work while a run is
going down and Prefect's API is gone. Also the checks the flow makes before and after the agent's session."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from a2rl_bench.grading.ledger import Ledger, LedgerCorrupted, head_mac
from a2rl_bench.summary.leak_audit import LeakReport, audit_run, hidden_texts, leak_metrics
from a2rl_bench.ngrams import StreamMatcher
from a2rl_bench.ops import stopping
from a2rl_bench.records import LedgerEntry, RunConfig, RunStatus, RunSummary
from a2rl_bench.capture.attempts import read_attempts
from a2rl_bench.capture.calls import read_llm_calls
from a2rl_bench.capture.snapshots import CodeSnapshots
from a2rl_bench.run import RunContext, make_run_id
from a2rl_bench.store.ingest import store_process_report
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.summary.process_facts import render_process_markdown, summarize_process
from a2rl_bench.summary.record import LedgerCheck, build_record, build_summary, read_run_record, withheld
from a2rl_bench.summary.report import last_event, run_notes, write_report
from a2rl_bench.summary.stages import render_markdown as render_stages
from a2rl_bench.summary.stages import run_stage_share, submission_tests
from a2rl_bench.workspace import RunPaths
from a2rl_bench.agents import SessionOutcome, agent_class
from a2rl_bench.analysis.run_figure import score_trajectory_png
from a2rl_bench.benchmarks import get_task
from a2rl_bench.tasks.run_steps import ledger_of


def hidden_items(ctx: RunContext) -> list[dict]:
    """The task's hidden validation and test items: what the agent must never have held."""
    bench, variant = get_task(ctx.config.task), ctx.config.variant
    return [item for split in ("validation", "test") for item in bench.load_split(variant, split)]


def leak_audit(ctx: RunContext) -> LeakReport:
    """No hidden validation or test item may appear in what the agent wrote or said (long n-gram overlap)."""
    return audit_run(ctx.paths, hidden_items(ctx))


def output_matcher(ctx: RunContext) -> StreamMatcher:
    """The search the agent's output passes through while it is written (the leak audit's matching)."""
    return StreamMatcher(hidden_texts(hidden_items(ctx)))


def write_summary(
    ctx: RunContext, status: RunStatus, phase_seconds: dict[str, float], error: str | None = None
) -> tuple[RunSummary, Path]:
    """Summary from the ledger's raw scores → report.md / report.json and the final DuckDB row.
    Plain function: it must also work when the run is going down and Prefect's API is gone.

    The ledger is checked against the head the results store anchored before any number is written: a ledger
    edited, cut or extended since (`ledger_integrity`) gives a row marked failed with the reason and no number,
    and a report that says why (`withheld`); the caller raises on it (`LedgerTampered`)."""
    integrity = ledger_integrity(ctx)
    store = ResultsStore(ctx.results_path)
    if integrity.tampered:
        return withhold_summary(ctx, store, status, phase_seconds, integrity)
    entries = ledger_of(ctx, store).entries()
    session_end = last_event(entries, "session-end")
    detail = session_end.detail if session_end else {}
    attempts = read_attempts(ctx.paths.harness_dir)
    summary = build_summary(ctx, entries, status, phase_seconds, session=detail,
                            attempts=max(1, len(attempts.attempts)), error=error)  # fmt: skip
    leaks = leak_audit(ctx)
    draw_trajectory(entries, ctx.paths.harness_dir)
    start = last_event(entries, "session-start")
    notes = run_notes(ctx, detail) + [f"Sandbox: {start.detail.get('sandbox', 'n/a') if start else 'no session'}."]
    notes.append(leaks.summary_line())
    share = run_stage_share(entries, ctx.paths.harness_dir)
    record = build_record(summary, entries, integrity, notes, stage_share=share,
                          submission_tests=[t for t in submission_tests(entries) if t.test is not None])
    report = write_report(ctx.paths.harness_dir, record, sections=render_stages(entries, ctx.paths.harness_dir))
    # Process metrics, route labels and the failure class sit beside the scores, in the report and the store.
    process = summarize_process(
        ctx.run_id, ctx.paths.harness_dir, entries, ctx.config, detail,
        snapshots=CodeSnapshots(ctx.paths.harness_dir, ctx.paths.workspace / "code"),
        summary=summary, run_status=status, run_error=error,
    )  # fmt: skip
    with report.open("a") as f:
        f.write("\n" + render_process_markdown(process) + "\n" + attempts.markdown(status))
    # One connection and one transaction for the run's summary rows; the final status last inside it, so a run
    # whose summary step breaks never reads `completed`.
    with store.batch():
        store.record_metrics(ctx.run_id, leak_metrics(leaks))
        store_process_report(store, process, ctx.paths.harness_dir)
        store.finish_run(summary)
    if summary.status == "completed":
        stopping.row_final(ctx.run_id)  # a stop from now on waits for the flow run's end (one truth: completed)
    return summary, report


def ledger_integrity(ctx: RunContext) -> LedgerCheck:
    """The ledger's head as this report is built from it, checked against the head the results store
    anchored at every append: an edited last entry, a cut-off end or entries appended past the anchored head
    show up here, as `tampered` (no number may be written from this ledger). `head_mac` authenticates the head
    for a later ingest into another store (`a2rl_bench.grading.ledger.head_mac`)."""
    try:
        ledger = Ledger(ctx.paths.harness_dir / "ledger.jsonl")
    except LedgerCorrupted as e:
        return LedgerCheck(entries=None, head_hash=None, anchored=False, tampered=True, problems=[str(e)])
    head = ledger.head()
    out = LedgerCheck(entries=head.entries, head_hash=head.hash, head_mac=head_mac(ctx.run_id, head), anchored=False,
                      tampered=False, problems=[])  # fmt: skip
    try:
        anchored = ResultsStore(ctx.results_path).ledger_head(ctx.run_id)
    except Exception as e:  # noqa: BLE001 - a report must still be written; it says what could not be checked
        out.problems.append(f"the results store could not be read to check the ledger's end ({type(e).__name__})")
        return out
    out.anchored = anchored is not None
    if anchored is None:
        out.problems.append("no head anchored in the results store for this run")
    elif mismatch := ledger.check_head(anchored, "the results store"):
        out.problems.append(mismatch)
        out.tampered = True
    if ledger.torn_tail is not None:
        out.problems.append(str(ledger.torn_tail))
    return out


class LedgerTampered(RuntimeError):
    """The run's ledger does not end where the results store anchored it: its numbers are not reported."""


def withhold_summary(ctx: RunContext, store: ResultsStore, status: RunStatus, phase_seconds: dict[str, float],
                     integrity: LedgerCheck) -> tuple[RunSummary, Path]:  # fmt: skip
    """The record of a run whose ledger does not verify: the row marked failed with the reason, no number."""
    reason = "; ".join(integrity.problems)
    summary = withheld(build_summary(ctx, [], status, phase_seconds), reason)
    record = build_record(summary, [], integrity, [f"The ledger was changed after the harness wrote it ({reason}): "
                                                   "this run's scores are not reported."])  # fmt: skip
    report = write_report(ctx.paths.harness_dir, record)
    with store.batch():
        store.record_metrics(ctx.run_id, {"failure_class": "ledger tampered", "failure_reason": reason})
        store.finish_run(summary)
    return summary, report


def draw_trajectory(entries: list[LedgerEntry], harness_dir: Path) -> None:
    try:
        score_trajectory_png(entries, harness_dir / "score_trajectory.png")
    except ImportError as error:  # matplotlib is optional (e.g. a GPU image without it): only the figure is lost
        logging.getLogger(__name__).warning("score trajectory figure skipped: %s", error)


def completed_before(config: RunConfig, results: Path, runs_dir: Path, flow_run_id: str | None) -> RunSummary | None:
    """The summary of this flow run's benchmark run if an earlier attempt completed it (a Retry pressed on a
    completed run), else None."""
    if flow_run_id is None:  # called outside a flow run: a new run every time
        return None
    run_id = make_run_id(config, flow_run_id)
    report = RunPaths.for_run(runs_dir, run_id).harness_dir / "report.json"
    if not results.exists() or not report.exists():
        return None
    rows = ResultsStore(results).query("SELECT status FROM runs WHERE run_id = ?", [run_id])
    if list(rows["status"]) != ["completed"]:
        return None
    return read_run_record(report).summary


class AgentDidNotStart(RuntimeError):
    """The agent never started, or ended before doing anything, because of the harness or its configuration."""


def did_not_start(ctx: RunContext, outcome: SessionOutcome) -> str | None:
    """Why the session does not count as the agent's attempt, or None when it does.

    A launch error (no CLI, wrong driver API) never started the agent. An LLM agent that ended by itself
    with no submission and not one successful LLM call never got to work (bad key, endpoint, CLI config):
    that is the harness's failure, not the agent's result."""
    if outcome.ended_by == "launch-error":
        return f"the agent could not be launched: {outcome.error}"
    if outcome.ended_by != "exited" or not agent_class(ctx.config.agent).uses_llm:
        return None
    h = ctx.paths.harness_dir
    if any(e.kind == "submission" for e in ledger_of(ctx).entries()):
        return None
    if any(not c.get("error") and (c.get("output_tokens") or 0) > 0 for c in read_llm_calls(h / "llm_calls.jsonl")):
        return None
    return (f"the agent exited (code {outcome.exit_code}) after {outcome.agent_seconds:.0f} s without one "
            f"successful LLM call or a submission; see {h / 'agent.log'}")  # fmt: skip


def record_failure(ctx: RunContext, status: RunStatus, phases: dict[str, float], error: str, run_log: Path) -> None:
    """Write the failed (or interrupted) run's report and row. Should that fail too (the data it audits may be
    what was missing), the row still ends `status` with both errors and class `infrastructure failure`."""
    try:
        write_summary(ctx, status, phases, error=error)
        return
    except Exception as again:
        log_traceback(run_log, "recording the failure failed as well")
        error = f"{error}; then, while recording it: {type(again).__name__}: {' '.join(str(again).split())}"
    try:
        entries = [] if ledger_integrity(ctx).tampered else ledger_of(ctx).entries()
    except Exception:  # a damaged ledger must not keep the row `running`
        entries = []
    summary = build_summary(ctx, entries, status, phases, error=error)
    store = ResultsStore(ctx.results_path)
    store.finish_run(summary)
    store.record_metrics(ctx.run_id, {"failure_class": "infrastructure failure"})
    try:
        note = f"The run {status}; its full report could not be written (see {run_log})."
        write_report(ctx.paths.harness_dir, build_record(summary, entries, ledger_integrity(ctx), [note]))
    except Exception:
        log_traceback(run_log, "writing the short report failed")


def log_traceback(run_log: Path, what: str) -> None:
    try:
        with run_log.open("a") as f:
            f.write(f"\n=== {what} ===\n{traceback.format_exc()}")
    except OSError:
        pass
