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

# "CUDA error: out of memory" is torch's AcceleratorError (a raw cudaErrorMemoryAllocation, e.g. while the weights are
# moved to a card other runs have filled): its traceback also names from_pretrained, so it must win over a LOAD
# marker, or a full card reads as the agent's broken checkpoint (H200, 4 runs a card, 2026-11-29).
_OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "CUDA error: out of memory", "cudaErrorMemoryAllocation",
                "MemoryError", "Cannot allocate memory")
_LOAD_MARKERS = ("from_pretrained", "load_state_dict", "safetensors", "size mismatch", "SafetensorError")


def classify_failure(text: str, returncode: int | None = None) -> FailureKind:
    """The category of an evaluation process's failure, from its exit status and its traceback."""
    if returncode in (-9, 137) or any(m in text for m in _OOM_MARKERS):
        return FailureKind.OOM  # SIGKILL from outside is, in practice, the OOM killer
    if any(m in text for m in _LOAD_MARKERS):
        return FailureKind.LOAD
    return FailureKind.CRASH
