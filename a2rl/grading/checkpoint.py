"""Checks on a submitted checkpoint path, before any evaluation is spent on it."""

from __future__ import annotations

import json
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
MAX_CHECKPOINT_BYTES = 64 * 1024**3


class SubmissionRejected(ValueError):
    """A submission that cannot be evaluated; `status_code` is the HTTP status to answer with."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code


def resolve_in_workspace(workspace: Path, model_path: str) -> Path:
    """Resolve an agent-given path; it must stay inside the workspace (symlinks resolved)."""
    if not isinstance(model_path, str) or not model_path.strip():
        raise SubmissionRejected("model_path must be a non-empty string")
    if "\x00" in model_path:
        raise SubmissionRejected("model_path contains a NUL byte")
    root = workspace.resolve()
    candidate = Path(model_path)
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if resolved != root and root not in resolved.parents:
        raise SubmissionRejected(
            f"model_path {model_path!r} resolves outside the workspace; submit a directory under output/"
        )
    if not resolved.exists():
        raise SubmissionRejected(f"model_path {model_path!r} does not exist", 404)
    if not resolved.is_dir():
        raise SubmissionRejected(f"model_path {model_path!r} is not a directory (submit a checkpoint dir)")
    return resolved


def check_checkpoint(path: Path, max_bytes: int = MAX_CHECKPOINT_BYTES) -> dict:
    """Structural checks of a HF checkpoint dir; returns a few facts, raises SubmissionRejected."""
    if (path / "adapter_config.json").exists() and not (path / "config.json").exists():
        raise SubmissionRejected(
            "this is an unmerged LoRA adapter (adapter_config.json without config.json): merge it into "
            "the base model first (peft: model.merge_and_unload(); then save_pretrained) and submit that"
        )
    config_path = path / "config.json"
    if not config_path.exists():
        raise SubmissionRejected("config.json is missing: save the model with save_pretrained()")
    try:
        config = json.loads(config_path.read_text())
    except ValueError as e:
        raise SubmissionRejected(f"config.json is not valid JSON: {e}") from e
    weights = [p for pattern in WEIGHT_PATTERNS for p in path.glob(pattern)]
    if not weights:
        raise SubmissionRejected("no weights found (*.safetensors or *.bin)")
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise SubmissionRejected("tokenizer files are missing: also save the tokenizer into the checkpoint dir")
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    if size > max_bytes:
        raise SubmissionRejected(f"checkpoint is {size / 1e9:.1f} GB, over the {max_bytes / 1e9:.0f} GB cap", 413)
    return {"architectures": config.get("architectures"), "vocab_size": config.get("vocab_size"), "size_bytes": size}
