"""What the agent may learn when something fails: harness-written text only.

A refused submission answers with a short message the grader wrote about the agent's own request or files.
A failed evaluation ran over hidden items, so its raw text (stderr, exception messages) could carry them out
(a chat template that raises with the prompt, a config that makes a loader quote its input): the agent gets
one fixed category, the full text goes to the harness log only.
"""

from __future__ import annotations

from a2rl_bench.inference.failures import PUBLIC_REASONS, FailureKind, classify_failure

__all__ = ["PUBLIC_REASONS", "FailureKind", "SubmissionRejected", "classify_failure", "public_failure"]


class SubmissionRejected(ValueError):
    """A submission that cannot be evaluated; `status_code` is the HTTP status to answer with."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code


def public_failure(exc: BaseException) -> str:
    """The agent-facing reason for an evaluation that raised `exc`."""
    kind = getattr(exc, "kind", None)
    if kind in {k.value for k in FailureKind}:
        return FailureKind(kind).reason
    if isinstance(exc, MemoryError):
        return FailureKind.OOM.reason
    return FailureKind.CRASH.reason  # in-process errors (OSError, ValueError) are the harness's, not the weights'

