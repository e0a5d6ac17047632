"""A stop (Ctrl-C, SIGTERM) against a run's end: one truth for the run's row, the terminal and Prefect's state.

Before the summary commits the run's row `completed`, a stop interrupts the run: the row ends `interrupted`, the
flow run Cancelled, and the command says so. Once the row reads `completed`, the run is over but for Prefect
recording its end (seconds, or minutes on a starved machine): a first stop then waits for that (the flow run ends
Completed, the command says the run completed); a second one does not wait. The command's signal handler asks
`hold`; the flow says when its row is final (`row_final`). Plain module state: one run per process at a time.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_state: dict[str, Any] = {"final": None, "held": None, "last": None, "armed": False, "previous": None}


@contextmanager
def armed() -> Iterator[None]:
    """While the block runs, this process owns its run's end and acts on a held stop once the flow returns (`a2rl
    run`): only then is a stop after the row is final held (a sweep's or a worker's runs, or a flow called from
    Python, never are)."""
    _state["armed"] = True
    try:
        yield
    finally:
        _state["armed"] = False


def begin_run() -> None:
    """A new run in this process: nothing final, nothing held."""
    _state.update(final=None, held=None)


def row_final(run_id: str) -> None:
    """The run's row is committed `completed`: a stop from now on is held until the flow run has ended. Prefect's
    own SIGTERM bridge (active while the flow runs) is set aside for that time; Prefect restores the command's
    handler as the flow run ends, and that one holds a first stop too."""
    _state["final"] = run_id
    if not _state["armed"] or threading.current_thread() is not threading.main_thread():
        return
    if (current := signal.getsignal(signal.SIGTERM)) is not _hold_or_stop:
        _state["previous"] = current
        signal.signal(signal.SIGTERM, _hold_or_stop)


def final_run() -> str | None:
    """The run whose row is final in this process, if any."""
    return _state["final"]


def _hold_or_stop(signum: int, frame: Any) -> None:
    if hold(signum):
        return
    previous = _state["previous"]
    if callable(previous):
        previous(signum, frame)
    raise KeyboardInterrupt()


def hold(signum: int) -> bool:
    """Whether a stop arriving now waits for the flow run's end (True once, after `row_final`, when armed)."""
    _state["last"] = signum
    if not _state["armed"] or _state["final"] is None or _state["held"] is not None:
        return False
    _state["held"] = signum
    print(f"a2rl: {signal_words(signum)[0]}: the run is already recorded 'completed'; stopping once Prefect has "
          "recorded its end (again to stop at once)", file=sys.stderr, flush=True)
    return True


def held() -> int | None:
    """The signal held until the run ended, if any."""
    return _state["held"]


def stopped_by(signum: int) -> None:
    """The signal that stopped the run, where it came another way than through `hold` (Prefect's SIGTERM)."""
    _state["last"] = signum


def last_signal() -> int | None:
    return _state["last"]


def signal_words(signum: int | None) -> tuple[str, int]:
    """('SIGTERM', 143) or ('Ctrl-C', 130): a stop's name and its exit code by the shell's rule."""
    if signum == signal.SIGTERM:
        return "SIGTERM", 128 + signal.SIGTERM
    return "Ctrl-C", 128 + signal.SIGINT
