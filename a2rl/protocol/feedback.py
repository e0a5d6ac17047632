"""Which split's scores the agent sees under a protocol: the one rule of what gives feedback."""

from __future__ import annotations

from a2rl.records import Protocol, Split


def feedback_split(protocol: Protocol | str) -> Split:
    """heldout: the agent only ever sees validation scores (the hidden test is scored once, after the session);
    paper: every submission is scored on the test set, as in the original benchmark."""
    return "test" if protocol == "paper" else "validation"
