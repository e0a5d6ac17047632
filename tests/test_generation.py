"""Batched generation on the tiny model: order, limits, stop strings, token counts, batched = one-by-one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from a2rl_bench.inference.generation import GenerationOutput, LoadedModel, _real_length, generate
from tests.tiny_model import tiny_questions

MAX_NEW = 12


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, str]]]:
    """20 prompts of varied length, so batches need padding."""
    questions = tiny_questions(0, 20)
    return [[{"role": "user", "content": q * (1 + i % 3)}] for i, q in enumerate(questions)]


@pytest.fixture(scope="module")
def one_by_one(tiny: LoadedModel, conversations) -> GenerationOutput:
    return generate(tiny, conversations, max_new_tokens=MAX_NEW, batch_size=1)


def test_batched_greedy_matches_one_by_one(tiny: LoadedModel, conversations, one_by_one) -> None:
    batched = generate(tiny, conversations, max_new_tokens=MAX_NEW, batch_size=8)
    same = sum(a == b for a, b in zip(batched.completions, one_by_one.completions))
    # In fp32 the padded and unpadded runs differ only in float rounding (different matmul shapes and
    # masked pad positions change the summation order), which can flip a greedy argmax at a near-tie and
    # then change the rest of that completion. That is rare; on this model all 20 agree today.
    assert same >= 0.9 * len(conversations)


def test_completions_come_back_in_input_order(tiny: LoadedModel, conversations, one_by_one) -> None:
    reordered = conversations[::-1]
    out = generate(tiny, reordered, max_new_tokens=MAX_NEW, batch_size=8)
    assert len(out.completions) == len(reordered) == len(out.completion_tokens)
    assert out.completions == one_by_one.completions[::-1]
    assert len(set(out.completions)) > len(out.completions) // 2  # prompts really give different outputs


def test_max_new_tokens_bounds_every_completion(one_by_one: GenerationOutput) -> None:
    assert all(1 <= n <= MAX_NEW for n in one_by_one.completion_tokens)
    assert one_by_one.generated_tokens == sum(one_by_one.completion_tokens)
    assert one_by_one.seconds > 0


def test_stop_string_cuts_completions_and_ends_generation_early(tiny: LoadedModel, conversations) -> None:
    free = generate(tiny, conversations[:4], max_new_tokens=24, batch_size=4)
    # A stop string the model really produces mid-completion (ASCII, so it is a plain token substring).
    hit, match = next(
        (i, m) for i, text in enumerate(free.completions) for m in re.finditer(r"[A-Za-z]{3,}", text) if m.start() > 0
    )
    stop = match.group()
    stopped = generate(tiny, conversations[:4], max_new_tokens=24, batch_size=4, stop=(stop, "#never#"))
    for text, cut in zip(free.completions, stopped.completions):
        assert cut == (text[: text.index(stop)] if stop in text else text)
    assert stopped.completion_tokens[hit] < 24
    assert stopped.generated_tokens < free.generated_tokens

    new_tokens: list[int] = []  # what transformers itself generated, pad included
    original_generate = tiny.model.generate

    def spy(*args, **kwargs):
        output = original_generate(*args, **kwargs)
        new_tokens.append(output.shape[1] - kwargs["input_ids"].shape[1])
        return output

    tiny.model.generate = spy
    try:
        alone = generate(tiny, [conversations[hit]], max_new_tokens=24, stop=(stop,), engine="generate")
    finally:
        del tiny.model.generate
    # transformers stopped at the token completing the stop string, not at max_new_tokens
    assert new_tokens == [alone.generated_tokens] == [stopped.completion_tokens[hit]]


def test_real_length_ignores_padding_after_eos_and_after_a_stop(tiny: LoadedModel) -> None:
    tok = tiny.tokenizer
    eos, pad = tok.eos_token_id, tok.pad_token_id
    word = tok("Tom", add_special_tokens=False)["input_ids"]
    assert _real_length([5, 6, eos, pad, pad], tok, (), {eos}) == 3
    assert _real_length([5, 6, 7], tok, (), {eos}) == 3
    # A row that ended on a stop string is padded while the rest of its batch goes on.
    ids = [5, *word, pad, pad]
    assert _real_length(ids, tok, ("Tom",), {eos}) == 1 + len(word)


def test_sampling_is_repeatable_with_a_seed(tiny: LoadedModel, conversations) -> None:
    first = generate(tiny, conversations[:3], max_new_tokens=8, temperature=1.0, seed=7)
    second = generate(tiny, conversations[:3], max_new_tokens=8, temperature=1.0, seed=7)
    assert first.completions == second.completions


def test_generate_loads_from_a_directory_and_accepts_no_prompts(tiny_model_dir: Path) -> None:
    out = generate(tiny_model_dir, [[{"role": "user", "content": "Hi"}]], max_new_tokens=3, device="cpu")
    assert len(out.completions) == 1 and out.completion_tokens[0] <= 3
    empty = generate(tiny_model_dir, [], max_new_tokens=3)
    assert empty.completions == [] and empty.generated_tokens == 0


def test_num_threads_applies_to_the_call_only(tiny: LoadedModel, conversations) -> None:
    import torch

    before = torch.get_num_threads()
    generate(tiny, conversations[:1], max_new_tokens=2, num_threads=2)
    assert torch.get_num_threads() == before


@pytest.fixture(scope="module")
def with_prefix(conversations) -> list[list[dict[str, str]]]:
    """The prompts behind one long system message: a shared token prefix, as few-shot exemplars give."""
    system = " ".join(tiny_questions(20, 26))
    return [[{"role": "system", "content": system}, *c] for c in conversations]


@pytest.mark.parametrize("slots", [1, 3, 8, 32])
def test_cpu_batcher_matches_the_static_engine_token_for_token(tiny: LoadedModel, with_prefix, slots) -> None:
    """Greedy answers of the shared-prefix, continuously refilled CPU batcher (`auto`) are the static-cache
    engine's (the prefix copied into every row, fixed batches), whatever the number of slots: a freed slot takes
    the next prompt mid-way through the others' decoding."""
    from a2rl_bench.inference.prefix_batching import PrefixBatcher

    stop = ("e",)  # the tiny model's rows reach it after 1 to 15 characters: slots free up at many steps
    reference = generate(tiny, with_prefix, max_new_tokens=MAX_NEW, batch_size=8, engine="static", stop=stop)
    done: list[int] = []
    ours = generate(tiny, with_prefix, max_new_tokens=MAX_NEW, batch_size=slots, stop=stop, on_done=done.append)
    assert ours.completions == reference.completions
    assert ours.completion_tokens == reference.completion_tokens
    assert sum(done) == len(with_prefix) and (slots == 1 or len(done) > 1)  # counted as rows finish
    assert not tiny.model.__dict__.get("_a2rl_batcher_failed") and PrefixBatcher(tiny.model)  # it really ran


