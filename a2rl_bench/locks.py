"""The one inter-process lock: an exclusive `flock` on a lock file, held for a `with` block.

Used where processes (parallel runs, the CLI beside a flow) must take turns: building a base model once
(`a2rl_bench.base_models.registry`), opening the DuckDB results store (`a2rl_bench.store.results`) and preparing
a task's data (`BenchmarkTask.prepare`, re-entrant). The lock goes with the file descriptor,
so a process that dies releases it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class LockTimeout(TimeoutError):
    """The lock was still held by another process at the deadline."""


@contextmanager
def exclusive_lock(
    lock_path: Path | str, deadline: float | None = None, timeout_error: Callable[[], Exception] | None = None
) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` (created if missing) until the block exits. Without `deadline`
    (a `time.monotonic()` value) wait as long as it takes; with one, poll so the timeout is exact and raise
    `timeout_error()` (default `LockTimeout`) when it passes."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if deadline is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            _poll(fd, deadline, timeout_error or (lambda: LockTimeout(f"timed out waiting for {lock_path}")))
        yield
    finally:
        os.close(fd)  # also releases the flock


_HELD = threading.local()


@contextmanager
def reentrant_lock(lock_path: Path | str, deadline: float | None = None,
                   timeout_error: Callable[[], Exception] | None = None) -> Iterator[None]:  # fmt: skip
    """`exclusive_lock`, which the thread holding it may take again inside its block (a second flock on a new
    descriptor of one process would wait on itself forever). Other threads and processes wait their turn."""
    held: set[str] = _HELD.__dict__.setdefault("paths", set())
    key = os.path.realpath(lock_path)
    if key in held:
        yield
        return
    with exclusive_lock(lock_path, deadline, timeout_error):
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)


def _poll(fd: int, deadline: float, timeout_error: Callable[[], Exception]) -> None:
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            if time.monotonic() >= deadline:
                raise timeout_error() from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
