"""Seeded splits of goal ids and the committed split manifests of the interactive tasks (stdlib only)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def split_ids(ids: list[str], sizes: Mapping[str, int], seed: int) -> dict[str, list[str]]:
    """Shuffle ids (sorted first, so input order does not matter) and cut them into named parts.

    A size of -1 takes whatever is left (used for train).
    """
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    fixed = sum(n for n in sizes.values() if n >= 0)
    if fixed > len(order):
        raise ValueError(f"split sizes {dict(sizes)} need {fixed} ids, only {len(order)} exist")
    parts, start = {}, 0
    for name, size in sizes.items():
        size = len(order) - fixed if size < 0 else size
        parts[name] = order[start : start + size]
        start += size
    return parts


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write a manifest with each id list on one line (readable diffs, small files)."""
    lists = {k: v for k, v in manifest.items() if isinstance(v, dict) and all(isinstance(x, list) for x in v.values())}
    body = json.dumps({k: ({n: f"@{k}.{n}@" for n in v} if k in lists else v) for k, v in manifest.items()}, indent=2)
    for key, parts in lists.items():
        for name, ids in parts.items():
            body = body.replace(f'"@{key}.{name}@"', json.dumps(ids))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body + "\n")


def read_manifest(path: Path, error: type[Exception], regenerate: str) -> dict[str, Any]:
    if not path.is_file():
        raise error(f"missing {path}; regenerate it with {regenerate}")
    return json.loads(path.read_text())
