"""The static-cache decode engine (CPU, no CUDA graph) against transformers' greedy `generate`, token for token:
left padding of different prompt lengths, EOS and stop strings between host-check chunks, a shared prefix
prefilled once, and the fallback to `generate`."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import a2rl_bench.inference.generation as generation
from a2rl_bench.inference.decode_engine import Decoder, shared_prefix, unsupported_reason
from a2rl_bench.inference.generation import LoadedModel, _generate_batch, generate, load_model
from tests.tiny_model import tiny_questions

MAX_NEW = 40


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, str]]]:
    """12 prompts of 1-3x a question's length: every batch is left-padded by different amounts."""
    questions = tiny_questions(0, 12)
    return [[{"role": "user", "content": q * (1 + i % 3)}] for i, q in enumerate(questions)]


@pytest.fixture(scope="module")
def with_system(conversations) -> list[list[dict[str, str]]]:
    """The same prompts behind one long system message: a shared token prefix of well over 32 tokens."""
    system = " ".join(tiny_questions(20, 26))
    return [[{"role": "system", "content": system}, *c] for c in conversations]


def test_engine_tokens_equal_generate_with_left_padding(tiny: LoadedModel, conversations) -> None:
    tok = tiny.tokenizer
    prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    rows = tok(prompts, add_special_tokens=False)["input_ids"]
    assert len({len(r) for r in rows}) > 3  # really different lengths → different left padding
    options = {"max_new_tokens": MAX_NEW, "do_sample": False, "pad_token_id": tok.pad_token_id}
    free = _generate_batch(tiny.model, tok, prompts, options)
    decoder = Decoder(tiny.model, use_graph=True, chunk=5)  # use_graph is ignored off CUDA
    assert not decoder.use_graph
    assert decoder.decode(rows, MAX_NEW, lambda t: False, tok.pad_token_id) == free
    # An end token that some rows produce mid-way: those rows end early and generate pads them.
    end = next(t for t in free[0][3:] if sum(t in r for r in free) < len(free))
    reference = _generate_batch(tiny.model, tok, prompts, {**options, "eos_token_id": end})
    ours = decoder.decode(rows, MAX_NEW, lambda t: end in t, tok.pad_token_id)
    for ref, got in zip(reference, ours):
        n = ref.index(end) + 1 if end in ref else len(ref)
        assert got[:n] == ref[:n]
    assert any(end not in r for r in reference) and any(r.index(end) < MAX_NEW - 5 for r in reference if end in r)


def test_engine_outputs_equal_generate_with_stop_strings(tiny: LoadedModel, conversations) -> None:
    free = generate(tiny, conversations, max_new_tokens=MAX_NEW, batch_size=8, engine="generate")
    words = {m.group() for text in free.completions for m in re.finditer(r"[A-Za-z]{4,}", text) if m.start() > 0}
    stop = (sorted(words)[0], "#never#")
    reference = generate(tiny, conversations, max_new_tokens=MAX_NEW, batch_size=8, stop=stop, engine="generate")
    ours = generate(tiny, conversations, max_new_tokens=MAX_NEW, batch_size=8, stop=stop, engine="static")
    assert ours.completions == reference.completions
    assert ours.completion_tokens == reference.completion_tokens
    assert reference.completions != free.completions  # the stop string really cut something


def test_shared_prefix_is_prefilled_once_with_identical_outputs(tiny: LoadedModel, with_system) -> None:
    reference = generate(tiny, with_system, max_new_tokens=MAX_NEW, batch_size=5, engine="generate")
    reused = generate(tiny, with_system, max_new_tokens=MAX_NEW, batch_size=5, engine="static")
    assert reused.completions == reference.completions
    assert reused.completion_tokens == reference.completion_tokens
    prefix = tiny.model.__dict__["_a2rl_decoders"][False].last_prefix
    assert prefix is not None and prefix.length >= generation.MIN_SHARED_PREFIX


def test_sampling_on_cpu_uses_plain_generate(tiny: LoadedModel, conversations, monkeypatch) -> None:
    called = []
    original = tiny.model.generate
    monkeypatch.setattr(tiny.model, "generate", lambda *a, **k: called.append(1) or original(*a, **k))
    generate(tiny, conversations[:3], max_new_tokens=4, temperature=1.0, seed=0)
    assert called


