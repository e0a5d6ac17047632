"""One run's record, typed: the content of report.json, what report.md and the results store's run row are
rendered from, built in one place (`build_summary`, `build_record`) for a finished, a failed and a withheld run
alike.

The record holds the run's summary (identity and config, status, times per phase summed over its attempts, the
headline numbers of `a2rl_bench.summary.headline`), each submission's latest state, the ledger's check against the
store's anchor and the notes; a full report adds the post-hoc hidden-test evaluations (`submission_tests`,
`stage_share`). The process facts (metrics, routes, failure class) are the `ProcessFacts` of
`a2rl_bench.summary.process_facts`, written beside it (process.json).

The record carries its format version and its provenance (`a2rl_bench.run.Provenance`). `read_run_record` is its one
reader (ingest, merge, the retry of a completed run): a record of an older format is migrated as it is read, one
of a newer format is refused. Modelled on Inspect AI's EvalLog (a version field, old fields migrated on read).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from a2rl_bench.protocol.picking import latest_submissions
from a2rl_bench.records import LedgerEntry, RunStatus, RunSummary, Sparse
from a2rl_bench.run import Provenance, RunContext
from a2rl_bench.summary.headline import SCORES, headline
from a2rl_bench.summary.stages import StageShare, SubmissionTest


class LedgerCheck(Sparse):
    """The ledger's head as the report was built from it, checked against the head the results store anchored."""

    entries: int | None
    head_hash: str | None
    head_mac: str | None = None
    """Authenticates the head for a later ingest into another store (`a2rl_bench.grading.ledger.head_mac`); absent
    where the ledger could not be read."""
    anchored: bool = False
    tampered: bool = False
    """Edited, cut or extended past the anchored head: no number may be written from this ledger."""
    problems: list[str] = []


RUN_RECORD_VERSION = 1
"""The format of report.json. 0: the record before it carried a version (to issue 38), without provenance; the
oldest of them (before the ledger check of issue 24) have no `ledger`. 1: `format_version`, `provenance` and
`created_at` added."""


class RunRecord(Sparse):
    """A run's record (see the module docstring): report.json is its JSON."""

    format_version: int = RUN_RECORD_VERSION
    provenance: Provenance | None = None
    """What the run ran with and where (its manifest's); None in a record migrated from version 0."""
    created_at: datetime | None = None
    """When the record was written."""
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


class RecordTooNew(ValueError):
    """A run record of a format newer than this harness reads."""


def _from_unversioned(data: dict[str, Any]) -> dict[str, Any]:
    """0 → 1: no provenance to add (it was never recorded); the parts the oldest records lack, empty."""
    return {"submissions": [], "notes": [], "ledger": {"entries": None, "head_hash": None}} | data


MIGRATIONS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [_from_unversioned]
"""MIGRATIONS[v] turns a record of version v into one of version v + 1."""


def read_run_record(path: Path | str) -> RunRecord:
    """A run's record (report.json) as this harness's `RunRecord`: an older format migrated, a newer one refused
    (`RecordTooNew`, one line); unreadable JSON or a record that does not validate raises ValueError, a missing file
    OSError."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a run record (a JSON {type(data).__name__})")
    version = data.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"{path}: format_version {version!r} is not a version")
    if version > RUN_RECORD_VERSION:
        raise RecordTooNew(f"{path}: run record format {version} is newer than this harness reads "
                           f"({RUN_RECORD_VERSION}): read it with the a2rl that wrote it, or a newer one")  # fmt: skip
    for migrate in MIGRATIONS[version:]:
        data = migrate(data)
    return RunRecord.model_validate(data | {"format_version": RUN_RECORD_VERSION})
