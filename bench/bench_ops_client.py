"""CPU of the harness's talk to the Prefect server: one ops call (`prefect_api.client` and a read) and one lease
renewal cycle (AttemptLease._renew: read, flow-run verdict, write, taker's record), against a real local server.

    python bench/bench_ops_client.py [--calls 40] [--cycles 40]

Run it at two commits in one session (a git worktree of the older one, the same server start) and compare the
CPU milliseconds as ratios; BENCHMARKS.md "Suite wall time, seventeenth pass" has the figures.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
import uuid
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OnePass:
    """The renewal loop's stop event, letting exactly one pass of `AttemptLease._renew` through."""

    def __init__(self) -> None:
        self._waits = iter((False, True))

    def wait(self, timeout_s: float) -> bool:
        return next(self._waits)

    def set(self) -> None:  # the loop stops itself on a stale verdict: nothing more to do here
        pass


def thread_cpu_ms(fn, n: int) -> float:
    """CPU of this thread over n calls, in ms per call (the server's own CPU is another process's)."""
    fn()  # imports and the first connection: not what is measured
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40, help="ops calls timed (default 40)")
    parser.add_argument("--cycles", type=int, default=40, help="lease renewal cycles timed (default 40)")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    home = Path(tempfile.mkdtemp(prefix="bench-ops-client-"))
    from a2rl_bench.ops import prefect_local, run_lease

    port = free_port()
    url = prefect_local.api_url_of("127.0.0.1", port)
    print(f"starting a Prefect server on {url} ...", flush=True)
    prefect_local.start_server(port=port, home=home)
    try:
        run_id = str(uuid.uuid4())
        call_ms = thread_cpu_ms(lambda: run_lease.read_lease(url, run_id), args.calls)
        lease = run_lease.AttemptLease(url, run_id, 1, lambda why: None, host="bench")
        lease.take()
        lease._stop.set()  # its own thread stops; the cycles below are run here, one at a time
        lease._thread.join()

        def cycle() -> None:
            lease._stop = OnePass()
            lease._renew()

        cycle_ms = thread_cpu_ms(cycle, args.cycles)
        print(f"ops call (client + read): {call_ms:.1f} ms CPU   lease renewal cycle: {cycle_ms:.1f} ms CPU "
              f"({args.calls} calls, {args.cycles} cycles; at the default RENEW_S of {run_lease.RENEW_S:g} s "
              f"that is {cycle_ms / 10 / run_lease.RENEW_S:.2f} % of a core per running attempt)")
    finally:
        prefect_local.stop_server(home)


if __name__ == "__main__":
    main()
