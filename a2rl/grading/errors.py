"""What the agent may learn when something fails: harness-written text only.

A refused submission answers with a short message the grader wrote about the agent's own request or files.
A failed evaluation ran over hidden items, so its raw text (stderr, exception messages) could carry them out
(a chat template that raises with the prompt, a config that makes a loader quote its input): the agent gets
one fixed category, the full text goes to the harness log only.
"""

from __future__ import annotations

from enum import Enum


class SubmissionRejected(ValueError):
    """A submission that cannot be evaluated; `status_code` is the HTTP status to answer with."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code


class FailureKind(str, Enum):
    """Why an evaluation produced no score; `.reason` is all the agent sees of it."""

    LOAD = "load"
    OOM = "oom"
    TIMEOUT = "timeout"
    CRASH = "crash"
    INTERRUPTED = "interrupted"

    @property
    def reason(self) -> str:
        return PUBLIC_REASONS[self]


PUBLIC_REASONS = {
    FailureKind.LOAD: "could not load the weights",
    FailureKind.OOM: "evaluation ran out of memory",
    FailureKind.TIMEOUT: "evaluation timed out",
    FailureKind.CRASH: "evaluation failed (details are in the harness log only)",
    FailureKind.INTERRUPTED: "evaluation was interrupted by a grader restart and could not be resumed",
}

_OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "MemoryError", "Cannot allocate memory")
_LOAD_MARKERS = ("from_pretrained", "load_state_dict", "safetensors", "size mismatch", "SafetensorError")


def classify_failure(text: str, returncode: int | None = None) -> FailureKind:
    """The category of an evaluation process's failure, from its exit status and its traceback."""
    if returncode in (-9, 137) or any(m in text for m in _OOM_MARKERS):
        return FailureKind.OOM  # SIGKILL from outside is, in practice, the OOM killer
    if any(m in text for m in _LOAD_MARKERS):
        return FailureKind.LOAD
    return FailureKind.CRASH


def public_failure(exc: BaseException) -> str:
    """The agent-facing reason for an evaluation that raised `exc`."""
    kind = getattr(exc, "kind", None)
    if kind in {k.value for k in FailureKind}:
        return FailureKind(kind).reason
    if isinstance(exc, MemoryError):
        return FailureKind.OOM.reason
    return FailureKind.CRASH.reason  # in-process errors (OSError, ValueError) are the harness's, not the weights'

