"""A local Prefect server and process worker as managed subprocesses: start, stop, status, deploy.

Each process gets a JSON state file under PREFECT_HOME (pid, start time, URL, log file), so `a2rl server
stop` in another shell finds it, and a reused pid is never mistaken for ours. Prefect is driven through its
CLI and its Python client (a2rl_bench.ops.prefect_api, imported on first use).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
from pydantic import BaseModel

from a2rl_bench.isolation import procs
from a2rl_bench.ops import prefect_api
from a2rl_bench.ops.gpu_slots import LEASE_STORAGE, LEASE_STORAGE_ENV
from a2rl_bench.paths import checkout_root, prefect_home_path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200
DEFAULT_POOL = "a2rl-local"
RUN_DEPLOYMENT = "benchmark-run/benchmark-run"
RUNS_QUEUE = "default"
"""The work queue of benchmark runs (prefect.yaml); sweeps go to `sweeps`, so a runs-only limit never blocks them."""
REPO_ROOT = checkout_root() or Path.cwd()
"""Where prefect.yaml is and servers and workers start: the checkout (an installed wheel: where a2rl started)."""
SERVER_STATE = "a2rl-server.json"
WORKER_STATE = "a2rl-worker.json"
# Set for every Prefect process we start: the machine is offline, and telemetry would only log errors. A wide
# console: Prefect's CLI draws its messages in boxes as wide as the console (80 columns without a terminal), which
# cut `prefect deploy`'s "... created with id '...'" lines, ids and all, across lines `a2rl deploy` then dropped.
QUIET_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "400"}


class OpsError(RuntimeError):
    """A server, worker or deployment command did not do what was asked; the message says what to check."""


class ManagedProcess(BaseModel):
    """A process we started, as recorded in its state file."""

    name: str
    pid: int
    create_time: float
    log: str
    url: str | None = None
    pool: str | None = None

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            # Same pid and same start time: still our process, not a newcomer that reused the pid.
            return abs(proc.create_time() - self.create_time) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


def prefect_home() -> Path:
    return prefect_home_path()


def api_url_of(host: str, port: int) -> str:
    return f"http://{host}:{port}/api"


def url_port(url: str | None) -> int | None:
    from urllib.parse import urlsplit

    try:
        return urlsplit(url or "").port
    except ValueError:
        return None


def reachable_address() -> str:
    """This machine's address on the network its default route leads to (no packet is sent), else 127.0.0.1."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the outgoing interface
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def exposure_warning(host: str, port: int) -> str | None:
    """For a bind beyond this machine's loopback: the server has no authentication, so say who can reach it."""
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    where = "every interface" if host in WILDCARD_HOSTS else host
    return (f"the Prefect server listens on {where} (port {port}) with no authentication: anyone who can reach "
            f"that port can read, start, change and delete runs; keep --host 127.0.0.1 (and reach it over SSH) "
            f"unless this network is trusted")


def answering_on(port: int) -> str | None:
    """'a Prefect server (http://127.0.0.1:PORT/api)' when one answers on this machine's `port`, else None."""
    url = api_url_of(DEFAULT_HOST, port)
    return f"a Prefect server ({url})" if server_healthy(url) else None


def database_users(home: Path) -> str | None:
    """Processes that hold this PREFECT_HOME's SQLite database open (an `a2rl run`'s own server, another server)
    but the server a2rl started from it: a second server on it meets 'database is locked'. None when there are
    none (or they cannot be seen)."""
    db = (home / "prefect.db").resolve()
    ours = read_state(SERVER_STATE, home)
    users = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid in (os.getpid(), ours.pid if ours else None):
                continue
            if any(Path(f.path) == db for f in proc.open_files()):
                users.append(f"pid {proc.pid} ({' '.join(proc.info['cmdline'] or [])[:80]})")
        except (psutil.Error, OSError):
            continue
    if not users:
        return None
    return (f"{db} is in use by {', '.join(users[:3])}: a second server on the same database answers 'database is "
            f"locked' while they write; wait for them to end, or give this one its own home: PREFECT_HOME=DIR a2rl "
            f"server start --port N")


