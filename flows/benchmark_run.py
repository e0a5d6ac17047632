"""The `benchmark-run` flow: provision → baseline → agent session → final grading → summary.

Flows stay thin: each step is a Prefect task over a plain a2rl function; state is checkpointed in the
ledger and the DuckDB results store as it happens, so a retried flow run resumes instead of starting over.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from prefect import flow, get_run_logger
from prefect.runtime import flow_run as prefect_flow_run
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled, Completed
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact

from a2rl_bench.safetext import cells
from a2rl_bench.ops import disk, stopping
from a2rl_bench.ops.load import load_per_core
from a2rl_bench.grading import BudgetClock, GradingServer
from a2rl_bench.grading.clock import CLOCK_FILE, ClockRecorder
from a2rl_bench.capture.attempts import AttemptLog
from a2rl_bench.capture.snapshots import CodeSnapshots
from a2rl_bench.capture.resources import ResourceSampler, workspace_pids
from a2rl_bench.records import LedgerEntry, RunConfig, RunStatus, RunSummary
from a2rl_bench.protocol.picking import latest_submissions
from a2rl_bench.summary.report import last_event
from a2rl_bench.run import RunContext, gpu_names, sandbox_for
from a2rl_bench.run_options import GRACE_S, ResumePolicy, RunOptions, resolve_results, run_results
from a2rl_bench.tasks.preflight import check_run
from a2rl_bench.ops.gpu_slots import hold_gpu_slot
from a2rl_bench.ops.run_lease import AttemptLease, StaleAttempt, ended_earlier
from a2rl_bench.isolation import procs
from a2rl_bench.ops.housekeeping import clean_stale_temp
from a2rl_bench.ops.progress import RUN_LOG, ProgressWriter, note_phase, note_step
from a2rl_bench.tasks.phases import RunPhases
from a2rl_bench.tasks.session_steps import GpuWaitNotice, SessionRecorder, start_grading
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.agents import AgentEnv, SessionOutcome, get_agent, run_agent
from a2rl_bench.blocks import resolve_driver
from a2rl_bench.tasks.summary_steps import (
    AgentDidNotStart,
    LedgerTampered,
    completed_before,
    did_not_start,
    log_traceback,
    output_matcher,
    record_failure,
    write_summary,
)
from a2rl_bench.tasks.run_steps import (
    base_model_step,
    build_workspace_step,
    evaluate_baseline,
    evaluate_every_submission,
    evaluate_final,
    ledger_of,
    open_run,
    prepare_base_model,
    prune_snapshots,
    prepare_task_data,
    record_attempt,
)

INTERRUPTIONS = (KeyboardInterrupt, SystemExit, TerminationSignal)


@flow(name="provision-workspace")
def provision_workspace(ctx: RunContext) -> Path:
    """Prepare task data and the base model, then build the agent's workspace. Returns the base model dir."""
    note_step(ctx.paths.harness_dir, "preparing the task data")
    public_dir = prepare_task_data(ctx)
    note_step(ctx.paths.harness_dir, base_model_step(ctx.config.base_model))
    base_model_dir = prepare_base_model(ctx.config.base_model)
    note_step(ctx.paths.harness_dir, "building the workspace and installing the agent")
    build_workspace_step(ctx, public_dir, base_model_dir)
    return base_model_dir


