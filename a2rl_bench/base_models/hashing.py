"""Content hashes of checkpoint directories (a base model's or a submission's): names and bytes, never mtimes."""

from __future__ import annotations

import hashlib
from pathlib import Path

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