def test_cpu_batcher_without_a_shared_prefix_matches_generate(tiny: LoadedModel, conversations, one_by_one) -> None:
    reference = generate(tiny, conversations, max_new_tokens=MAX_NEW, batch_size=8, engine="generate")
    ours = generate(tiny, conversations, max_new_tokens=MAX_NEW, batch_size=8)
    assert ours.completions == reference.completions == one_by_one.completions
    assert ours.completion_tokens == reference.completion_tokens


def test_cpu_batcher_failure_falls_back_with_the_same_answers(tiny: LoadedModel, with_prefix, monkeypatch) -> None:
    from a2rl_bench.inference import prefix_batching

    def broken(*args, **kwargs):
        raise RuntimeError("simulated")

    monkeypatch.setattr(prefix_batching.PrefixBatcher, "decode", broken)
    monkeypatch.setitem(tiny.model.__dict__, "_a2rl_batcher_failed", False)
    done: list[int] = []
    out = generate(tiny, with_prefix, max_new_tokens=MAX_NEW, batch_size=8, on_done=done.append)
    reference = generate(tiny, with_prefix, max_new_tokens=MAX_NEW, batch_size=8, engine="static")
    assert out.completions == reference.completions and sum(done) == len(with_prefix)


def test_cpu_evaluation_is_fp32_everywhere_unless_bf16_is_asked_for(tmp_path, monkeypatch) -> None:
    """fp32 on every CPU by default, even where the probe measured bf16 faster: a checkpoint gets one answer set
    wherever it is graded. bf16 is an opt-in (`bf16`, or `auto`: where the probe says it pays) whose path names
    what changes its answers, the batch size and the engine; the probe's verdict is kept per machine; a typo is
    refused."""
    from a2rl_bench.inference import numerics

    monkeypatch.setattr(numerics, "_verdict_file", lambda: tmp_path / "cpu-numerics.json")
    monkeypatch.delenv(numerics.CPU_DTYPE_ENV, raising=False)
    monkeypatch.delenv("A2RL_DECODE_ENGINE", raising=False)
    measured = numerics.probe_verdict()
    assert measured["fp32_s"] > 0 and measured["bf16_s"] > 0
    assert numerics.probe_verdict() == measured  # kept, not measured again
    (tmp_path / "cpu-numerics.json").write_text(json.dumps({**measured, "bf16_speedup": 2.1}))
    assert numerics.numeric_path("transformers", on_gpu=False) == "cpu-fp32"  # the probe alone picks nothing
    assert numerics.numeric_path("transformers", on_gpu=True) == "cuda-bf16"
    monkeypatch.setenv(numerics.CPU_DTYPE_ENV, "auto")
    assert numerics.numeric_path("transformers", on_gpu=False, batch_size=4) == "cpu-bf16-b4-auto"
    (tmp_path / "cpu-numerics.json").write_text(json.dumps({**measured, "bf16_speedup": 1.0}))
    assert numerics.cpu_path(4) == "cpu-fp32"
    monkeypatch.setenv(numerics.CPU_DTYPE_ENV, "bf16")
    assert numerics.cpu_path(16) == "cpu-bf16-b16-auto" != numerics.cpu_path(16, engine="static")
    monkeypatch.setenv("A2RL_DECODE_ENGINE", "generate")
    assert numerics.cpu_path(1) == "cpu-bf16-b1-generate"
    assert str(numerics.torch_dtype(numerics.cpu_path(1))) == "torch.bfloat16"
    monkeypatch.setenv(numerics.CPU_DTYPE_ENV, "fp32")
    assert numerics.cpu_path(1) == "cpu-fp32" and str(numerics.torch_dtype("cpu-fp32")) == "torch.float32"
    monkeypatch.setenv(numerics.CPU_DTYPE_ENV, "fp16")
    with pytest.raises(ValueError, match="fp32, bf16 or auto"):
        numerics.cpu_path()