@flow(name="agent-session")
def agent_session(
    ctx: RunContext,
    baseline: dict[str, float],
    base_model_dir: Path,
    grace_s: float = GRACE_S,
    on_resume: ResumePolicy = "continue",
) -> SessionOutcome:
    """Start the grading service, run the agent under its budget, and drain the grading queue.

    Resumable: a finished session is not run again; a session a crash interrupted either continues with
    what remains of the agent's budget (`on_resume="continue"`) or is recorded as interrupted.
    """
    logger = get_run_logger()
    entered = time.monotonic()  # the session's start delay (the agent's clock stands still until it launches)
    end_earlier_attempt(ctx)
    store = ResultsStore(ctx.results_path)
    entries = ledger_of(ctx, store).entries()
    if (done := last_event(entries, "session-end")) is not None:
        logger.info("agent session already finished (%s); reusing its outcome", done.detail.get("ended_by"))
        return SessionOutcome.model_validate(done.detail)
    clock_file = ctx.paths.harness_dir / CLOCK_FILE
    note_step(ctx.paths.harness_dir, "starting the grading service, then the agent (its clock starts with it)")
    used_s = ClockRecorder.used_seconds(clock_file)
    clock = BudgetClock(ctx.config.budget_s, already_used_s=used_s)
    snapshots = CodeSnapshots(ctx.paths.harness_dir, ctx.paths.workspace / "code")
    service = start_grading(ctx, baseline, base_model_dir, store, clock, SessionRecorder(snapshots, logger))
    interrupted = last_event(entries, "session-start") is not None
    if interrupted and on_resume == "interrupted":
        service.close()
        outcome = SessionOutcome(exit_code=None, ended_by="interrupted", agent_seconds=min(used_s, ctx.config.budget_s),
                                 grace_seconds=max(0.0, used_s - ctx.config.budget_s), wall_seconds=0.0,
                                 error="the session was interrupted by a crash and not resumed (policy)")
        service.record_event("session-end", **outcome.model_dump(), grading_seconds=0.0)
        return outcome
    if interrupted and clock.remaining() <= 0:
        # The budget (and part of the grace, maybe) was spent before the crash: the agent does not start again;
        # what it submitted is graded.
        service.close()
        outcome = SessionOutcome(exit_code=None, ended_by="budget", agent_seconds=round(clock.agent_seconds(), 3),
                                 grace_seconds=round(clock.grace_seconds(), 3), wall_seconds=0.0)  # fmt: skip
        service.record_event("session-end", **outcome.model_dump(), grading_seconds=round(service.grading_seconds, 3))
        logger.info("agent budget already spent before the crash (%.1f s); its submissions are graded", used_s)
        return outcome
    agent = get_agent(ctx.config.agent, driver=resolve_driver(ctx.config.driver))
    # One GPU slot per agent session (global concurrency limit `gpu`, made by sweeps; a no-op without it).
    # A short lease frees a dead run's slot within a minute; a run that waits says so (log and progress).
    holder = prefect_flow_run.get_parent_flow_run_id() or prefect_flow_run.get_id()  # the benchmark-run
    with hold_gpu_slot(holder, GpuWaitNotice(ctx.paths.harness_dir, logger)), \
            GradingServer(service, request_log=ctx.paths.harness_dir / "requests.jsonl") as server:
        note_phase(ctx.paths.harness_dir, "agent_session")
        policy, sandbox = sandbox_for(ctx, server.url, agent.uses_llm)
        service.record_event("session-resumed" if interrupted else "session-start", url=server.url,
                             budget_s=ctx.config.budget_s, already_used_s=used_s, sandbox=sandbox,
                             gpus=gpu_names(), start_delay_s=round(time.monotonic() - entered, 1))
        logger.info("grading service on %s; agent %s %s with %.0f s left", server.url, agent.id,
                    "resumes" if interrupted else "starts", clock.remaining())
        env = AgentEnv(ctx.config.task, ctx.config.base_model, ctx.paths.workspace, server.url, server.token,
                       ctx.config.seed, harness_dir=ctx.paths.harness_dir)
        sampler = ResourceSampler(
            ctx.paths.harness_dir, workspace_pids(ctx.paths.workspace), interval_s=10, workspace=ctx.paths.workspace,
            extra_fn=lambda: {"grading": clock.is_paused, "agent_elapsed_s": round(clock.elapsed(), 1),
                              "load_per_core": round(load_per_core(), 2)},
        )
        note_step(ctx.paths.harness_dir, None)  # the agent's own lines say what it does from here
        with ClockRecorder(clock, clock_file), snapshots.periodic(300), sampler:
            outcome = run_agent(agent, env, clock, ctx.paths.harness_dir / "agent.log", grace_s=grace_s,
                                sandbox=policy, log_matcher=output_matcher(ctx))
            service.close()
    outcome.agent_seconds, outcome.grace_seconds = round(clock.agent_seconds(), 3), round(clock.grace_seconds(), 3)
    service.record_event("session-end", **outcome.model_dump(), grading_seconds=round(service.grading_seconds, 3),
                         host_frozen_s=round(clock.frozen_seconds(), 1))
    logger.info("agent %s after %.0f s (exit code %s)", outcome.ended_by, outcome.agent_seconds, outcome.exit_code)
    if clock.frozen_seconds():
        logger.warning("the host stood still (stopped or frozen) for %.0f s of the session: not charged to the agent",
                       clock.frozen_seconds())
    return outcome


