"""Why an evaluation produced no score, as a fixed category: the failure classes of an evaluation process.

The evaluation process's raw text (stderr, exception messages) ran over hidden items and could carry them out;
only the category's `.reason` reaches the agent (`a2rl_bench.grading.errors.public_failure` picks it).
"""

from __future__ import annotations

from enum import Enum


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
