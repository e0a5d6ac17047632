"""The agent's output (stdout and stderr), capped on disk and searched for hidden items as it is written.

An agent printing fast grew `harness/agent.log` to 3 GiB in 36 s. `AgentLog` keeps the first `head_bytes` in the
file as they come and the last `tail_bytes` in memory, and at the end writes the tail after one line saying how
many bytes were dropped between them. Every byte, dropped or kept, first passes through a `StreamMatcher` for the
hidden items (when the harness gives one): the leak audit then knows what the whole output held, not only what
was kept. `capture` reads the agent's pipe on a thread of its own; a slow reader only slows the agent's writes
(the pipe fills), it never skips bytes.

The record of each capture goes to `harness/agent-log.json` (`AgentLogRecord`), rewritten every few seconds while
bytes are dropped and once more at the end (`complete`): a capture the harness's death cut short says so.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections import deque
from pathlib import Path

from pydantic import BaseModel, Field

from a2rl_bench.ngrams import StreamMatcher

HEAD_BYTES = 48 * 1024**2
TAIL_BYTES = 16 * 1024**2
RECORD_FILE = "agent-log.json"
FLUSH_SECONDS = 5.0


class AgentLogRecord(BaseModel):
    """One session's output: how much there was, what was kept, and what the stream search found in all of it."""

    total_bytes: int = 0
    head_bytes: int = 0
    tail_bytes: int = 0
    dropped_bytes: int = 0
    """Written by the agent between the kept head and tail; in the search (when `scanned`), not in the file."""
    scanned: bool = False
    """Every byte passed through the hidden-item search (the harness gave one)."""
    complete: bool = False
    """The capture saw the end of the output and wrote the tail: False when the harness died meanwhile."""
    found: dict[int, tuple[str, str]] = Field(default_factory=dict)
    """Hidden item index -> (kind, evidence), over every byte the search read."""


class AgentLog:
    """The capped, searched agent log of one session (see the module docstring)."""

    def __init__(self, path: Path, matcher: StreamMatcher | None = None, head_bytes: int = HEAD_BYTES,
                 tail_bytes: int = TAIL_BYTES):  # fmt: skip
        self.path, self.matcher = Path(path), matcher
        self.head_left = max(0, head_bytes - (self.path.stat().st_size if self.path.exists() else 0))
        self.tail_bytes = tail_bytes
        self.record = AgentLogRecord(scanned=matcher is not None)
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._file = self.path.open("ab")
        self._records_path = self.path.with_name(RECORD_FILE)
        self._earlier = _read_records(self._records_path)
        self._flushed = 0.0
        self._flush()

    def write(self, data: bytes) -> None:
        if self.matcher is not None:
            self.matcher.feed(data)
        self.record.total_bytes += len(data)
        if self.head_left:
            head = data[: self.head_left]
            self._file.write(head)
            self._file.flush()
            self.head_left -= len(head)
            self.record.head_bytes += len(head)
            data = data[len(head) :]
        if data:
            self._tail.append(data)
            self._tail_size += len(data)
            while self._tail_size - len(self._tail[0]) >= self.tail_bytes:
                self._tail_size -= len(self._tail.popleft())
            if time.monotonic() - self._flushed > FLUSH_SECONDS:
                self._flush()

    def close(self, complete: bool = True) -> AgentLogRecord:
        """Write the tail (after a line saying what was dropped) and the final record."""
        tail = b"".join(self._tail)[-self.tail_bytes :] if self._tail else b""
        dropped = self.record.total_bytes - self.record.head_bytes - len(tail)
        if dropped:
            self._file.write(f"\n[a2rl: {dropped} bytes of agent output dropped here (the log keeps the first "
                             f"{self.record.head_bytes} and the last {len(tail)}); "
                             f"{'all were searched for hidden items' if self.matcher else 'not searched'}]\n"
                             .encode())  # fmt: skip
        self._file.write(tail)
        self._file.close()
        if self.matcher is not None:
            self.matcher.close()
        self.record.tail_bytes, self.record.dropped_bytes, self.record.complete = len(tail), dropped, complete
        self._flush()
        return self.record

    def _flush(self) -> None:
        if self.matcher is not None:
            self.record.found = dict(self.matcher.found)
        self.record.dropped_bytes = max(self.record.dropped_bytes,
                                        self.record.total_bytes - self.record.head_bytes - self._tail_size)  # fmt: skip
        tmp = self._records_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"captures": [*self._earlier, self.record.model_dump(mode="json")]}, indent=1))
        tmp.replace(self._records_path)
        self._flushed = time.monotonic()


def _read_records(path: Path) -> list[dict]:
    try:
        return list(json.loads(path.read_text())["captures"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def read_agent_log_records(harness_dir: Path) -> list[AgentLogRecord]:
    """Every capture of the run's agent log (one per session attempt), oldest first."""
    return [AgentLogRecord.model_validate(r) for r in _read_records(Path(harness_dir) / RECORD_FILE)]


class Capture:
    """Reads the agent's output pipe into an `AgentLog` on a daemon thread (`start`), until every writer has closed
    the pipe; `finish` (after the session) drains what is left, or gives up after `drain_s` on a writer that
    escaped the session: the log is then recorded as incomplete."""

    def __init__(self, read_fd: int, log: AgentLog, chunk: int = 1 << 20):
        self.fd, self.log, self.chunk = read_fd, log, chunk
        self._stop_at: float | None = None
        self._thread = threading.Thread(target=self._pump, name="agent-log", daemon=True)

    def start(self) -> Capture:
        self._thread.start()
        return self

    def finish(self, drain_s: float = 10.0) -> AgentLogRecord:
        self._stop_at = time.monotonic() + drain_s
        self._thread.join(drain_s + 5)
        return self.log.record

    def _pump(self) -> None:
        complete = False
        try:
            while self._stop_at is None or time.monotonic() < self._stop_at:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    continue
                data = os.read(self.fd, self.chunk)
                if not data:  # every writer is gone: the whole output was read
                    complete = True
                    break
                self.log.write(data)
        finally:
            os.close(self.fd)
            self.log.close(complete=complete)
