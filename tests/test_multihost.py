"""Several hosts, simulated on one machine: a Prefect server on PostgreSQL, three GPU-host workers that share
nothing but the server (each its own working directory, PREFECT_HOME, A2RL_HOME, TMPDIR, results store and run
directories, one run at a time: its "GPU"), and a sweep worker on the server host. A nightly-style sweep of three
configurations spreads over them; one host is killed mid-run and its run is retried on another; the sweep merges
every host's store into one, from which `a2rl analyze` draws.

Slow (about 8-12 minutes on 2 busy cores): a PostgreSQL cluster, a server, four workers and four benchmark runs of
the reference agent on the tiny model. Deselect with `-m "not prefect_server"`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx
import pytest

from a2rl.grading.ledger import read_ledger
from a2rl.ops import prefect_local
from tests.postgres_support import LocalPostgres, PostgresUnavailable, free_port
from tests.run_dirs import dump_store
from tests.live_server import FAST_POLLING, SERVER_ENV, SMALL_AGENT
from tests.live_server import family as _family
from tests.live_server import final_run as _final_run
from tests.live_server import flow_run as _flow_run
from tests.live_server import kill_worker_host as _kill_worker_host
from tests.live_server import set_state as _set_state
from tests.live_server import wait_for as _wait_for

pytestmark = pytest.mark.prefect_server

HOSTS = ("gpu-host-1", "gpu-host-2", "gpu-host-3")


@dataclass
class Cluster:
    url: str
    root: Path
    server_home: Path
    pg: LocalPostgres

    def host_dir(self, host: str) -> Path:
        return self.root / "hosts" / host

    def host_store(self, host: str) -> Path:
        return self.host_dir(host) / "results" / "a2rl.duckdb"

    def host_of(self, path: Path) -> str:
        return path.relative_to(self.root / "hosts").parts[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """PostgreSQL, a Prefect server on it, the deployments (no schedules), three GPU-host workers and a sweep worker."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("multihost")
    try:
        pg = LocalPostgres().start()
    except PostgresUnavailable as e:
        if os.environ.get("CI"):  # `make test` installs it: a CI without it is broken, not a reason to skip
            raise
        pytest.skip(str(e))
    homes: list[Path] = []
    pids: list[int] = []
    server_home = root / "server-host" / "prefect"
    server_home.mkdir(parents=True)
    try:
        database = pg.create_database("prefect")
        server = prefect_local.start_server(port=free_port(), home=server_home, env=SERVER_ENV, database=database,
                                            timeout_s=300)  # fmt: skip
        pids.append(server.pid)
        prefect_local.deploy(server.url)
        # Stored in PostgreSQL, then dropped: the sweep worker below must never start tonight's nightly sweep.
        schedules = _unschedule(server.url)
        assert schedules == {"sweep/nightly-sweep": [("0 2 * * *", True)],
                             "merge-stores/merge-stores": [("30 * * * *", False)]}, schedules
        cluster = Cluster(server.url, root, server_home, pg)
        for host in HOSTS:
            d = cluster.host_dir(host)
            for sub in ("work", "cache", "tmp", "prefect"):
                (d / sub).mkdir(parents=True)
            env = {**FAST_POLLING, "A2RL_HOST": host, "A2RL_HOME": str(d / "cache"), "TMPDIR": str(d / "tmp"),
                   "A2RL_HOST_RESULTS": str(cluster.host_store(host))}  # fmt: skip
            homes.append(d / "prefect")
            pids.append(prefect_local.start_worker(server.url, home=d / "prefect", queues=("default",), limit=1,
                                                   env=env, cwd=d / "work").pid)  # fmt: skip
        homes.append(root / "server-host" / "worker")
        homes[-1].mkdir()
        pids.append(prefect_local.start_worker(server.url, home=homes[-1], queues=("sweeps",), env=FAST_POLLING,
                                               cwd=root / "server-host").pid)  # fmt: skip
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            yield cluster
    finally:
        for home in homes:
            prefect_local.stop_worker(home, flow_run_grace_s=30)
        prefect_local.stop_server(server_home)
        pg.stop()
        leaked = [p for pid in pids for p in _family(pid)]
        assert not leaked, f"processes left behind: {leaked}"