def test_the_cache_keeps_bf16_results_of_another_batch_size_apart(tmp_path, monkeypatch) -> None:
    """fp32 answers do not depend on the batch, so one cached fp32 result serves every batch size; bf16 answers
    do, so its cache entries (and evaluator ids, hence settings) differ by batch size."""
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference import numerics
    from a2rl_bench.inference.evaluation import EvalCache, EvalSpec

    task = get_task("gsm8k")
    cache = EvalCache(tmp_path)
    by_batch = {b: EvalSpec.of(task, "offline", "test", 8, batch_size=b) for b in (4, 16)}
    monkeypatch.setenv(numerics.CPU_DTYPE_ENV, "fp32")
    assert cache._file("h", by_batch[4]) == cache._file("h", by_batch[16])
    monkeypatch.setenv(numerics.CPU_DTYPE_ENV, "bf16")
    assert cache._file("h", by_batch[4]) != cache._file("h", by_batch[16])


def test_the_default_batch_is_larger_only_where_answers_do_not_depend_on_it(monkeypatch) -> None:
    """By default (None) the CPU fp32 path decodes a single-turn split together, up to CPU_FP32_MAX_BATCH; the GPU
    paths, CPU bf16 and interactive episodes keep 16, and an explicit batch means itself on every path."""
    from a2rl_bench.inference import numerics
    from a2rl_bench.inference.numerics import CPU_FP32_MAX_BATCH, eval_batch

    assert (eval_batch(None, "cpu-fp32", 32), eval_batch(None, "cpu-fp32", 7)) == (32, 7)
    assert eval_batch(None, "cpu-fp32", 1319) == CPU_FP32_MAX_BATCH < 1319
    assert eval_batch(None, "cpu-fp32", 134, interactive=True) == 16
    for path in ("cuda-bf16", "vllm", "cpu-bf16-b16-auto"):
        assert eval_batch(None, path, 32) == eval_batch(None, path, 134, interactive=True) == 16, path
    for path in ("cpu-fp32", "cuda-bf16", "vllm", "cpu-bf16-b16-auto"):
        assert eval_batch(4, path, 32) == 4 and eval_batch(160, path, 32, interactive=True) == 160, path
    assert numerics.numeric_path("transformers", on_gpu=True) == "cuda-bf16"
    monkeypatch.setenv(numerics.CPU_DTYPE_ENV, "bf16")  # bf16 names the batch: the default's is 16's name
    assert numerics.numeric_path("transformers", on_gpu=False) == numerics.cpu_path(16) == "cpu-bf16-b16-auto"


