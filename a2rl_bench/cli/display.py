"""The live progress display of `a2rl run`: a rich panel on a terminal, plain lines otherwise.

It only reads files (see `a2rl_bench.ops.progress`), from a thread, so it shows the same whether the flow runs in this
process or elsewhere, and it cannot slow the run down by more than a few file reads per second.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from a2rl_bench.ops.progress import PHASE_LABELS, PROGRESS_FILE, CountView, Snapshot, read_announced, read_snapshot, status_line
from a2rl_bench.safetext import terminal

PLAIN_HEARTBEAT_S = 30.0
"""Without a terminal, a line at every change and at least this often."""
LABEL_WIDTH = 12
"""The labels' column, fixed: a long value is cut (with an ellipsis), never a label ("elap…"), down to 80 columns."""


class RunDisplay:
    """A context manager: watches the run announced in `announce_file` until the block ends."""

    def __init__(self, announce_file: Path, stream: TextIO | None = None, live: bool | None = None,
                 interval_s: float = 0.5):  # fmt: skip
        self.announce_file = Path(announce_file)
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="a2rl-display")
        self._started = time.monotonic()
        self._last_plain = ("", 0.0)
        self._waiting = ("starting", time.monotonic())
        self._counts = CountView()  # counters that never go back, ETAs that do not jump

    def waiting(self, what: str) -> None:
        """What the command waits on before the run has a row (loading Prefect, starting its server, ...)."""
        self._waiting = (what, time.monotonic())

    def __enter__(self) -> RunDisplay:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def snapshot(self) -> Snapshot | None:
        announced = read_announced(self.announce_file)
        return read_snapshot(announced.harness_dir / PROGRESS_FILE) if announced else None

    def _loop(self) -> None:
        if not self.live:
            while not self._stop.wait(self.interval_s):
                self._plain(self.snapshot())
            self._plain(self.snapshot())
            return
        from rich.console import Console
        from rich.live import Live

        console = Console(file=self.stream)
        with Live(self._render(None), console=console, refresh_per_second=4, transient=False) as live:
            while not self._stop.wait(self.interval_s):
                live.update(self._render(self.snapshot()))
            live.update(self._render(self.snapshot()))

    def _plain(self, snap: Snapshot | None) -> None:
        key, at = self._last_plain
        if snap is None:
            what, since = self._waiting
            if what != key or time.monotonic() - at >= PLAIN_HEARTBEAT_S:
                print(f"a2rl {time.strftime('%H:%M:%S')} {what} ({time.monotonic() - since:.0f} s)", file=self.stream,
                      flush=True)  # fmt: skip
                self._last_plain = (what, time.monotonic())
            return
        events = status_line(snap, with_time=False)
        if events != key or time.monotonic() - at >= PLAIN_HEARTBEAT_S:
            activity = f" | {terminal(snap.last_activity, 160)}" if snap.last_activity and snap.progress.phase == "agent_session" else ""
            print(f"a2rl {time.strftime('%H:%M:%S')} {status_line(snap, view=self._counts)}; elapsed {self._elapsed()}{activity}",
                  file=self.stream, flush=True)  # fmt: skip
            self._last_plain = (events, time.monotonic())

    def _elapsed(self) -> str:
        seconds = round(time.monotonic() - self._started)
        return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"

    def _render(self, snap: Snapshot | None):
        from rich.table import Table
        from rich.text import Text

        # Expanded, with the values' column the only flexible one: Rich then cuts values, not labels.
        grid = Table.grid(padding=(0, 2), expand=True)
        grid.add_column(style="bold", no_wrap=True, width=LABEL_WIDTH)
        grid.add_column(overflow="ellipsis", no_wrap=True, ratio=1)
        if snap is None:
            what, since = self._waiting
            grid.add_row("a2rl run", Text(f"{what} ({time.monotonic() - since:.0f} s)", style="cyan"))
            grid.add_row("elapsed", self._elapsed())
            return grid
        p = snap.progress
        grid.add_row("run", f"{p.run_id}")
        in_phase = time.time() - p.phase_started_at if p.phase_started_at else 0.0
        step = f": {p.step}" if p.step else ""
        grid.add_row("phase", Text(f"{PHASE_LABELS.get(p.phase, p.phase)}{step} ({in_phase:.0f} s)", style="cyan"))
        grid.add_row("elapsed", self._elapsed())
        if p.phase != "baseline" and p.baseline_total and p.baseline_done >= p.baseline_total:
            # The finished baseline stays on screen with the score to beat: its last items can finish between two
            # frames, and the count would otherwise vanish with its phase before it read complete.
            score = f": validation {snap.baseline_val:.1f}" if snap.baseline_val is not None else ""
            total = p.baseline_total
            grid.add_row("baseline", f"{_bar(total, total)} {total}/{total} items, done{score}")
        for c in self._counts.counts(snap):
            split = f" ({p.baseline_split})" if c.label == "baseline" and p.baseline_split else ""
            grid.add_row(c.label, f"{_bar(c.done, c.total)} {c.done}/{c.total} items{split}, {c.left}")
        if p.phase in ("agent_session", "final_grading", "summary", "done") or snap.agent_s:
            paused = Text(" paused: grading", style="yellow") if snap.grading else Text("")
            grid.add_row("agent time", Text(f"{_bar(snap.agent_s, p.budget_s)} {snap.agent_s:.0f}/{p.budget_s:.0f} s") + paused)
            scores = ", ".join(snap.scores[-6:]) or "-"
            grid.add_row("submissions", f"{snap.queued} queued, {snap.graded} graded: {scores}")
        if snap.llm:
            grid.add_row("driver", snap.llm.text())
        if snap.mode_breaches:
            grid.add_row("mode", Text(f"{snap.mode_breaches} submission(s) broke the mode", style="bold red"))
        if snap.last_activity:
            grid.add_row("agent", Text(terminal(snap.last_activity, 400)))
        if p.error:
            grid.add_row("error", Text(terminal(p.error, 400), style="red"))
        return grid


