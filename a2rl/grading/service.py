"""The grading service of one run: accepts submissions, evaluates them in a queue, keeps the ledger.

The HTTP layer (server.py) is a thin shell over this class, so the harness's own admin actions
(baseline, final test evaluation) call it directly and are never reachable from the agent's API.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from a2rl.evaluation import EvalSpec, EvaluationFailed, evaluate_cached
from a2rl.grading.checkpoint import SubmissionRejected, check_checkpoint, resolve_in_workspace
from a2rl.grading.clock import BudgetClock
from a2rl.grading.ledger import Ledger
from a2rl.models import checkpoint_size, weights_hash
from a2rl.records import EvalResult, LedgerEntry, RunConfig, Split

Evaluate = Callable[[Path, str, EvalSpec], EvalResult]
"""(checkpoint dir, weights hash, spec) -> result; raises EvaluationFailed."""


@dataclass
class GradingContext:
    """Everything the service needs to know about its run."""

    run_id: str
    config: RunConfig
    workspace: Path
    harness_dir: Path
    baseline: dict[str, float] = field(default_factory=dict)
    """split -> base model score, computed by the harness before the session."""


class GradingService:
    def __init__(
        self,
        ctx: GradingContext,
        clock: BudgetClock,
        evaluate: Evaluate = evaluate_cached,
        on_entry: Callable[[LedgerEntry], None] | None = None,
        on_evaluation: Callable[[LedgerEntry, EvalResult], None] | None = None,
        workers: int = 1,
    ):
        self.ctx = ctx
        self.clock = clock
        self._evaluate = evaluate
        self._on_entry = on_entry or (lambda e: None)
        self._on_evaluation = on_evaluation or (lambda e, r: None)
        self.ledger = Ledger(ctx.harness_dir / "ledger.jsonl")
        self._queue: queue.Queue[LedgerEntry | None] = queue.Queue()
        self._done: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.closed = False
        self.grading_seconds = 0.0
        self._workers = [threading.Thread(target=self._work, daemon=True, name=f"grader-{i}") for i in range(workers)]
        for w in self._workers:
            w.start()

    # -- agent-facing ------------------------------------------------------------------------
    @property
    def feedback_split(self) -> Split:
        # heldout: the agent only ever sees validation scores; paper: test scores, as the original.
        return "test" if self.ctx.config.protocol == "paper" else "validation"

    def submit(self, model_path: str, wait: bool = False, timeout_s: float = 3600) -> dict:
        if self.closed:
            raise SubmissionRejected("the session is over: no more submissions are accepted", 403)
        with self._lock:
            used = len(self.submissions())
            if used >= self.ctx.config.max_submissions:
                raise SubmissionRejected(
                    f"submission cap reached ({self.ctx.config.max_submissions} per run)", 429
                )
            resolved = resolve_in_workspace(self.ctx.workspace, model_path)
            facts = check_checkpoint(resolved)
            entry = self._append(
                kind="submission",
                submission_id=used + 1,
                model_path=model_path,
                resolved_path=str(resolved),
                weights_hash=weights_hash(resolved),
                size_bytes=facts["size_bytes"],
                split=self.feedback_split,
                status="queued",
                agent_elapsed_s=round(self.clock.elapsed(), 3),
            )
            self._done[entry.submission_id] = threading.Event()
        self._queue.put(entry)
        if wait:
            self._done[entry.submission_id].wait(timeout_s)
        return self.response(entry.submission_id)

    def budget(self) -> dict:
        return {
            "budget_s": self.clock.budget_s,
            "elapsed_s": round(self.clock.elapsed(), 3),
            "remaining_s": round(self.clock.remaining(), 3),
            "grading_paused": self.clock.is_paused,
            "submissions_used": len(self.submissions()),
            "max_submissions": self.ctx.config.max_submissions,
        }

    def submissions(self) -> list[LedgerEntry]:
        """Latest state of each submission, in submission order."""
        latest: dict[int, LedgerEntry] = {}
        for e in self.ledger.entries():
            if e.kind == "submission" and e.submission_id is not None:
                latest[e.submission_id] = e
        return [latest[k] for k in sorted(latest)]

    def best(self) -> LedgerEntry | None:
        scored = [e for e in self.submissions() if e.status == "scored" and e.score is not None]
        # Ties go to the earliest submission, as in the original.
        return max(scored, key=lambda e: (e.score, -e.submission_id)) if scored else None

    def response(self, submission_id: int) -> dict:
        """A submission in the original grader's response shape, plus our fields."""
        subs = {e.submission_id: e for e in self.submissions()}
        if submission_id not in subs:
            raise SubmissionRejected(f"no submission {submission_id}", 404)
        e = subs[submission_id]
        base = self.ctx.baseline.get(self.feedback_split)
        best = self.best()
        return {
            "submission_id": e.submission_id,
            "timestamp": e.at.isoformat(),
            "model_path": e.model_path,
            "status": e.status,
            "split": e.split,
            "score": e.score,
            "cached": e.cached,
            "baseline_score": base,
            "improvement": round(e.score - base, 6) if e.score is not None and base is not None else None,
            "elapsed_seconds": e.eval_seconds,
            "error": e.error,
            "best": _public(best) if best else None,
            "total_submissions": len(subs),
        }

    # -- harness-facing ------------------------------------------------------------------------
    def record_event(self, name: str, **detail) -> LedgerEntry:
        return self._append(kind="event", detail={"event": name, **detail})

    def close(self, drain_timeout_s: float = 3600) -> None:
        """Stop accepting submissions and wait for queued evaluations to finish."""
        self.closed = True
        deadline = time.monotonic() + drain_timeout_s
        for ev in list(self._done.values()):
            ev.wait(max(0.0, deadline - time.monotonic()))
        for _ in self._workers:
            self._queue.put(None)

    # -- internals ---------------------------------------------------------------------------
    def _append(self, **fields) -> LedgerEntry:
        entry = self.ledger.append(run_id=self.ctx.run_id, **fields)
        self._on_entry(entry)
        return entry

    def _work(self) -> None:
        while (entry := self._queue.get()) is not None:
            try:
                self._grade(entry)
            finally:
                self._done[entry.submission_id].set()

    def _grade(self, queued: LedgerEntry) -> None:
        fields = queued.model_dump(exclude={"seq", "at", "prev_hash", "status", "kind", "run_id"})
        spec = EvalSpec(
            task=self.ctx.config.task,
            variant=self.ctx.config.variant,
            split=queued.split,
            limit=self.ctx.config.val_limit if queued.split == "validation" else self.ctx.config.test_limit,
            batch_size=self.ctx.config.eval_batch_size,
            backend=self.ctx.config.eval_backend,
        )
        self.clock.pause()
        start = time.monotonic()
        try:
            result = self._evaluate(Path(queued.resolved_path), queued.weights_hash, spec)
        except (EvaluationFailed, OSError, ValueError) as e:
            # A failed evaluation is recorded as an error and never counted as a score.
            fields.update(status="error", error=str(e)[-2000:], eval_seconds=round(time.monotonic() - start, 3))
            self._append(kind="submission", **fields)
            return
        finally:
            self.clock.resume()
            self.grading_seconds += time.monotonic() - start
        fields.update(status="scored", score=result.score, cached=result.cached, eval_seconds=round(result.duration_s, 3))
        entry = self._append(kind="submission", **fields)
        self._on_evaluation(entry, result)


def _public(e: LedgerEntry) -> dict:
    return {
        "submission_id": e.submission_id,
        "model_path": e.model_path,
        "score": e.score,
        "split": e.split,
        "timestamp": e.at.isoformat(),
    }
