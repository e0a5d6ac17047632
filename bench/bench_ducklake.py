"""DuckLake (catalog in PostgreSQL, data in Parquet files) as the one store of several hosts: what a2rl's store would
need from it, and what a run's small writes cost there. Issue #27's alternative to per-host DuckDB stores + merge.

DuckLake exists only for DuckDB 1.3.0-1.4.4 (PyPI `duckdb-ext-ducklake`); the project pins duckdb 2.0.1, so this
runs in a virtual environment of its own, outside the project's:

    python3 -m venv .tools/ducklake-bench
    .tools/ducklake-bench/bin/pip install duckdb==1.4.4 duckdb-ext-ducklake==1.4.4.20260205 \
        duckdb-ext-postgres==1.4.4.20260205
    .tools/ducklake-bench/bin/python bench/bench_ducklake.py --transactions 300 --writers 3

It starts a throwaway PostgreSQL cluster (tests/postgres_support.py) and measures:
- which statements a2rl's schema and writes use DuckLake accepts (PRIMARY KEY, ON CONFLICT upserts, macros, MERGE);
- the latency of one small upsert transaction (the unit of a run's live writes: a ledger head, a submission row,
  an event), with one long-lived connection and with a connection per transaction (a2rl's pattern);
- several writer processes upserting into one table at once (conflicts and retries);
- Parquet files left behind, and a count over them before and after DuckLake's compaction;
- the same upsert on a local DuckDB file opened per transaction (a2rl's pattern), in the same run.
The other side of the comparison, the same transaction on a local DuckDB 2.0.1 store, is
`bench/bench_store_merge.py` (project venv).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.postgres_support import LocalPostgres  # noqa: E402

PROBES = {
    "PRIMARY KEY": "CREATE TABLE probe_pk (run_id VARCHAR PRIMARY KEY)",
    "INSERT ... ON CONFLICT DO UPDATE": "INSERT INTO events VALUES ('r', 0, now(), 'x', '{}') "
                                       "ON CONFLICT (run_id, seq) DO UPDATE SET kind = excluded.kind",
    "INSERT OR REPLACE": "INSERT OR REPLACE INTO events VALUES ('r', 0, now(), 'x', '{}')",
    "CREATE MACRO (the schema's t975, binomial_se)": "CREATE MACRO probe_m(x) AS x + 1",
    "CREATE VIEW": "CREATE VIEW probe_v AS SELECT * FROM events",
    "MERGE INTO (upsert)": "MERGE INTO events USING (SELECT 'r' AS run_id, 0 AS seq) s "
                           "ON events.run_id = s.run_id AND events.seq = s.seq WHEN NOT MATCHED THEN "
                           "INSERT VALUES (s.run_id, s.seq, now(), 'x', '{}')",
}
UPSERT = ("MERGE INTO events USING (SELECT ? AS run_id, ? AS seq, now() AS created_at, ? AS kind, ? AS detail_json) s "
          "ON events.run_id = s.run_id AND events.seq = s.seq "
          "WHEN MATCHED THEN UPDATE SET kind = s.kind, detail_json = s.detail_json "
          "WHEN NOT MATCHED THEN INSERT VALUES (s.run_id, s.seq, s.created_at, s.kind, s.detail_json)")


def extension_dir() -> Path:
    import duckdb_ext  # the PyPI packages put the extension files under this package

    found = sorted(f for d in duckdb_ext.__path__ for f in Path(d).glob("extensions/*/*/ducklake.duckdb_extension"))
    if not found:
        raise SystemExit("duckdb-ext-ducklake is not installed in this environment (see the module docstring)")
    return found[-1].parent


def attach(libpq: str, data: str):
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET extension_directory = '{tempfile.mkdtemp()}'")
    for ext in ("postgres_scanner", "ducklake"):
        con.execute(f"LOAD '{extension_dir() / ext}.duckdb_extension'")
    con.execute(f"ATTACH 'ducklake:postgres:{libpq}' AS lake (DATA_PATH '{data}/')")
    con.execute("USE lake")
    return con


def upsert(con, run: str, seq: int) -> None:
    con.execute("BEGIN TRANSACTION")
    con.execute(UPSERT, [run, seq, "submission", json.dumps({"seq": seq})])
    con.execute("COMMIT")


def writer(libpq: str, data: str, worker: int, n: int, out: mp.Queue) -> None:
    """One host's run: n upserts, each retried on a transaction conflict; reports latencies and conflicts."""
    con = attach(libpq, data)
    latencies, conflicts = [], 0
    for seq in range(n):
        t = time.perf_counter()
        while True:
            try:
                upsert(con, f"host{worker}-run", seq)
                break
            except Exception as e:  # noqa: BLE001 - DuckLake reports a conflict as a TransactionException
                try:
                    con.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - already rolled back by the failed commit
                    pass
                if "conflict" not in str(e).lower():
                    raise
                conflicts += 1
        latencies.append(time.perf_counter() - t)
    out.put({"worker": worker, "latencies": latencies, "conflicts": conflicts})


