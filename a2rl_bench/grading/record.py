"""Evaluate, append to the ledger, record in the store: one way for the grader (each submission) and the run's steps
(baseline, final pick, post-hoc evaluations, events) to keep a run's books.

`RunBook` is a run's ledger with the results store beside it. Every append is anchored in the store (the ledger's
end, `a2rl_bench.grading.ledger`) and written there as its row: an event's, a submission's. A scored evaluation
(`record_scored`) adds its row and per-item results in the store and its full result in
`harness/evaluations/<key>.json`, outside the workspace (it holds hidden-test answers), which ingest rebuilds
the rows from. The file is written first and the sha256 of its bytes goes into its ledger line (`detail`,
`EVAL_DIGEST`), so the chain and the head's MAC cover the per-item results too: `read_evaluations` hands out only
files that match their line. Each of the book's writes (a line with its anchor, row and evaluation) is one store
transaction that refreshes the run's derived rows once. Grading sits below the store: the store is typed here by what the book uses of it
(`RunStore`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from a2rl_bench.grading.ledger import Anchor, Ledger, LedgerCorrupted
from a2rl_bench.inference.evaluation import EvalSpec, evaluate_cached, evaluate_cached_splits
from a2rl_bench.records import EvalResult, LedgerEntry

log = logging.getLogger(__name__)
EVAL_DIGEST = "eval_sha256"
"""Key of a scored ledger line's `detail`: sha256 of its evaluation file's bytes."""
SCORED_KINDS = ("baseline", "submission", "final", "posthoc")


class RunStore(Protocol):
    """What a run's book writes to: the results store (`a2rl_bench.store.results.ResultsStore`)."""

    def ledger_anchor(self, run_id: str) -> Anchor: ...

    def record_event(self, run_id: str, seq: int, kind: str, detail: Mapping[str, Any],
                     at: datetime | None = None) -> None: ...  # fmt: skip

    def record_submission(self, run_id: str, entry: LedgerEntry) -> None: ...

    def record_evaluation(self, run_id: str, eval_key: str, kind: Any, result: EvalResult,
                          submission_id: int | None = None) -> None: ...  # fmt: skip

    def batch(self) -> AbstractContextManager[Any]: ...


def eval_key(kind: str, submission_id: int | None, split: str | None) -> str:
    """An evaluation's key in the store and its file's name: `<kind>-<submission or 0>-<split>`."""
    return f"{kind}-{submission_id or 0}-{split}"


class RunBook:
    """A run's ledger and, where given, its results store: see the module docstring. Without a store (a grader
    served on its own, tests) only the ledger and the evaluation files are written."""

    def __init__(self, run_id: str, harness_dir: Path, store: RunStore | None = None) -> None:
        self.run_id, self.harness_dir, self.store = run_id, Path(harness_dir), store
        self.ledger = Ledger(self.harness_dir / "ledger.jsonl", anchor=store.ledger_anchor(run_id) if store else None)

    def entries(self) -> list[LedgerEntry]:
        return self.ledger.entries()

    def append(self, on_durable: Callable[[LedgerEntry], None] | None = None, **fields: Any) -> LedgerEntry:
        """One ledger line, anchored, and its row (`on_durable`: `Ledger.append`), in one store transaction. The
        harness's own evaluations (baseline, final, post-hoc) have no row of their own: theirs is the evaluation's
        (`record_evaluation`)."""
        with ExitStack() as transaction:
            return self._append(transaction, on_durable, **fields)

    def _append(self, transaction: ExitStack, on_durable: Callable[[LedgerEntry], None] | None,
                **fields: Any) -> LedgerEntry:  # fmt: skip
        """`append`, its store writes in a batch that `transaction` holds open for the caller's further writes. The
        batch begins once the line is on disk (the grader's clock runs again first, as without a store), so the
        anchor, the row and what the caller adds commit together, and the derived rows are refreshed once."""

        def durable(entry: LedgerEntry) -> None:
            if on_durable is not None:
                on_durable(entry)
            if self.store is not None:
                transaction.enter_context(self.store.batch())

        entry = self.ledger.append(on_durable=durable, run_id=self.run_id, **fields)
        if self.store is not None and entry.kind == "event":
            self.store.record_event(self.run_id, entry.seq, entry.detail.get("event", "event"), entry.detail,
                                    at=entry.at)  # fmt: skip
        elif self.store is not None and entry.kind == "submission":
            self.store.record_submission(self.run_id, entry)
        return entry

    def record_scored(self, result: EvalResult, on_durable: Callable[[LedgerEntry], None] | None = None,
                      **fields: Any) -> LedgerEntry:  # fmt: skip
        """An evaluation's outcome: its scored ledger line (`fields` plus the result's score, cache hit and
        seconds), its rows and its file."""
        outcome = {"status": "scored", "score": result.score, "cached": result.cached,
                   "eval_seconds": round(result.duration_s, 3)}
        key = eval_key(fields["kind"], fields.get("submission_id"), result.split)
        # The file first (ingest rebuilds the rows from it), then its digest in the line the chain covers.
        digest = write_evaluation(self.harness_dir, key, result)
        fields["detail"] = {**(fields.get("detail") or {}), EVAL_DIGEST: digest}
        with ExitStack() as transaction:  # one store transaction: the anchor, the submission's row, the evaluation
            entry = self._append(transaction, on_durable, **fields | outcome)
            if self.store is not None:
                self.store.record_evaluation(self.run_id, key, entry.kind, result, submission_id=entry.submission_id)
        return entry


