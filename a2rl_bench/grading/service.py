"""The grading service of one run: accepts submissions, evaluates them in a queue, keeps the ledger.

The HTTP layer (server.py) is a thin shell over this class, so the harness's own admin actions
(baseline, final test evaluation) call library functions directly and are never reachable from the
agent's API. What is graded is a snapshot taken when the submission arrives: the agent cannot change a
checkpoint after submitting it. A service started on an existing ledger resumes the evaluations that a
crash interrupted.
"""

from __future__ import annotations

import json
import logging
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2rl_bench.contracts import BenchmarkTask
from a2rl_bench.inference.evaluation import EvalCache, EvalSpec, EvaluationFailed, evaluate_cached
from a2rl_bench.ops.progress import GRADING_PROGRESS_FILE
from a2rl_bench.grading.checkpoint import (
    SNAPSHOT_QUOTA_BYTES,
    CheckedCheckpoint,
    allocated_bytes,
    check_checkpoint,
    check_compatible,
    open_checkpoint,
    snapshot_base_files,
    write_snapshot,
)
from a2rl_bench.grading.clock import BudgetClock
from a2rl_bench.grading.errors import FailureKind, SubmissionRejected, public_failure
from a2rl_bench.grading.files import Deadline
from a2rl_bench.grading.record import RunBook, RunStore
from a2rl_bench.protocol.feedback import feedback_split
from a2rl_bench.protocol.picking import best_submission, latest_submissions
from a2rl_bench.grading.route_audit import GRADER_LIMITS, RouteScanner, check_snapshot
from a2rl_bench.base_models.hashing import weights_hash
from a2rl_bench.records import EvalResult, LedgerEntry, RunConfig, Split
from a2rl_bench.safetext import terminal

log = logging.getLogger("a2rl_bench.grading")
MAX_PARALLEL_COPIES = 2
MAX_FINAL_PICKS = 100
"""Changes of the declared final pick per run (each is a ledger line): an agent calling /final in a loop
cannot grow the ledger and its anchors without bound."""

Evaluate = Callable[..., EvalResult]
"""(checkpoint dir, weights hash, spec, device=...) -> result; raises EvaluationFailed."""


@dataclass
class GradingContext:
    """Everything the service needs to know about its run."""

    run_id: str
    config: RunConfig
    workspace: Path
    harness_dir: Path
    baseline: dict[str, float] = field(default_factory=dict)
    """split -> base model score, computed by the harness before the session."""
    base_model_dir: Path | None = None
    """Submissions must match its architecture and vocabulary, and its tokenizer, chat template and generation
    config (copied to harness/base-tokenizer) render every prompt. Without it (tests with a stand-in evaluator)
    snapshots carry no tokenizer at all: never a submission's."""
    devices: list[str | None] = field(default_factory=lambda: [None])
    """One evaluation worker per entry; "0", "1", ... pin a worker to a GPU, None = default device."""
    store: RunStore | None = None
    """The run's results store (`a2rl_bench.store.results.ResultsStore`): every ledger head is anchored there and every
    line and evaluation recorded (`a2rl_bench.grading.record.RunBook`); None: the ledger and evaluation files only."""
    task: BenchmarkTask | None = None
    """The task object `config.task` names (`a2rl_bench.benchmarks.get_task`), resolved by whoever starts the service;
    needed by the real evaluator (`evaluate_cached`), not by a test's own."""
    on_process: Callable[[Any], None] | None = None
    """Told every evaluation process as it starts (`a2rl_bench.isolation.procs.Started`: pid and start time), e.g. to
    record it in the run's attempt record; passed to the evaluator as `on_start` (only when set)."""
    snapshot_quota_bytes: int = SNAPSHOT_QUOTA_BYTES
    """Bytes the submissions' snapshots (`harness/snapshots/`) may write over the run, counted as written (sparse
    files copied sparsely); a submission that would pass it is refused (507) and the refusal is on the ledger."""