def read_state(name: str, home: Path | None = None) -> ManagedProcess | None:
    path = (home or prefect_home()) / name
    try:
        return ManagedProcess.model_validate_json(path.read_text())
    except (OSError, ValueError):  # a missing, torn or foreign state file: no process of ours
        return None


def _write_state(proc: ManagedProcess, state: str, home: Path) -> None:
    (home / state).write_text(proc.model_dump_json(indent=1))


def resolve_api_url(home: Path | None = None) -> str | None:
    """PREFECT_API_URL if set, else the URL of the server `a2rl server start` left running."""
    if url := os.environ.get("PREFECT_API_URL"):
        return url
    server = read_state(SERVER_STATE, home)
    return server.url if server and server.alive() else None


def prefect_env(api_url: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **QUIET_ENV, **(extra or {})}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def prefect_cli(*args: str, api_url: str | None = None, cwd: Path | None = None, timeout_s: float = 300,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `prefect --no-prompt ARGS` with this interpreter; raise OpsError with its output on failure."""
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", *args]
    out = subprocess.run(cmd, cwd=cwd, env=prefect_env(api_url), capture_output=True, text=True, timeout=timeout_s)
    if check and out.returncode != 0:
        raise OpsError(f"`prefect {' '.join(args)}` failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


# ---- server ------------------------------------------------------------------------------------------


def server_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    with prefect_api.client(api_url, timeout_s) as c:
        return c.api_healthcheck() is None


def database_problem(api_url: str, timeout_s: float = 10.0) -> str | None:
    """Why the server's database does not answer (None when it does). `/health` answers without touching the
    database; `/ready` connects to it, and reading the flow runs' count runs a real query."""
    with prefect_api.client(api_url, timeout_s) as c:
        try:
            c.request("GET", "/ready")  # the client has no method for this route: through its own session
        except httpx.HTTPStatusError as e:
            if e.response.status_code != 404:  # an older server has no /ready
                return f"GET /ready answered HTTP {e.response.status_code}"
        except httpx.HTTPError as e:
            return f"{type(e).__name__} after {timeout_s:.0f} s"
        try:
            c.count_flow_runs()
        except httpx.HTTPStatusError as e:
            return f"POST /flow_runs/count answered HTTP {e.response.status_code}"
        except httpx.HTTPError as e:
            return f"{type(e).__name__} after {timeout_s:.0f} s"
    return None


DATABASE_ENV = "PREFECT_SERVER_DATABASE_CONNECTION_URL"


def start_server(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, home: Path | None = None,
                 env: dict[str, str] | None = None, timeout_s: float = 120,
                 database: str | None = None) -> ManagedProcess:
    """Start `prefect server start` on host:port in its own session; wait until /api/health answers.

    Its logs live under `home` (PREFECT_HOME), and so does its SQLite database unless `database` (or
    PREFECT_SERVER_DATABASE_CONNECTION_URL) names another, e.g. `postgresql+asyncpg://user:pw@db:5432/prefect`
    for several hosts' workers; `env` adds server settings. Returns the running server if one we started is
    already up.
    """
    if database:
        env = {**(env or {}), DATABASE_ENV: database}
    home = home or prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    url = api_url_of(host, port)
    if (running := read_state(SERVER_STATE, home)) and running.alive():
        if running.url != url:
            raise OpsError(f"a server started by a2rl already runs on {running.url} with PREFECT_HOME={home}; "
                           f"use it, or stop it first (`a2rl server stop`) to start one on {url}")
        return running
    if server_healthy(url):
        raise OpsError(f"another Prefect server already answers on {url}; stop it or pick another --port")
    if reason := _port_taken(host, port):
        raise OpsError(f"port {port} on {host} is in use by another program ({reason}); pick another --port")
    if (other := _background_server_pid(home)) is not None:
        raise OpsError(f"a Prefect server started with `prefect server start --background` (pid {other}) uses "
                       f"PREFECT_HOME={home}; stop it (`prefect server stop`) or set another PREFECT_HOME")
    log = home / "a2rl-server.log"
    # Prefect's server with a2rl's crash-report rule (a late Crashed never undoes a Retry):
    # a2rl_bench.ops.crash_reports.
    cmd = [sys.executable, "-m", "a2rl_bench.ops.crash_reports", "server", "start", "--host", host, "--port", str(port),
           "--analytics-off"]  # fmt: skip
    # Leases of the GPU slots on disk, so a restarted server still knows (and can expire) them.
    server_env = prefect_env(None, {"PREFECT_HOME": str(home), LEASE_STORAGE_ENV: LEASE_STORAGE,
                                    **ui_env(host, port), **(env or {})})  # fmt: skip
    server_env.pop("PREFECT_API_URL", None)  # the server must not try to talk to another API
    proc = _spawn(cmd, server_env, log)
    server = ManagedProcess(name="server", pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(), log=str(log),
                            url=url)  # fmt: skip
    _write_state(server, SERVER_STATE, home)
    deadline = time.monotonic() + timeout_s
    while not server_healthy(url):
        if proc.poll() is not None:
            (home / SERVER_STATE).unlink(missing_ok=True)
            raise OpsError(f"the Prefect server exited with code {proc.returncode} ({_last_error(log)}); see {log}")
        if time.monotonic() > deadline:
            stop_server(home)
            raise OpsError(f"the Prefect server did not answer on {url} within {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)
    return server


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def ui_env(host: str, port: int) -> dict[str, str]:
    """The settings that make the server's UI talk to this server's API: without them `/ui-settings` names the
    default port (4200) and the UI on any other port cannot reach its API. A wildcard host is served to the
    browser as this machine's address on its network (a host name may not resolve where the browser is)."""
    ui_host = reachable_address() if host in WILDCARD_HOSTS else host
    return {"PREFECT_SERVER_API_HOST": host, "PREFECT_SERVER_API_PORT": str(port),
            "PREFECT_UI_API_URL": api_url_of(ui_host, port)}  # fmt: skip


def database_label(url: str | None) -> str:
    """The server's database for a message, without its password: `postgresql on db:5432/prefect`, or SQLite."""
    if not url:
        return "SQLite under PREFECT_HOME"
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    kind = parts.scheme.split("+")[0]
    return f"{kind} {parts.path}" if kind == "sqlite" else f"{kind} on {parts.hostname}:{parts.port or 5432}{parts.path}"


def _port_taken(host: str, port: int) -> str | None:
    """Why `port` cannot be listened on (None when it can). With SO_REUSEADDR, as the server itself binds: the
    connections a stopped or killed server left in TIME_WAIT do not count, only a program listening on it."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def _background_server_pid(home: Path) -> int | None:
    """The pid of a live `prefect server start --background` server of this PREFECT_HOME, if any."""
    try:
        pid = int((home / "server.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        return pid if "server" in " ".join(psutil.Process(pid).cmdline()) else None  # not a reused pid
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _last_error(log: Path) -> str:
    """The line of a log that says what went wrong (its last error line), for a one-line message."""
    lines = [line.strip() for line in _tail(log, 200).splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def stop_server(home: Path | None = None, timeout_s: float = 30) -> bool:
    """Stop the server we started (one SIGTERM is enough for it), and a `prefect server start --background`
    one left in the same PREFECT_HOME. Returns whether anything was running."""
    home = home or prefect_home()
    stopped = False
    if server := read_state(SERVER_STATE, home):
        stopped = server.alive()
        _stop_group(server, term_signals=1, timeout_s=timeout_s)
        (home / SERVER_STATE).unlink(missing_ok=True)
    if (home / "server.pid").exists():  # started with `prefect server start --background`
        prefect_cli("server", "stop", check=False, timeout_s=60)
        stopped = True
    return stopped


# ---- worker ------------------------------------------------------------------------------------------


def ensure_work_pool(api_url: str, pool: str = DEFAULT_POOL, pool_type: str = "process") -> bool:
    """Create the work pool unless it exists. Returns whether it was created."""
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url) as c:
        try:
            c.read_work_pool(pool)
            return False
        except (ObjectNotFound, httpx.HTTPStatusError):
            pass
    # Through the CLI: it fills in the worker type's default job template.
    prefect_cli("work-pool", "create", pool, "--type", pool_type, api_url=api_url, timeout_s=120)
    return True


def start_worker(api_url: str, pool: str = DEFAULT_POOL, home: Path | None = None, queues: tuple[str, ...] = (),
                 limit: int | None = None, env: dict[str, str] | None = None,
                 timeout_s: float = 60, run_limit: int | None = None, cwd: Path | None = None,
                 plain: bool = False) -> ManagedProcess:
    """Start a process worker on `pool` (created if missing) in its own session; wait until it polls.

    `queues` restricts it to some work queues (default: all of the pool's); `limit` caps concurrent flow
    runs of this worker, sweeps included (a sweep waiting for its runs then holds a place they need: prefer
    `run_limit`, which caps the pool's `default` queue, where benchmark runs go); `env` is added to the
    worker's environment, which its flow runs inherit; `cwd` is its working directory (default: the repository);
    `plain`: Prefect's `prefect worker start` as is, as other hosts run it (docs/scale-out.md §5).
    """
    home = home or prefect_home()
    if (running := read_state(WORKER_STATE, home)) and running.alive():
        return running
    ensure_work_pool(api_url, pool)
    log = home / "a2rl-worker.log"
    # Prefect's process worker that reports crashes of current attempts only (a2rl_bench.ops.crash_reports).
    entry = ["prefect"] if plain else ["a2rl_bench.ops.crash_reports"]
    cmd = [sys.executable, "-m", *entry, "worker", "start", "--pool", pool, "--type", "process",
           "--install-policy", "never"]  # fmt: skip
    for q in queues:
        cmd += ["--work-queue", q]
    if limit:
        cmd += ["--limit", str(limit)]
    if run_limit:  # on the runs' queue only: a sweep (queue `sweeps`) never takes a place its runs need
        set_queue_limit(api_url, pool, RUNS_QUEUE, run_limit)
    proc = _spawn(cmd, prefect_env(api_url, {"PREFECT_HOME": str(home), **(env or {})}), log, cwd=cwd)
    worker = ManagedProcess(name="worker", pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(), log=str(log),
                            url=api_url, pool=pool)  # fmt: skip
    _write_state(worker, WORKER_STATE, home)
    deadline = time.monotonic() + timeout_s
    while not _worker_polling(api_url, pool, since=worker.create_time):
        if proc.poll() is not None:
            (home / WORKER_STATE).unlink(missing_ok=True)
            raise OpsError(f"the worker exited with code {proc.returncode}; see {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise OpsError(f"the worker did not poll pool {pool!r} within {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)
    return worker


def set_queue_limit(api_url: str, pool: str, queue: str, limit: int | None) -> None:
    """Most flow runs of `queue` in `pool` running at once, across all workers (None: no limit)."""
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url) as c:
        try:
            found = c.read_work_queue_by_name(queue, work_pool_name=pool)
        except ObjectNotFound:
            c.create_work_queue(queue, concurrency_limit=limit, work_pool_name=pool)
            return
        c.update_work_queue(found.id, concurrency_limit=limit)


FLOW_RUN_GRACE_S = 120.0
"""How long a flow run may take, after SIGTERM, to record itself `interrupted` with its report."""


def stop_worker(home: Path | None = None, timeout_s: float = 30, flow_run_grace_s: float = FLOW_RUN_GRACE_S) -> bool:
    """Stop the worker. Its flow runs go first, one SIGTERM each, while the worker and the server are still up:
    each records its run `interrupted` with a report and ends Cancelled in Prefect, which a Retry resumes.
    Then the worker, which ignores the first SIGTERM (it only asks its loop to stop) and forwards a second one
    to its runs as SIGKILL, gets two; whatever is left (SIGTERM, then SIGKILL) goes with it."""
    home = home or prefect_home()
    worker = read_state(WORKER_STATE, home)
    if worker is None:
        return False
    alive = worker.alive()
    if alive:
        interrupt_flow_runs(worker, flow_run_grace_s)
    _stop_group(worker, term_signals=2, timeout_s=timeout_s)
    (home / WORKER_STATE).unlink(missing_ok=True)
    return alive


def interrupt_flow_runs(worker: ManagedProcess, grace_s: float) -> list[int]:
    """SIGTERM the worker's flow-run processes (its children) and wait up to `grace_s` for them to end.
    Returns their pids."""
    try:
        runs = psutil.Process(worker.pid).children(recursive=False)
    except psutil.NoSuchProcess:
        return []
    pids = [p.pid for p in runs]
    procs.signal_pids(pids, signal.SIGTERM)
    procs.wait_gone(pids, grace_s)
    return pids


def _worker_polling(api_url: str, pool: str, since: float) -> bool:
    try:
        with prefect_api.client(api_url, timeout_s=5) as c:
            workers = c.read_workers_for_work_pool(pool, limit=50)
    except httpx.HTTPError:
        return False
    return any(w.last_heartbeat_time is not None and w.last_heartbeat_time.timestamp() >= since - 1 for w in workers)


# ---- deployments and runs ----------------------------------------------------------------------------


def deploy(api_url: str, names: list[str] | None = None, root: Path = REPO_ROOT,
           pool: str = DEFAULT_POOL) -> str:
    """`prefect --no-prompt deploy --all` (or `-n NAME` each) from the repository root, pool created first.

    The deployments then run flows from `root` (prefect.yaml has no pull section). Returns the CLI output.
    """
    ensure_work_pool(api_url, pool)
    targets = [a for n in names for a in ("-n", n)] if names else ["--all"]
    out = prefect_cli("deploy", *targets, api_url=api_url, cwd=root, timeout_s=600)
    return out.stdout


def deployment_exists(api_url: str, name: str) -> bool:
    """Whether `flow/deployment` is registered on the server."""
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url) as c:
        try:
            c.read_deployment_by_name(name)
        except ObjectNotFound:
            return False
    return True


def recent_flow_runs(api_url: str, limit: int = 10, scheduled: bool = False) -> list[dict[str, Any]]:
    """The latest flow runs that are not waiting for their time (newest first); with `scheduled`, the next
    scheduled ones instead (soonest first)."""
    states = {"type": {"any_": ["SCHEDULED"]} if scheduled else {"not_any_": ["SCHEDULED"]}}
    sort = "EXPECTED_START_TIME_ASC" if scheduled else "EXPECTED_START_TIME_DESC"
    return prefect_api.read_flow_runs(api_url, {"state": states}, limit, sort=sort)


RETRYABLE = {"CRASHED", "FAILED", "CANCELLED"}


def retry_flow_run(api_url: str, flow_run_id: str, settle_s: float = 0.0, verify_s: float = 10.0,
                   timeout_s: float = 120.0, poll_s: float = 1.0) -> str:
    """What the UI's Retry button does (the run to Scheduled/AwaitingRetry; a worker re-runs it with the same id
    and parameters), made to take:

    * a completed run is refused (its results stand; a retry could only rewrite its timings);
    * a run that reads Running or Pending while its process is gone or stopped (the worker's host died, the
      harness froze; this machine's run directory tells) is first marked Crashed, as the UI's "Change state"
      would; any other Running run is refused;
    * with `settle_s`, it waits until the run's state has not changed for that long (only useful against a
      server and worker without a2rl's crash-report guards, a2rl_bench.ops.crash_reports: there a late report of the
      crash can still overwrite a retry);
    * it then checks for `verify_s` that the run stays Scheduled/Pending/Running (or ends), and presses again
      if a late crash report undid it. Returns the state name the run was left in."""
    deadline = time.monotonic() + timeout_s
    run = _read_flow_run(api_url, flow_run_id)
    state = (run.get("state") or {}).get("type")
    if state == "COMPLETED":
        raise OpsError(f"flow run {run['name']} completed: a retry is refused (its results and timings stand); "
                       "start a new run of the deployment to repeat it")  # fmt: skip
    if state in ("RUNNING", "PENDING") and (why := _process_gone(api_url, run)):
        _set_state(api_url, flow_run_id, {"type": "CRASHED", "name": "Crashed", "message": f"a2rl retry: {why}"})
        state = "CRASHED"
    if state not in RETRYABLE:
        raise OpsError(f"flow run {run['name']} is {run.get('state_name')}: only a crashed, failed or cancelled run "
                       "can be retried (a run whose process is gone but still reads Running: mark it crashed first)")
    while True:
        run = _settled(api_url, flow_run_id, settle_s, deadline, poll_s)
        if (run.get("state") or {}).get("type") not in RETRYABLE:  # someone else retried it meanwhile
            return run.get("state_name") or "?"
        _set_state(api_url, flow_run_id, {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry (a2rl)"})
        if (after := _holds(api_url, flow_run_id, verify_s, poll_s, run.get("run_count", 0))) is not None:
            return after
        if time.monotonic() > deadline:
            raise OpsError(f"flow run {flow_run_id}: the retry was overwritten by crash reports for {timeout_s:.0f} s; "
                           "is its worker still reporting on it? (`a2rl status`)")  # fmt: skip


def _process_gone(api_url: str, run: dict[str, Any]) -> str | None:
    """Why a Running/Pending flow run is not running any more (its process gone or stopped, from its run
    directory on this machine), or None when it is, or we cannot tell."""
    from a2rl_bench.ops import status

    row = status.flow_run_rows(api_url, [run])[0]
    process = status.run_process(status.harness_dir_of(row))
    if process is None or process[1] == "alive":
        return None
    return f"its process {process[0]} is {process[1]}"


def _read_flow_run(api_url: str, flow_run_id: str) -> dict[str, Any]:
    from prefect.exceptions import ObjectNotFound

    with prefect_api.client(api_url) as c:
        try:
            return prefect_api.flow_runs_json([c.read_flow_run(flow_run_id)])[0]
        except ObjectNotFound:
            raise OpsError(f"no flow run {flow_run_id} on {api_url}") from None


def _set_state(api_url: str, flow_run_id: str, state: dict[str, Any]) -> None:
    """Forced, as the UI's "Change state" and Retry are; `state` as the API's JSON (type, name, message), which
    the client's State model fills in as the server would (a Scheduled one is due now)."""
    from prefect.client.schemas.objects import State

    with prefect_api.client(api_url) as c:
        c.set_flow_run_state(flow_run_id, State.model_validate(state), force=True)


def _settled(api_url: str, flow_run_id: str, settle_s: float, deadline: float, poll_s: float) -> dict[str, Any]:
    """The flow run once its state is at least `settle_s` old (or at the deadline)."""
    from datetime import datetime, timezone

    while True:
        run = _read_flow_run(api_url, flow_run_id)
        stamp = (run.get("state") or {}).get("timestamp")
        age = (datetime.now(timezone.utc) - datetime.fromisoformat(stamp)).total_seconds() if stamp else settle_s
        if age >= settle_s or time.monotonic() > deadline:
            return run
        time.sleep(min(poll_s, settle_s - age))


def _holds(api_url: str, flow_run_id: str, verify_s: float, poll_s: float, run_count: int) -> str | None:
    """The run's state name if the retry held for `verify_s`, else None: Crashed/Failed/Cancelled again before
    the run started once more (its run count unchanged) is a late report of the old crash, not a new outcome."""
    end = time.monotonic() + verify_s
    while True:
        run = _read_flow_run(api_url, flow_run_id)
        if (run.get("state") or {}).get("type") in RETRYABLE:
            return run.get("state_name") if run.get("run_count", 0) > run_count else None
        if time.monotonic() >= end:
            return run.get("state_name") or "?"
        time.sleep(poll_s)


# ---- processes ---------------------------------------------------------------------------------------


def _spawn(cmd: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    """Start `cmd` as the leader of a new session (so its whole group can be stopped), output to `log`. It
    outlives this command (`a2rl server start` returns), so it gets no parent-death signal."""
    with log.open("ab") as out:
        return procs.start(cmd, group="session", die_with_parent=False, env=env, stdout=out,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd or REPO_ROOT)  # fmt: skip


def _stop_group(proc: ManagedProcess, term_signals: int, timeout_s: float) -> None:
    """SIGTERM the leader `term_signals` times, then SIGTERM and finally SIGKILL whatever is left of its process
    group and descendants (flow runs, their agents): a2rl_bench.isolation.procs.stop_tree."""
    procs.stop_tree(proc.pid, proc.create_time, term_signals=term_signals, timeout_s=timeout_s)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def server_flow_run_lookup() -> Callable[[list[str]], dict[str, Any]] | None:
    """What `merge_stores(flow_runs=...)` asks to tell `running` attempts that are over: the Prefect server at
    PREFECT_API_URL (or the local one); None where there is none."""
    from a2rl_bench.ops.status import flow_run_states

    url = resolve_api_url()
    return (lambda ids: flow_run_states(url, ids)) if url else None
