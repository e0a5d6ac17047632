"""End of a session and resume: no submission is lost at close, and the agent's clock only moves forward.

Deterministic: the interleavings are forced with events, never with sleeps that race."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from a2rl_bench.inference.evaluation import EvalSpec
from a2rl_bench.grading import BudgetClock, GradingContext, GradingService, Ledger
from a2rl_bench.grading.checkpoint import SubmissionRejected
from a2rl_bench.base_models.hashing import weights_hash
from a2rl_bench.records import EvalResult, LedgerEntry, RunConfig

WAIT_S = 30  # an upper bound for a step that should take milliseconds; reaching it fails the test


def gated_evaluator(score: float, started: threading.Event, release: threading.Event):
    """A grader whose evaluation starts, says so, and ends only when the test releases it."""

    def evaluate(model_dir: Path, whash: str, spec: EvalSpec, device=None) -> EvalResult:
        started.set()
        assert release.wait(WAIT_S), "the test never released the evaluation"
        return EvalResult(task=spec.task, split=spec.split, score=score, n=4, n_correct=2, evaluator_id="gated",
                          weights_hash=whash)  # fmt: skip

    return evaluate


@pytest.fixture
def workspace(tmp_path, tiny_model_dir) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, ws / "output" / "v1")
    return ws


def test_a_submission_accepted_while_the_session_closes_is_graded_before_close_returns(tmp_path, workspace):
    started, release = threading.Event(), threading.Event()
    service: GradingService

    def on_entry(entry: LedgerEntry) -> None:
        # Inside submit(), after the submission is accepted: hold it here until close() has begun.
        if entry.kind == "submission" and entry.status == "queued":
            assert service.closing.wait(WAIT_S)

    ctx = GradingContext("run-close", RunConfig(), workspace, tmp_path / "harness", baseline={"validation": 10.0})
    service = GradingService(ctx, BudgetClock(60), evaluate=gated_evaluator(40.0, started, release),
                             on_entry=on_entry)  # fmt: skip
    answers: dict[str, object] = {}
    submitter = threading.Thread(target=lambda: answers.update(sub=service.submit("output/v1")))
    submitter.start()
    closer = threading.Thread(target=lambda: (service.close(drain_timeout_s=WAIT_S), answers.update(closed=True)))
    assert _wait_until(lambda: service._lock.locked())  # the submission is being accepted
    closer.start()
    submitter.join(WAIT_S)
    assert answers["sub"]["status"] == "queued"  # accepted before the close took effect
    assert started.wait(WAIT_S)
    assert "closed" not in answers  # close() waits for the evaluation of what it accepted
    release.set()
    closer.join(WAIT_S)
    assert answers.get("closed")
    final = {e.submission_id: e for e in service.submissions()}
    assert final[1].status == "scored" and final[1].score == 40.0
    with pytest.raises(SubmissionRejected, match="session is over") as refused:
        service.submit("output/v1")
    assert refused.value.status_code == 403
    assert [e.status for e in service.submissions()] == ["scored"]  # the refused one left no row


def test_budget_clock_only_moves_forward_around_start_and_stop():
    clock = BudgetClock(90, already_used_s=50.0)
    clock.pause()  # a resumed run re-grades a pending submission before the agent restarts
    assert clock.elapsed() == 50.0
    clock.start()
    assert clock.elapsed() == 50.0  # still paused
    clock.resume()
    seen = [clock.elapsed()]
    clock.stop()
    seen.append(clock.elapsed())
    clock.pause()  # the final drain grades after the agent stopped
    clock.resume()
    seen.append(clock.elapsed())
    assert 50.0 <= seen[0] <= seen[1] == seen[2]
    assert clock.remaining() <= 40.0


def test_a_resumed_run_with_a_pending_submission_keeps_a_monotone_clock(tmp_path, workspace):
    """The crash left submission 1 queued with its snapshot; the resumed service re-grades it at once, before
    the agent's clock starts. The agent is then told a time ≥ what it had used, and later submissions carry
    larger agent times than earlier ones."""
    harness = tmp_path / "harness"
    snapshot = harness / "snapshots" / "s1"
    shutil.copytree(workspace / "output" / "v1", snapshot)
    Ledger(harness / "ledger.jsonl").append(
        run_id="run-resume", kind="submission", submission_id=1, model_path="output/v1", resolved_path=str(snapshot),
        weights_hash=weights_hash(snapshot), split="validation", status="queued", agent_elapsed_s=40.0,
    )  # fmt: skip
    started, release = threading.Event(), threading.Event()
    clock = BudgetClock(90, already_used_s=48.0)  # restored from clock.json before the service exists
    ctx = GradingContext("run-resume", RunConfig(budget_s=90), workspace, harness, baseline={"validation": 10.0})
    service = GradingService(ctx, clock, evaluate=gated_evaluator(30.0, started, release))
    try:
        assert started.wait(WAIT_S)  # re-grading submission 1, the clock paused
        threading.Event().wait(0.3)  # the agent takes a moment to restart (not a race: any length must pass)
        clock.start()  # the agent restarts while the evaluation runs
        told = service.budget()
        assert told["elapsed_s"] >= 48.0 and told["remaining_s"] <= 42.0
        release.set()
        assert service._done[1].wait(WAIT_S)
        assert service.budget()["elapsed_s"] >= told["elapsed_s"]
        second = service.submit("output/v1", wait=True, timeout_s=WAIT_S)
        times = [e.agent_elapsed_s for e in service.submissions()]
        assert second["submission_id"] == 2 and times[0] <= 48.0 <= times[1]
        assert [e.status for e in service.submissions()] == ["scored", "scored"]
    finally:
        release.set()
        service.close(drain_timeout_s=WAIT_S)


def _wait_until(predicate, timeout_s: float = WAIT_S) -> bool:
    done = threading.Event()
    for _ in range(int(timeout_s * 100)):
        if predicate():
            return True
        done.wait(0.01)
    return False
