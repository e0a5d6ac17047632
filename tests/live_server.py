"""A real local Prefect server, the deployments of prefect.yaml and a process worker, as `a2rl server start`
runs them, for the tests that need the whole operating setup (tests/test_deployments.py, test_kill_points.py).

One server per test module (own PREFECT_HOME and port); the helpers read flow runs over the REST API as the UI
does. Nothing here is a stand-in: server and worker are a2rl's (Prefect's, with a2rl's crash-report guards)."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from a2rl_bench.ops import prefect_local
import prefect_http
from tests.postgres_support import LocalPostgres, PostgresUnavailable

# Runs start within a second or two of being scheduled (defaults: 10 s each).
FAST_POLLING = {"PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
# Passed to the runs as a job-variable override: the reference agent trains a few steps only.
SMALL_AGENT = {"A2RL_SFT_MAX_STEPS": "4", "A2RL_SFT_BATCH_SIZE": "4", "A2RL_SFT_MAX_LENGTH": "512",
               "A2RL_SFT_TRAIN_S": "5", "A2RL_SFT_LR": "5e-3"}  # fmt: skip
# A run waiting for a GPU slot asks again after at most this many seconds (default 30).
SERVER_ENV = {"PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS": "2"}
# Lease times an operator may set (docs/scale-out.md §4), shortened for the modules whose tests are not about the
# default lease: the server finds an attempt that stopped renewing ~11 s after its last renewal instead of ~32-35 s
# (two such waits were 65 of the auto-retry test's 105 s). test_multihost, test_outages and the kill matrix keep the
# defaults: their waits are what they test.
SHORT_LEASE = {"A2RL_LEASE_S": "10", "A2RL_LEASE_SWEEP_S": "1"}
# The runs' side of it (their job variables' env): a renewal every 2 s, so that a short lease still spans five
# renewals, as the default 30 s spans six of 5 s, and one late renewal on a loaded machine is not a death.
SHORT_LEASE_RUNS = {"A2RL_LEASE_RENEW_S": "2"}
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@dataclass
class LiveServer:
    url: str
    home: Path
    port: int
    server_env: dict[str, str]
    """The server's environment beside this process's (`SERVER_ENV`, with `SHORT_LEASE` where a module asks)."""

    def start_worker(self) -> prefect_local.ManagedProcess:
        # Only the `default` queue: the nightly sweep (queue `sweeps`) must not start if the tests run at 2 am.
        return prefect_local.start_worker(self.url, home=self.home, queues=("default",), env=FAST_POLLING)

    def start_server(self) -> prefect_local.ManagedProcess:
        return start_sqlite_server(self.home, port=self.port, env=self.server_env)


def start_sqlite_server(home: Path, **kwargs: Any) -> prefect_local.ManagedProcess:
    """`prefect_local.start_server` on `home`'s own SQLite database, a fresh home's given the one this test process's
    first such server migrated (`seed_migrated_db`, `keep_migrated_db`)."""
    seed_migrated_db(home)
    server = prefect_local.start_server(home=home, **kwargs)
    keep_migrated_db(home)
    return server


def migrated_db_template() -> Path:
    """Where this test process keeps a Prefect database as its first local server had it when it answered: in the
    session's folder (A2RL_HOME's parent, tests/conftest.py), never a user's."""
    return Path(os.environ["A2RL_HOME"]).parent / "prefect-db-template.sqlite"


def seed_migrated_db(home: Path) -> None:
    """A fresh PREFECT_HOME gets a copy of the migrated database, so that its server skips Alembic's migrations of
    an empty one (every migration since 2022, the same schema each time: ~7 CPU s and ~8 s of a module's set-up;
    BENCHMARKS.md "Suite wall time, nineteenth pass"). A home with a database keeps it. The server's start from an
    empty database stays covered: the test harness's server, `a2rl run`'s own ephemeral one (test_benchmark_run,
    test_cli_first_hour), test_servers, and the first server here."""
    template, db = migrated_db_template(), home / "prefect.db"
    if template.exists() and not db.exists():
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, db)


