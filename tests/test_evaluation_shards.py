"""An evaluation split over processes (one torch thread each) gives the answers of one process: the same completions
item for item, in the split's order, the same score; and it does split (one process per 8 items, at most one per
CPU). The default run's baseline, final grading and gradings of submissions take this path on a 2-core machine."""

from __future__ import annotations

import os

import pytest

from a2rl_bench.benchmarks import get_task
from a2rl_bench.inference import evaluation
from a2rl_bench.inference.evaluation import EVAL_PROCESSES_ENV, EvalSpec, eval_processes, evaluate_in_subprocess
from a2rl_bench.ops.progress import ItemProgress


def _evaluate(model_dir, spec, monkeypatch, processes: int, progress=None):
    monkeypatch.setenv(EVAL_PROCESSES_ENV, str(processes))
    started = []
    result = evaluate_in_subprocess(model_dir, spec, timeout_s=300, on_start=started.append, progress_file=progress)
    return result, len(started)


def test_items_split_over_two_processes_get_the_answers_of_one(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
    spec = EvalSpec.of(get_task("gsm8k"), "offline", "validation", 17)  # odd: slices of 8 and 9 items
    one, one_started = _evaluate(tiny_model_dir, spec, monkeypatch, 1)
    progress = tmp_path / "eval_progress.json"
    two, two_started = _evaluate(tiny_model_dir, spec, monkeypatch, 2, progress)
    assert (one_started, two_started) == (1, 2)
    assert one.n == two.n == 17
    assert [i.item_id for i in two.items] == [i.item_id for i in one.items]
    assert [i.completion for i in two.items] == [i.completion for i in one.items]
    assert [i.detail.get("generated_tokens") for i in two.items] == [i.detail.get("generated_tokens")
                                                                    for i in one.items]  # fmt: skip
    assert (two.score, two.n_correct, two.detail, two.generated_tokens, two.evaluator_id) == (
        one.score, one.n_correct, one.detail, one.generated_tokens, one.evaluator_id)
    # The display reads one count over both processes; their own files are gone.
    counted = ItemProgress.model_validate_json(progress.read_text())
    assert (counted.done, counted.total) == (17, 17)
    assert sorted(p.name for p in tmp_path.iterdir() if "eval_progress" in p.name) == ["eval_progress.json"]


def test_a_failing_process_fails_the_whole_evaluation(tiny_model_dir, tmp_path, monkeypatch):
    """No score from half the items: one slice's crash is the evaluation's failure."""
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
    real = evaluation._evaluate_process

    def second_crashes(model_dir, spec, timeout_s, device, progress_file, on_start, shard=(0, 1)):
        if shard[0] == 1:
            raise evaluation.EvaluationFailed("evaluation process exited with 1: boom")
        return real(model_dir, spec, timeout_s, device, progress_file, on_start, shard)

    monkeypatch.setattr(evaluation, "_evaluate_process", second_crashes)
    monkeypatch.setenv(EVAL_PROCESSES_ENV, "2")
    with pytest.raises(evaluation.EvaluationFailed, match="boom"):
        evaluate_in_subprocess(tiny_model_dir, EvalSpec.of(get_task("gsm8k"), "offline", "validation", 16),
                               timeout_s=300)  # fmt: skip


def test_how_many_processes(monkeypatch):
    gsm8k = EvalSpec.of(get_task("gsm8k"), "offline", "validation", 16)
    monkeypatch.setenv(EVAL_PROCESSES_ENV, "2")
    assert [eval_processes(gsm8k, None, n) for n in (1, 8, 15, 16, 48)] == [1, 1, 1, 2, 2]
    assert eval_processes(gsm8k, "0", 48) == 1  # a GPU evaluation: one process
    assert eval_processes(EvalSpec.of(get_task("gsm8k"), "offline", "validation", backend="vllm"), None, 48) == 1
    monkeypatch.setenv("A2RL_CPU_EVAL_DTYPE", "bf16")
    assert eval_processes(gsm8k, None, 48) == 1  # bf16's answers depend on the batch: never split
    monkeypatch.delenv("A2RL_CPU_EVAL_DTYPE")
    interactive = EvalSpec.of(get_task("deepsearchqa"), "offline", "validation", 16)
    assert eval_processes(interactive, None, 48) == 1  # episodes in lockstep stay in one process
    monkeypatch.delenv(EVAL_PROCESSES_ENV)
    assert eval_processes(gsm8k, None, 1000) == len(os.sched_getaffinity(0))
    assert [evaluation.shard_bounds(17, i, 2) for i in (0, 1)] == [(0, 8), (8, 17)]
