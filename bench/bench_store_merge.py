"""The cost of the chosen multi-host store path (issue #27): each host writes its own DuckDB store, and
`a2rl store merge` rebuilds every host's runs in the central store from their run directories.

1. Host side: runs written the way a benchmark run writes them (tests/run_dirs.py: the run's own code, no agent,
   made-up scores), with the time spent inside the results store counted per run (connections, transactions,
   seconds), and one small upsert (an event row) timed on its own: the unit bench/bench_ducklake.py times on
   DuckLake.
2. Merge side: RUNS runs over three host stores, cloned from the written ones (new run ids, each ledger re-chained
   and its head anchored in its host's store, the report's head and its MAC updated), then merged into an empty central store,
   merged again (nothing changes), and merged again after one host finished one more run.

Usage (repository root):  python bench/bench_store_merge.py --runs 1000 --written 12
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from a2rl_bench.grading.ledger import Ledger, LedgerHead, head_mac, read_ledger  # noqa: E402
from a2rl_bench.records import RunConfig  # noqa: E402
from a2rl_bench.store.merge import merge_stores  # noqa: E402
from a2rl_bench.store.results import ResultsStore  # noqa: E402
from tests.run_dirs import write_run  # noqa: E402

HOSTS = ("host-1", "host-2", "host-3")


class StoreClock:
    """Counts the results store's connections (one per transaction or read) and the seconds spent in them."""

    def __init__(self) -> None:
        self.seconds, self.connections = 0.0, 0
        self._real = ResultsStore._connect

    def __enter__(self) -> StoreClock:
        clock, real = self, self._real

        @contextmanager
        def timed(store, read_only):
            t = time.perf_counter()
            with real(store, read_only) as con:
                yield con
            clock.seconds += time.perf_counter() - t
            clock.connections += 1

        ResultsStore._connect = timed
        return self

    def __exit__(self, *exc: object) -> None:
        ResultsStore._connect = self._real


def host_writes(root: Path, n: int) -> tuple[dict, list[tuple[str, Path]]]:
    """n runs written to host-1's store; the store's share of each run's time."""
    per_run, walls, conns = [], [], []
    written = []
    for k in range(n):
        with StoreClock() as clock:
            t = time.perf_counter()
            ctx = write_run(root / HOSTS[0] / "a2rl.duckdb", root / HOSTS[0] / "runs", RunConfig(seed=k),
                            uuid.uuid4().hex)  # fmt: skip
            walls.append(time.perf_counter() - t)
        per_run.append(clock.seconds)
        conns.append(clock.connections)
        written.append((ctx.run_id, ctx.paths.run_dir))
    store = ResultsStore(root / HOSTS[0] / "a2rl.duckdb")
    upserts = []
    for seq in range(100):
        t = time.perf_counter()
        store.record_event("bench-upsert", seq, "submission", {"seq": seq})
        upserts.append(time.perf_counter() - t)
    return {
        "runs_written": n,
        "store_s_per_run_median": round(statistics.median(per_run), 2),
        "store_connections_per_run": round(statistics.median(conns)),
        "whole_run_write_s_median (summary step included)": round(statistics.median(walls), 2),
        "one_upsert_ms_median": round(1000 * statistics.median(upserts), 1),
        "one_upsert_ms_p90": round(1000 * sorted(upserts)[89], 1),
    }, written


def clone(template: tuple[str, Path], template_store: Path, host: str, root: Path, k: int) -> None:
    """A copy of a written run under a new run id on `host`: directory, re-chained ledger anchored in the host's store,
    report head, and the run's row."""
    run_id, run_dir = template
    new_id = f"{run_id.rsplit('-', 1)[0]}-{k:08x}"
    dest = root / host / "runs" / new_id
    shutil.copytree(run_dir, dest, symlinks=True)
    harness = dest / "harness"
    manifest = json.loads((harness / "manifest.json").read_text())
    (harness / "manifest.json").write_text(json.dumps(manifest | {"run_id": new_id}))
    entries = read_ledger(harness / "ledger.jsonl")
    (harness / "ledger.jsonl").unlink()
    ledger = Ledger(harness / "ledger.jsonl")
    heads = []
    for e in entries:
        entry = ledger.append(**(e.model_dump(exclude={"seq", "prev_hash"}) | {"run_id": new_id}))
        heads.append((entry.seq, ledger._last_hash_of(entry), e.at))
    report = json.loads((harness / "report.json").read_text())
    report["summary"]["run_id"] = new_id
    head = LedgerHead(len(heads), heads[-1][1])
    # the report's head MAC names the run id and head, so a clone carries its own (the merge checks it)
    report["ledger"].update(entries=head.entries, head_hash=head.hash, head_mac=head_mac(new_id, head))
    (harness / "report.json").write_text(json.dumps(report))
    row = ResultsStore(template_store, read_only=True).query("SELECT * FROM runs WHERE run_id = ?", [run_id])
    row["run_id"], row["harness_dir"] = new_id, str(harness)
    store = ResultsStore(root / host / "a2rl.duckdb")
    with store.batch():
        store.adopt_ledger_heads(new_id, heads)
        store.bulk_write("runs", row)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000, help="runs merged, over three host stores")
    ap.add_argument("--written", type=int, default=12, help="runs written the live way (templates of the clones)")
    ap.add_argument("--out", type=Path, default=None, help="keep the stores here (default: a temporary directory)")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="a2rl-bench-merge-"))
    facts: dict = {"machine": platform.platform(), "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    src = root / "written"
    facts["host writes"], written = host_writes(src, args.written)
    template_store = src / HOSTS[0] / "a2rl.duckdb"
    t = time.perf_counter()
    for k in range(args.runs):
        clone(written[k % len(written)], template_store, HOSTS[k % len(HOSTS)], root / "hosts", k)
    facts["clone_s"] = round(time.perf_counter() - t, 1)

    sources = [root / "hosts" / h / "a2rl.duckdb" for h in HOSTS]
    central = root / "central.duckdb"
    timings, refused = {}, []
    for label in ("first merge (all new)", "second merge (nothing changed)"):
        t = time.perf_counter()
        report = merge_stores(central, sources)
        refused += report.refused
        timings[label] = {"s": round(time.perf_counter() - t, 1), "outcome": report.summary().split(": ", 1)[1]}
    clone(written[0], template_store, HOSTS[0], root / "hosts", args.runs)  # one host finished one more run
    t = time.perf_counter()
    report = merge_stores(central, sources)
    timings["third merge (one new run)"] = {"s": round(time.perf_counter() - t, 1),
                                            "outcome": report.summary().split(": ", 1)[1]}  # fmt: skip
    facts["merge"] = timings
    refused += report.refused
    facts["central_store_mb"] = round(central.stat().st_size / 1e6, 1)
    facts["host_store_mb"] = round(sources[0].stat().st_size / 1e6, 1)
    print(json.dumps(facts, indent=1))
    if args.out is None:
        shutil.rmtree(root, ignore_errors=True)
    if refused:  # a refused clone is the bench's fault, and its timings would measure refusals
        for o in refused[:5]:
            print(f"REFUSED {o.run_id} ({o.source}): {o.detail}", file=sys.stderr)
        print(f"bench_store_merge: the merge refused {len(refused)} run(s): these timings are not the merge's",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