def end_earlier_attempt(ctx: RunContext) -> None:
    """A retried run first ends every process an earlier attempt left (recorded in the harness dir, or tagged
    with the run), checked gone; raises ProcessesSurvived (the run fails, no second agent starts) where it
    cannot. An earlier attempt's agent found still running (its harness frozen, or cut off from Prefect) has
    its clock charged up to the moment it was sent SIGKILL."""
    harness = ctx.paths.harness_dir
    agent_running = any(r.running() for r in procs.read_records(harness) if r.kind == "agent" and not r.ours())
    killed_at: list[float] = []
    if ended := procs.end_earlier_attempts(harness, run_id=ctx.run_id, on_kill=lambda: killed_at.append(time.time())):
        charged = ClockRecorder.charge_until(harness / CLOCK_FILE, killed_at[0]) if agent_running else 0.0
        logging.getLogger(__name__).warning(
            "ended %d processes of an earlier attempt of this run: %s%s", len(ended), ended,
            f" (its agent was still running: {charged:.1f} s more on the agent's clock)" if agent_running else "",
        )  # fmt: skip


@flow(name="final-grading")
def final_grading(ctx: RunContext, base_model_dir: Path) -> LedgerEntry:
    """Evaluate the final pick on the hidden test set (admin action: not on the agent's API); with
    `test_every_submission`, then every scored submission too, for analysis only."""
    entry = evaluate_final(ctx, base_model_dir)
    logger = get_run_logger()
    logger.info("final hidden-test score %.2f (submission %s)", entry.score or 0.0, entry.submission_id)
    if ctx.config.test_every_submission:
        for e in evaluate_every_submission(ctx):
            logger.info("submission %s on the hidden test (analysis only): %.2f", e.submission_id, e.score or 0.0)
    prune_snapshots(ctx)
    return entry


@flow(name="summarize-run")
def summarize_run(ctx: RunContext, status: RunStatus, phase_seconds: dict[str, float]) -> RunSummary:
    """Write the report and the final results row (the parent flow publishes them as artifacts)."""
    summary, _ = write_summary(ctx, status, phase_seconds)
    if summary.error and summary.error.startswith("ledger integrity"):
        raise LedgerTampered(summary.error)
    return summary


def publish_artifacts(ctx: RunContext) -> None:
    """The report, the submissions table and the score trajectory as artifacts of the flow run this is called in:
    the benchmark-run itself, whose Artifacts tab is where a user looks (a subflow's is one click deeper). Never
    raises: the run's files are its record."""
    try:
        _publish(ctx)
    except Exception as e:  # noqa: BLE001 - Prefect's API may be what failed; the files are the record
        logging.getLogger(__name__).warning("could not publish the run's report as artifacts: %s", e)


def _publish(ctx: RunContext) -> None:
    report = ctx.paths.harness_dir / "report.md"
    if report.exists():
        create_markdown_artifact(report.read_text(), key=_artifact_key(ctx.run_id), description="a2rl run report")
    entries = ledger_of(ctx).entries()
    create_table_artifact(  # the path is the agent's text: one rule for it (`safetext.cells`)
        cells([{"submission": e.submission_id, "status": e.status, "score": e.score, "path": e.model_path}
               for e in latest_submissions(entries)]) or [{"submission": None}],
        key=_artifact_key(ctx.run_id) + "-submissions", description="a2rl run submissions",
    )  # fmt: skip
    trajectory = ctx.paths.harness_dir / "score_trajectory.png"
    if trajectory.exists():
        create_image_artifact(
            "data:image/png;base64," + base64.b64encode(trajectory.read_bytes()).decode(),
            key=_artifact_key(ctx.run_id) + "-trajectory", description="score trajectory",
        )


def _artifact_key(run_id: str) -> str:
    return "run-" + "".join(ch if ch.isalnum() else "-" for ch in run_id.lower())


