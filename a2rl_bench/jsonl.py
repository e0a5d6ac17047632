"""JSON Lines, the one reader and writers: task splits, the agents' call logs, the harness's own records.

`read_jsonl` is strict by default (a bad line is an error: a task's data must be whole); `tolerant=True` is for
files another process may still be writing or may have left torn (an agent that crashed mid-line): the bad
lines and non-object rows are skipped, a missing file reads as empty.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def read_jsonl(path: Path | str, *, tolerant: bool = False) -> list[Any]:
    """The rows of a JSON Lines file, blank lines skipped."""
    path = Path(path)
    if tolerant and not path.exists():
        return []
    # Split on "\n" only: `str.splitlines` also splits on U+2028 and U+0085, which JSON leaves raw inside strings.
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    if not tolerant:
        return [json.loads(line) for line in lines]
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:  # a torn last line of a crashed writer: skip it, keep the rest
            continue
    return [r for r in rows if isinstance(r, dict)]


def write_jsonl(path: Path | str, rows: Iterable[Any]) -> None:
    """Write all rows at once: to a temporary file beside `path`, then renamed, so readers never see half. The
    temporary is the writer's own: two runs on one host filling the shared task-data cache at once each rename
    theirs (a shared name made the second rename fail, FileNotFoundError, and could mix both writes)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def append_jsonl(path: Path | str, record: BaseModel | dict) -> None:
    """Append one JSON line (one `write` call, so concurrent appenders do not interleave lines)."""
    line = record.model_dump_json() if isinstance(record, BaseModel) else json.dumps(record, default=str)
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(line + "\n")
