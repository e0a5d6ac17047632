"""Checks on a submitted checkpoint, before any evaluation is spent on it, and the snapshot that is graded.

The snapshot holds the submission's weights and (cleaned) config.json only; the tokenizer, chat template and
generation settings come from the harness's own copy of the base model's files (`snapshot_base_files`), so
nothing the agent wrote runs over hidden prompts except the weights themselves.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2rl_bench.grading.errors import SubmissionRejected
from a2rl_bench.grading.files import CheckpointDir, Deadline, OpenFile, refusal, shown
from a2rl_bench.grading.weights import (
    MAX_SAFETENSORS_HEADER,
    TensorStats,
    check_config_against_weights,
    parse_safetensors_header,
)

MAX_CHECKPOINT_BYTES = 64 * 1024**3
SNAPSHOT_QUOTA_BYTES = 4 * MAX_CHECKPOINT_BYTES
"""Default bytes a run's submission snapshots may write in all (`GradingContext.snapshot_quota_bytes`)."""
WEIGHT_SUFFIXES = (".safetensors", ".bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
NOT_WEIGHTS = {"training_args.bin"}  # Trainer's pickled arguments, never loaded by the grader
BASE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    "generation_config.json",
)  # fmt: skip
"""Harness-owned: taken from the base model for every snapshot, never from a submission."""
CONFIG_KEYS_DROPPED = ("auto_map", "tokenizer_class", "chat_template", "custom_pipelines")
"""config.json keys that would choose code or a template; the base model's files decide those."""

__all__ = ["SubmissionRejected", "CheckedCheckpoint", "open_checkpoint", "check_checkpoint", "check_compatible",
           "SNAPSHOT_QUOTA_BYTES", "allocated_bytes"]


def resolve_in_workspace(workspace: Path, model_path: str) -> Path:
    """Resolve an agent-given path; it must stay inside the workspace (symlinks resolved)."""
    if not isinstance(model_path, str) or not model_path.strip():
        raise SubmissionRejected("model_path must be a non-empty string")
    if "\x00" in model_path:
        raise SubmissionRejected("model_path contains a NUL byte")
    try:
        model_path.encode()
    except UnicodeEncodeError as e:  # a lone surrogate from JSON's \udXXX escapes names no file
        raise SubmissionRejected("model_path is not valid Unicode text") from e
    root = workspace.resolve()
    candidate = Path(model_path)
    try:
        resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    except (RuntimeError, OSError) as e:  # Python 3.11's resolve() raises RuntimeError on a link loop
        raise SubmissionRejected(f"model_path {shown(model_path)} is a symbolic link loop") from e
    # Outside first: never say whether a host path outside the workspace exists.
    if resolved != root and root not in resolved.parents:
        raise SubmissionRejected(
            f"model_path {shown(model_path)} resolves outside the workspace; submit a directory under output/"
        )
    try:
        mode = resolved.stat().st_mode
    except OSError as e:
        raise refusal(e, f"model_path {shown(model_path)}") from e
    if not stat.S_ISDIR(mode):
        raise SubmissionRejected(f"model_path {shown(model_path)} is not a directory (submit a checkpoint dir)")
    return resolved


def open_checkpoint(workspace: Path, model_path: str) -> CheckpointDir:
    """The agent's checkpoint dir, resolved inside the workspace and held open by fd."""
    resolved = resolve_in_workspace(workspace, model_path)
    return CheckpointDir.open(workspace.resolve(), resolved, model_path)


@dataclass
class CheckedCheckpoint:
    """A checkpoint that passed the structural checks: its open files and what the grader learnt."""

    dir: CheckpointDir
    config: dict[str, Any]
    weights: list[OpenFile]
    index: OpenFile | None
    size_bytes: int
    facts: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        self.dir.close()


def check_checkpoint(ckpt: CheckpointDir, max_bytes: int = MAX_CHECKPOINT_BYTES,
                     deadline: Deadline | None = None) -> CheckedCheckpoint:  # fmt: skip
    """Structural checks of a HF checkpoint dir (top level); raises SubmissionRejected."""
    deadline = deadline or Deadline()
    entries = ckpt.entries(deadline)
    links = sorted(n for n, st in entries.items() if stat.S_ISLNK(st.st_mode))
    if links:
        raise SubmissionRejected(f"checkpoint contains symbolic links ({', '.join(map(shown, links[:5]))}): "
                                 "submit regular files only")  # fmt: skip
    odd = sorted(n for n, st in entries.items() if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)))
    if odd:
        names = ", ".join(map(shown, odd[:5]))
        raise SubmissionRejected(f"checkpoint contains files that are not regular files ({names}): FIFOs, sockets "
                                 "and devices are refused")  # fmt: skip
    if "adapter_config.json" in entries and "config.json" not in entries:
        raise SubmissionRejected(
            "this is an unmerged LoRA adapter (adapter_config.json without config.json): merge it into "
            "the base model first (peft: model.merge_and_unload(); then save_pretrained) and submit that"
        )
    if "config.json" not in entries:
        raise SubmissionRejected("config.json is missing: save the model with save_pretrained()")
    config_file = ckpt.open_file("config.json")
    weight_names = sorted(n for n in entries if n.endswith(WEIGHT_SUFFIXES) and n not in NOT_WEIGHTS)
    if not weight_names:
        raise SubmissionRejected("no weights found (*.safetensors or *.bin)")
    weights = [ckpt.open_file(n) for n in weight_names]
    index_name = next((n for n in INDEX_FILES if n in entries), None)
    index = ckpt.open_file(index_name) if index_name else None
    opened = [config_file, *weights, *([index] if index else [])]
    size = sum(f.size for f in opened)  # apparent sizes: a sparse file counts in full
    if size > max_bytes:
        raise SubmissionRejected(f"checkpoint is {size / 1e9:.1f} GB, over the {max_bytes / 1e9:.0f} GB cap", 413)
    config = config_file.read_json()
    if not isinstance(config, dict):
        raise SubmissionRejected("config.json is not a JSON object")
    if index is not None:
        _check_index(index, weight_names)
    deadline.check("reading config.json")
    facts = {"architectures": config.get("architectures"), "vocab_size": config.get("vocab_size"),
             "size_bytes": size}  # fmt: skip
    return CheckedCheckpoint(ckpt, config, weights, index, size, facts)


