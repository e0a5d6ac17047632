"""Which split's scores the agent sees under a protocol: the one rule of what gives feedback."""

from __future__ import annotations

from a2rl_bench.records import Protocol, Split


def feedback_split(protocol: Protocol | str) -> Split:
    """heldout: the agent only ever sees validation scores (the hidden test is scored once, after the session);
    paper: every submission is scored on the test set, as in the original benchmark."""
    return "test" if protocol == "paper" else "validation"


def scored_on_test_in_session(protocol: Protocol | str | None) -> bool:
    """Whether the agent's submissions were scored on the test set during the session (`paper`): the final pick
    then needs no evaluation of its own, nor the submissions a post-hoc test evaluation."""
    return feedback_split(protocol or "heldout") == "test"


def split_baseline(split: str | None, baseline_val: float | None, baseline_test: float | None) -> float | None:
    """The base model's score on the split a submission was scored on (the baseline its gain is measured from)."""
    return baseline_test if split == "test" else baseline_val
