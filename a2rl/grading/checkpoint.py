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
    # The grader runs outside the sandbox: a link that dangles for the agent may resolve here (to hidden data).
    links = [p.name for p in path.rglob("*") if p.is_symlink()]
    if links:
        raise SubmissionRejected(f"checkpoint contains symbolic links ({', '.join(sorted(links)[:5])}): "
                                 "submit regular files only")
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


def check_compatible(path: Path, base_model_dir: Path) -> None:
    """The submission must be the base model's architecture and vocabulary (the task's prompts and
    tokenizer assumptions hold only then), and its safetensors files must be intact."""
    mine = json.loads((path / "config.json").read_text())
    base = json.loads((Path(base_model_dir) / "config.json").read_text())
    if mine.get("architectures") != base.get("architectures") or mine.get("model_type") != base.get("model_type"):
        raise SubmissionRejected(
            f"checkpoint architecture {mine.get('architectures')} ({mine.get('model_type')}) differs from the base "
            f"model's {base.get('architectures')} ({base.get('model_type')}): fine-tune the base model in models/base"
        )
    if mine.get("vocab_size") != base.get("vocab_size"):
        raise SubmissionRejected(
            f"checkpoint vocab_size {mine.get('vocab_size')} differs from the base model's {base.get('vocab_size')}"
        )
    for f in sorted(path.glob("*.safetensors")):
        check_safetensors(f)


def check_safetensors(path: Path) -> None:
    """Read the header (8-byte length + JSON) and check every tensor's byte range lies inside the file:
    catches truncated, overwritten and non-safetensors files without loading any weights."""
    size = path.stat().st_size
    with path.open("rb") as f:
        raw_len = f.read(8)
        if len(raw_len) < 8:
            raise SubmissionRejected(f"{path.name} is not a valid safetensors file (too short)")
        header_len = int.from_bytes(raw_len, "little")
        if header_len <= 0 or 8 + header_len > size or header_len > 100 * 1024**2:
            raise SubmissionRejected(f"{path.name} is corrupted: bad safetensors header length")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise SubmissionRejected(f"{path.name} is corrupted: unreadable safetensors header") from e
    data_size = size - 8 - header_len
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not offsets or len(offsets) != 2 or not (0 <= offsets[0] <= offsets[1] <= data_size):
            raise SubmissionRejected(f"{path.name} is corrupted or truncated (tensor {name!r} out of bounds)")