def grading_devices(workers: int) -> list[str | None]:
    """One entry per evaluation worker: GPUs round-robin where CUDA is visible, else the CPU."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g for g in visible.split(",") if g.strip()]
    else:
        try:
            import torch

            gpus = [str(i) for i in range(torch.cuda.device_count())]
        except ImportError:
            gpus = []
    return [gpus[i % len(gpus)] for i in range(workers)] if gpus else [None] * workers


class GradingService:
    def __init__(
        self,
        ctx: GradingContext,
        clock: BudgetClock,
        evaluate: Evaluate = evaluate_cached,
        on_entry: Callable[[LedgerEntry], None] | None = None,
    ):
        """`on_entry` hears of every ledger line once it is recorded (the run's code snapshot, its log)."""
        if evaluate is evaluate_cached and ctx.task is None:
            raise ValueError(f"GradingContext.task is not set: resolve {ctx.config.task!r} to its task object first")
        self.ctx = ctx
        self.clock = clock
        self._evaluate = evaluate
        self._on_entry = on_entry or (lambda e: None)
        self.book = RunBook(ctx.run_id, ctx.harness_dir, ctx.store)
        self.ledger = self.book.ledger
        self.snapshots = ctx.harness_dir / "snapshots"
        # The base model's tokenizer, chat template and generation config, copied once into the harness dir:
        # every snapshot renders prompts with these, never with files a submission brings.
        self.base_files = (snapshot_base_files(ctx.base_model_dir, ctx.harness_dir / "base-tokenizer")
                           if ctx.base_model_dir else None)  # fmt: skip
        self._cache = EvalCache()
        self._queue: queue.Queue[LedgerEntry | None] = queue.Queue()
        self._done: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._copy_lock = threading.Lock()
        self._copies = 0  # checkpoints being checked (and copied) right now, outside self._lock
        self._snapshot_bytes = allocated_bytes(self.snapshots)  # under _copy_lock; what earlier sessions wrote too
        self._pending_bytes: dict[Path, int] = {}  # bytes charged for each pending copy, refunded if discarded
        self._routes = RouteScanner(GRADER_LIMITS)  # bounded, and incremental between submissions
        self._route_lock = threading.Lock()
        self.closed = False
        self.closing = threading.Event()
        self.grading_seconds = 0.0
        self._workers = [
            threading.Thread(target=self._work, args=(device,), daemon=True, name=f"grader-{i}")
            for i, device in enumerate(ctx.devices or [None])
        ]
        self._recover()
        for w in self._workers:
            w.start()

    # -- agent-facing ------------------------------------------------------------------------
    @property
    def feedback_split(self) -> Split:
        return feedback_split(self.ctx.config.protocol)

    def validate(self, model_path: str) -> dict:
        """All checks a submission gets, without spending an evaluation or a submission; under the same limit of
        checks at once as submissions (each holds a header or a config in memory while it runs)."""
        with self._check_slot(MAX_PARALLEL_COPIES):
            checked = self._checked(model_path, Deadline())
            checked.close()
        return {"ok": True, "model_path": model_path, **checked.facts}

    def _check_mode(self) -> dict:
        """Route label of the agent's code now, and whether it keeps to the run's mode; in strict mode a
        breach is refused (before it counts as a submission), otherwise it is flagged in the ledger."""
        with self._route_lock:  # one scan at a time over the one cache
            analysis, verdict = check_snapshot(self.ctx.workspace / "code", self.ctx.config.mode, scanner=self._routes)
        if not verdict.ok and self.ctx.config.strict_mode:
            raise SubmissionRejected(verdict.message, 403)
        return {"route": analysis.label, "mode_ok": verdict.ok, "mode_message": verdict.message,
                **({} if analysis.complete else {"route_complete": False})}  # fmt: skip

    def _checked(self, model_path: str, deadline: Deadline) -> CheckedCheckpoint:
        """Open the checkpoint by fd (no links followed) and run every check; the caller closes it."""
        ckpt = open_checkpoint(self.ctx.workspace, model_path)
        try:
            checked = check_checkpoint(ckpt, self.ctx.config.max_checkpoint_bytes, deadline)
            if self.ctx.base_model_dir:
                check_compatible(checked, self.ctx.base_model_dir, deadline)
        except BaseException:
            ckpt.close()
            raise
        return checked

    def _checked_copy(self, model_path: str) -> tuple[Path, dict]:
        """Check the checkpoint and copy it into a pending snapshot, from the very fds that were checked.
        Runs outside the service lock: a slow or hostile checkpoint never holds up other requests. At most
        MAX_PARALLEL_COPIES run at once, and never more than the submissions left: a burst of concurrent
        submits of a large checkpoint cannot fill the harness disk with copies that the cap then refuses."""
        left = self.ctx.config.max_submissions - len(self.submissions())
        with self._check_slot(min(MAX_PARALLEL_COPIES, left)):
            return self._check_and_copy(model_path)

    @contextmanager
    def _check_slot(self, limit: int) -> Iterator[None]:
        """One of the checks (validate or submit) allowed at once; 429 when `limit` already run."""
        with self._copy_lock:  # held for the count only
            if self._copies >= limit:
                raise SubmissionRejected("another checkpoint is still being checked: retry when it is answered "
                                         "(or the submission cap is reached)", 429)  # fmt: skip
            self._copies += 1
        try:
            yield
        finally:
            with self._copy_lock:
                self._copies -= 1

    def _check_and_copy(self, model_path: str) -> tuple[Path, dict]:
        deadline = Deadline()
        checked = self._checked(model_path, deadline)
        pending = self.snapshots / f".pending-{uuid.uuid4().hex}"
        charged = [0]

        def charge(n: int) -> None:
            self._charge_snapshot(n, charged[0])
            charged[0] += n

        try:
            write_snapshot(checked, pending, self.base_files, deadline, charge=charge)
        except BaseException:
            shutil.rmtree(pending, ignore_errors=True)
            self._refund_snapshot(charged[0])
            raise
        finally:
            checked.close()
        self._pending_bytes[pending] = charged[0]
        return pending, checked.facts

    def _charge_snapshot(self, n: int, so_far: int) -> None:
        """`n` more bytes of a snapshot being written (`so_far` already): within the run's snapshot quota, or
        refused, with the refusal on the ledger."""
        quota = self.ctx.snapshot_quota_bytes
        with self._copy_lock:
            if self._snapshot_bytes + n <= quota:
                self._snapshot_bytes += n
                return
            used = self._snapshot_bytes - so_far
        self.record_event("snapshot-quota-refused", quota_bytes=quota, used_bytes=used, needed_bytes=so_far + n)
        raise SubmissionRejected(
            f"the harness's disk for submission snapshots is used up: {used / 1e9:.2f} of {quota / 1e9:.2f} GB "
            f"written by earlier submissions, and this checkpoint needs over {(so_far + n) / 1e9:.2f} GB more "
            "(its data, holes not counted); nothing was spent", 507)  # fmt: skip

    def _refund_snapshot(self, n: int) -> None:
        with self._copy_lock:
            self._snapshot_bytes -= n

    def _discard(self, pending: Path) -> None:
        """A pending copy that did not become a submission's snapshot: removed, its bytes given back."""
        charged = self._pending_bytes.pop(pending, 0)
        if pending.exists():
            shutil.rmtree(pending, ignore_errors=True)
            self._refund_snapshot(charged)

    def submit(self, model_path: str, wait: bool = False, timeout_s: float = 6 * 3600, stage: str | None = None,
               parent: int | None = None) -> dict:  # fmt: skip
        if self.closed:  # fail fast; the authoritative check is under the lock below
            raise SubmissionRejected("the session is over: no more submissions are accepted", 403)
        if len(self.submissions()) >= self.ctx.config.max_submissions:
            raise SubmissionRejected(f"submission cap reached ({self.ctx.config.max_submissions} per run)", 429)
        pending, facts = self._checked_copy(model_path)
        try:
            route = self._check_mode()
            whash = weights_hash(pending)
            with self._lock:
                # Checked under the lock that close() takes: a submission is either accepted before the session
                # closes (and then graded before close() returns) or refused with this answer, never lost.
                if self.closed:
                    raise SubmissionRejected("the session is over: no more submissions are accepted", 403)
                used = len(self.submissions())
                if used >= self.ctx.config.max_submissions:
                    raise SubmissionRejected(f"submission cap reached ({self.ctx.config.max_submissions} per run)", 429)
                submission_id = used + 1
                if parent is not None and not 1 <= parent < submission_id:
                    raise SubmissionRejected(f"parent {parent} is no earlier submission of this run (it has {used}): "
                                             "name the submission whose checkpoint this one's training started from",
                                             400)  # fmt: skip
                snapshot = self._snapshot(pending, submission_id)
                # From its arrival until its grade is recorded the clock is paused (one pause per submission,
                # released by whoever records its outcome): what the harness does for it meanwhile (its code
                # snapshot, the queue, the evaluation) is never the agent's time, and `agent_elapsed_s` below is
                # exactly where the agent's clock stopped.
                self.clock.pause()
                handed_over = False
                try:
                    entry = self._append(
                        kind="submission", submission_id=submission_id, model_path=model_path,
                        resolved_path=str(snapshot), weights_hash=whash, size_bytes=facts["size_bytes"],
                        split=self.feedback_split, status="queued", agent_elapsed_s=round(self.clock.elapsed(), 3),
                        detail={"workspace_path": str(self.ctx.workspace / model_path), **route,
                                **({"stage": stage} if stage else {}),
                                **({"parent": parent} if parent is not None else {})},
                    )  # fmt: skip
                    self._done[submission_id] = threading.Event()
                    hit = self._cache.lookup(whash, self._spec(entry.split))
                    if hit is None:  # queued under the lock: before close() can send the workers their stop marks
                        self._queue.put(entry)
                    handed_over = True
                finally:
                    if not handed_over:
                        self.clock.resume()
        finally:
            self._discard(pending)
        if hit is not None:  # identical weights, same evaluator: answered at once, still on the ledger
            release = self._release_once()
            try:
                self._finish(entry, hit, release)
            finally:
                release()
        if wait:
            self._done[submission_id].wait(timeout_s)
        return self.response(submission_id)

    def declare_final(self, submission_id: int) -> dict:
        """The agent's declared final pick (heldout protocol): evaluated on the hidden test set after the session."""
        subs = {e.submission_id: e for e in self.submissions()}
        if submission_id not in subs:
            raise SubmissionRejected(f"no submission {submission_id}", 404)
        if subs[submission_id].status == "error":
            raise SubmissionRejected(f"submission {submission_id} failed grading and cannot be the final pick", 409)
        with self._lock:  # every pick is a ledger line (fsynced, anchored): only changes count, and few of them
            picks = [e.detail.get("submission_id") for e in self.ledger.entries() if e.detail.get("event") == "final-pick"]
            if picks and picks[-1] == submission_id:
                return {"final_submission_id": submission_id}
            if len(picks) >= MAX_FINAL_PICKS:
                raise SubmissionRejected(f"the final pick was changed {MAX_FINAL_PICKS} times: it stays "
                                         f"{picks[-1]}", 429)  # fmt: skip
            self.record_event("final-pick", submission_id=submission_id)
        return {"final_submission_id": submission_id}

    def budget(self) -> dict:
        return {
            "budget_s": self.clock.budget_s,
            "elapsed_s": round(self.clock.elapsed(), 3),
            "remaining_s": round(self.clock.remaining(), 3),
            "grading_paused": self.clock.is_paused,
            "grading_s": round(self.clock.paused_seconds(), 3),
            "submissions_used": len(self.submissions()),
            "max_submissions": self.ctx.config.max_submissions,
        }

    def submissions(self) -> list[LedgerEntry]:
        """Latest state of each submission, in submission order."""
        return latest_submissions(self.ledger.entries())

    def best(self) -> LedgerEntry | None:
        """The best scored submission on the feedback split (ties: the earliest, as in the original)."""
        return best_submission(self.ledger.entries(), self.feedback_split)

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

    def close(self, drain_timeout_s: float = 6 * 3600) -> None:
        """Stop accepting submissions and wait for every accepted one to be graded.

        `closing` is set first (a submission being accepted right now finishes, one after is refused); then
        `closed` and the list to wait for are taken under the submission lock, so nothing accepted is missed."""
        self.closing.set()
        with self._lock:
            self.closed = True
            pending = list(self._done.values())
        deadline = time.monotonic() + drain_timeout_s
        for ev in pending:
            ev.wait(max(0.0, deadline - time.monotonic()))
        for _ in self._workers:
            self._queue.put(None)

    # -- internals ---------------------------------------------------------------------------
    def _spec(self, split: Split) -> EvalSpec:
        return EvalSpec.for_run(self.ctx.config, split, self.ctx.task)

    def _snapshot(self, pending: Path, submission_id: int) -> Path:
        """Give a checked copy its submission's name: what was submitted is what is graded."""
        dst = self.snapshots / f"s{submission_id}"
        if dst.exists():
            shutil.rmtree(dst)
        pending.rename(dst)
        return dst

    def _recover(self) -> None:
        """Re-queue submissions a crash left without an outcome (their snapshot is still on disk)."""
        for e in self.submissions():
            if e.status not in ("queued", "running"):
                continue
            self._done[e.submission_id] = threading.Event()
            if e.resolved_path and Path(e.resolved_path).exists():
                self.record_event("evaluation-resumed", submission_id=e.submission_id)
                self.clock.pause()  # released once it is graded, as for a new submission
                self._queue.put(e)
            else:
                self._record_failure(e, FailureKind.INTERRUPTED.reason, 0.0, "snapshot missing after a grader crash")

    def _append(self, **fields) -> LedgerEntry:
        entry = self.book.append(**fields)  # `on_durable` may be among `fields`: see `_release_once`
        self._on_entry(entry)
        return entry

    def _work(self, device: str | None) -> None:
        while (entry := self._queue.get()) is not None:
            try:
                self._grade(entry, device)
            except Exception:  # noqa: BLE001 - recording failed (a full disk, a broken store): the next is graded
                log.exception("submission %s: its outcome could not be recorded in full", entry.submission_id)
            finally:
                self._done[entry.submission_id].set()

    def _grade(self, queued: LedgerEntry, device: str | None) -> None:
        """Evaluate one queued submission; the clock, paused since it arrived, runs again once its outcome is on
        the ledger (a crash before that leaves it stopped where the queued line says)."""
        release = self._release_once()
        start = time.monotonic()
        try:
            try:
                extra = {"on_start": self.ctx.on_process} if self.ctx.on_process else {}
                if self._evaluate is evaluate_cached:  # items counted as they finish, where the display reads them
                    extra["progress_file"] = self.ctx.harness_dir / GRADING_PROGRESS_FILE
                result = self._evaluate(Path(queued.resolved_path), queued.weights_hash, self._spec(queued.split),
                                        device=device, **extra)
            except (EvaluationFailed, OSError, ValueError, MemoryError) as e:
                # A failed evaluation is recorded as an error and never counted as a score. Its text ran over
                # hidden items: the agent gets a fixed category, the full text goes to the harness log only.
                seconds = time.monotonic() - start
                self._record_failure(queued, public_failure(e), seconds, f"{type(e).__name__}: {e}", release)
                return
            finally:
                self.grading_seconds += time.monotonic() - start
            self._finish(queued, result, release)
        finally:
            release()  # where recording the outcome failed: the clock runs again all the same

    def _release_once(self) -> Callable[..., None]:
        """The resume of one submission's pause, whoever calls it first (the outcome's line once it is durable,
        else a `finally`): a second resume would release another submission's pause."""
        released = threading.Event()

        def release(*_entry: LedgerEntry) -> None:
            if not released.is_set():
                released.set()
                self.clock.resume()

        return release

    def _finish(self, queued: LedgerEntry, result: EvalResult, release: Callable[..., None]) -> None:
        self._on_entry(self.book.record_scored(result, on_durable=release, kind="submission", **_carry(queued)))
        if queued.submission_id in self._done:
            self._done[queued.submission_id].set()

    def _record_failure(self, queued: LedgerEntry, public_reason: str, seconds: float, full_text: str,
                        release: Callable[..., None] | None = None) -> None:  # fmt: skip
        """`public_reason` is harness-written (agent-visible); `full_text` goes to the harness log only."""
        log.warning("submission %s evaluation failed: %s", queued.submission_id, terminal(full_text, 8000, keep_lines=True))
        with (self.ctx.harness_dir / "evaluation-errors.jsonl").open("a") as f:
            f.write(json.dumps({"at": time.time(), "submission_id": queued.submission_id, "error": full_text}) + "\n")
        fields = _carry(queued)
        fields.update(status="error", error=public_reason, eval_seconds=round(seconds, 3))
        self._append(kind="submission", on_durable=release, **fields)
        if queued.submission_id in self._done:
            self._done[queued.submission_id].set()


def _carry(queued: LedgerEntry) -> dict:
    return queued.model_dump(exclude={"seq", "at", "prev_hash", "status", "kind", "run_id"})


def _public(e: LedgerEntry) -> dict:
    return {
        "submission_id": e.submission_id,
        "model_path": e.model_path,
        "score": e.score,
        "split": e.split,
        "timestamp": e.at.isoformat(),
    }
