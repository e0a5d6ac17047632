"""The agent session's collaborators, put together for the `agent-session` subflow: the grading service (which
records its ledger lines and evaluations in the run's store itself, `a2rl_bench.grading.record`) with what each ledger
line sets going in the run (`SessionRecorder`), and the notice of a wait for a GPU slot."""

from __future__ import annotations

import logging
from pathlib import Path

from a2rl_bench.grading import BudgetClock, GradingContext, GradingService
from a2rl_bench.grading.service import grading_devices
from a2rl_bench.isolation import procs
from a2rl_bench.ops.progress import note_phase
from a2rl_bench.capture.snapshots import CodeSnapshots
from a2rl_bench.records import LedgerEntry
from a2rl_bench.run import RunContext
from a2rl_bench.safetext import terminal
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.benchmarks import get_task


class SessionRecorder:
    """What each ledger line of the grading service sets going in the run: the code that produced a submission
    committed to a harness-owned git history, and a log line per grade."""

    def __init__(self, snapshots: CodeSnapshots, logger: logging.Logger | logging.LoggerAdapter) -> None:
        self.snapshots, self.logger = snapshots, logger
        self.service: GradingService | None = None
        """Set once the service exists (it is built with this recorder's callbacks)."""

    def on_entry(self, entry: LedgerEntry) -> None:
        if entry.kind == "submission" and entry.status == "queued":
            sha = self.snapshots.snapshot(f"submission-{entry.submission_id}")
            self.service.record_event("code-snapshot", submission_id=entry.submission_id, sha=sha)
        if entry.kind == "submission" and entry.status in ("scored", "error"):
            self.logger.info(
                "submission %s (%s): %s %s",
                entry.submission_id, terminal(entry.model_path), entry.status,
                f"{entry.split} score {entry.score:.2f}" if entry.score is not None else terminal(entry.error),
            )  # fmt: skip


def start_grading(ctx: RunContext, baseline: dict[str, float], base_model_dir: Path, store: ResultsStore,
                  clock: BudgetClock, recorder: SessionRecorder) -> GradingService:  # fmt: skip
    """The run's grading service, its ledger anchored and recorded in `store` and its lines heard by `recorder`."""
    service = GradingService(
        GradingContext(ctx.run_id, ctx.config, ctx.paths.workspace, ctx.paths.harness_dir, baseline,
                       base_model_dir=base_model_dir, devices=grading_devices(ctx.config.grading_workers),
                       store=store, task=get_task(ctx.config.task),
                       on_process=procs.record_started),  # each evaluation recorded as this attempt's
        clock,
        on_entry=recorder.on_entry,
    )
    recorder.service = service
    return service


class GpuWaitNotice:
    """Says that the run waits for a GPU slot: in the log and in the run's progress (phase `waiting_gpu`)."""

    def __init__(self, harness_dir: Path, logger: logging.Logger | logging.LoggerAdapter) -> None:
        self.harness_dir, self.logger = harness_dir, logger

    def __call__(self, line: str) -> None:
        self.logger.warning(line)
        note_phase(self.harness_dir, "waiting_gpu")
