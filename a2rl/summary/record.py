"""One run's record, typed: the content of report.json, what report.md and the results store's run row are
rendered from, built in one place (`build_summary`, `build_record`) for a finished, a failed and a withheld run
alike.

The record holds the run's summary (identity and config, status, times per phase summed over its attempts, the
headline numbers of `a2rl.summary.headline`), each submission's latest state, the ledger's check against the
store's anchor and the notes; a full report adds the post-hoc hidden-test evaluations (`submission_tests`,
`stage_share`). The process facts (metrics, routes, failure class) are the `ProcessFacts` of
`a2rl.summary.process_facts`, written beside it (process.json).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from a2rl.protocol.picking import latest_submissions
from a2rl.records import LedgerEntry, RunStatus, RunSummary, Sparse
from a2rl.run import RunContext
from a2rl.summary.headline import SCORES, headline
from a2rl.summary.stages import StageShare, SubmissionTest


class LedgerCheck(Sparse):
    """The ledger's head as the report was built from it, checked against the head the results store anchored."""

    entries: int | None
    head_hash: str | None
    head_mac: str | None = None
    """Authenticates the head for a later ingest into another store (`a2rl.grading.ledger.head_mac`); absent
    where the ledger could not be read."""
    anchored: bool = False
    tampered: bool = False
    """Edited, cut or extended past the anchored head: no number may be written from this ledger."""
    problems: list[str] = []


class RunRecord(Sparse):
    """A run's record (see the module docstring): report.json is its JSON."""

    summary: RunSummary
    submissions: list[LedgerEntry]
    """Each submission's latest state (none where the ledger does not verify)."""
    submission_tests: list[SubmissionTest] | None = None
    """Every submission's post-hoc hidden-test score, where one was evaluated (full reports only)."""
    stage_share: StageShare | None = None
    ledger: LedgerCheck
    notes: list[str]


def build_summary(
    ctx: RunContext,
    entries: list[LedgerEntry],
    status: RunStatus,
    phase_seconds: Mapping[str, float],
    *,
    session: Mapping[str, Any] | None = None,
    attempts: int = 1,
    error: str | None = None,
) -> RunSummary:
    """The run's summary: its `headline` numbers from the ledger `entries` with its identity, status and times.

    Args:
        session: the `session-end` event's detail (agent, grading and grace seconds); None before it.
        attempts: how many attempts the run took.
    """
    detail = session or {}
    return RunSummary(
        run_id=ctx.run_id,
        config=ctx.config,
        status=status,
        protocol=ctx.config.protocol,
        variant_label=ctx.variant_label,
        agent_seconds=round(detail.get("agent_seconds", 0.0), 3),
        grading_seconds=round(detail.get("grading_seconds", 0.0), 3),
        wall_seconds=round(sum(phase_seconds.values()), 3),
        phase_seconds={k: round(v, 3) for k, v in phase_seconds.items()},
        error=error,
        **headline(entries, ctx.config.protocol).model_dump(),
        grace_seconds=round(detail.get("grace_seconds", 0.0), 3),
        attempts=attempts,
    )


def build_record(summary: RunSummary, entries: list[LedgerEntry], ledger: LedgerCheck, notes: list[str],
                 **post_hoc: Any) -> RunRecord:  # fmt: skip
    """The run's record: its summary, its submissions' latest states and the notes, the ledger's problems first.
    `post_hoc`: `submission_tests` and `stage_share` of a full report."""
    return RunRecord(
        summary=summary,
        submissions=[] if ledger.tampered else latest_submissions(entries),
        ledger=ledger,
        notes=[f"LEDGER INTEGRITY: {p}" for p in ledger.problems] + notes,
        **post_hoc,
    )


def withheld(summary: RunSummary, reason: str) -> RunSummary:
    """A run whose ledger does not verify: marked failed, with the reason, and no number from that ledger."""
    return summary.model_copy(update={**dict.fromkeys(SCORES), "status": "failed", "n_scored": 0,
                                      "error": f"ledger integrity: {reason}; no number of this run is reported"})
