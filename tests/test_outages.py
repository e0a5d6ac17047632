"""Server outages with runs in flight (#44): the Prefect server stopped (SIGSTOP) for 45 s, then its PostgreSQL
down for 60 s, while benchmark runs work on real process workers. No live run may be called dead: each run ends
with one completed row, one Completed state (no Crashed in its history, one attempt) and no attempt left alive.

Scaled to the 2-core test machine: 4 runs of the reference agent on the tiny model, on 2 plain `prefect worker
start` hosts taking 2 runs each (the issue's goal is 8 runs on 4 hosts); the lease settings are the defaults
(30 s of heard silence), so each outage is longer than a lease. Each outage starts once every run reads Running
and holds its lease (the database's, once each lease was renewed after the stall); nothing else waits on the clock.
Slow (a PostgreSQL cluster, a server, two workers; a few minutes on busy cores). Deselect with
`-m "not prefect_server"`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from a2rl_bench.capture.attempts import read_attempts
from a2rl_bench.ops import prefect_local, run_lease
from a2rl_bench.run_options import nest_parameters
from tests.live_server import SERVER_ENV, SMALL_AGENT, family, final_run, flow_run, wait_for
from tests.live_server import plain_host, postgres_or_skip
from tests.postgres_support import LocalPostgres, free_port
import prefect_http

pytestmark = pytest.mark.prefect_server

HOSTS = ("host-a", "host-b")
RUNS = 4
STALL_S = 45.0
OUTAGE_S = 60.0


@dataclass
class Cluster:
    url: str
    root: Path
    pg: LocalPostgres
    server_pid: int
    workers: list[int]

    def harness_dirs(self, flow_run_id: Any) -> list[Path]:
        return sorted(self.root.glob(f"hosts/*/results/runs/*-{str(flow_run_id).replace('-', '')[:8]}/harness"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("outages")
    pg = postgres_or_skip()
    server_home = root / "server" / "prefect"
    server_home.mkdir(parents=True)
    homes: list[Path] = []
    pids: list[int] = []
    try:
        server = prefect_local.start_server(port=free_port(), home=server_home, env=SERVER_ENV,
                                            database=pg.create_database("prefect"), timeout_s=300)  # fmt: skip
        pids.append(server.pid)
        prefect_local.deploy(server.url)
        for host in HOSTS:
            d = root / "hosts" / host
            env = plain_host(d, host, d / "results" / "a2rl.duckdb")
            homes.append(d / "prefect")
            pids.append(prefect_local.start_worker(server.url, home=d / "prefect", queues=("default",), limit=2,
                                                   env=env, cwd=d / "work", plain=True).pid)  # fmt: skip
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            yield Cluster(server.url, root, pg, server.pid, pids[1:])
    finally:
        for home in homes:
            prefect_local.stop_worker(home, flow_run_grace_s=30)
        prefect_local.stop_server(server_home)
        pg.stop()
        leaked = [p for pid in pids for p in family(pid)]
        assert not leaked, f"processes left behind: {leaked}"


def test_a_server_stalled_45_s_then_its_database_down_60_s_with_runs_in_flight_calls_none_dead(
    cluster, tiny_model_dir
):
    """Both outages meet the same runs, one after the other: after the stall the runs still have their baseline,
    session and final grading ahead of them (a minute and more), and a second set of four runs for the database's
    outage cost the file CPU seconds and a minute (BENCHMARKS.md, fourteenth pass)."""
    runs = _runs_in_flight(cluster, tiny_model_dir)
    stopped = [psutil.Process(cluster.server_pid), *psutil.Process(cluster.server_pid).children(recursive=True)]
    for p in stopped:
        p.suspend()
    try:
        time.sleep(STALL_S)  # what is tested is a stall of this length
    finally:
        for p in stopped:
            p.resume()
    _renewed_again(cluster, runs, "before the database went down")  # each attempt heard after the stall
    cluster.pg.halt()
    try:
        time.sleep(OUTAGE_S)  # what is tested is an outage of this length
    finally:
        cluster.pg.resume()
    _each_ended_once(cluster, runs)


# ---- helpers -----------------------------------------------------------------------------------------


def _runs_in_flight(cluster: Cluster, tiny_model_dir: Path) -> list[str]:
    """Start RUNS benchmark runs; return their flow-run ids once every one reads Running and holds its lease."""
    from prefect.deployments import run_deployment

    ids = []
    for seed in range(RUNS):
        params = dict(base_model=str(tiny_model_dir), budget_s=30, seed=seed, val_limit=2, test_limit=2, grace_s=5)
        fr = run_deployment("benchmark-run/benchmark-run", parameters=nest_parameters(params),
                            job_variables={"env": SMALL_AGENT}, timeout=0)  # fmt: skip
        ids.append(str(fr.id))
    # A lease is written before its take ends (`AttemptLease.take` writes the `a2rl-taken-` record next, then starts
    # the renewals): an outage between the two once left a lease nobody renewed (the take is now tried again,
    # `take_until_answered`, tested in test_ops_run_lease.py). The stall meets runs whose takes are written, so that
    # what this test sees is the outage of working runs.
    wait_for(lambda: _all_leased(cluster, ids, "before the stall")
             and all(run_lease.read_taken(cluster.url, i) is not None for i in ids), timeout_s=600,
             what=f"{RUNS} runs Running with their leases taken")  # fmt: skip
    return ids


def _renewed_again(cluster: Cluster, ids: list[str], when: str) -> None:
    """Wait until every run reads Running and its lease was renewed since now."""
    seq = {i: run_lease.read_lease(cluster.url, i, timeout_s=120).seq for i in ids}  # a backlog answered first
    wait_for(lambda: _all_leased(cluster, ids, when, renewed_after=seq), timeout_s=120,
             what=f"{RUNS} runs Running, each lease renewed {when}")  # fmt: skip


def _all_leased(cluster: Cluster, ids: list[str], when: str, renewed_after: dict[str, int] | None = None) -> bool:
    """Whether every run reads Running and holds its lease (renewed since `renewed_after`'s renewal count, where
    given); fails at once if one has ended."""
    runs = {i: flow_run(cluster.url, i) for i in ids}  # each read once a poll
    for i, run in runs.items():
        if run["state_type"] in ("FAILED", "CRASHED", "CANCELLED", "COMPLETED"):
            pytest.fail(f"run {i} ended {when}: {run['state']}")
    if not all(run["state_type"] == "RUNNING" for run in runs.values()):
        return False
    leases = {i: run_lease.read_lease(cluster.url, i) for i in ids}
    return all(lease is not None and lease.seq > (renewed_after or {}).get(i, -1) for i, lease in leases.items())


def _each_ended_once(cluster: Cluster, ids: list[str]) -> None:
    """Every run: Completed at its first attempt with no Crashed (or second ending) in its history, one completed
    row in the stores of all hosts, one attempt in its directory, and no process of it left."""
    finals = {i: wait_for(lambda: final_run(cluster.url, i), timeout_s=900, what=f"run {i} to end") for i in ids}
    # No attempt alive: the workers' flow-run processes (and their agents) are all gone; the stores are free.
    wait_for(lambda: all(len(family(w)) == 1 for w in cluster.workers), timeout_s=120,
             what="the flow-run processes to exit")  # fmt: skip
    for i, final in finals.items():
        states = sorted(prefect_http.get(f"{cluster.url}/flow_run_states/", params={"flow_run_id": i}).json(),
                        key=lambda s: s["timestamp"])  # fmt: skip
        endings = [s["type"] for s in states if s["type"] in ("CRASHED", "COMPLETED", "FAILED", "CANCELLED")]
        history = [(s["name"], s["message"]) for s in states]
        assert final["state_type"] == "COMPLETED" and endings == ["COMPLETED"], (i, history)
        assert final["run_count"] == 1, (i, final["run_count"])
        (harness,) = cluster.harness_dirs(i)  # one host ran it
        assert len(read_attempts(harness).attempts) == 1
        assert [_status(store, harness.parent.name) for store in cluster.root.glob("hosts/*/results/a2rl.duckdb")
                ].count("completed") == 1  # fmt: skip


def _status(store: Path, run_id: str) -> str | None:
    with duckdb.connect(str(store), read_only=True) as con:
        row = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return row[0] if row else None