def test_shared_prefix_leaves_every_prompt_a_token() -> None:
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4, 6]]) == [1, 2, 3]
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == [1, 2]
    assert shared_prefix([[1, 2, 3]]) == []
    assert shared_prefix([[7, 1], [8, 1]]) == []


def test_engine_failure_falls_back_to_generate(tiny_model_dir: Path, with_system, monkeypatch, caplog) -> None:
    model = load_model(tiny_model_dir, "cpu")  # own copy: the failure disables the engine on this model
    reference = generate(model, with_system[:4], max_new_tokens=8, engine="generate")

    def broken(self, *args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(Decoder, "_prefill", broken)
    with caplog.at_level(logging.WARNING, logger="a2rl_bench.inference.generation"):
        out = generate(model, with_system[:4], max_new_tokens=8, engine="static")
    assert out.completions == reference.completions
    assert "decode engine failed (RuntimeError: injected fault)" in caplog.text


def test_generation_config_that_changes_greedy_keeps_generate(tiny_model_dir: Path, with_system) -> None:
    model = load_model(tiny_model_dir, "cpu")
    assert unsupported_reason(model.model) is None
    model.model.generation_config.repetition_penalty = 1.3
    assert "repetition_penalty" in unsupported_reason(model.model)
    reference = generate(model, with_system[:4], max_new_tokens=8, engine="generate")
    assert generate(model, with_system[:4], max_new_tokens=8).completions == reference.completions
    assert model.model.__dict__["_a2rl_decoders"] == {False: None}


def test_unknown_engine_is_one_clear_error(tiny: LoadedModel, conversations) -> None:
    with pytest.raises(ValueError, match="engine must be one of"):
        generate(tiny, conversations[:1], max_new_tokens=2, engine="fast")


def _plain_and_reused(model_dir: Path, task: str, limit: int, batch_size: int, monkeypatch):
    """The same evaluation with `generate` and with the engine that reuses shared prefixes."""
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate
    from a2rl_bench.benchmarks import get_task

    spec = EvalSpec.of(get_task(task), "offline", "validation", limit=limit, batch_size=batch_size)
    monkeypatch.setenv("A2RL_DECODE_ENGINE", "generate")
    plain = evaluate(model_dir, spec)
    monkeypatch.setenv("A2RL_DECODE_ENGINE", "auto")
    return plain, evaluate(model_dir, spec)


def test_gsm8k_grading_is_identical_with_prefix_reuse(tiny_model_dir: Path, monkeypatch) -> None:
    """The 4-shot prompt shares its exemplars across items: reusing their KV changes no completion or score."""
    plain, reused = _plain_and_reused(tiny_model_dir, "gsm8k", limit=6, batch_size=4, monkeypatch=monkeypatch)
    assert [i.completion for i in reused.items] == [i.completion for i in plain.items]
    assert (reused.score, reused.n_correct, reused.generated_tokens) == (
        plain.score, plain.n_correct, plain.generated_tokens)


def test_interactive_episodes_are_identical_with_prefix_reuse(tiny_model_dir: Path, monkeypatch) -> None:
    """Lockstep episodes share their instructions: each step prefills them once (kept across steps)."""
    plain, reused = _plain_and_reused(tiny_model_dir, "webshop", limit=2, batch_size=2, monkeypatch=monkeypatch)
    assert [i.detail.get("turns") for i in reused.items] == [i.detail.get("turns") for i in plain.items]
    assert (reused.score, reused.generated_tokens) == (plain.score, plain.generated_tokens)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA device (the graph path)")
def test_graph_engine_equals_generate_on_cuda(tiny_model_dir: Path, conversations) -> None:
    cuda = load_model(tiny_model_dir, "cuda")
    cuda.model.float()  # fp32: the identity check is not about bf16 near-ties
    tok = cuda.tokenizer
    prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    rows = tok(prompts, add_special_tokens=False)["input_ids"]
    options = {"max_new_tokens": MAX_NEW, "do_sample": False, "pad_token_id": tok.pad_token_id}
    reference = _generate_batch(cuda.model, tok, prompts, options)
    decoder = Decoder(cuda.model, use_graph=True, chunk=8)
    assert decoder.decode(rows, MAX_NEW, lambda t: False, tok.pad_token_id) == reference
    assert decoder.graphs_captured == 1
    assert decoder.decode(rows, MAX_NEW, lambda t: False, tok.pad_token_id) == reference  # graph replayed
    assert decoder.graphs_captured == 1