def _bar(done: float, total: float, width: int = 20) -> str:
    filled = int(width * min(1.0, done / total)) if total else 0
    return "█" * filled + "░" * (width - filled)


PREFECT_QUEUE_SERVICES = ("APILogWorker", "EventsWorker")
"""Prefect's background senders log under their class names, outside the `prefect` logger tree; as a process
exits they warn that they are still draining, a line that would stand before a run's one-line error."""


def set_prefect_console_level(level: str) -> None:
    """Prefect's console lines at `level` ("off" = none). Its loggers keep their levels, so a run's log file
    still gets every line. Set before and after Prefect is imported: its subprocesses read the variable."""
    off = level.lower() == "off"
    level = "CRITICAL" if off else level.upper()
    os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = level
    for service in PREFECT_QUEUE_SERVICES:  # "Still processing items: N items remaining..." while exiting
        logging.getLogger(service).setLevel(logging.ERROR if off else logging.NOTSET)
    if "prefect" not in sys.modules:
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler):
                handler.setLevel(level)


class Waiting:
    """A command's wait that can take minutes on a loaded machine (`a2rl deploy`, `a2rl analyze`, saving a driver):
    what it waits on, said on stderr once it has lasted `first_s` (a quick command stays quiet), then again with
    the seconds counted every `every_s`, so no wait passes in silence. A context manager."""

    def __init__(self, what: str, first_s: float = 3.0, every_s: float = 15.0, stream: TextIO | None = None) -> None:
        self.what, self.first_s, self.every_s, self.stream = what, first_s, every_s, stream or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="a2rl-waiting")
        self._started = time.monotonic()

    def __enter__(self) -> Waiting:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        if self._stop.wait(self.first_s):
            return
        self._say(f"{self.what} ...")
        while not self._stop.wait(self.every_s):
            self._say(f"still {self.what} ({time.monotonic() - self._started:.0f} s)")

    def _say(self, line: str) -> None:
        print(f"a2rl {time.strftime('%H:%M:%S')} {line}", file=self.stream, flush=True)