@flow(name="benchmark-run")
def benchmark_run(config: RunConfig = RunConfig(), options: RunOptions = RunOptions()) -> RunSummary:
    """One benchmark run: (task, variant, agent, mode, base model, seed, budget) → scores, report, DuckDB rows.

    `config` is what the run measures (its hash names the run); `options` where it writes and how an attempt
    behaves (a2rl_bench/run_options.py). A relative `options.results` (a deployment's default) is taken from the
    repository root. The row ends `completed`, or `failed`/`interrupted` with the error (also when recording
    the failure fails again); the traceback goes to `harness/run.log`, the phase reached to
    `harness/progress.json`."""
    stop = StaleStop()
    lease = take_run_lease(stop)  # first: one attempt at a time across hosts, and the server hears this one at once
    deployed = deployed_run()
    stopping.begin_run()
    results, elsewhere = run_results(options.results, deployed=deployed)
    if elsewhere:
        get_run_logger().info("results go to %s", elsewhere)
    runs_dir = resolve_results(options.runs_dir) if options.runs_dir else results.parent / "runs"
    if (done := completed_before(config, results, runs_dir, prefect_flow_run.get_id())) is not None:
        get_run_logger().warning("run %s had already completed: a retry changes nothing (its row, report and "
                                 "timings stay as they were)", done.run_id)  # fmt: skip
        if lease is not None:
            lease.release()
        return done
    if lease is not None and (ended := ended_earlier(lease.api_url, lease.flow_run_id)) is not None:
        get_run_logger().warning(ended)  # on another host than the one holding its summary, or a plain server
        lease.release()
        return Completed(message=ended)
    t = time.perf_counter()
    try:  # what killed runs left in the caches (never the reason this run fails)
        if removed := clean_stale_temp():
            get_run_logger().info("removed %d file(s) killed runs left in the caches", len(removed))
    except OSError:
        pass
    ctx = open_run(config, results, runs_dir, prefect_flow_run.get_run_count() or 1)
    stop.harness_dir, stop.run_id = ctx.paths.harness_dir, ctx.run_id
    reserve = disk.reserve_space(ctx.run_id, [ctx.paths.harness_dir, results.parent])  # room to record a failure
    # This attempt: its times (wall, phases, summed with earlier attempts' for the report) and its identity,
    # which every process it starts is recorded with (a retry ends what an earlier attempt left, never its own).
    attempts = AttemptLog(ctx.paths.harness_dir, prefect_flow_run.get_id(), prefect_flow_run.get_run_count(),
                          opened_s=time.perf_counter() - t)  # fmt: skip
    procs.begin_attempt(ctx.paths.harness_dir,
                        procs.Attempt.here(ctx.run_id, prefect_flow_run.get_id(), attempts.current.number))
    record_flow_run(ctx, "Running")
    progress = ProgressWriter(ctx.run_id, ctx.paths.harness_dir, config.budget_s)
    # Before each step: a run that moved on (a later attempt, a Retry pressed, an ending) stops this attempt.
    phases = RunPhases(attempts, progress, before=lease.check if lease is not None else None)
    run_log = ctx.paths.harness_dir / RUN_LOG

    with logs_to(run_log):
        try:
            with phases.enter("preflight"):
                end_earlier_attempt(ctx)  # one attempt at a time: before anything else of this one
                record_attempt(ctx)  # a retry says where it runs, and whether it starts the run over
                # What the CLI checked, again for runs started elsewhere (deployments, sweeps); nothing slow.
                check_run(config, results, runs_dir, probe=False)
            with phases.enter("provision"):
                base_model_dir = provision_workspace(ctx)
            with phases.enter("baseline"):
                baseline = evaluate_baseline(ctx, base_model_dir, progress=progress.update)
            with phases.enter("agent_session"):
                outcome = agent_session(ctx, baseline, base_model_dir, grace_s=options.grace_s,
                                        on_resume=options.on_resume)
                if reason := did_not_start(ctx, outcome):
                    raise AgentDidNotStart(reason)
            with phases.enter("final_grading"):
                final_grading(ctx, base_model_dir)
            with phases.enter("summary"):
                summary = summarize_run(ctx, "completed", attempts.totals())
                publish_artifacts(ctx)  # best effort: the row is final, a failure here must not fail the run
            attempts.end("completed")
            record_flow_run(ctx, "Completed")
        except BaseException as e:
            if stopping.final_run() == ctx.run_id:  # a second stop after the row was final: it stays `completed`
                raise
            # Recorded without Prefect (its API may be going down too). A stop on request (SIGTERM: `a2rl server
            # stop`, a cancelled worker) ends the flow run Cancelled, with what happened; anything else is
            # re-raised so Prefect marks the flow run failed or crashed. Either way a Retry resumes it.
            status: RunStatus = "interrupted" if isinstance(e, INTERRUPTIONS) else "failed"
            error = f"{type(e).__name__} in {phases.current}: {one_line_error(e)}"
            if full := disk.disk_full(e, [ctx.paths.harness_dir, results.parent]):
                error += f"; {full}"
            disk.release(reserve)  # a full disk now has room for the failed row and its report
            log_traceback(run_log, f"run {status} in phase {phases.current}")
            progress.update(error=error)
            attempts.end(status)
            record_failure(ctx, status, attempts.totals(), error, run_log)
            # A stop on request ends the flow run Cancelled, as the row reads `interrupted`: Prefect's SIGTERM, and
            # Ctrl-C/SIGTERM of `a2rl run` (no deployment: no worker whose crash handling would look for Crashed).
            cancel = isinstance(e, TerminationSignal) or (isinstance(e, KeyboardInterrupt) and not deployed)
            record_flow_run(ctx, "Cancelled" if cancel
                            else "Failed" if isinstance(e, Exception) else "Crashed")  # as Prefect will have it
            if isinstance(e, Exception):  # a failed run's report on its page too
                publish_artifacts(ctx)
            if cancel:
                if isinstance(e, TerminationSignal):
                    stopping.stopped_by(signal.SIGTERM)
                return Cancelled(message=f"a2rl recorded the run interrupted ({error}); a Retry resumes it")
            raise
        finally:
            procs.end_attempt()
            if lease is not None:
                lease.release()
            disk.release(reserve)
    # The command returns once Prefect has recorded the flow run's end (minutes on a starved machine): said.
    progress.update(phase="done", step="the run is recorded; Prefect is recording the flow run's end")
    return summary


