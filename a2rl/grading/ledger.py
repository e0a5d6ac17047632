"""The grading ledger: append-only JSONL outside the workspace, fsynced, hash-chained.

Each line carries the sha256 of the previous line, so an edited, reordered or deleted entry is
detected by `verify()`. The ledger is the source of truth for scores; DuckDB is a view of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from a2rl.records import LedgerEntry


class LedgerCorrupted(RuntimeError):
    """The ledger file does not verify: a line was edited, removed or is not valid JSON."""


class Ledger:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: list[LedgerEntry] = self._load() if self.path.exists() else []
        self._last_hash = _line_hash(self._last_line()) if self._entries else ""

    def append(self, **fields: Any) -> LedgerEntry:
        """Write one entry durably (fsync) and return it."""
        with self._lock:
            entry = LedgerEntry(seq=len(self._entries), prev_hash=self._last_hash, **fields)
            line = entry.model_dump_json()
            with self.path.open("a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
            self._entries.append(entry)
            self._last_hash = _line_hash(line)
            return entry

    def entries(self) -> list[LedgerEntry]:
        with self._lock:
            return list(self._entries)

    def verify(self) -> int:
        """Re-read the file and check the hash chain; return the number of entries."""
        return len(self._load())

    def _last_line(self) -> str:
        with self.path.open() as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        return lines[-1]

    def _load(self) -> list[LedgerEntry]:
        entries: list[LedgerEntry] = []
        prev = ""
        with self.path.open() as f:
            raw_lines = f.read().split("\n")
        # A crash during a write can leave a torn last line (no trailing newline): it was never
        # acknowledged to anyone, so it is dropped and rewritten away rather than failing the run.
        if raw_lines and raw_lines[-1].strip():
            self._truncate_torn_tail(raw_lines)
            raw_lines = raw_lines[:-1]
        for n, line in enumerate(x for x in raw_lines if x.strip()):
            try:
                entry = LedgerEntry.model_validate_json(line)
            except ValueError as e:
                raise LedgerCorrupted(f"{self.path}: line {n + 1} is not a ledger entry: {e}") from e
            if entry.prev_hash != prev or entry.seq != n:
                raise LedgerCorrupted(
                    f"{self.path}: hash chain broken at line {n + 1} (seq {entry.seq}): "
                    "an entry was edited, removed or reordered"
                )
            prev = _line_hash(line)
            entries.append(entry)
        return entries

    def _truncate_torn_tail(self, raw_lines: list[str]) -> None:
        keep = "\n".join(raw_lines[:-1])
        keep = keep + "\n" if keep and not keep.endswith("\n") else keep
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(keep)
        os.replace(tmp, self.path)


def _line_hash(line: str) -> str:
    return hashlib.sha256(line.encode()).hexdigest()


def read_ledger(path: Path) -> list[LedgerEntry]:
    """Verified entries of a ledger file (raises LedgerCorrupted)."""
    return Ledger(path).entries()


def dump_entries(entries: list[LedgerEntry]) -> list[dict]:
    return [json.loads(e.model_dump_json()) for e in entries]
