"""What the agent may see of a failed evaluation: a fixed category, never the evaluator's text."""

from __future__ import annotations

import pytest

from a2rl_bench.inference.evaluation import EvaluationFailed
from a2rl_bench.grading.errors import PUBLIC_REASONS, FailureKind, classify_failure, public_failure

HIDDEN = "Natalia sold clips to 48 of her friends"


@pytest.mark.parametrize("text, returncode, kind", [
    (f"jinja2.exceptions.TemplateError: LEAK {HIDDEN}", 1, FailureKind.CRASH),
    (f"torch.OutOfMemoryError: CUDA out of memory while {HIDDEN}", 1, FailureKind.OOM),
    ("", -9, FailureKind.OOM),
    (f'File "modeling_utils.py", in from_pretrained\nValueError: {HIDDEN}', 1, FailureKind.LOAD),
])  # fmt: skip
def test_every_failure_maps_to_a_fixed_reason_without_its_text(text, returncode, kind):
    assert classify_failure(text, returncode) is kind
    reason = public_failure(EvaluationFailed(text, classify_failure(text, returncode)))
    assert reason == PUBLIC_REASONS[kind] and HIDDEN not in reason


def test_unknown_errors_get_the_generic_reason():
    assert public_failure(ValueError(HIDDEN)) == FailureKind.CRASH.reason
    assert public_failure(OSError(HIDDEN)) == FailureKind.CRASH.reason
    assert public_failure(EvaluationFailed(HIDDEN, "timeout")) == "evaluation timed out"
