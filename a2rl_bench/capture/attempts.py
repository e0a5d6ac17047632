"""The attempts of a run and where their time went: `harness/attempts.json`, one entry per attempt.

A run a crash interrupted and a retry resumed has several attempts; its wall time and phase times are the sums
over all of them, and the report lists each one. An attempt that dies without a word (SIGKILL, a lost host)
cannot record its end, so the entry is kept current as the attempt goes: its phases as they close, and a
heartbeat (`last_seen`) every second; such an attempt counts up to its last heartbeat, within a second.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field

ATTEMPTS_FILE = "attempts.json"
HEARTBEAT_S = 1.0


class AttemptTimes(BaseModel):
    number: int
    """1 for the run's first attempt, one more for each retry that resumed it."""
    flow_run_id: str | None = None
    prefect_run_count: int | None = None
    pid: int
    host: str
    started_at: float
    """Epoch seconds."""
    last_seen: float
    ended_at: float | None = None
    outcome: str | None = None
    """completed, failed or interrupted; None while it runs, or when it died without a word (a crash)."""
    phases: dict[str, float] = Field(default_factory=dict)
    """Seconds per phase closed in this attempt."""
    phase: str | None = None
    """The phase it is in (was in, at its last heartbeat)."""
    phase_started_at: float | None = None

    @property
    def end(self) -> float:
        return self.ended_at if self.ended_at is not None else self.last_seen

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.started_at)

    def phase_seconds(self) -> dict[str, float]:
        """Closed phases plus the one it was in, counted up to its end (or last heartbeat)."""
        out = dict(self.phases)
        if self.phase is not None and self.phase_started_at is not None:
            out[self.phase] = out.get(self.phase, 0.0) + max(0.0, self.end - self.phase_started_at)
        return out

    @property
    def label(self) -> str:
        if self.outcome:
            return self.outcome
        return f"crashed in {self.phase}" if self.phase else "crashed"


class Attempts(BaseModel):
    attempts: list[AttemptTimes] = Field(default_factory=list)

    def phase_seconds(self) -> dict[str, float]:
        """Each phase summed over all attempts, in the order phases first appeared."""
        total: dict[str, float] = {}
        for a in self.attempts:
            for name, seconds in a.phase_seconds().items():
                total[name] = total.get(name, 0.0) + seconds
        return total

    @property
    def wall_s(self) -> float:
        return sum(a.wall_s for a in self.attempts)

    @property
    def span_s(self) -> float:
        """From the first attempt's start to the last one's end (time between attempts included)."""
        return max(a.end for a in self.attempts) - self.attempts[0].started_at if self.attempts else 0.0

    def markdown(self, status: str = "running") -> str:
        """The report's section: every attempt, with its time, its phases and how it ended (the attempt writing
        the report, still going, ends with `status`)."""
        if not self.attempts:
            return ""
        lines = ["## Attempts", "", "| # | flow run | started (UTC) | wall s | phases (s) | ended |", "|---|---|---|---|---|---|"]
        for a in self.attempts:
            phases = ", ".join(f"{k} {v:.1f}" for k, v in a.phase_seconds().items())
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(a.started_at))
            label = status if a.outcome is None and (a.pid, a.host) == (os.getpid(), socket.gethostname()) else a.label
            lines.append(f"| {a.number} | {a.flow_run_id or '-'} | {started} | {a.wall_s:.1f} | {phases} | {label} |")
        lines += ["", f"Wall time {self.wall_s:.1f} s summed over the attempts; {self.span_s:.1f} s from the first "
                      f"start to the end ({self.span_s - self.wall_s:.1f} s between attempts).", ""]
        return "\n".join(lines)


def read_attempts(harness_dir: Path) -> Attempts:
    try:
        return Attempts.model_validate_json((Path(harness_dir) / ATTEMPTS_FILE).read_text())
    except (OSError, ValueError):  # none yet, or torn by a crash mid-write (writes are atomic: should not happen)
        return Attempts()


class AttemptLog:
    """The current attempt's entry: opened at its start, kept current (phases, heartbeat), closed at its end."""

    def __init__(self, harness_dir: Path, flow_run_id: str | None = None, prefect_run_count: int | None = None,
                 opened_s: float = 0.0):
        """`opened_s`: the seconds the attempt spent before its run directory existed (phase `open`)."""
        self.path = Path(harness_dir) / ATTEMPTS_FILE
        self._lock = threading.Lock()
        self._all = read_attempts(harness_dir)
        now = time.time()
        self.current = AttemptTimes(
            number=len(self._all.attempts) + 1, flow_run_id=flow_run_id, prefect_run_count=prefect_run_count,
            pid=os.getpid(), host=socket.gethostname(), started_at=now - opened_s, last_seen=now,
            phases={"open": opened_s} if opened_s else {},
        )  # fmt: skip
        self._all.attempts.append(self.current)
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="attempt-heartbeat")
        self._thread.start()

    @property
    def all(self) -> Attempts:
        return self._all

    def phase(self, name: str) -> None:
        """Close the phase in progress (its seconds added) and open `name`."""
        with self._lock:
            self._close_phase(time.time())
            self.current.phase, self.current.phase_started_at = name, time.time()
            self._write()

    def totals(self) -> dict[str, float]:
        """Seconds per phase summed over every attempt so far, this one counted up to now."""
        with self._lock:
            if self.current.ended_at is None:
                self.current.last_seen = time.time()
            return self._all.phase_seconds()

    def end(self, outcome: str) -> None:
        self._stop.set()
        with self._lock:
            now = time.time()
            self._close_phase(now)
            self.current.ended_at = self.current.last_seen = now
            self.current.outcome = outcome
            self._write()

    def _close_phase(self, now: float) -> None:
        c = self.current
        if c.phase is not None and c.phase_started_at is not None:
            c.phases[c.phase] = c.phases.get(c.phase, 0.0) + max(0.0, now - c.phase_started_at)
        c.phase = c.phase_started_at = None

    def _beat(self) -> None:
        # On a fixed grid, not a second after the last write: late wake-ups on a loaded machine do not add up, so
        # the last heartbeat before a SIGKILL is within a second of it (plus one wake-up's lateness).
        next_at = time.monotonic()
        while True:
            next_at = max(next_at + HEARTBEAT_S, time.monotonic())  # after a stall: one beat now, not a burst
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                return
            with self._lock:
                if self._stop.is_set():
                    return
                self.current.last_seen = time.time()
                self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(self._all.model_dump_json(indent=1))
            os.replace(tmp, self.path)
        except OSError:  # the record of times must never be the reason a run fails
            pass
