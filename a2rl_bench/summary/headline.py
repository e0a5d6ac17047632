"""A run's headline numbers — the final score among them — computed in one place, from the ledger's raw scores.

The final score of a run is `headline(entries, protocol).final_test`: the hidden-test score of the final pick
(`a2rl_bench.protocol.picking.final_pick`, evaluated by the `evaluate-final` step), and `delta_test` is that score less
the base model's, derived here from the stored raw scores, never taken from a stored difference. The run summary
(`RunSummary`), report.json / report.md, the results store's run row and the process metrics all take these
numbers from here.
"""

from __future__ import annotations

from pydantic import BaseModel

from a2rl_bench.protocol.breaches import mode_breaches
from a2rl_bench.protocol.feedback import feedback_split
from a2rl_bench.protocol.picking import best_submission, final_entry, latest_submissions
from a2rl_bench.records import LedgerEntry, Protocol, RunSummary


class Headline(BaseModel):
    """The numbers a run is reported by (the `RunSummary` fields of the same names)."""

    baseline_val: float | None
    baseline_test: float | None
    best_val: float | None
    """The best validation score the agent saw (None under `paper`, where feedback was on the test set)."""
    best_submission_id: int | None
    final_submission_id: int | None
    """None: the base model stands (no scored submission)."""
    final_test: float | None
    """The run's final score: the final pick's hidden-test score."""
    delta_test: float | None
    """final_test − baseline_test."""
    n_submissions: int
    n_scored: int
    mode_breaches: int


SCORES = ("baseline_val", "baseline_test", "best_val", "best_submission_id", "final_submission_id", "final_test",
          "delta_test")  # fmt: skip
"""The headline fields that are scores of the ledger (withheld where the ledger does not verify)."""


def baseline_scores(entries: list[LedgerEntry]) -> dict[str, float]:
    """The base model's score per split."""
    return {e.split: e.score for e in entries if e.kind == "baseline" and e.score is not None and e.split}


def delta(final: float | None, base: float | None) -> float | None:
    """A gain over the base model, from two raw scores (None where either is missing)."""
    return round(final - base, 6) if final is not None and base is not None else None


def headline(entries: list[LedgerEntry], protocol: Protocol | str) -> Headline:
    """The run's headline numbers from its ledger (see the module docstring)."""
    base = baseline_scores(entries)
    subs = latest_submissions(entries)
    split = feedback_split(protocol)
    best = best_submission(entries, split)
    final = final_entry(entries)
    final_test = final.score if final else None
    return Headline(
        baseline_val=base.get("validation"),
        baseline_test=base.get("test"),
        best_val=best.score if best and split == "validation" else None,
        best_submission_id=best.submission_id if best else None,
        final_submission_id=final.submission_id if final else None,
        final_test=final_test,
        delta_test=delta(final_test, base.get("test")),
        n_submissions=len(subs),
        n_scored=sum(e.status == "scored" for e in subs),
        mode_breaches=len(mode_breaches(entries)),
    )


def numbers_disagree(summary: RunSummary, entries: list[LedgerEntry]) -> list[str]:
    """Where a report's summary says otherwise than its ledger (a report edited apart from its ledger)."""
    return [f"{k}: the report says {getattr(summary, k)!r}, the ledger {v!r}"
            for k, v in headline(entries, summary.protocol).model_dump().items() if getattr(summary, k) != v]  # fmt: skip