def test_the_default_cpu_grading_decodes_a_split_past_16_at_once_with_batch_16s_answers(tiny_model_dir, tmp_path,
                                                                                       monkeypatch) -> None:
    """The default grading (no batch given: the evaluation process's command line) of 20 hidden-test items
    decodes them in one batch of 20 and records it; an explicit 16 runs as 16; the completions are the same."""
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference import evaluation, prefix_batching
    from a2rl_bench.records import EvalResult

    slots: list[int] = []
    decode = prefix_batching.PrefixBatcher.decode

    def counted(self, prefix, rows, max_new_tokens, n_slots, *args, **kwargs):
        slots.append(n_slots)
        return decode(self, prefix, rows, max_new_tokens, n_slots, *args, **kwargs)

    monkeypatch.setattr(prefix_batching.PrefixBatcher, "decode", counted)
    task = get_task("gsm8k")
    out = tmp_path / "default.json"
    evaluation.main(["--model", str(tiny_model_dir), "--task", "gsm8k", "--task-class", evaluation.task_class_ref(task),
                     "--split", "test", "--limit", "20", "--numerics", "cpu-fp32", "--out", str(out)])  # fmt: skip
    default = EvalResult.model_validate_json(out.read_text())
    explicit = evaluation.evaluate(tiny_model_dir, evaluation.EvalSpec.of(task, "offline", "test", 20, batch_size=16))
    assert slots == [20, 16] and (default.batch_size, explicit.batch_size) == (20, 16)
    assert [i.completion for i in default.items] == [i.completion for i in explicit.items]
    assert len({i.completion for i in default.items}) > 1 and default.evaluator_id == explicit.evaluator_id


def test_fp32_answers_do_not_depend_on_the_batch_or_its_company(tiny: LoadedModel, with_prefix) -> None:
    """The default (fp32, shared-prefix batcher) path gives the same items the same completions at batch 1, 4
    and 16, alone or among other prompts (in another order, behind another shared prefix or none)."""
    items = with_prefix[:6]
    alone = {b: generate(tiny, items, max_new_tokens=MAX_NEW, batch_size=b).completions for b in (1, 4, 16)}
    assert alone[1] == alone[4] == alone[16]
    others = [[c[0], {"role": "user", "content": q}] for c, q in zip(with_prefix, tiny_questions(40, 52))]
    crowd = others[:5] + items[::-1] + others[5:]
    among = generate(tiny, crowd, max_new_tokens=MAX_NEW, batch_size=4).completions[5 : 5 + len(items)][::-1]
    assert among == alone[1]
    bare = [c[1:] for c in with_prefix[6:12]]  # no shared system message: no prefix is prefilled once
    mixed = generate(tiny, bare + items, max_new_tokens=MAX_NEW, batch_size=16).completions[len(bare) :]
    assert mixed == alone[1]
    assert len(set(alone[1])) > 1  # the items really get different answers


def test_bf16_cpu_generation_runs_the_batcher_in_bf16(tiny_model_dir: Path, with_prefix) -> None:
    import torch

    from a2rl_bench.inference.generation import load_model

    bf16 = load_model(tiny_model_dir, "cpu", dtype=torch.bfloat16)
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    out = generate(bf16, with_prefix, max_new_tokens=MAX_NEW, batch_size=4)
    assert len(out.completions) == len(with_prefix) and not bf16.model.__dict__.get("_a2rl_batcher_failed")


