"""A pausable budget clock: the agent's time runs, except while its submissions are being graded.

`ClockRecorder` writes the clock to a file every few seconds, so a run resumed after a crash knows how
much of the agent's budget was already spent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path


class BudgetClock:
    def __init__(self, budget_s: float, already_used_s: float = 0.0):
        self.budget_s = float(budget_s)
        self._used_before_start = already_used_s
        self._lock = threading.Lock()
        self._started_at: float | None = None
        self._pauses = 0  # nested: several evaluations may be in flight at once
        self._paused_at = 0.0
        self._paused_total = 0.0
        self._stopped_at: float | None = None

    def start(self) -> None:
        with self._lock:
            if self._started_at is None:
                self._started_at = time.monotonic()

    def stop(self) -> None:
        with self._lock:
            if self._stopped_at is None:
                self._stopped_at = time.monotonic()

    def pause(self) -> None:
        with self._lock:
            if self._pauses == 0:
                self._paused_at = time.monotonic()
            self._pauses += 1

    def resume(self) -> None:
        with self._lock:
            if self._pauses == 0:
                return
            self._pauses -= 1
            if self._pauses == 0:
                self._paused_total += time.monotonic() - self._paused_at

    def elapsed(self) -> float:
        """Agent seconds used so far (grading pauses excluded)."""
        with self._lock:
            if self._started_at is None:
                return self._used_before_start
            now = self._stopped_at or time.monotonic()
            paused = self._paused_total + (now - self._paused_at if self._pauses else 0.0)
            return self._used_before_start + (now - self._started_at) - paused

    def paused_seconds(self) -> float:
        with self._lock:
            now = time.monotonic()
            return self._paused_total + (now - self._paused_at if self._pauses else 0.0)

    def remaining(self) -> float:
        return max(0.0, self.budget_s - self.elapsed())

    @property
    def is_paused(self) -> bool:
        return self._pauses > 0

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0


class ClockRecorder:
    """Persists `clock.elapsed()` to a JSON file every `interval_s` while active (a context manager)."""

    def __init__(self, clock: BudgetClock, path: Path, interval_s: float = 5.0):
        self.clock, self.path, self.interval_s = clock, Path(path), interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="clock-recorder")

    @staticmethod
    def used_seconds(path: Path) -> float:
        """Agent seconds recorded by an earlier (possibly crashed) session; 0 when none."""
        try:
            return float(json.loads(Path(path).read_text())["elapsed_s"])
        except (OSError, ValueError, KeyError):
            return 0.0

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"elapsed_s": round(self.clock.elapsed(), 3), "at": time.time()}))
        os.replace(tmp, self.path)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.save()

    def __enter__(self) -> ClockRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.save()
