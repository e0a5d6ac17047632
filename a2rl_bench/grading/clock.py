"""A pausable budget clock: the agent's time runs, except while its submissions are being graded.

`ClockRecorder` writes the clock to a file four times a second, so a run resumed after a crash knows how much
of the agent's budget was already spent, within a quarter of a second; an earlier attempt whose agent kept
running after its harness stopped recording (a frozen harness) is charged up to the moment the retry ended it
(`charge_until`); one that stops itself because a later attempt took over saves its clock as it ends its agent
(`stop_all_now`). Time past the budget (the grace the agent gets to wrap up) is counted apart from it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

CLOCK_FILE = "clock.json"
"""In the run's harness directory: the agent's clock as `ClockRecorder` last saved it."""
_RECORDING: set[ClockRecorder] = set()
"""The recorders of this process's running sessions (`ClockRecorder.stop_all_now`)."""


class BudgetClock:
    """Agent time runs only between `start()` and `stop()` and while no submission waits for or is in grading.

    It is kept as a sum of running stretches, so it only moves forward: a pause before `start()` (a resumed
    run re-grading a pending submission) or after `stop()` (the final drain) takes nothing off the agent's
    time, and `already_used_s` (restored on resume) is counted from the first moment.
    """

    def __init__(self, budget_s: float, already_used_s: float = 0.0):
        self.budget_s = float(budget_s)
        self._lock = threading.Lock()
        self._used = max(0.0, float(already_used_s))  # closed running stretches, restored time included
        self._running_since: float | None = None  # start of the current running stretch
        self._started = self._stopped = False
        self._pauses = 0  # nested: several evaluations may be in flight at once
        self._paused_at = 0.0
        self._paused_total = 0.0
        self._listeners: list = []  # told when pauses begin and end (`a2rl_bench.isolation.freezer.AgentFreezer`)
        self._transition = threading.Lock()  # orders the listeners' calls; never taken by readers of the clock
        self._charged_pause = False  # this pause's freeze was not confirmed: the agent's time runs through it

    def listen(self, listener) -> None:
        """`listener.on_pause()` when the clock stops for grading, `on_resume()` when it may run again; called in
        order, one transition at a time, but never under the clock's lock (a freeze that waits for processes
        must not stall `elapsed()`, i.e. the agent's `/budget` or the budget check). `on_pause` returns whether
        the agent is confirmed stopped: until it is, the agent's time runs on (False: for the whole pause). A
        listener attached while paused is told at once."""
        with self._transition:
            with self._lock:
                self._listeners.append(listener)
                paused = self._pauses > 0
            if paused and listener.on_pause() is False:
                with self._lock:
                    self._charged_pause = True
                    self._run_if_free(time.monotonic())

    def unlisten(self, listener) -> None:
        with self._transition, self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                self._run_if_free(time.monotonic())

    def stop(self) -> None:
        with self._lock:
            self._close_stretch(time.monotonic())
            self._stopped = True

    def pause(self) -> None:
        with self._transition:
            with self._lock:
                self._pauses += 1
                if self._pauses > 1:
                    return
                self._paused_at = time.monotonic()
                self._charged_pause = False
                listeners = list(self._listeners)
            # The agent's time runs until its processes are confirmed stopped, and through the whole pause when
            # they cannot be (a listener that returns False): a freeze that failed charges the agent, never the
            # harness, and waiting for it never holds the lock `elapsed()` needs.
            confirmed = all([listener.on_pause() is not False for listener in listeners])
            with self._lock:
                if confirmed:
                    self._close_stretch(time.monotonic())
                else:
                    self._charged_pause = True

    def resume(self) -> None:
        with self._transition:
            with self._lock:
                if self._pauses == 0:
                    return
                self._pauses -= 1
                if self._pauses:
                    return
                self._paused_total += time.monotonic() - self._paused_at
                listeners = list(self._listeners)
            for listener in listeners:
                listener.on_resume()
            with self._lock:
                self._charged_pause = False
                self._run_if_free(time.monotonic())

    def elapsed(self) -> float:
        """Agent seconds used so far (grading pauses excluded); never decreases."""
        with self._lock:
            running = time.monotonic() - self._running_since if self._running_since is not None else 0.0
            return self._used + running

    def paused_seconds(self) -> float:
        with self._lock:
            now = time.monotonic()
            return self._paused_total + (now - self._paused_at if self._pauses else 0.0)

    def remaining(self) -> float:
        return max(0.0, self.budget_s - self.elapsed())

    def agent_seconds(self) -> float:
        """The agent's time within its budget: never more than the budget."""
        return min(self.elapsed(), self.budget_s)

    def grace_seconds(self) -> float:
        """The agent's time past its budget (the grace to stop and make a last submission)."""
        return max(0.0, self.elapsed() - self.budget_s)

    @property
    def is_paused(self) -> bool:
        return self._pauses > 0

    @property
    def is_charging(self) -> bool:
        """The agent's time runs now: started, not stopped, and no pause, or a pause whose freeze failed."""
        return self._running_since is not None

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def _run_if_free(self, now: float) -> None:
        free = self._pauses == 0 or self._charged_pause
        if self._started and not self._stopped and free and self._running_since is None:
            self._running_since = now

    def _close_stretch(self, now: float) -> None:
        if self._running_since is not None:
            self._used += now - self._running_since
            self._running_since = None


class ClockRecorder:
    """Persists `clock.elapsed()` to a JSON file every `interval_s` while active (a context manager)."""

    def __init__(self, clock: BudgetClock, path: Path, interval_s: float = 0.25):
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

    @staticmethod
    def charge_until(path: Path, ended_at: float) -> float:
        """An earlier attempt's agent ran until `ended_at` (the retry found it alive and ended it) while its harness
        recorded nothing (frozen): its clock, unless it was paused for grading, runs on to that moment. Returns
        the seconds charged."""
        try:
            record = json.loads(Path(path).read_text())
            elapsed, at = float(record["elapsed_s"]), float(record["at"])
        except (OSError, ValueError, KeyError):
            return 0.0
        if record.get("paused") or ended_at <= at:
            return 0.0
        _write_json(Path(path), {**record, "elapsed_s": round(elapsed + ended_at - at, 3), "at": ended_at})
        return ended_at - at

    def save(self) -> None:
        _write_json(self.path, {"elapsed_s": round(self.clock.elapsed(), 3), "at": time.time(),
                                "paused": not self.clock.is_charging and self.clock.is_paused,
                                "budget_s": self.clock.budget_s})

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.save()

    @staticmethod
    def stop_all_now() -> None:
        """This process is about to end its agents and exit at once, without unwinding (an attempt that a later
        one took over): every running session's clock stops now and is saved, so the attempt that goes on
        resumes from the moment the agent was stopped, not from a save up to `interval_s` (on a loaded machine,
        seconds) before it."""
        for recorder in list(_RECORDING):
            recorder.clock.stop()
            recorder.close()

    def close(self) -> None:
        """Stop the periodic saves and save once more."""
        self._stop.set()
        self._thread.join(timeout=5)  # its last save is done before this one: one writer of the file at a time
        self.save()
        _RECORDING.discard(self)

    def __enter__(self) -> ClockRecorder:
        _RECORDING.add(self)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_json(path: Path, record: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