def keep_migrated_db(home: Path) -> None:
    """After a server on `home` answered and before anything was deployed: its database becomes the template if
    there is none yet (SQLite's online backup, a consistent copy while the server writes)."""
    template, db = migrated_db_template(), home / "prefect.db"
    if template.exists() or not db.exists():
        return
    part = template.with_name(f"{template.name}.{os.getpid()}.part")
    with closing(sqlite3.connect(db)) as source, closing(sqlite3.connect(part)) as copy:
        source.backup(copy)
    part.replace(template)


@contextmanager
def live_server(home: Path, server_env: dict[str, str] = SERVER_ENV) -> Iterator[LiveServer]:
    """The server (own PREFECT_HOME, `server_env` in its environment), the deployments of prefect.yaml, one process
    worker; on exit both are stopped and nothing they started may be left."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    live = LiveServer(prefect_local.api_url_of("127.0.0.1", port), home, port, dict(server_env))
    pids = [live.start_server().pid]
    try:
        prefect_local.deploy(live.url)
        pids.append(live.start_worker().pid)
        with temporary_settings(updates={PREFECT_API_URL: live.url}):  # in-process clients use this server
            yield live
    finally:
        for state in (prefect_local.WORKER_STATE, prefect_local.SERVER_STATE):
            if proc := prefect_local.read_state(state, home):
                pids.append(proc.pid)
        prefect_local.stop_worker(home)
        prefect_local.stop_server(home)
        leaked = [p for pid in pids for p in family(pid)]
        assert not leaked, f"processes left behind: {leaked}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def family(pid: int) -> list[psutil.Process]:
    try:
        proc = psutil.Process(pid)
        return [p for p in [proc, *proc.children(recursive=True)] if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.NoSuchProcess:
        return []


def wait_for(probe: Callable[[], Any], timeout_s: float, what: str, run: tuple[str, Any] | None = None,
             poll_s: float = 1.0) -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := probe():
            return result
        if run and (state := flow_run(*run)["state_type"]) in ("FAILED", "CRASHED", "CANCELLED"):
            pytest.fail(f"flow run ended {state} while waiting for {what}")
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def flow_run(url: str, flow_run_id: Any) -> dict:
    return prefect_http.get(f"{url}/flow_runs/{flow_run_id}").json()


def final_run(url: str, flow_run_id: Any) -> dict | None:
    run = flow_run(url, flow_run_id)
    return run if run["state_type"] in FINAL else None


def set_state(url: str, flow_run_id: Any, state: dict, force: bool = True) -> dict:
    r = prefect_http.post(f"{url}/flow_runs/{flow_run_id}/set_state", json={"state": state, "force": force})
    r.raise_for_status()
    return r.json()


def ledger_with(runs_dir: Path, suffix: str, marker: str) -> Path | None:
    # Raw text: the writer may be half-way through a line.
    for ledger in runs_dir.glob(f"*-{suffix}/harness/ledger.jsonl"):
        if marker in ledger.read_text():
            return ledger
    return None


def kill_worker_host(home: Path) -> list[int]:
    """SIGKILL the worker and everything below it (flow-run processes, agents in their own sessions), as a
    crashed host would leave them; the worker's state file goes too."""
    worker = prefect_local.read_state(prefect_local.WORKER_STATE, home)
    assert worker and worker.alive()
    procs = family(worker.pid)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    (home / prefect_local.WORKER_STATE).unlink()
    return [p.pid for p in procs]


def postgres_or_skip() -> LocalPostgres:
    """A started throwaway PostgreSQL; without one the test skips, but not under CI (`make test` installs it: a CI
    without it is broken, not a reason to skip)."""
    try:
        return LocalPostgres().start()
    except PostgresUnavailable as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))


def plain_host(d: Path, host: str, results: Path) -> dict[str, str]:
    """Make a host's folders under d; the environment its plain `prefect worker start` runs with."""
    for sub in ("work", "cache", "tmp", "prefect"):
        (d / sub).mkdir(parents=True)
    return {**FAST_POLLING, "A2RL_HOST": host, "A2RL_HOME": str(d / "cache"), "TMPDIR": str(d / "tmp"),
            "A2RL_HOST_RESULTS": str(results)}  # fmt: skip