def deployed_run() -> bool:
    """Whether this flow run is a deployment's, as the flow run the engine read at its start says
    (`prefect.runtime.deployment.get_id()` asks the API again for a run that is not: 0.2-1 s of every run's start)."""
    context = FlowRunContext.get()
    return context is not None and context.flow_run is not None and context.flow_run.deployment_id is not None


STALE_EXIT = 75
"""The exit status of an attempt that stopped itself: a later attempt holds the run's lease, or the run moved on."""


@dataclass
class StaleStop:
    """What a stale attempt stops (`stop_stale_attempt`): its run, once the run's directory is known."""

    harness_dir: Path | None = None
    run_id: str = "this run"

    def __call__(self, why: str) -> None:
        stop_stale_attempt(self.harness_dir, self.run_id, why)


def take_run_lease(stop: StaleStop) -> AttemptLease | None:
    """This attempt's hold on the run's lease in the server (a2rl_bench.ops.run_lease); None without a server (an
    ephemeral one: `a2rl run`, one process, nobody to retry it elsewhere)."""
    from prefect.settings import PREFECT_API_URL

    api_url, flow_run_id = PREFECT_API_URL.value(), prefect_flow_run.get_id()
    if not api_url or not flow_run_id:
        return None
    logger = logging.getLogger(__name__)
    lease = AttemptLease(api_url, flow_run_id, prefect_flow_run.get_run_count(), stop)
    try:
        if (earlier := lease.take_until_answered()) is not None:
            logger.warning("took the run's lease from %s, which stops itself", earlier.describe())
    except StaleAttempt as e:
        stop(str(e))
    except httpx.HTTPError as e:
        logger.warning("could not take the run's lease (%s): this attempt goes on without it", e)
        return None
    return lease


def stop_stale_attempt(harness_dir: Path | None, run_id: str, why: str) -> None:
    """A later attempt holds the run's lease, or the run moved on (a Retry, an ending): end this attempt's processes
    and exit at once, writing nothing more (the flow run's state and the run's files are the later attempt's now,
    and a run has one ending) than its agent's clock as it stops."""
    logging.getLogger(__name__).error("this attempt of %s stops itself: %s", run_id, why)
    ClockRecorder.stop_all_now()  # the agent's time ends here, with the SIGKILLs below
    for record in procs.read_records(harness_dir) if harness_dir is not None else []:
        if record.ours():
            procs.stop_session(record.leader)
    procs.signal_pids(procs.descendants(os.getpid()), signal.SIGKILL)
    os._exit(STALE_EXIT)


def record_flow_run(ctx: RunContext, state: str) -> None:
    """The run's flow run, this attempt's number and its last Prefect state in the run's row: what SQL over the
    central store answers "what failed or crashed, and which flow run to retry" from (a crash leaves "Running",
    which the merge turns into `crashed` once the server says the attempt is over). Never fails the run."""
    import pandas as pd

    row = {"run_id": ctx.run_id, "flow_run_id": prefect_flow_run.get_id(), "attempts": prefect_flow_run.get_run_count(),
           "prefect_state": state}  # fmt: skip
    try:
        ResultsStore(ctx.results_path).bulk_write("runs", pd.DataFrame([row]))
    except Exception as e:  # the store is locked or gone: the row lacks it, the run goes on
        logging.getLogger(__name__).warning("could not record the flow run in the results store: %s", e)


def one_line_error(e: BaseException) -> str:
    """The error as one line for the row and the terminal: a child process's traceback (an evaluation's stderr)
    shrinks to its exception line; the whole text is in the run log."""
    text = str(e)
    head, marker, tb = text.partition("Traceback (most recent call last):")
    if marker:
        last = [line for line in tb.splitlines() if line.strip() and not line.startswith((" ", "\t"))][-1:]
        text = f"{head}{last[0] if last else ''} (traceback in the run log)"
    return " ".join(text.split())


@contextmanager
def logs_to(path: Path) -> Iterator[None]:
    """Everything logged in this process while the run lasts (Prefect's lines included) also goes to `path`."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