def test_the_report_names_the_numeric_path_that_graded(tmp_path):
    """The evaluator id ends in the numeric path (#37): the report says which one graded the run."""
    import json

    from a2rl_bench.summary.report import graded_numeric_paths

    evaluations = tmp_path / "evaluations"
    evaluations.mkdir()
    graded = (("baseline-0-test", "cpu-bf16"), ("final-1-test", "cpu-bf16"), ("submission-1-validation", "cpu-fp32"))
    for name, path in graded:
        (evaluations / f"{name}.json").write_text(json.dumps({"evaluator_id": f"gsm8k/prompt/v1@{path}", "items": []}))
    (evaluations / "torn.json").write_text("{")
    assert graded_numeric_paths(evaluations) == ["cpu-bf16", "cpu-fp32"]
    assert graded_numeric_paths(tmp_path / "missing") == []


def test_results_and_the_report_warn_when_numeric_paths_are_mixed(tmp_path, capsys):
    """Runs graded on different numeric paths give different answers: `a2rl results` says so under its table,
    and a run whose own evaluations mix paths says so in its report; one path alone gives no warning."""
    import argparse
    from types import SimpleNamespace

    from a2rl_bench.cli import cmd_results
    from a2rl_bench.records import EvalResult, RunConfig
    from a2rl_bench.store.results import ResultsStore
    from a2rl_bench.summary.report import run_notes

    path = tmp_path / "results.duckdb"
    store = ResultsStore(path)
    for run_id, numerics in (("r1", "cpu-fp32"), ("r2", "cpu-fp32"), ("r3", "cpu-bf16-b16-auto")):
        store.start_run(run_id, RunConfig(seed=int(run_id[1])), None, "offline")
        result = EvalResult(task="gsm8k", split="test", score=5.0, n=8, n_correct=0,
                            evaluator_id=f"gsm8k/prompt/v1@{numerics}", generated_tokens=1, duration_s=1.0)  # fmt: skip
        store.record_evaluation(run_id, "baseline-test", "baseline", result)
    assert cmd_results(argparse.Namespace(results=str(path), limit=10)) == 0
    assert "different numeric paths (cpu-bf16-b16-auto, cpu-fp32)" in capsys.readouterr().out
    assert cmd_results(argparse.Namespace(results=str(path), limit=2)) == 0  # r3 and r2
    assert "different numeric paths" in capsys.readouterr().out
    store.record_evaluation("r3", "baseline-test", "baseline", result.model_copy(update={"evaluator_id": "x@cpu-fp32"}))
    assert cmd_results(argparse.Namespace(results=str(path), limit=10)) == 0
    assert "numeric paths" not in capsys.readouterr().out
    # Runs that shared their GPU with different numbers of other processes: said too, until they shared alike.
    for run_id, others in (("r1", 0), ("r2", 7), ("r3", None)):
        store.record_metrics(run_id, {"gpu_shared_procs_median": others})
    assert cmd_results(argparse.Namespace(results=str(path), limit=10)) == 0
    assert "shared their GPUs differently (other processes on the card, median per run: 0 to 7)" in \
        capsys.readouterr().out
    store.record_metrics("r2", {"gpu_shared_procs_median": 0})
    assert cmd_results(argparse.Namespace(results=str(path), limit=10)) == 0
    assert "shared their GPUs" not in capsys.readouterr().out
    paths = SimpleNamespace(harness_dir=tmp_path)
    evaluations = tmp_path / "evaluations"
    evaluations.mkdir()
    for name, numerics in (("baseline-0-test", "cpu-fp32"), ("final-1-test", "cpu-fp32")):
        (evaluations / f"{name}.json").write_text(json.dumps({"evaluator_id": f"gsm8k/prompt/v1@{numerics}"}))
    notes = run_notes(SimpleNamespace(config=RunConfig(), variant_label="offline", paths=paths), {})
    assert any("`cpu-fp32`" in n for n in notes) and not any("mix numeric paths" in n for n in notes)
    (evaluations / "final-1-test.json").write_text(json.dumps({"evaluator_id": "gsm8k/prompt/v1@cpu-bf16-b16-auto"}))
    notes = run_notes(SimpleNamespace(config=RunConfig(), variant_label="offline", paths=paths), {})
    assert any("mix numeric paths" in n for n in notes), notes
