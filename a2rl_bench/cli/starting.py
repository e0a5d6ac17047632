"""What `a2rl run` waits for before its run has a row: the Prefect server it needs, named on the display.

Without PREFECT_API_URL a run uses an ephemeral Prefect server, a subprocess that migrates its database before it
answers: seconds on an idle machine, minutes on a loaded one. It is started here, under its own word on the
display and with a start-up timeout that grows with the machine's load, instead of silently inside the first
API call of the flow.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from a2rl_bench.ops.load import describe_load, scaled_timeout

STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
STARTUP_TIMEOUT_S = 90.0
"""On an idle machine (the variable above, where set, instead); scaled with the load."""
TIMED_OUT = "Timed out while attempting to connect to ephemeral Prefect API server"


def startup_timeout_s() -> float:
    return scaled_timeout(float(os.environ.get(STARTUP_TIMEOUT_ENV) or STARTUP_TIMEOUT_S))


def starts_server() -> bool:
    """Whether `start_prefect` starts a local server (none configured, ephemeral mode on): the run's longest wait."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    return not settings.api.url and settings.server.ephemeral.enabled


def start_prefect(say: Callable[[str], None]) -> None:
    """Start the ephemeral server the flow would start (the same one: Prefect keeps it per process), saying so;
    nothing when a server is configured (PREFECT_API_URL) or ephemeral mode is off."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if not starts_server():
        say(f"connecting to the Prefect server at {settings.api.url}" if settings.api.url else "connecting to Prefect")
        return
    from prefect.server.api.server import SubprocessASGIServer

    timeout = startup_timeout_s()
    say(f"starting a local Prefect server (up to {timeout:.0f} s on this machine; `a2rl server start` keeps one running)")
    SubprocessASGIServer().start(timeout=int(timeout))


def start_failure(error: BaseException, places: list[Path] | None = None) -> str:
    """One line for an error before the run had a row, with what to do where that is known (`places`: where the
    run writes, for a full disk)."""
    from a2rl_bench.ops.disk import disk_full

    text = " ".join(str(error).split())
    if full := disk_full(error, places or []):  # the run's directory may exist: it stopped as it opened, not before
        return f"the run stopped before its row was written: {full}"
    if TIMED_OUT in text:
        return (f"the run could not start: the local Prefect server did not answer within {startup_timeout_s():.0f} s "
                f"({describe_load()}); run again when the machine is quieter, set {STARTUP_TIMEOUT_ENV} higher, or "
                f"start a lasting server once (`a2rl server start`) and export the PREFECT_API_URL it "
                f"prints")  # fmt: skip
    return f"the run could not start: {type(error).__name__}: {text[:300]}"
