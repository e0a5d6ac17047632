"""Which submission is the best and which is the run's final pick: the protocol's selection rules, once.

A submission has several ledger lines (queued, running, scored or error); its latest line is its state. The best
is the highest score among scored submissions, a tie going to the earliest submission (as in the original). The
final pick is what the hidden-test score of a run is taken from: under `heldout` the agent's declared pick
(POST /final) if that submission was scored, else its best on validation, else the base model; under `paper` the
best test score already seen (selection on the test set, as in the original).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from a2rl_bench.protocol.feedback import feedback_split, scored_on_test_in_session
from a2rl_bench.records import LedgerEntry, Protocol

T = TypeVar("T")

PAPER_SELECTION = "max over test scores (paper protocol: selection on the test set)"
DECLARED_SELECTION = "declared by the agent (POST /final)"
BEST_SELECTION = "best on validation"
BASE_SELECTION = "no scored submission: base model"


def pick_best(candidates: Iterable[T], score: Callable[[T], float], ident: Callable[[T], int]) -> T | None:
    """The highest-scoring candidate, the earliest (lowest id) on a tie; None when there is none."""
    items = list(candidates)
    return max(items, key=lambda c: (score(c), -ident(c))) if items else None


def latest_submissions(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """Each submission's latest ledger line, in submission order."""
    latest: dict[int, LedgerEntry] = {}
    for e in entries:
        if e.kind == "submission" and e.submission_id is not None:
            latest[e.submission_id] = e
    return [latest[k] for k in sorted(latest)]


def scored_submissions(entries: list[LedgerEntry], split: str | None = None) -> list[LedgerEntry]:
    """The submissions with a score (on `split`, where given), in submission order."""
    return [e for e in latest_submissions(entries)
            if e.status == "scored" and e.score is not None and (split is None or e.split == split)]  # fmt: skip


def best_submission(entries: list[LedgerEntry], split: str) -> LedgerEntry | None:
    """The best scored submission on `split` (ties: the earliest)."""
    return pick_best(scored_submissions(entries, split), lambda e: e.score, lambda e: e.submission_id)


def final_entry(entries: list[LedgerEntry]) -> LedgerEntry | None:
    """The run's scored final evaluation (its last), None before there is one."""
    return next((e for e in reversed(entries) if e.kind == "final" and e.score is not None), None)


@dataclass(frozen=True)
class FinalPick:
    """The submission whose hidden-test score is the run's (None: the base model stands), and why."""

    entry: LedgerEntry | None
    selection: str


def final_pick(entries: list[LedgerEntry], protocol: Protocol | str) -> FinalPick:
    """The run's final pick under `protocol` (see the module docstring)."""
    if protocol == "paper":
        return FinalPick(best_submission(entries, feedback_split(protocol)), PAPER_SELECTION)
    subs = {e.submission_id: e for e in latest_submissions(entries)}
    declared = [e.detail["submission_id"] for e in entries if e.detail.get("event") == "final-pick"]
    if declared and subs.get(declared[-1]) and subs[declared[-1]].status == "scored":
        return FinalPick(subs[declared[-1]], DECLARED_SELECTION)
    best = best_submission(entries, feedback_split(protocol))
    return FinalPick(best, BEST_SELECTION if best else BASE_SELECTION)


def final_evaluation_key(protocol: Protocol | str, final: LedgerEntry) -> str:
    """The evaluation file (`harness/evaluations/<key>.json`) that holds the final pick's per-item test results:
    under `paper` the pick's own submission evaluation (the final is not evaluated again), else the final's."""
    return f"{'submission' if protocol == 'paper' else 'final'}-{final.submission_id or 0}-test"


def best_so_far(scores: Sequence[float | None]) -> list[float | None]:
    """The best score seen after each submission, in submission order (None until the first score)."""
    out: list[float | None] = []
    running: float | None = None
    for score in scores:
        if score is not None:
            running = score if running is None else max(running, score)
        out.append(running)
    return out


def gain_over_base(score: float | None, baseline: float | None) -> float:
    """The improvement a best score makes on the base model: the base model is always a candidate (it stands when
    nothing better was submitted), so the gain is never below 0, and 0 where either number is missing."""
    return 0.0 if score is None or baseline is None else max(score - baseline, 0.0)


def final_test_evaluation(protocol: Protocol | str | None, final_submission_id: int | None,
                          evaluations: Iterable[tuple[str, int | None, str | None, str]]) -> str | None:
    """The stored evaluation (its key) that holds the final pick's hidden-test results, from a run's evaluations as
    (kind, submission_id, split, eval_key): its final evaluation, or under `paper` the picked submission's own test
    evaluation (the final is not evaluated again); the first key on a tie, None without one."""
    keys = [(kind != "final", key) for kind, sub, split, key in evaluations
            if split == "test" and (kind == "final" or (kind == "submission" and scored_on_test_in_session(protocol)
                                                        and sub is not None and sub == final_submission_id))]
    return min(keys)[1] if keys else None


def baseline_test_evaluation(evaluations: Iterable[tuple[str, int | None, str | None, str]]) -> str | None:
    """The base model's hidden-test evaluation (its key) the final pick's items are paired with: the first key of
    the run's baseline test evaluations, as (kind, submission_id, split, eval_key); None without one."""
    return min((key for kind, _, split, key in evaluations if kind == "baseline" and split == "test"), default=None)