def _check_index(index: OpenFile, weight_names: list[str]) -> None:
    """The shard index may only name shards of this checkpoint (never `../` or an absolute path)."""
    data = index.read_json()
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise SubmissionRejected(f"{index.name} has no valid weight_map")
    unknown = sorted(set(weight_map.values()) - set(weight_names))
    if unknown:
        raise SubmissionRejected(f"{index.name} names shards that are not files of this checkpoint "
                                 f"({', '.join(map(shown, unknown[:3]))})")  # fmt: skip


def check_compatible(checked: CheckedCheckpoint, base_model_dir: Path, deadline: Deadline | None = None) -> None:
    """The submission must be the base model's architecture and vocabulary (the base model's tokenizer and
    chat template render the prompts), its safetensors files must be intact, and its config must describe its
    weights (`weights.check_config_against_weights`: no config that builds a far larger model)."""
    deadline = deadline or Deadline()
    mine = checked.config
    base = json.loads((Path(base_model_dir) / "config.json").read_text())
    if mine.get("architectures") != base.get("architectures") or mine.get("model_type") != base.get("model_type"):
        raise SubmissionRejected(
            f"checkpoint architecture {_short(mine.get('architectures'))} ({_short(mine.get('model_type'))}) differs "
            f"from the base model's {base.get('architectures')} ({base.get('model_type')}): fine-tune the base model "
            "in models/base"
        )
    if mine.get("vocab_size") != base.get("vocab_size"):
        raise SubmissionRejected(
            f"checkpoint vocab_size {_short(mine.get('vocab_size'))} differs from the base model's "
            f"{base.get('vocab_size')}: grading uses the base model's tokenizer"
        )
    stats = TensorStats()
    for f in checked.weights:
        if f.name.endswith(".safetensors"):
            deadline.check(f"checking {f.name}")
            stats.add(check_safetensors(f))
    other = sum(f.size for f in checked.weights if not f.name.endswith(".safetensors"))
    check_config_against_weights(mine, stats, other)
    checked.facts["parameters"] = stats.numel or None


def _short(value: Any) -> str:
    text = json.dumps(value)[:80]
    return text


def check_safetensors(f: OpenFile) -> TensorStats:
    """Read the header (8-byte length + JSON) in bounded memory and check that every tensor's byte range has its
    dtype's size and that the ranges tile the file's data: catches truncated, overwritten and non-safetensors
    files without loading any weights (`a2rl_bench.grading.weights`)."""
    name = shown(f.name)
    raw_len = f.read_at(0, 8)
    if len(raw_len) < 8:
        raise SubmissionRejected(f"{name} is not a valid safetensors file (too short)")
    header_len = int.from_bytes(raw_len, "little")
    if header_len <= 0 or 8 + header_len > f.size or header_len > MAX_SAFETENSORS_HEADER:
        raise SubmissionRejected(f"{name} is corrupted: bad safetensors header length")
    raw = f.read_at(8, header_len)
    if len(raw) != header_len:
        raise SubmissionRejected(f"{name} changed while it was checked: submit it again", 409)
    return parse_safetensors_header(raw, f.size - 8 - header_len, name)


# -- snapshots -------------------------------------------------------------------------------------------
def snapshot_base_files(base_model_dir: Path, dest: Path) -> Path:
    """Copy the base model's tokenizer, chat template and generation config into a harness-only directory,
    once (first use); later snapshots take them from here, never from a submission."""
    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in BASE_FILES:
        src = Path(base_model_dir) / name
        if src.is_file():  # the base model is the harness's own (links in a hub-style cache are fine)
            shutil.copyfile(src, tmp / name)
    tmp.rename(dest)
    return dest


def write_snapshot(checked: CheckedCheckpoint, dest: Path, base_files: Path | None, deadline: Deadline,
                   charge: Callable[[int], None] | None = None) -> Path:  # fmt: skip
    """The graded copy: weights (from the checked fds, sparsely; each block told to `charge` before it is
    written), a cleaned config.json, the base model's tokenizer."""
    dest.mkdir(parents=True)
    for f in [*checked.weights, *([checked.index] if checked.index else [])]:
        f.copy_to(dest / f.name, deadline, charge=charge)
    config = {k: v for k, v in checked.config.items() if k not in CONFIG_KEYS_DROPPED}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    if base_files is not None:
        for src in sorted(base_files.iterdir()):
            shutil.copyfile(src, dest / src.name)
    return dest


def allocated_bytes(root: Path) -> int:
    """Disk bytes the files under `root` (a harness-owned directory) take: their allocated blocks."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def check_directory(path: Path, max_bytes: int = MAX_CHECKPOINT_BYTES) -> dict[str, Any]:
    """`check_checkpoint` on a directory given directly (harness tools and tests): its facts."""
    path = Path(path).resolve()
    with CheckpointDir.open(path.parent, path, path.name) as ckpt:
        return check_checkpoint(ckpt, max_bytes).facts
