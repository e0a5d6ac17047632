"""How busy this machine is, for waits that must not mistake a loaded machine for a broken install.

A program that answers `--version` in 3 s on an idle machine can take 30 s when every core has several
runnable processes; a fixed timeout would then advise a reinstall of something that works. Timeouts scale
with the load per core (capped), and the message of one that still runs out names the load.
"""

from __future__ import annotations

import os

MAX_FACTOR = 8.0
"""A timeout grows at most this many times: past it, something is wrong beyond a busy machine."""


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load_per_core() -> float:
    """The 1-minute load average per core this process may use (0 where the platform has none)."""
    try:
        return os.getloadavg()[0] / cores()
    except OSError:
        return 0.0


def scaled_timeout(base_s: float) -> float:
    """`base_s` on an idle machine, proportionally more when there are more runnable processes than cores."""
    return base_s * min(MAX_FACTOR, max(1.0, load_per_core()))


def describe_load() -> str:
    """E.g. 'load 9.3 on 2 cores' (for a message about a wait that ran out)."""
    try:
        return f"load {os.getloadavg()[0]:.1f} on {cores()} cores"
    except OSError:
        return f"{cores()} cores"
