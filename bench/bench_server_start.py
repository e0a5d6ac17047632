"""A local Prefect server's start (`a2rl_bench.ops.prefect_local.start_server`, a2rl's server process) on a fresh
PREFECT_HOME against one whose SQLite database is a copy of one a server had already migrated, as the suite's
servers now start (`tests/live_server.py`: `seed_migrated_db`). Wall seconds until /api/health answers and the
server's CPU seconds (its process tree, user + system) at that moment; the two cases alternate.

    python bench/bench_server_start.py --repeats 3
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from a2rl_bench.ops import prefect_local


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_once(home: Path) -> tuple[float, float]:
    """(wall s until healthy, the server tree's CPU s then); the server is stopped afterwards."""
    begun = time.monotonic()
    server = prefect_local.start_server(port=_free_port(), home=home)
    wall = time.monotonic() - begun
    proc = psutil.Process(server.pid)
    cpu = sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])
    prefect_local.stop_server(home)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="starts of each kind (default 3)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-server-start-"))
    runs: dict[str, list[tuple[float, float]]] = {"fresh database": [], "migrated database copied": []}
    try:
        for i in range(args.repeats):
            fresh = root / f"fresh{i}"
            runs["fresh database"].append(start_once(fresh))
            seeded = root / f"seeded{i}"
            seeded.mkdir()
            shutil.copyfile(fresh / "prefect.db", seeded / "prefect.db")
            runs["migrated database copied"].append(start_once(seeded))
            print(f"repeat {i + 1}: " + "; ".join(f"{k} {w:.1f} s wall, {c:.1f} CPU s" for k, (w, c) in
                                               ((k, v[-1]) for k, v in runs.items())), flush=True)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| start | wall s (each) | median wall s | CPU s (each) | median CPU s |\n|---|---|---|---|---|")
    for kind, values in runs.items():
        walls, cpus = [w for w, _ in values], [c for _, c in values]
        print(f"| {kind} | {', '.join(f'{w:.1f}' for w in walls)} | {statistics.median(walls):.1f} | "
              f"{', '.join(f'{c:.1f}' for c in cpus)} | {statistics.median(cpus):.1f} |")


if __name__ == "__main__":
    main()
