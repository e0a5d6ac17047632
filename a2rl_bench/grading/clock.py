"""A pausable budget clock: the agent's time runs, except while its submissions are being graded.

`ClockRecorder` writes the clock to a file four times a second, so a run resumed after a crash knows how much
of the agent's budget was already spent, within a quarter of a second; an earlier attempt whose agent kept
running after its harness stopped recording (a frozen harness) is charged up to the moment the retry ended it
(`charge_until`); one that stops itself because a later attempt took over saves its clock as it ends its agent
(`stop_all_now`). Time past the budget (the grace the agent gets to wrap up) is counted apart from it.

Frozen host time is not agent time: `FreezeWatch` ticks beside the clock and takes off the agent's time any stretch
in which the harness itself could not run (its host or process group stopped, SIGSTOP or a cgroup freeze): its
ticker's gap of at least `FROZEN_GAP_S` spent neither running nor waiting for a CPU (the kernel's schedstat), in
which the ticker was put on a CPU at most `MAX_RUNS_PER_FROZEN_S` times a second.
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
FROZEN_GAP_S = 5.0
"""A gap of the clock's ticker at least this long that its thread spent neither on a CPU nor waiting for one is time
the harness could not run: not charged to the agent. A loaded machine makes the ticker wait for a CPU, which the
kernel counts (run delay), so load alone never reaches it; 5 s is 20 ticks, far above a GIL hand-over (5 ms)."""
MAX_RUNS_PER_FROZEN_S = 20.0
"""A gap counts as frozen only if the ticker's thread was put on a CPU at most this often per second of it
(schedstat's third field). A stopped process is hardly scheduled: entering and leaving the stop (measured: 2 runs
in a 3 s SIGSTOP, 12 in a 7 s one with every core busy). A thread that waits for the GIL held by a long C call (a
huge regex or `sum(range(...))` in another harness thread) is asleep, not runnable, so its gap looks the same by
time alone; but it wakes every switch interval (5 ms) to ask for the GIL (measured: ~200 runs a second of gap,
701 in 3.5 s, loaded or not), so it is charged, and no input the agent controls can turn a slow harness into
free agent time. Time blocked in I/O (page faults under memory pressure) is charged the same way, unless it is
few long waits."""
TICK_S = 0.25
"""The ticker's period."""


class FreezeWatch:
    """Tells `on_frozen(start, end)` (monotonic seconds) of each stretch in which this process could not run.

    A thread sleeps `TICK_S` at a time; on waking it reads its own CPU time, run delay (the time it was runnable
    but waited for a CPU) and number of runs from /proc/thread-self/schedstat. Of the wall time since its last
    tick, what is neither its sleep, nor CPU, nor run delay, is time the thread was stopped (SIGSTOP, a frozen
    cgroup) or asleep in the kernel; a stretch of at least `threshold_s` in which the thread ran at most
    `MAX_RUNS_PER_FROZEN_S` times a second is reported (one that kept waking up, e.g. for the GIL, was not). The
    agent cannot fake one: its processes run under their own user in the sandbox and cannot stop, freeze or trace
    the harness's, and loading every CPU shows up as run delay, not as a gap. Without schedstat (not Linux) nothing
    is reported and all time is charged.
    """

    def __init__(self, on_frozen, threshold_s: float = FROZEN_GAP_S, period_s: float = TICK_S):
        self.on_frozen, self.threshold_s, self.period_s = on_frozen, threshold_s, period_s
        self._stop = threading.Event()
        self._ticked = threading.Condition()
        self._last_tick = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="freeze-watch")

    def start(self) -> None:
        if Path("/proc/thread-self/schedstat").exists():
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def settle(self) -> None:
        """Called before the clock is read: when the ticker has not ticked for `threshold_s` (this process just
        woke from a freeze, or is starved), wait up to a few ticks for it, so that a frozen stretch is taken off
        before anyone reads the clock, whose reading must never go down."""
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return
        with self._ticked:
            if time.monotonic() - self._last_tick >= self.threshold_s:
                self._ticked.wait(timeout=4 * self.period_s)

    def _loop(self) -> None:
        last = _thread_times()
        if last is None:
            return
        last_at = time.monotonic()
        while not self._stop.wait(self.period_s):
            now, times = time.monotonic(), _thread_times()
            if times is None:
                return
            lost = (now - last_at) - self.period_s - (times[0] - last[0]) - (times[1] - last[1])
            runs = times[2] - last[2]
            if lost >= self.threshold_s and runs <= MAX_RUNS_PER_FROZEN_S * lost:
                woke = now - (times[0] - last[0]) - (times[1] - last[1])  # it ended as the thread became runnable
                self.on_frozen(woke - lost, woke)
            last, last_at = times, now
            with self._ticked:
                self._last_tick = now
                self._ticked.notify_all()


def _thread_times() -> tuple[float, float, int] | None:
    """This thread's (CPU seconds, seconds waited for a CPU, times put on a CPU) from the kernel; None where it
    does not say."""
    try:
        fields = Path("/proc/thread-self/schedstat").read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9, int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


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
        self._frozen_s = 0.0  # host time taken off the agent's (`FreezeWatch`)
        self._shown = 0.0  # the last reading of `elapsed()`, which never goes down
        self._watch = FreezeWatch(self._exclude)

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
                self._watch.start()

    def stop(self) -> None:
        self._watch.settle()
        with self._lock:
            self._close_stretch(time.monotonic())
            self._stopped = True
        self._watch.stop()

    def pause(self) -> None:
        self._watch.settle()  # a frozen stretch is taken off before the running one closes
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
        """Agent seconds used so far (grading pauses and frozen host time excluded); never decreases."""
        self._watch.settle()
        with self._lock:
            running = time.monotonic() - self._running_since if self._running_since is not None else 0.0
            self._shown = max(self._shown, self._used + running)
            return self._shown

    def frozen_seconds(self) -> float:
        """Host time in which the harness could not run, taken off the agent's time."""
        with self._lock:
            return self._frozen_s

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

    def _exclude(self, start: float, end: float) -> None:
        """The harness could not run from `start` to `end`: the part of it in the running stretch is not the
        agent's (its processes stood still with the host's; a grading pause is not charged anyway)."""
        with self._lock:
            if self._running_since is not None:
                overlap = max(0.0, end - max(start, self._running_since))
                self._running_since += overlap
                self._frozen_s += overlap

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
