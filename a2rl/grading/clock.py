"""A pausable budget clock: the agent's time runs, except while its submissions are being graded."""

from __future__ import annotations

import threading
import time


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