def write_evaluation(harness_dir: Path, key: str, result: EvalResult) -> str:
    """`harness/evaluations/<key>.json`; returns the sha256 of the bytes written."""
    out = Path(harness_dir) / "evaluations"
    out.mkdir(exist_ok=True)
    data = result.model_dump_json(indent=1).encode()
    (out / f"{key}.json").write_bytes(data)
    return hashlib.sha256(data).hexdigest()


class EvaluationsAltered(LedgerCorrupted):
    """An evaluation file does not match the digest its ledger line recorded: per-item results were edited."""


def expected_digests(entries: Iterable[LedgerEntry]) -> dict[str, str | None]:
    """Per evaluation key, the digest its latest scored ledger line recorded (None: a line from before digests,
    which the chain shows was written so)."""
    out: dict[str, str | None] = {}
    for e in entries:
        if e.kind in SCORED_KINDS and e.status == "scored" and e.score is not None:
            out[eval_key(e.kind, e.submission_id, e.split)] = e.detail.get(EVAL_DIGEST)
    return out


def read_evaluations(harness_dir: Path | str, entries: Iterable[LedgerEntry],
                     keys: Iterable[str] | None = None) -> dict[str, EvalResult]:  # fmt: skip
    """The evaluation files the ledger vouches for (`keys`, or every scored line's): each one's bytes must hash to
    the digest its line recorded, else EvaluationsAltered (naming the keys, never trusting any of them). A file
    no scored line names is not an evaluation of this run and is left out; a missing or unparsable one too."""
    folder = Path(harness_dir) / "evaluations"
    expected = expected_digests(entries)
    wanted = [k for k in (expected if keys is None else keys) if k in expected]
    found: dict[str, EvalResult] = {}
    altered = []
    for key in wanted:
        try:
            data = (folder / f"{key}.json").read_bytes()
        except OSError:
            continue
        if expected[key] is not None and hashlib.sha256(data).hexdigest() != expected[key]:
            altered.append(key)
            continue
        try:
            found[key] = EvalResult.model_validate_json(data)
        except ValueError as e:  # one damaged file must not lose the run's other results
            log.warning("per-item results skipped: %s is not an evaluation (%s)", folder / f"{key}.json", e)
    if altered:
        raise EvaluationsAltered(f"{folder}: {len(altered)} evaluation files do not match the digests their ledger "
                                 f"lines recorded ({', '.join(sorted(altered)[:5])}): per-item results were edited")
    return found


def read_evaluation(harness_dir: Path | str, entries: Iterable[LedgerEntry], key: str) -> EvalResult | None:
    """One evaluation the ledger vouches for (`read_evaluations`), or None (missing, unparsable or altered)."""
    try:
        return read_evaluations(harness_dir, entries, [key]).get(key)
    except EvaluationsAltered as e:
        log.warning("%s", e)
        return None


def evaluate_and_record(book: RunBook, checkpoint: Path, weights_hash: str, spec: EvalSpec, kind: str,
                        progress_file: Path | None = None, on_start: Callable[[Any], None] | None = None,
                        **fields: Any) -> tuple[LedgerEntry, EvalResult]:  # fmt: skip
    """Evaluate `checkpoint` (`evaluate_cached`), append its scored `kind` line to the ledger (`fields` plus what was
    evaluated: checkpoint, weights, split, score) and record it in the store: the run's steps' evaluations. The
    grader evaluates in its workers, with its own failure handling, and records through `RunBook.record_scored`."""
    result = evaluate_cached(checkpoint, weights_hash, spec, progress_file=progress_file, on_start=on_start)
    entry = book.record_scored(result, kind=kind, split=spec.split, resolved_path=str(checkpoint),
                               weights_hash=weights_hash, **fields)  # fmt: skip
    return entry, result


def evaluate_and_record_splits(book: RunBook, checkpoint: Path, weights_hash: str, specs: list[EvalSpec], kind: str,
                               progress_file: Path | None = None, on_start: Callable[[Any], None] | None = None,
                               results: list[EvalResult] | None = None,
                               **fields: Any) -> list[tuple[LedgerEntry, EvalResult]]:  # fmt: skip
    """`evaluate_and_record` of several splits in one evaluation process (`evaluate_cached_splits`; the caller
    checked `shares_one_process`): each split's own cache entry, scored line, rows and file, in the specs' order,
    as one call per split writes them. `results`: that evaluation's, made already (a2rl_bench.tasks.baseline_ahead)."""
    if results is None:
        results = evaluate_cached_splits(checkpoint, weights_hash, specs, progress_file=progress_file,
                                         on_start=on_start)  # fmt: skip
    return [(book.record_scored(result, kind=kind, split=spec.split, resolved_path=str(checkpoint),
                                weights_hash=weights_hash, **fields), result)
            for spec, result in zip(specs, results)]  # fmt: skip