def ms(values: list[float]) -> dict:
    values = sorted(values)
    return {"median_ms": round(1000 * statistics.median(values), 1),
            "p90_ms": round(1000 * values[int(0.9 * (len(values) - 1))], 1), "n": len(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transactions", type=int, default=300, help="upserts per measurement")
    ap.add_argument("--writers", type=int, default=3, help="writer processes at once")
    args = ap.parse_args()
    import duckdb

    facts: dict = {"duckdb": duckdb.__version__, "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    with LocalPostgres() as pg:
        pg.create_database("lake")
        data = tempfile.mkdtemp(prefix="a2rl-lake-")
        con = attach(pg.libpq("lake"), data)
        con.execute("CREATE TABLE events (run_id VARCHAR, seq BIGINT, created_at TIMESTAMPTZ, kind VARCHAR, "
                    "detail_json VARCHAR)")  # fmt: skip
        support = {}
        for name, sql in PROBES.items():
            try:
                con.execute(sql)
                support[name] = "accepted"
            except duckdb.Error as e:
                support[name] = "refused: " + str(e).splitlines()[0][:120]
        facts["statements"] = support
        con.execute("DELETE FROM events")

        n = args.transactions
        lat = []
        for seq in range(n):
            t = time.perf_counter()
            upsert(con, "one-connection", seq)
            lat.append(time.perf_counter() - t)
        facts["upsert, one long-lived connection"] = ms(lat)
        lat = []
        for seq in range(min(n, 100)):
            t = time.perf_counter()
            c = attach(pg.libpq("lake"), data)
            upsert(c, "connection-per-write", seq)
            c.close()
            lat.append(time.perf_counter() - t)
        facts["upsert, attach per transaction (a2rl's pattern)"] = ms(lat)

        local = Path(tempfile.mkdtemp()) / "local.duckdb"
        with duckdb.connect(str(local)) as c:
            c.execute("CREATE TABLE events (run_id VARCHAR, seq BIGINT, created_at TIMESTAMPTZ, kind VARCHAR, "
                      "detail_json VARCHAR, PRIMARY KEY (run_id, seq))")  # fmt: skip
        lat = []
        for seq in range(min(n, 100)):
            t = time.perf_counter()
            with duckdb.connect(str(local)) as c:
                c.execute("BEGIN TRANSACTION")
                c.execute("INSERT INTO events VALUES (?, ?, now(), ?, ?) ON CONFLICT (run_id, seq) DO UPDATE SET "
                          "kind = excluded.kind", ["local", seq, "submission", json.dumps({"seq": seq})])  # fmt: skip
                c.execute("COMMIT")
            lat.append(time.perf_counter() - t)
        facts["same upsert on a local DuckDB file, connection per transaction (same DuckDB, same window)"] = ms(lat)

        queue: mp.Queue = mp.get_context("spawn").Queue()
        procs = [mp.get_context("spawn").Process(target=writer, args=(pg.libpq("lake"), data, w, n, queue))
                 for w in range(args.writers)]  # fmt: skip
        t = time.perf_counter()
        for p in procs:
            p.start()
        results = [queue.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
        facts[f"{args.writers} writer processes at once"] = {
            "wall_s": round(time.perf_counter() - t, 1),
            "conflicts_retried": sum(r["conflicts"] for r in results),
            **ms([x for r in results for x in r["latencies"]]),
        }
        files = sum(len(f) for _, _, f in os.walk(data))
        t = time.perf_counter()
        rows = con.execute("SELECT count(*) FROM events").fetchone()[0]
        before = time.perf_counter() - t
        t = time.perf_counter()
        con.execute("CALL ducklake_merge_adjacent_files('lake')")
        con.execute("CALL ducklake_cleanup_old_files('lake', cleanup_all => true)")
        compact = time.perf_counter() - t
        t = time.perf_counter()
        con.execute("SELECT count(*) FROM events").fetchone()
        after = time.perf_counter() - t
        facts["files"] = {"rows": rows, "parquet_files_before_compaction": files,
                          "count_before_s": round(before, 3), "compaction_s": round(compact, 2),
                          "parquet_files_after": sum(len(f) for _, _, f in os.walk(data)),
                          "count_after_s": round(after, 3)}  # fmt: skip
        con.close()
    print(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