def test_a_nightly_sweep_over_three_hosts_survives_a_dead_host_and_lands_in_one_store(cluster, tiny_model_dir,
                                                                                      tmp_path, monkeypatch, capsys):
    from prefect.deployments import run_deployment

    from a2rl.cli import main
    from a2rl.ops.status import flow_runs_by_suffix

    central = tmp_path / "central" / "a2rl.duckdb"
    params = dict(
        tasks=["gsm8k"], agents=["reference-sft"], drivers=["none"], modes=["free"], seeds=[0, 1, 2], budget_s=45,
        results=str(central), base_model=str(tiny_model_dir), val_limit=2, test_limit=2, grace_s=5, gpu_slots=3,
        job_variables={"env": SMALL_AGENT}, poll_s=2, watch_timeout_s=1800,
        merge_from=[str(cluster.root / "hosts" / "*" / "results" / "a2rl.duckdb")],
    )  # fmt: skip
    sweep = run_deployment("sweep/nightly-sweep", parameters=params, timeout=0)

    # The first run whose agent session starts is on the host that dies.
    ledger = _wait_for(lambda: _first_session(cluster), timeout_s=600, what="an agent session on some host",
                       run=(cluster.url, sweep.id))  # fmt: skip
    victim_host, run_id = cluster.host_of(ledger), ledger.parts[-3]
    (victim,) = flow_runs_by_suffix(cluster.url, [run_id.rsplit("-", 1)[1]]).values()
    time.sleep(3)  # the agent trains
    killed = _kill_worker_host(cluster.host_dir(victim_host) / "prefect")
    assert len(killed) >= 3, f"expected worker, flow-run process and agent, killed {killed}"
    _set_state(cluster.url, victim.id, {"type": "CRASHED", "name": "Crashed", "message": "host lost"})
    prefect_local.retry_flow_run(cluster.url, victim.id, settle_s=3)

    final = _wait_for(lambda: _final_run(cluster.url, sweep.id), timeout_s=1800, what="the sweep to end")
    assert final["state_type"] == "COMPLETED", final["state"]
    retried = _flow_run(cluster.url, victim.id)
    assert retried["state_type"] == "COMPLETED" and retried["run_count"] >= 2

    # The dead host still holds its lost attempt; another host started the run over and completed it.
    with duckdb.connect(str(cluster.host_store(victim_host)), read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchall() == [("running",)]
    (done,) = [h for h in HOSTS if h != victim_host and _status(cluster.host_store(h), run_id) == "completed"]
    attempts = [e.detail for e in read_ledger(cluster.host_dir(done) / "results" / "runs" / run_id / "harness" /
                                              "ledger.jsonl") if e.detail.get("event") == "attempt"]  # fmt: skip
    assert attempts and attempts[0]["host"] == done and attempts[0]["starts_over"] is True, attempts

    # One store: one completed row per configuration, the retried run from the host that completed it.
    with duckdb.connect(str(central), read_only=True) as con:
        rows = con.execute("SELECT run_id, seed, status, harness_dir FROM runs ORDER BY seed").fetchall()
    assert [(seed, status) for _, seed, status, _ in rows] == [(0, "completed"), (1, "completed"), (2, "completed")]
    assert cluster.host_of(Path(dict((r[0], r[3]) for r in rows)[run_id])) == done
    assert {cluster.host_of(Path(r[3])) for r in rows} <= set(HOSTS)

    # Merging again changes nothing; the lost attempt stays out.
    before = dump_store(central)
    assert main(["store", "merge", "--into", str(central), *params["merge_from"]]) == 0
    out = capsys.readouterr().out
    assert "0 merged, 3 unchanged" in out and f"unfinished  {run_id}" in out
    assert dump_store(central) == before

    # `a2rl results` and `a2rl analyze` draw from it; a second sweep finds every configuration done.
    assert main(["results", "--results", str(central)]) == 0
    listed = capsys.readouterr().out
    assert all(r[0] in listed for r in rows)
    out_dir = tmp_path / "analysis"
    assert main(["analyze", "--results", str(central), "--out", str(out_dir)]) == 0
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["completed_runs"] == 3 and (out_dir / "report.html").exists()
    again = run_deployment("sweep/nightly-sweep", parameters=params, timeout=600)
    assert again.state.is_completed(), again.state
    assert _benchmark_runs(cluster.url) == 3  # one flow run per configuration: the second sweep started none

    # The server's state is in PostgreSQL, and `a2rl status` reads it.
    assert int(cluster.pg.psql("prefect", "SELECT count(*) FROM flow_run")) >= 6
    monkeypatch.setenv("PREFECT_API_URL", cluster.url)
    monkeypatch.setenv("PREFECT_HOME", str(cluster.server_home))
    assert main(["status", "--results", str(central)]) == 0
    status = capsys.readouterr().out
    assert f"server {cluster.url}: up" in status and run_id in status
    assert "GPU slots: 0 of 3 in use" in status  # the sweep's limit; the dead host's slot expired with its lease


# ---- helpers -----------------------------------------------------------------------------------------


def _unschedule(url: str) -> dict[str, list[tuple[str, bool]]]:
    """Drop the deployments' schedules and the runs they already put on the calendar; returns (cron, active) of each."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for name in ("sweep/nightly-sweep", "merge-stores/merge-stores"):
        dep = httpx.get(f"{url}/deployments/name/{name}", timeout=10).json()
        found[name] = [(s["schedule"]["cron"], s["active"]) for s in dep.get("schedules") or []]
        for schedule in dep.get("schedules") or []:
            httpx.delete(f"{url}/deployments/{dep['id']}/schedules/{schedule['id']}", timeout=10).raise_for_status()
        body = {"deployments": {"id": {"any_": [dep["id"]]}}, "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}
        for run in httpx.post(f"{url}/flow_runs/filter", json=body, timeout=10).json():
            httpx.delete(f"{url}/flow_runs/{run['id']}", timeout=10).raise_for_status()
    return found


def _first_session(cluster: Cluster) -> Path | None:
    for ledger in sorted((cluster.root / "hosts").glob("*/results/runs/*/harness/ledger.jsonl")):
        if '"session-start"' in ledger.read_text():  # raw text: the writer may be half-way through a line
            return ledger
    return None


def _status(store: Path, run_id: str) -> str | None:
    if not store.exists():
        return None
    with duckdb.connect(str(store), read_only=True) as con:
        row = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return row[0] if row else None


def _benchmark_runs(url: str) -> int:
    """Flow runs of the benchmark-run deployment on the server."""
    dep = httpx.get(f"{url}/deployments/name/benchmark-run/benchmark-run", timeout=10).json()
    return len(httpx.post(f"{url}/flow_runs/filter", json={"deployments": {"id": {"any_": [dep["id"]]}}},
                          timeout=10).json())  # fmt: skip
