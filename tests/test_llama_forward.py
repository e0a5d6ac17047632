"""The grader's CPU fp32 path without transformers (`a2rl_bench.inference.llama_forward`): the same logits, tokens,
prompts and completions as transformers' model and tokenizer, no transformers import on that path, and
transformers for whatever the own forward does not cover."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from a2rl_bench.inference.generation import generate, load_model, load_transformers, render_prompt
from tests.tiny_model import tiny_questions

FEW_SHOT = "".join(f"Question: {q}\nAnswer: {i}\n\n" for i, q in enumerate(tiny_questions(0, 6)))
"""A shared prefix long enough for the shared-prefix batcher (the grader's default CPU path)."""


def _conversations(questions: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": FEW_SHOT}, {"role": "user", "content": q}] for q in questions]


@pytest.fixture(scope="module")
def own(tiny_model_dir):
    loaded = load_model(tiny_model_dir, "cpu", own_forward=True)
    assert getattr(loaded.model, "own_forward", False), "the tiny Llama is covered by the own forward"
    return loaded


def _relative(a, b) -> float:
    return float((a - b).norm() / b.norm())


def test_the_own_forward_gives_transformers_logits(own, tiny, one_torch_thread):
    import torch

    ids = own.tokenizer([render_prompt(own.tokenizer, c) for c in _conversations(tiny_questions(10, 12))])
    width = min(len(i) for i in ids["input_ids"])
    x = torch.tensor([i[:width] for i in ids["input_ids"]])
    with torch.inference_mode():
        expected = tiny.model(x).logits
    assert _relative(own.model.logits(x), expected) < 1e-5


def test_the_own_tokenizer_renders_encodes_and_decodes_as_transformers(own, tiny):
    conversations = _conversations(tiny_questions(20, 24)) + [[{"role": "user", "content": "a <|im_end|> b \n\n"}]]
    prompts = [render_prompt(own.tokenizer, c) for c in conversations]
    assert prompts == [render_prompt(tiny.tokenizer, c) for c in conversations]
    assert own.tokenizer(prompts)["input_ids"] == tiny.tokenizer(prompts, add_special_tokens=False)["input_ids"]
    every = [[i] for i in range(len(tiny.tokenizer))]
    for skip in (False, True):
        assert own.tokenizer.batch_decode(every, skip_special_tokens=skip) == tiny.tokenizer.batch_decode(
            every, skip_special_tokens=skip
        )
    assert (own.tokenizer.eos_token_id, own.tokenizer.pad_token_id, len(own.tokenizer)) == (
        tiny.tokenizer.eos_token_id, tiny.tokenizer.pad_token_id, len(tiny.tokenizer),
    )  # fmt: skip


@pytest.mark.parametrize("batch_size", [1, 4])
def test_greedy_completions_are_those_of_transformers(own, tiny, one_torch_thread, batch_size):
    conversations = _conversations(tiny_questions(30, 36))
    kwargs = dict(max_new_tokens=24, stop=["\n\n"], batch_size=batch_size)
    mine, theirs = generate(own, conversations, **kwargs), generate(tiny, conversations, **kwargs)
    assert mine.completions == theirs.completions
    assert mine.completion_tokens == theirs.completion_tokens
    assert len(set(mine.completions)) > 1  # prompts are told apart: the comparison means something


def test_sampling_on_the_own_model_is_transformers_sampling(own, tiny, one_torch_thread):
    conversations = _conversations(tiny_questions(40, 43))
    kwargs = dict(max_new_tokens=12, temperature=1.0, seed=7, batch_size=3)
    assert generate(own, conversations, **kwargs).completions == generate(tiny, conversations, **kwargs).completions


def test_the_evaluation_process_never_imports_transformers(tiny_model_dir, tmp_path):
    """The whole CPU evaluation of a Llama checkpoint, as the grader's subprocess runs it (`main`)."""
    out = tmp_path / "result.json"
    code = textwrap.dedent(f"""
        import sys
        from a2rl_bench.inference.evaluation import main
        main(["--model", {str(tiny_model_dir)!r}, "--task", "gsm8k", "--task-class",
              "a2rl_bench.benchmarks.gsm8k.task:GSM8K", "--split", "validation", "--limit", "2",
              "--batch-size", "2", "--numerics", "cpu-fp32", "--out", {str(out)!r}])
        print("IMPORTED", sorted(m for m in sys.modules if m.split(".")[0] == "transformers")[:5])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "IMPORTED []" in done.stdout, done.stdout[-500:]
    assert json.loads(out.read_text())["n"] == 2


def _changed_copy(tiny_model_dir: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / "changed"
    shutil.copytree(tiny_model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "RoPE type 'linear'"),
        ({"attention_bias": True}, "biases in attention or MLP"),
        ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, "model type 'qwen2' is not 'llama'"),
    ],
)
def test_a_config_the_own_forward_does_not_cover_loads_with_transformers(tiny_model_dir, tmp_path, caplog, changes,
                                                                         reason):  # fmt: skip
    from transformers import PreTrainedModel

    checkpoint = _changed_copy(tiny_model_dir, tmp_path, **changes)
    with caplog.at_level(logging.INFO, logger="a2rl_bench.inference.llama_forward"):
        loaded = load_model(checkpoint, "cpu", own_forward=True)
    assert isinstance(loaded.model, PreTrainedModel)
    assert any(reason in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_the_parameter_count_of_a_covered_config_is_transformers_count(tiny_model_dir, tmp_path):
    from a2rl_bench.inference.config_check import ConfigMismatch, _transformers_parameter_count
    from a2rl_bench.inference.llama_forward import parameter_count

    for tied in (True, False):
        config = {**json.loads((tiny_model_dir / "config.json").read_text()), "tie_word_embeddings": tied}
        checkpoint = _changed_copy(tiny_model_dir, tmp_path / str(tied), tie_word_embeddings=tied)
        assert parameter_count(config) == _transformers_parameter_count(checkpoint)
    from a2rl_bench.inference.config_check import check_config_matches_weights

    inflated = _changed_copy(tiny_model_dir, tmp_path / "inflated", num_hidden_layers=3)
    with pytest.raises(ConfigMismatch):
        check_config_matches_weights(inflated)


def _default_base_model() -> Path | None:
    from a2rl_bench.base_models.registry import resolve_base_model

    try:
        path = resolve_base_model("smollm2-135m-instruct")
    except Exception:  # noqa: BLE001 - not downloaded on this machine: the tiny model's tests still run
        return None
    return path if (path / "model.safetensors").is_file() else None


def test_the_default_base_model_gives_transformers_logits_and_completions(one_torch_thread):
    import torch

    model_dir = _default_base_model()
    if model_dir is None:
        pytest.skip("the default base model is not on this machine (offline)")
    own, theirs = load_model(model_dir, "cpu", own_forward=True), load_transformers(model_dir, "cpu")
    assert getattr(own.model, "own_forward", False)
    conversations = [[{"role": "system", "content": "Answer with a number.\n" * 8}, {"role": "user", "content": q}]
                     for q in ("What is 2+3?", "Tom has 5 apples and buys 7. How many now?", "What is 9*9?", "Hi")]
    prompts = [render_prompt(own.tokenizer, c) for c in conversations]
    assert prompts == [render_prompt(theirs.tokenizer, c) for c in conversations]
    x = torch.tensor(own.tokenizer(prompts[:1])["input_ids"])
    with torch.inference_mode():
        assert _relative(own.model.logits(x), theirs.model(x).logits) < 1e-5
    for batch_size in (1, 4):
        kwargs = dict(max_new_tokens=8, stop=["\n\n"], batch_size=batch_size)
        mine, expected = generate(own, conversations, **kwargs), generate(theirs, conversations, **kwargs)
        assert mine.completions == expected.completions


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"hidden_size": "64"}, "hidden_size is not a positive integer"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": None}}, "not a positive number"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings is not a boolean"),
    ],
)
def test_an_agents_malformed_config_is_refused_with_its_reason(tiny_model_dir, tmp_path, changes, reason):
    """config.json of a submission is the agent's: a number the forward cannot use is named, never a crash."""
    from a2rl_bench.inference.llama_forward import unsupported_reason

    assert unsupported_reason(tiny_model_dir) is None
    assert reason in (unsupported_reason(_changed_copy(tiny_model_dir, tmp_path, **changes)) or "")


def test_a_tied_checkpoint_with_another_saved_head_is_left_to_transformers(tiny_model_dir, tmp_path, caplog):
    """An agent may save an `lm_head.weight` that differs from the embeddings it says are tied."""
    from safetensors.torch import load_file, save_file
    from transformers import PreTrainedModel

    checkpoint = _changed_copy(tiny_model_dir, tmp_path)
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * 2
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.INFO, logger="a2rl_bench.inference.llama_forward"):
        loaded = load_model(checkpoint, "cpu", own_forward=True)
    assert isinstance(loaded.model, PreTrainedModel)
    assert any("different lm_head.weight" in r.getMessage() for r in caplog.records)


def test_the_batchers_forward_is_bit_for_bit_transformers(own, tiny, one_torch_thread):
    """Through the shared-prefix batcher's attention (the grader's CPU path) the hidden states are the same bits:
    every other operation is transformers' own, in its order, so greedy tokens cannot drift at near-ties."""
    import torch

    from a2rl_bench.inference import prefix_batching
    from a2rl_bench.inference.prefix_batching import PrefixBatcher, _Forward

    ids = torch.randint(5, len(tiny.tokenizer), (2, 30), generator=torch.Generator().manual_seed(0))
    hidden = []
    for model in (own.model, tiny.model):
        batcher = PrefixBatcher(model)
        keys = [torch.zeros((2, batcher.kv_heads, 32, batcher.head_dim)) for _ in range(batcher.layers)]
        f = _Forward([], [], keys, [torch.zeros_like(k) for k in keys], torch.arange(2), torch.zeros(2).long(), False)
        before, model.config._attn_implementation = model.config._attn_implementation, prefix_batching.ATTENTION
        prefix_batching._CURRENT.append(f)
        try:
            with torch.inference_mode():
                hidden.append(model.model(input_ids=ids, attention_mask=torch.ones((2, 1, 1, 1), dtype=torch.bool),
                                          position_ids=torch.arange(30)[None].expand(2, -1)).last_hidden_state)
        finally:
            prefix_batching._CURRENT.pop()
            model.config._attn_implementation = before
    assert torch.equal(hidden[0], hidden[1])


def test_the_own_forward_reads_the_weight_files_transformers_reads(tiny_model_dir, tmp_path, one_torch_thread):
    """An agent may leave other `*.safetensors` beside `model.safetensors` (transformers ignores them): the own
    forward must grade the weights transformers loads, never a stray file's copy of a tensor; a shard index that
    saves one tensor twice is left to transformers."""
    import torch
    from safetensors.torch import load_file, save_file

    from a2rl_bench.inference.llama_forward import load

    checkpoint = _changed_copy(tiny_model_dir, tmp_path)
    tensors = load_file(checkpoint / "model.safetensors")
    save_file({"model.embed_tokens.weight": tensors["model.embed_tokens.weight"] * 2}, checkpoint / "zz.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    model, _ = load(checkpoint)
    assert torch.equal(model.embed, tensors["model.embed_tokens.weight"])

    (checkpoint / "model.safetensors").rename(checkpoint / "a.safetensors")
    weight_map = {name: "a.safetensors" for name in tensors} | {"model.embed_tokens.weight": "zz.safetensors"}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert load(checkpoint) is None  # the embeddings are in both shards
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../a.safetensors"}}))
    assert load(checkpoint) is None
