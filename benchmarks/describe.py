"""A plain-text description of one task for `a2rl tasks show`: metric, evaluator, decoding, data per variant."""

from __future__ import annotations

import json
from pathlib import Path

from a2rl_bench.paths import task_data_dir
from a2rl_bench.benchmarks import get_task
from a2rl_bench.benchmarks.base import BenchmarkTask


def prepared_manifest(task: BenchmarkTask, variant: str) -> dict | None:
    """The manifest `prepare()` wrote for this variant, or None if it was not prepared on this machine."""
    path = task_data_dir() / task.id / f"{variant}-v{task.data_version}" / "manifest.json"
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _sizes(sizes: dict) -> str:
    return ", ".join(f"{name} {sizes.get(name, 0)}" for name in ("train", "validation", "test"))


def describe_variant(task: BenchmarkTask, variant: str, load_offline: bool = True) -> list[str]:
    """Sizes and source of one variant: from its prepared manifest, else by loading it (offline only,
    since the `full` variants download from the Hugging Face Hub)."""
    lines = [f"  {variant}: {task.variant_labels.get(variant, variant)}"]
    try:
        loadable = variant in task.loaders()
    except NotImplementedError:  # a task that overrides load() alone: it says at load time
        loadable = True
    if not loadable:  # a task.toml copied from another task's (gsm8k's `full`) labels a variant this one lacks
        return [*lines, f"    not a variant of {task.id}: task.toml labels it, but the task has no loader for it "
                        "(remove it from [variant_labels])"]
    manifest = prepared_manifest(task, variant)
    if manifest is not None:
        lines.append(f"    prepared: {_sizes(manifest['sizes'])}")
        lines.append(f"    source: {manifest['source']}")
    elif variant == "offline" and load_offline:
        try:
            data = task.load(variant)
        except Exception as e:  # a missing wheel or a drifted split: say why, keep describing
            lines.append(f"    not loadable here: {type(e).__name__}: {str(e).splitlines()[0]}")
        else:
            sizes = {"train": len(data.train), "validation": len(data.validation), "test": len(data.test)}
            lines.append(f"    loadable (not prepared yet): {_sizes(sizes)}")
            lines.append(f"    source: {data.source}")
    else:
        lines.append("    not prepared on this machine (needs internet / Hugging Face access to load)")
    return lines


def describe_task(task_id: str, load_offline: bool = True) -> str:
    """Everything a user needs to know about a task before running it, as text.

    Args:
        task_id: A registered task id.
        load_offline: Load the offline variant to count its splits when it was not prepared yet
            (a few seconds for some tasks); False reports only what is prepared.
    """
    task = get_task(task_id)
    d = task.decoding
    stop = ", ".join(repr(s) for s in d.stop) or "none"
    lines = [
        f"{task.id} ({task.level}): {task.title}",
        f"metric: {task.metric}",
        f"evaluator: {task.evaluator_id()}",
        f"decoding: temperature {d.temperature:g}, max_new_tokens {d.max_new_tokens}, stop {stop}",
        f"prompt: {task.prompt_version}",
        f"default base model: {task.default_base_model}",
        "variants:",
    ]
    for variant in task.variant_labels:
        lines += describe_variant(task, variant, load_offline)
    extra = getattr(task, "describe_extra", None)
    if callable(extra):
        lines += extra()
    return "\n".join(lines)
