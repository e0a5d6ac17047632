"""The phases of a run attempt, timed in one place: `with phases.enter("baseline"): ...` records the phase's wall
time into the attempt's record (`a2rl_bench.capture.attempts`) and shows it in the run's progress file; the phase
reached is what a failure is reported in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from a2rl_bench.ops.progress import ProgressWriter
from a2rl_bench.capture.attempts import AttemptLog


class RunPhases:
    """The current attempt's phases (a phase lasts until the next begins, or the attempt ends)."""

    def __init__(self, attempts: AttemptLog, progress: ProgressWriter, first: str = "preflight",
                 before: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.attempts, self.progress, self.before = attempts, progress, before
        """`before`: called as each phase is entered (the flow's check that this attempt is still the run's)."""
        self.current = first
        """The phase reached: set on entering, kept when it raises (a failure is reported in it)."""

    @contextmanager
    def enter(self, name: str) -> Iterator[None]:
        if self.before is not None:
            self.before()
        self.current = name
        self.attempts.phase(name)
        self.progress.update(phase=name)
        yield
