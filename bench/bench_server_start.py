"""A local Prefect server's start (`a2rl_bench.ops.prefect_local.start_server`, a2rl's server process) on a fresh
PREFECT_HOME against one whose SQLite database is a copy of one a server had already migrated, as the suite's
servers now start (`tests/live_server.py`: `seed_migrated_db`). Wall seconds until /api/health answers and the
server's CPU seconds (its process tree, user + system) at that moment; the two cases alternate.

With --postgres, the same on a throwaway PostgreSQL cluster (tests/postgres_support.py): a new database that the
server migrates, against one given a SQL dump of a migrated one first (measured, not used by the suite: BENCHMARKS.md
"Suite wall time, nineteenth pass"). There the wall includes `createdb` and the dump's load, and the CPU seconds add
PostgreSQL's (the postmaster and the backends it reaped) to the server's; the clients' (createdb, psql) are left out:
this process's reaped-children count would also take in the Prefect servers that an earlier start left to reap.

    python bench/bench_server_start.py --repeats 3
    python bench/bench_server_start.py --repeats 3 --postgres
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from a2rl_bench.ops import prefect_local

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.postgres_support import LocalPostgres  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu(proc: psutil.Process) -> float:
    try:
        return sum(proc.cpu_times()[:2])
    except psutil.NoSuchProcess:  # a backend that ended after the listing: its seconds go to the postmaster's reaped
        return 0.0


def _tree_cpu(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(_cpu(p) for p in [proc, *proc.children(recursive=True)])


def _postgres_cpu(pg: LocalPostgres) -> float:
    """The cluster's CPU s so far: the postmaster, its live children and the backends it reaped."""
    postmaster = psutil.Process(int((pg.data / "postmaster.pid").read_text().split()[0]))
    return sum(postmaster.cpu_times()[:4]) + sum(_cpu(p) for p in postmaster.children(recursive=True))


def start_once(home: Path, pg: LocalPostgres | None = None, dump: str | None = None) -> tuple[float, float]:
    """(wall s until healthy, the server tree's CPU s then, with PostgreSQL's for a cluster); the server is stopped
    afterwards."""
    pg_cpu = _postgres_cpu(pg) if pg else 0.0
    begun = time.monotonic()
    database = None
    if pg:
        database = pg.create_database(home.name)
        if dump:
            pg.load(home.name, dump)
    server = prefect_local.start_server(port=_free_port(), home=home, database=database)
    wall = time.monotonic() - begun
    cpu = _tree_cpu(server.pid) + (_postgres_cpu(pg) - pg_cpu if pg else 0.0)
    prefect_local.stop_server(home)
    return wall, cpu


def _postgres_runs(root: Path, repeats: int) -> dict[str, list[tuple[float, float]]]:
    runs: dict[str, list[tuple[float, float]]] = {"fresh database": [], "migrated dump loaded": []}
    with LocalPostgres() as pg:
        for i in range(repeats):
            runs["fresh database"].append(start_once(root / f"fresh{i}", pg))
            dump = pg.dump(f"fresh{i}")
            runs["migrated dump loaded"].append(start_once(root / f"loaded{i}", pg, dump))
            _report(i, runs)
    return runs


def _sqlite_runs(root: Path, repeats: int) -> dict[str, list[tuple[float, float]]]:
    runs: dict[str, list[tuple[float, float]]] = {"fresh database": [], "migrated database copied": []}
    for i in range(repeats):
        fresh = root / f"fresh{i}"
        runs["fresh database"].append(start_once(fresh))
        seeded = root / f"seeded{i}"
        seeded.mkdir()
        shutil.copyfile(fresh / "prefect.db", seeded / "prefect.db")
        runs["migrated database copied"].append(start_once(seeded))
        _report(i, runs)
    return runs


def _report(i: int, runs: dict[str, list[tuple[float, float]]]) -> None:
    print(f"repeat {i + 1}: " + "; ".join(f"{k} {v[-1][0]:.1f} s wall, {v[-1][1]:.1f} CPU s" for k, v in runs.items()),
          flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="starts of each kind (default 3)")
    parser.add_argument("--postgres", action="store_true", help="on a throwaway PostgreSQL cluster, not SQLite")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-server-start-"))
    try:
        runs = (_postgres_runs if args.postgres else _sqlite_runs)(root, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| start | wall s (each) | median wall s | CPU s (each) | median CPU s |\n|---|---|---|---|---|")
    for kind, values in runs.items():
        walls, cpus = [w for w, _ in values], [c for _, c in values]
        print(f"| {kind} | {', '.join(f'{w:.1f}' for w in walls)} | {statistics.median(walls):.1f} | "
              f"{', '.join(f'{c:.1f}' for c in cpus)} | {statistics.median(cpus):.1f} |")


if __name__ == "__main__":
    main()
