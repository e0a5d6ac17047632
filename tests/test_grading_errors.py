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
    # a full card while the weights move to it (seen on an H200 with four runs on it): the card, not the checkpoint
    ('File "generation.py", in load_transformers\n    model = AutoModelForCausalLM.from_pretrained(model_dir)'
     '.to(target)\n  File "torch/nn/modules/module.py", in convert\ntorch.AcceleratorError: CUDA error: out of memory'
     "\nSearch for `cudaErrorMemoryAllocation' in https://docs.nvidia.com", 1, FailureKind.OOM),
])  # fmt: skip
def test_every_failure_maps_to_a_fixed_reason_without_its_text(text, returncode, kind):
    assert classify_failure(text, returncode) is kind
    reason = public_failure(EvaluationFailed(text, classify_failure(text, returncode)))
    assert reason == PUBLIC_REASONS[kind] and HIDDEN not in reason


def test_unknown_errors_get_the_generic_reason():
    assert public_failure(ValueError(HIDDEN)) == FailureKind.CRASH.reason
    assert public_failure(OSError(HIDDEN)) == FailureKind.CRASH.reason
    assert public_failure(EvaluationFailed(HIDDEN, "timeout")) == "evaluation timed out"



@pytest.mark.parametrize("device, fails, status, calls", [
    ("0", 2, "scored", 3),  # GPU 0 (as `grading_devices` names it), filled by other runs: graded once they free it
    ("0", 3, "error", 3),  # too big for the card: the error after the last try
    (None, 1, "error", 1),  # no GPU here: the CPU's memory limit is the checkpoint's own, no second try
])  # fmt: skip
def test_a_gpu_evaluation_out_of_memory_is_graded_again_before_it_counts_as_an_error(
    tmp_path, tiny_model_dir, monkeypatch, device, fails, status, calls
):
    """Several runs share a card: one run's grading can find it full (three of 27 on an H200 with four runs). The
    evaluation (`evaluate_cached`, which submissions, baselines and final tests all go through) runs again after a
    wait; only a failure on every try reaches the agent, as the fixed out-of-memory reason, through the server."""
    import shutil

    import httpx

    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
    from a2rl_bench.inference import evaluation
    from a2rl_bench.records import EvalResult, RunConfig

    monkeypatch.setattr(evaluation, "GPU_OOM_WAITS_S", (0.1, 0.2))
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))  # an evaluation cache of its own: no earlier case's hit
    seen = []

    def evaluate_in_subprocess(model_dir, spec, timeout_s, device=None, *_, **__):
        seen.append(device)
        if len(seen) <= fails:
            raise EvaluationFailed(f"torch.AcceleratorError: CUDA error: out of memory {HIDDEN}", FailureKind.OOM)
        return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="constant")

    monkeypatch.setattr(evaluation, "evaluate_in_subprocess", evaluate_in_subprocess)
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, ws / "models" / "base")
    shutil.copytree(tiny_model_dir, ws / "output" / "v1")
    ctx = GradingContext("oom", RunConfig(max_submissions=3), ws, tmp_path / "harness", {"validation": 10.0},
                         base_model_dir=tiny_model_dir, devices=[device], task=get_task("gsm8k"))  # fmt: skip
    service = GradingService(ctx, BudgetClock(600), evaluate=lambda *a, **k: evaluation.evaluate_cached(*a, **k))
    with GradingServer(service) as server:
        r = httpx.post(f"{server.url}/submit", json={"model_path": "output/v1", "wait": True}, timeout=120,
                       headers={"Authorization": f"Bearer {server.token}"})  # fmt: skip
    service.close(10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == status, r.text
    assert len(seen) == calls and set(seen) == {device}
    if status == "error":
        assert body["error"] == FailureKind.OOM.reason and HIDDEN not in r.text
    else:
        assert body["score"] == 50.0
