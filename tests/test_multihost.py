"""Several hosts, simulated on one machine: a Prefect server on PostgreSQL, three GPU-host workers that share
nothing but the server (each its own working directory, PREFECT_HOME, A2RL_HOME, TMPDIR, results store and run
directories, one run at a time: its "GPU"), all plain `prefect worker start` as docs/scale-out.md says, and a sweep
worker on the server host; automatic retry on. A nightly-style sweep of three configurations spreads over them; one
host dies with its run (noticed by the server, retried automatically), another's run is killed and Retry pressed
1 s later while its plain worker reports the crash; the sweep merges every host's store into one, from which `a2rl
analyze` draws. The server's rule and lease sweep are checked on their own first; the database goes down last.

Slow (about 10-14 minutes on 2 busy cores): a PostgreSQL cluster, a server, four workers and five benchmark runs of
the reference agent on the tiny model. Deselect with `-m "not prefect_server"`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import pytest

from a2rl_bench.ops import auto_retry, gpu_slots, prefect_local, run_lease
from tests.postgres_support import LocalPostgres, free_port
from tests.live_server import FAST_POLLING, SERVER_ENV, SMALL_AGENT, plain_host, postgres_or_skip
from tests.live_server import family as _family
from tests.live_server import final_run as _final_run
from tests.live_server import flow_run as _flow_run
from tests.live_server import kill_worker_host as _kill_worker_host
from tests.live_server import set_state as _set_state
from tests.live_server import wait_for as _wait_for
import prefect_http

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


def _join(hosts: dict[str, dict[str, str]]) -> None:
    """The hosts join as docs/scale-out.md says: each host's ledger key (`a2rl store host-key` on the host, in its
    environment) is registered where stores are merged (`a2rl store trust-host` in the test's own A2RL_HOME, which the
    sweep worker shares), so that its runs verify in the central store. The hosts make their keys side by side, and
    the registering is this process's `a2rl` (the same command, without three more interpreters starting: ~8 s)."""
    from a2rl_bench.cli import main

    makers = {host: subprocess.Popen([sys.executable, "-m", "a2rl_bench", "store", "host-key"], text=True,
                                     env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
              for host, env in hosts.items()}  # fmt: skip
    for host, maker in makers.items():
        out, err = maker.communicate(timeout=300)
        assert maker.returncode == 0, (host, err)
        assert main(["store", "trust-host", out.strip(), "--host", host]) == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """PostgreSQL, a Prefect server on it, the deployments (no schedules), three GPU-host workers and a sweep worker."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("multihost")
    pg = postgres_or_skip()
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
        auto_retry.set_auto_retry(server.url, "benchmark-run/benchmark-run", 2)
        # Stored in PostgreSQL, then dropped: the sweep worker below must never start tonight's nightly sweep.
        schedules = _unschedule(server.url)
        assert schedules == {"sweep/nightly-sweep": [("0 2 * * *", True)],
                             "merge-stores/merge-stores": [("30 * * * *", False)]}, schedules
        cluster = Cluster(server.url, root, server_home, pg)
        envs = {host: plain_host(cluster.host_dir(host), host, cluster.host_store(host)) for host in HOSTS}
        _join(envs)
        for host, env in envs.items():
            d = cluster.host_dir(host)
            homes.append(d / "prefect")
            pids.append(prefect_local.start_worker(server.url, home=d / "prefect", queues=("default",), limit=1,
                                                   env=env, cwd=d / "work", plain=True).pid)  # fmt: skip
        homes.append(root / "server-host" / "worker")
        homes[-1].mkdir()
        pids.append(prefect_local.start_worker(server.url, home=homes[-1], queues=("sweeps",), env=FAST_POLLING,
                                               cwd=root / "server-host", plain=True).pid)  # fmt: skip
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            yield cluster
    finally:
        for home in homes:
            prefect_local.stop_worker(home, flow_run_grace_s=30)
        prefect_local.stop_server(server_home)
        pg.stop()
        leaked = [p for pid in pids for p in _family(pid)]
        assert not leaked, f"processes left behind: {leaked}"


def test_the_server_refuses_crash_reports_and_retries_while_an_attempt_holds_the_lease_and_crashes_a_dead_one(
        cluster):  # fmt: skip
    """#35: a plain worker's crash report names no attempt; the server's rule keeps it off a run whose attempt holds
    the run's lease, and its lease sweep marks the run Crashed once that lease expires."""
    prefect_http.post(f"{cluster.url}/work_pools/", json={"name": "nobody", "type": "process"})
    flow = prefect_http.post(f"{cluster.url}/flows/", json={"name": "leased"}).json()
    deployment = prefect_http.post(f"{cluster.url}/deployments/", json={
        "name": "leased", "flow_id": flow["id"], "work_pool_name": "nobody"}).json()  # fmt: skip
    run = prefect_http.post(f"{cluster.url}/deployments/{deployment['id']}/create_flow_run", json={}).json()
    for state in ({"type": "PENDING", "name": "Pending"}, {"type": "RUNNING", "name": "Running"}):
        assert _set_state(cluster.url, run["id"], state, force=False)["status"] == "ACCEPT"
    now = datetime.now(timezone.utc)
    run_lease.write_lease(cluster.url, run_lease.RunLease(run["id"], 1, "gpu-host-2", 4242, now + timedelta(seconds=60)))
    late = _set_state(cluster.url, run["id"], {"type": "CRASHED", "name": "Crashed",
                                               "message": "Flow run infrastructure exited with non-zero status code -9."},
                      force=False)  # fmt: skip
    assert late["status"] == "ABORT" and "holds the run's lease" in late["details"]["reason"], late
    assert _flow_run(cluster.url, run["id"])["state_type"] == "RUNNING"

    # The attempt's host dies: its lease is not renewed; the server's sweep marks the run crashed.
    run_lease.write_lease(cluster.url, run_lease.RunLease(run["id"], 1, "gpu-host-2", 4242, datetime.now(timezone.utc)))
    t = time.monotonic()
    crashed = _wait_for(lambda: (r := _flow_run(cluster.url, run["id"]))["state_type"] == "CRASHED" and r,
                        timeout_s=120, what="the lease sweep")  # fmt: skip
    assert time.monotonic() - t <= 120
    assert "its attempt 1 on gpu-host-2 stopped renewing the run's lease" in crashed["state"]["message"]


def test_a_nightly_sweep_over_three_plain_hosts_survives_a_dead_host_and_a_killed_run_and_lands_in_one_store(
        cluster, tiny_model_dir, tmp_path, monkeypatch, capsys):  # fmt: skip
    from prefect.deployments import run_deployment

    from a2rl_bench.cli import main
    from a2rl_bench.isolation.procs import kill_tree
    from a2rl_bench.ops.status import flow_runs_by_suffix, run_process

    monkeypatch.setenv("PREFECT_API_URL", cluster.url)  # the merge below asks the server which attempts are over
    central = tmp_path / "central" / "a2rl.duckdb"
    params = dict(
        # One submission ends a session (a run option): the kills below strike two sessions in their first round,
        # and the rounds after it only kept the hosts busy (the dead host's retry waits for a free one) while
        # nothing here looks at them.
        run=dict(budget_s=45, base_model=str(tiny_model_dir), val_limit=2, test_limit=2, max_submissions=1),
        matrix=dict(tasks=["gsm8k"], agents=["reference-sft"], drivers=["none"], modes=["free"], seeds=[0, 1, 2]),
        options=dict(results=str(central), grace_s=5), gpu_slots=3,
        job_variables={"env": SMALL_AGENT}, poll_s=2, watch_timeout_s=1800,
        merge_from=[str(cluster.root / "hosts" / "*" / "results" / "a2rl.duckdb")],
    )  # fmt: skip
    sweep = run_deployment("sweep/nightly-sweep", parameters={"config": params}, timeout=0)

    # Two agent sessions at work on two hosts: one host dies whole (worker, flow run and agent; nobody reports it:
    # the server notices its lease expiring and the automation retries it elsewhere); on the other, the run loses
    # its flow-run process: its plain worker reports the crash twice (at once and 5-20 s later) while Retry is
    # pressed 1 s after the kill (the V1 UI's call, on a run that reads Running): neither report may land on the
    # retry, wherever it runs.
    two = _wait_for(lambda: len(s := _sessions(cluster)) >= 2 and s, timeout_s=600,
                    what="agent sessions on two hosts", run=(cluster.url, sweep.id))  # fmt: skip
    (dead_host, dead_run), (_, killed_run) = [(cluster.host_of(p), p.parts[-3]) for p in two[:2]]
    (dead,) = flow_runs_by_suffix(cluster.url, [dead_run.rsplit("-", 1)[1]]).values()
    (victim,) = flow_runs_by_suffix(cluster.url, [killed_run.rsplit("-", 1)[1]]).values()
    time.sleep(3)  # the agents train
    killed = _kill_worker_host(cluster.host_dir(dead_host) / "prefect")
    assert len(killed) >= 3, f"expected worker, flow-run process and agent, killed {killed}"
    t_dead = time.monotonic()
    pid, _ = run_process(two[1].parent)
    kill_tree(pid)
    time.sleep(1)
    pressed = _set_state(cluster.url, victim.id, {"type": "SCHEDULED", "name": "AwaitingRetry",
                                                  "message": "Retry from the UI"}, force=False)  # fmt: skip
    assert pressed["status"] == "ACCEPT", pressed
    _wait_for(lambda: _ever(cluster.url, dead.id, "CRASHED"), timeout_s=180, what="the dead host's run crashed")
    assert time.monotonic() - t_dead <= 120  # ≤ 2 minutes, as docs/scale-out.md §4 states (30 s lease + 10 s sweep)

    final = _wait_for(lambda: _final_run(cluster.url, sweep.id), timeout_s=1800, what="the sweep to end")
    assert final["state_type"] == "COMPLETED", final["state"]
    for fr, run_id in ((dead, dead_run), (victim, killed_run)):
        done = _flow_run(cluster.url, fr.id)
        assert done["state_type"] == "COMPLETED" and done["run_count"] == 2, (run_id, done["run_count"])
        after_retry = _states_since_retry(cluster.url, fr.id)  # one attempt after the retry, ended once
        assert [s["type"] for s in after_retry if s["type"] in ("CRASHED", "COMPLETED", "FAILED")] == ["COMPLETED"]
        completed = [h for h in HOSTS if _status(cluster.host_store(h), run_id) == "completed"]
        assert len(completed) == 1, (run_id, completed)  # one completed row, from one host

    # One store: one completed row per configuration, each with its flow run, attempt and state.
    with duckdb.connect(str(central), read_only=True) as con:
        rows = con.execute("SELECT run_id, seed, status, flow_run_id, attempts, prefect_state FROM runs "
                           "ORDER BY seed").fetchall()  # fmt: skip
    assert [(seed, status, state) for _, seed, status, _, _, state in rows] == [
        (0, "completed", "Completed"), (1, "completed", "Completed"), (2, "completed", "Completed")]
    assert {r[0]: r[4] for r in rows}[dead_run] == 2 and {r[0]: r[3] for r in rows}[dead_run] == str(dead.id)

    # Merging again changes nothing; the lost attempts are superseded.
    assert main(["store", "merge", "--into", str(central), *params["merge_from"]]) == 0
    out = capsys.readouterr().out
    assert "0 merged, 3 unchanged, 0 crashed" in out and f"superseded  {dead_run}" in out

    # `a2rl analyze` draws from it; a second sweep finds every configuration done.
    out_dir = tmp_path / "analysis"
    assert main(["analyze", "--results", str(central), "--out", str(out_dir)]) == 0
    summary = json.loads((out_dir / "summary.json").read_text())
    # A run the loaded machine kept from scoring a submission in its 45 s is left out as the environment's, not the
    # agent's (seen with a second pytest-xdist worker beside this test): every run is analysed or excluded so.
    starved = {"environment (the machine starved the run)"}
    assert set(summary["excluded_runs"]) <= starved, summary["excluded_runs"]
    assert summary["completed_runs"] + sum(summary["excluded_runs"].values()) == 3, summary
    assert (out_dir / "report.html").exists()
    again = run_deployment("sweep/nightly-sweep", parameters={"config": params}, timeout=600)
    assert again.state.is_completed(), again.state
    assert _benchmark_runs(cluster.url) == 3  # one flow run per configuration: the second sweep started none

    # The server's state is in PostgreSQL, and `a2rl status` reads it: every run of the last sweep.
    assert int(cluster.pg.psql("prefect", "SELECT count(*) FROM flow_run")) >= 6
    monkeypatch.setenv("PREFECT_HOME", str(cluster.server_home))
    # The dead host's slot (and the killed run's) is freed once its lease, last renewed before the kill, expires
    # and the server's repossessor next looks: on a fast machine the sweep, the merge and the second sweep are over
    # sooner than that (~55 s after the kill on 2026-12-02, where `a2rl status` still rightly showed a slot held).
    from prefect.settings import get_current_settings

    repossessor_s = get_current_settings().server.services.repossessor.loop_seconds  # the server's too (15 s)
    free_by = t_dead + gpu_slots.LEASE_S + repossessor_s + 45.0
    _wait_for(lambda: (limit := gpu_slots.read_limit(cluster.url)) is not None and limit.active_slots == 0,
              timeout_s=max(1.0, free_by - time.monotonic()), what="the dead runs' GPU slots to be freed")
    assert main(["status", "--results", str(central)]) == 0
    status = capsys.readouterr().out
    assert f"server {cluster.url}: up, its database answers" in status and dead_run in status
    assert "GPU slots: 0 of 3 in use" in status  # the dead host's slot expired with its lease

    # The database goes down: `a2rl status` says so in one line, no HTTP 500 dump.
    cluster.pg.halt()
    assert main(["status", "--results", str(central)]) == 1
    status = capsys.readouterr().out
    line = next(x for x in status.splitlines() if x.startswith(f"server {cluster.url}"))
    assert "the server is up but its database is not answering" in line
    assert "Traceback" not in status and "flow runs on" not in status


# ---- helpers -----------------------------------------------------------------------------------------


def _unschedule(url: str) -> dict[str, list[tuple[str, bool]]]:
    """Drop the deployments' schedules and the runs they already put on the calendar; returns (cron, active) of each."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for name in ("sweep/nightly-sweep", "merge-stores/merge-stores"):
        dep = prefect_http.get(f"{url}/deployments/name/{name}").json()
        found[name] = [(s["schedule"]["cron"], s["active"]) for s in dep.get("schedules") or []]
        for schedule in dep.get("schedules") or []:
            prefect_http.delete(f"{url}/deployments/{dep['id']}/schedules/{schedule['id']}").raise_for_status()
        body = {"deployments": {"id": {"any_": [dep["id"]]}}, "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}
        for run in prefect_http.post(f"{url}/flow_runs/filter", json=body).json():
            prefect_http.delete(f"{url}/flow_runs/{run['id']}").raise_for_status()
    return found


def _sessions(cluster: Cluster) -> list[Path]:
    """Ledgers of runs whose agent session is at work, one per host."""
    found: dict[str, Path] = {}
    for ledger in sorted((cluster.root / "hosts").glob("*/results/runs/*/harness/ledger.jsonl")):
        text = ledger.read_text()  # raw text: the writer may be half-way through a line
        if '"session-start"' in text and '"session-end"' not in text:
            found.setdefault(cluster.host_of(ledger), ledger)
    return list(found.values())


def _states(url: str, flow_run_id: Any) -> list[dict]:
    r = prefect_http.get(f"{url}/flow_run_states/", params={"flow_run_id": str(flow_run_id)})
    r.raise_for_status()
    return sorted(r.json(), key=lambda s: s["timestamp"])


def _ever(url: str, flow_run_id: Any, state_type: str) -> bool:
    return any(s["type"] == state_type for s in _states(url, flow_run_id))


def _states_since_retry(url: str, flow_run_id: Any) -> list[dict]:
    states = _states(url, flow_run_id)
    last_retry = max(i for i, s in enumerate(states) if s["name"] == "AwaitingRetry")
    return states[last_retry + 1:]


def _status(store: Path, run_id: str) -> str | None:
    if not store.exists():
        return None
    with duckdb.connect(str(store), read_only=True) as con:
        row = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return row[0] if row else None


def _benchmark_runs(url: str) -> int:
    """Flow runs of the benchmark-run deployment on the server."""
    dep = prefect_http.get(f"{url}/deployments/name/benchmark-run/benchmark-run").json()
    body = {"deployments": {"id": {"any_": [dep["id"]]}}}
    return len(prefect_http.post(f"{url}/flow_runs/filter", json=body).json())
