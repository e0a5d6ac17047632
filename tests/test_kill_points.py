"""Kill points × retries (#29.6): a run killed anywhere comes back with one Retry, whenever it is pressed.

The matrix: ten kill points — the flow-run process SIGKILLed in provision, during a baseline evaluation, at
the start of the agent session, mid-training, during a grading call, during the final evaluation and in the
summary; the harness frozen (SIGSTOP) mid-session; the server SIGKILLed and restarted; the worker's whole tree
SIGKILLed and a new worker started — times six ways to retry: the UI's own API call (`POST set_state`
AwaitingRetry, as the V1 UI sends it, or forced, as the V2 UI does) 0, 1, 3, 10 and 20 s after the kill, and
`a2rl retry`. A run that nothing reports as crashed (frozen, cut off, lost with its worker) is first marked
crashed as an operator does in the UI ("Change state"), or by `a2rl retry` itself where its process is gone.

Every cell must end with: the Retry taking at once (the next attempt starts: a new entry in attempts.json, its
flow run Running), nothing of an earlier attempt left running once the next one is past its first step (the
killed harness, its agent, its evaluations, anything tagged with an earlier attempt), the agent's clock at the
resumed session within a second of the truth (measured here, from the ledger's clock readings and the moment
the earlier attempt's agent ended), and at the end one completed run: one row, every submission queued once,
the ledger's hash chain intact, its Prefect state Completed and no Crashed after any Retry.

Cost, kept down by parametrizing smartly: one server for the module; cells chained, several per run (a run
passes through provision, its session and its summary on every attempt, so one run takes many kills), three
runs side by side; each kill point of a run is hit twice with two different retries, and each global one
strikes all three runs at once. 60 cells on 6 runs: 27 min on the 2-core machine shared with other jobs (load
average 13-19; BENCHMARKS.md), most of it flow-run processes starting; that is `A2RL_KILL_MATRIX=full`. In the
suite, every kill point once and every retry in turn (14 cells). Deselect with `-m "not prefect_server"`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from a2rl_bench.grading.ledger import read_ledger
from a2rl_bench.isolation import procs
from a2rl_bench.ops import prefect_local
from a2rl_bench.run_options import nest_parameters
from live_server import SMALL_AGENT, LiveServer, flow_run, kill_worker_host, live_server, set_state
import prefect_http

pytestmark = pytest.mark.prefect_server

RETRIES = ("ui@0", "ui@1", "ui@3", "ui@10", "ui@20", "a2rl retry")
# Kill points of one run, in the order a run meets them; each is hit twice per chain (two attempts).
RUN_KILLS = ("provision", "baseline", "session", "mid_training", "frozen_harness", "grading_call",
             "final_evaluation", "summary")  # fmt: skip
GLOBAL_KILLS = ("worker_tree", "server_kill")
CHAINS = 3
CLOCK_TOLERANCE_S = 1.0
DIES_WITH_S = 5.0
"""A harness SIGKILLed takes its agent and its evaluations with it within this long."""
COMPLETED_POLL_S = 1.0
"""How often a wait for a kill point asks the server whether the run completed on its own (a guard: the kill points
themselves are watched in the run's files and /proc every 50 ms)."""
ATTEMPT_ENV = "A2RL_RUN_ATTEMPT"
"""The tag every process of an attempt carries (a2rl_bench.isolation.procs.ATTEMPT_ENV). The checks here read only what
any version of the harness leaves (its progress file, process records and ledger, /proc and Prefect), so that
the matrix runs, and fails, on code from before #29 too."""


FULL_MATRIX = os.environ.get("A2RL_KILL_MATRIX") == "full"
"""`A2RL_KILL_MATRIX=full`: all 60 cells (29 min on the loaded 2-core machine; BENCHMARKS.md). By default, in the
suite, every kill point is hit once and every way to retry is used (14 cells, about a quarter of the time):
the suite has to fit CI's time on a busy machine, the full matrix is run before changing retries."""
SUBMISSION_CAP = 2 if FULL_MATRIX else 1
"""Submissions that end a run's session. The quick matrix kills each attempt in its first round at the latest (the
in-session kill points strike while it trains or grades its first submission), so a second round only added time
before the later kill points and the run's end; the full one, each kill point twice in a row, keeps two."""
GLOBAL_SUBMISSION_CAP = len(GLOBAL_KILLS)
"""The global matrix's cap: every run must still be in its session at the second kill. With one submission, a run
the first kill struck after it had submitted ended its resumed session at once and completed while the test waited
for the other runs to be back in theirs (seen once, on a fast machine)."""


def schedule(chain: int, kills: tuple[str, ...], full: bool = True) -> list[tuple[str, str]]:
    """Full: each kill point twice in a row, and over the chains every kill point meets every retry exactly
    once. Quick: a run's kill points are shared out over the chains (a global one strikes every chain at once),
    the retries in turn."""
    if full:
        return [(kill, RETRIES[(2 * chain + j + k) % len(RETRIES)]) for k, kill in enumerate(kills) for j in (0, 1)]
    if set(kills) <= set(GLOBAL_KILLS):
        # The UI can press nothing before the killed server is back (~25 s on the 2-core machine), so the long delays
        # go to the server kill, where they cost no wait of their own, and the short ones to the worker tree's.
        return [(kill, RETRIES[(CHAINS * k + chain) % len(RETRIES)]) for k, kill in enumerate(kills)]
    return [(kill, RETRIES[k % len(RETRIES)]) for k, kill in enumerate(kills) if k % CHAINS == chain]


def test_the_schedule_covers_every_cell_once_and_the_quick_one_every_kill_and_retry():
    for kills in (RUN_KILLS, GLOBAL_KILLS):
        cells = [cell for c in range(CHAINS) for cell in schedule(c, kills)]
        assert sorted(cells) == sorted((k, r) for k in kills for r in RETRIES)
        quick = [cell for c in range(CHAINS) for cell in schedule(c, kills, full=False)]
        assert {k for k, _ in quick} == set(kills) and {r for _, r in quick} == set(RETRIES)
        assert len(quick) == (len(kills) if kills == RUN_KILLS else CHAINS * len(kills))


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("prefect-server")) as server:
        os.environ["PREFECT_API_URL"] = server.url  # `a2rl retry` in this process finds it
        try:
            yield server
        finally:
            os.environ.pop("PREFECT_API_URL", None)


def test_the_server_aborts_a_late_crash_report_for_a_scheduled_run_and_the_worker_drops_stale_ones(live):
    """The two guards (a2rl_bench.ops.crash_reports), on the module's server: a Crashed report that is not forced, for a
    run a Retry has scheduled, is aborted (a forced change still goes through); and the worker's check tells a
    report for the attempt it launched from one the run has left behind."""
    import asyncio

    from prefect.client.orchestration import get_client

    from a2rl_bench.ops.crash_reports import superseded

    # A deployment on a pool no worker polls: its runs stay where these states put them.
    prefect_http.post(f"{live.url}/work_pools/", json={"name": "nobody", "type": "process"}).raise_for_status()
    flow = prefect_http.post(f"{live.url}/flows/", json={"name": "guarded"}).json()
    deployment = prefect_http.post(f"{live.url}/deployments/", json={
        "name": "guarded", "flow_id": flow["id"], "work_pool_name": "nobody"}).json()  # fmt: skip
    run = prefect_http.post(f"{live.url}/deployments/{deployment['id']}/create_flow_run", json={}).json()
    crashed = {"type": "CRASHED", "name": "Crashed", "message": "Process exited with status code: -9"}

    async def launched_then(*states: dict) -> str | None:
        """Pick the run up as a worker does (Scheduled), go through `states`, then ask the worker's check."""
        async with get_client() as client:
            snapshot = await client.read_flow_run(run["id"])
            for state in states:
                set_state(live.url, run["id"], state)
            return await superseded(client, snapshot)

    set_state(live.url, run["id"], {"type": "SCHEDULED", "name": "Scheduled"})
    current = asyncio.run(launched_then({"type": "PENDING", "name": "Pending"}, {"type": "RUNNING", "name": "Running"}))
    assert current is None  # its own attempt: the report goes out
    retried = asyncio.run(launched_then(crashed, {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry"},
                                        {"type": "PENDING", "name": "Pending"}, {"type": "RUNNING", "name": "Running"}))
    assert retried and retried.startswith("the run was rescheduled (AwaitingRetry")  # a later attempt's run
    set_state(live.url, run["id"], {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"})
    late = set_state(live.url, run["id"], crashed, force=False)
    assert late["status"] == "ABORT" and "a crash report for its earlier attempt is not applied" in late["details"]["reason"]
    assert flow_run(live.url, run["id"])["state_name"] == "AwaitingRetry"
    assert set_state(live.url, run["id"], crashed, force=True)["status"] == "ACCEPT"  # an operator's change


@dataclass
class Cell:
    chain: int
    kill: str
    retry: str
    attempt: int
    """The attempt that was killed."""
    killed_at: float = 0.0
    phase: str = ""
    """The phase the killed attempt was in."""
    pressed_after_s: float | None = None
    took_after_s: float | None = None
    """From the kill to the next attempt's start."""
    state_at_press: str = ""
    clock_error_s: float | None = None
    left_running: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    HEADER = ("| kill point | retry | run/attempt | phase at kill | state at press | pressed after | next attempt "
              "after | clock error | left running | outcome |\n|---|---|---|---|---|---|---|---|---|---|")

    def row(self) -> str:
        def secs(v: float | None, fmt: str = ".1f") -> str:
            return "-" if v is None else f"{v:{fmt}} s"

        return (f"| {self.kill} | {self.retry} | {self.chain}/{self.attempt} | {self.phase} | {self.state_at_press} | "
                f"{secs(self.pressed_after_s)} | {secs(self.took_after_s)} | {secs(self.clock_error_s, '+.2f')} | "
                f"{len(self.left_running)} | {'; '.join(self.problems) or 'ok'} |")


class Run:
    """One benchmark run through the deployment, killed and retried as its schedule says."""

    def __init__(self, live: LiveServer, tiny: Path, root: Path, name: str, budget_s: float, agent_env: dict,
                 max_submissions: int = SUBMISSION_CAP):  # fmt: skip
        from prefect.deployments import run_deployment

        self.live, self.root, self.name = live, root, name
        root.mkdir(parents=True)
        self.params = dict(base_model=str(tiny), budget_s=budget_s, results=str(root / "results.duckdb"),
                           runs_dir=str(root / "runs"), val_limit=2, test_limit=2, grace_s=3,
                           max_submissions=max_submissions)  # fmt: skip
        env = {**SMALL_AGENT, **agent_env, "A2RL_HOME": str(root / "a2rl-home")}  # its own evaluation cache
        self.fr = run_deployment("benchmark-run/benchmark-run", parameters=nest_parameters(self.params),
                                 job_variables={"env": env}, timeout=0, flow_run_name=name)  # fmt: skip
        self.id = str(self.fr.id)
        self.cells: list[Cell] = []
        self.clock_truth: float | None = None  # the agent's clock the next resumed session must start from
        self.truth_cell: Cell | None = None
        self.index, self.ui_forces = 0, False
        self.pids: list[int] = []
        self.ended_at = 0.0  # epoch of its flow run's ending: which chain the matrix's time waits on
        self._completed, self._completed_asked = False, -COMPLETED_POLL_S

    # -- what the run is doing ---------------------------------------------------------------------------
    @property
    def harness(self) -> Path | None:
        return next(iter((self.root / "runs").glob(f"*-{self.fr.id.hex[:8]}/harness")), None)

    @property
    def run_id(self) -> str:
        return self.harness.parent.name

    def attempt(self) -> tuple[int, int] | None:
        """(number, harness pid) of the latest attempt: the process its progress file names, numbered in the
        order they appeared."""
        try:
            pid = int(json.loads((self.harness / "progress.json").read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if pid not in self.pids:
            self.pids.append(pid)
        return self.pids.index(pid) + 1, pid

    def phase(self) -> str | None:
        try:
            return json.loads((self.harness / "progress.json").read_text())["phase"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def ledger(self) -> list:
        try:
            return read_ledger(self.harness / "ledger.jsonl")
        except Exception:  # a line being written: the next look sees it whole
            return []

    def evaluating(self, pid: int) -> bool:
        return bool(self.evaluations(pid))

    def training(self) -> bool:
        ws = str(self.harness.parent / "workspace")
        return any("train_sft.py" in (c := " ".join(cmdline(p.pid))) and ws in c for p in procs.all_procs())

    def agent_pids(self) -> list[int]:
        from a2rl_bench.capture.resources import workspace_pids

        return workspace_pids(self.harness.parent / "workspace")()

    def state(self) -> dict:
        return flow_run(self.live.url, self.id)

    def completed(self) -> bool:
        """Whether the flow run reads Completed, asked of the server at most every COMPLETED_POLL_S: the waits for
        a kill point poll 20 times a second, on three runs at once."""
        if time.monotonic() - self._completed_asked >= COMPLETED_POLL_S:
            self._completed_asked = time.monotonic()
            self._completed = self.state()["state_type"] == "COMPLETED"
        return self._completed

    # -- kill points ---------------------------------------------------------------------------------------
    def evaluations(self, pid: int) -> list[int]:
        """The evaluation processes below the harness `pid` (and their supervisors)."""
        found = set()
        for p in procs.descendants(pid):
            if "a2rl_bench.inference.evaluation" in " ".join(cmdline(p)) and (st := procs.proc_stat(p)) is not None:
                found |= {p, st.ppid}  # the evaluation and its supervisor (gone already: not counted)
        return sorted(found - {pid})

    def reached(self, kill: str, started: float, pid: int) -> bool:
        """Whether the current attempt (started at `started`, harness `pid`) is where `kill` strikes."""
        phase = self.phase()

        def in_session() -> bool:
            return phase == "agent_session" and any(
                e.kind == "event" and e.detail.get("event") in ("session-start", "session-resumed")
                and e.at.timestamp() >= started for e in self.ledger()
            )  # fmt: skip

        # Only the asked kill point's probe runs: each /proc scan or ledger read, 20 times a second on three
        # runs, was the test process's busiest work.
        return {
            "provision": lambda: phase == "provision",
            "baseline": lambda: phase == "baseline" and self.evaluating(pid),
            "session": in_session,
            "mid_training": lambda: in_session() and self.training(),
            "frozen_harness": lambda: in_session() and self.training(),
            "grading_call": lambda: in_session() and self.evaluating(pid),
            "final_evaluation": lambda: phase == "final_grading" and self.evaluating(pid),
            "summary": lambda: phase == "summary",
        }[kill]()


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def until(probe: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# -- the clock's truth ---------------------------------------------------------------------------------------
def clock_truth(entries: list, since: float, agent_start: float | None, agent_end: float) -> float | None:
    """The agent's clock when the attempt that started at `since` (epoch) ended its agent at `agent_end`, from
    the moment its agent process started (`agent_start`, None: it never did) and the ledger's readings of that
    attempt: the session (re)start (`already_used_s`), each submission's arrival (`agent_elapsed_s`, after which
    the clock pauses while it is graded) and each grade (the clock runs again). None when the attempt's session
    never started."""
    value = at = None
    paused = False
    for e in entries:
        t = e.at.timestamp() if isinstance(e.at, datetime) else float(e.at)
        if t < since:
            continue
        event = e.detail.get("event") if e.kind == "event" else None
        if event in ("session-start", "session-resumed"):
            value = float(e.detail.get("already_used_s") or 0.0)
            if agent_start is None:  # killed before its agent started: no time ran
                return value
            at = agent_start
        elif event == "evaluation-resumed":
            paused = True
        elif e.kind == "submission" and e.status == "queued" and e.agent_elapsed_s is not None:
            value, at, paused = e.agent_elapsed_s, t, True
        elif e.kind == "submission" and e.status in ("scored", "error") and value is not None:
            if paused:
                at = t  # the clock ran again from here, at the value it stopped at
            paused = False
    if value is None:
        return None
    return value if paused else value + max(0.0, agent_end - at)


# -- one cell -------------------------------------------------------------------------------------------------
@dataclass
class Armed:
    """A run's current attempt at the moment a kill point was reached: what the checks need afterwards."""

    number: int
    pid: int
    started: float
    agents: list[int]
    evaluations: list[int]
    phase: str | None


def arm(run: Run, kill: str) -> Armed:
    """Wait until the run's current attempt is where `kill` strikes."""
    number, pid = until(run.attempt, 300, f"{run.name}: an attempt")
    started = started_at(pid) or time.time()
    check_resumed_clock(run)
    until(lambda: run.reached(kill, started, pid) or run.completed(), 600,
          f"{run.name}: kill point {kill} in attempt {number}")
    assert run.state()["state_type"] != "COMPLETED", f"{run.name} completed before kill point {kill}"
    check_resumed_clock(run)
    return Armed(number, pid, started, run.agent_pids(), run.evaluations(pid), run.phase())


def started_at(pid: int) -> float | None:
    """When process `pid` started (epoch, to 10 ms), from its start ticks."""
    st = procs.proc_stat(pid)
    if st is None:
        return None
    uptime = float(Path("/proc/uptime").read_text().split()[0])  # to 10 ms, unlike /proc/stat's btime
    return time.time() - uptime + st.start_ticks / os.sysconf("SC_CLK_TCK")


def kill_run(kill: str, pid: int) -> float:
    """SIGSTOP or SIGKILL the run's process; a SIGKILL counts from when it has landed (the process a zombie or
    gone: on a loaded machine the kernel may take a moment to end it, which no operator's press could beat)."""
    os.kill(pid, signal.SIGSTOP if kill == "frozen_harness" else signal.SIGKILL)
    deadline = time.monotonic() + DIES_WITH_S
    while kill != "frozen_harness" and procs.proc_stat(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.005)
    return time.time()


def kill_everything(kill: str, live: LiveServer) -> float:
    """A global kill point: the server (SIGKILL, then started again at once on its port: the UI needs it to
    press anything) or the worker's whole tree (SIGKILL; the new worker comes while the retries are pressed)."""
    at = time.time()
    if kill == "server_kill":
        server = prefect_local.read_state(prefect_local.SERVER_STATE, live.home)
        doomed = family_of(server.pid)
        for p in doomed:
            p.kill()
        psutil.wait_procs(doomed, timeout=10)
        live.start_server()  # at once: the port a killed server held is free to listen on
    else:
        kill_worker_host(live.home)
    return at


def follow(run: Run, cell: Cell, armed: Armed) -> None:
    """After the kill: press the retry as `cell.retry` says, check that the next attempt starts once and that
    nothing of the killed one runs once it is past its first step, and note what the agent's clock should be."""
    agent_end = watch_agent_gone(run, armed, cell.killed_at)
    harness_end = watch_gone([armed.pid], cell.killed_at)  # a frozen or cut-off harness ends only at the retry
    children_end = watch_gone(armed.agents + armed.evaluations, cell.killed_at)
    if not press(run, cell):
        return
    nxt = until(lambda: (a := run.attempt()) and a[1] != armed.pid and a, 420,
                f"{run.name}: the attempt after {armed.number}")  # fmt: skip
    cell.took_after_s = time.time() - cell.killed_at
    until(lambda: (run.phase() not in (None, "open", "preflight") and run.attempt()[1] == nxt[1])
          or run.completed(), 300, f"{run.name}: attempt {nxt[0]} past preflight")
    if cell.kill not in ("frozen_harness", "server_kill") and (late := children_end() - cell.killed_at) > DIES_WITH_S:
        cell.problems.append(f"its agent or evaluations outlived the killed harness by {late:.0f} s")
    earlier = [armed.pid, *armed.agents, *armed.evaluations, *tagged(run.run_id, nxt[1])]
    cell.left_running = sorted({p for p in earlier if procs.alive(p)})
    if cell.left_running:
        cell.problems.append(f"left running: {cell.left_running} ({', '.join(' '.join(cmdline(p))[:60] for p in cell.left_running)})")
    # What the killed attempt wrote, to its end (a harness cut off from the server went on grading meanwhile).
    ended = harness_end()
    written = [e for e in run.ledger() if e.at.timestamp() < ended]
    truth = clock_truth(written, armed.started, agent_started(run, armed.pid), agent_end())
    if truth is not None:
        run.clock_truth, run.truth_cell = truth, cell


def agent_started(run: Run, harness_pid: int) -> float | None:
    """When the agent process of the attempt whose harness is `harness_pid` started (epoch, to 10 ms), from the
    run's process records: the agent's clock starts right before it."""
    records = [r for r in procs.read_records(run.harness)
               if r.harness == harness_pid and getattr(r, "kind", "agent") == "agent"]  # fmt: skip
    if not records:
        return None
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + records[0].leader_start / os.sysconf("SC_CLK_TCK")


def watch_agent_gone(run: Run, armed: Armed, killed_at: float) -> Callable[[], float]:
    """When the killed attempt's agent ended: the processes seen when the attempt was armed and the agent its
    harness records. A harness the kill left alive (the server killed) may start its agent only after it: seen in
    its session before the agent existed, it had none to watch yet."""

    def state() -> tuple[bool, bool]:
        """(an agent of the attempt is alive, one can still start: the harness lives and has started none)"""
        records = [r for r in procs.read_records(run.harness) if r.harness == armed.pid and r.kind == "agent"]
        alive = any(procs.alive(p) for p in armed.agents) or any(procs.alive(r.leader, r.leader_start) for r in records)
        return alive, not records and procs.alive(armed.pid)

    return watch_while(state, killed_at)


def watch_gone(pids: list[int], killed_at: float) -> Callable[[], float]:
    """When the last of `pids` ended (watched from now on, in a thread), or `killed_at` if none runs."""
    return watch_while(lambda: (any(procs.alive(p) for p in pids), False), killed_at)


def watch_while(state: Callable[[], tuple[bool, bool]], killed_at: float) -> Callable[[], float]:
    """When what `state` watches was last seen alive (watched from now on, in a thread, while it is alive or may
    still start: `state()` is the pair), or `killed_at` if it is not alive now and never comes."""
    if not any(state()):
        return lambda: killed_at
    ended: dict[str, float] = {}

    def watch() -> None:
        seen = False
        while any(now := state()):
            seen = seen or now[0]
            time.sleep(0.02)
        ended["at"] = time.time() if seen else killed_at

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    def when() -> float:
        thread.join(600)
        return ended.get("at", time.time())

    return when


def press(run: Run, cell: Cell) -> bool:
    """The retry, as `cell.retry` says: the UI's call d seconds after the kill, or `a2rl retry` at once. False
    when there was nothing to retry (the run completed on its own, e.g. through a server restart)."""
    from a2rl_bench.cli import main

    delay = 0.0 if cell.retry == "a2rl retry" else float(cell.retry.split("@")[1])
    time.sleep(max(0.0, cell.killed_at + delay - time.time()))
    state = run.state()["state"]
    cell.pressed_after_s, cell.state_at_press = time.time() - cell.killed_at, state["name"]
    if state["type"] == "COMPLETED":
        cell.state_at_press += " (completed on its own)"
        return False
    unreported = cell.kill in ("frozen_harness", "server_kill", "worker_tree") and state["type"] in ("RUNNING", "PENDING")
    if cell.retry == "a2rl retry":
        if cell.kill == "server_kill" and unreported:
            # Cut off from the server but alive: only an operator can tell it to start over (UI: Change state).
            set_state(run.live.url, run.id, {"type": "CRASHED", "name": "Crashed", "message": "marked by the operator"})
        assert main(["retry", run.id]) == 0, f"{run.name}: a2rl retry failed"
        return True
    if unreported:
        # The UI shows it Running; the operator marks it crashed ("Change state", forced), then presses Retry.
        set_state(run.live.url, run.id, {"type": "CRASHED", "name": "Crashed", "message": "marked by the operator"})
    # The UI's Retry: the V1 UI (served at /) proposes it; the V2 UI forces it. Chains alternate.
    answer = set_state(run.live.url, run.id, {"type": "SCHEDULED", "name": "AwaitingRetry",
                                              "message": "Retry from the UI"}, force=run.ui_forces)  # fmt: skip
    if answer["status"] != "ACCEPT":
        cell.problems.append(f"the UI's retry was answered {answer['status']}: {answer.get('details')}")
    return True


def tagged(run_id: str, current_pid: int) -> list[int]:
    """Live processes tagged with an attempt of `run_id` other than the one whose harness is `current_pid`."""
    found = []
    for p in procs.all_procs():
        try:
            environ = Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for var in environ:
            text = var.decode(errors="replace")
            if text.startswith(f"{ATTEMPT_ENV}={run_id}/") and f"/{current_pid}:" not in text:
                found.append(p.pid)
    return found


def family_of(pid: int) -> list[psutil.Process]:
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def check_resumed_clock(run: Run) -> None:
    """The session a retry resumes starts its clock where the killed attempt's agent really stopped."""
    if run.clock_truth is None:
        return
    cell = run.truth_cell
    resumed = [e for e in run.ledger() if e.kind == "event" and e.detail.get("event") == "session-resumed"
               and e.at.timestamp() > cell.killed_at]  # fmt: skip
    if not resumed:
        return
    cell.clock_error_s = float(resumed[0].detail.get("already_used_s") or 0.0) - run.clock_truth
    if abs(cell.clock_error_s) > CLOCK_TOLERANCE_S:
        cell.problems.append(f"clock off by {cell.clock_error_s:+.2f} s")
    run.clock_truth = None


def check_completed(run: Run) -> list[str]:
    """One completed run: its flow run Completed, one row, every submission queued once, the ledger intact,
    and no Crashed state after any Retry (a late report undoing one)."""
    problems = []
    final = until(lambda: (r := run.state())["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") and r,
                  600, f"{run.name} to end", poll_s=1.0)  # fmt: skip
    run.ended_at = datetime.fromisoformat(final["state"]["timestamp"]).timestamp()
    if final["state_type"] != "COMPLETED":
        problems.append(f"ended {final['state_name']}: {final['state']['message']}")
    with duckdb.connect(run.params["results"], read_only=True) as con:
        rows = con.execute("SELECT status FROM runs").fetchall()
    if rows != [("completed",)]:
        problems.append(f"rows {rows}")
    entries = read_ledger(run.harness / "ledger.jsonl")  # verifies the hash chain
    queued = [e.submission_id for e in entries if e.kind == "submission" and e.status == "queued"]
    if len(queued) != len(set(queued)):
        problems.append(f"a submission queued twice: {queued}")
    if [e.kind for e in entries].count("final") != 1:
        problems.append("not one final evaluation")
    states = prefect_http.get(f"{run.live.url}/flow_run_states/", params={"flow_run_id": run.id}).json()
    names = [s["name"] for s in sorted(states, key=lambda s: s["timestamp"])]
    for i, name in enumerate(names[:-1]):
        if name == "AwaitingRetry" and "Crashed" in names[i + 1 : i + 2]:
            problems.append(f"a Crashed report undid a Retry: ...{names[max(0, i - 2) : i + 3]}")
    return problems


def drive(run: Run, plan: list[tuple[str, str]]) -> None:
    """The kill points of one run, one after the other, each followed by its retry."""
    for kill, retry in plan:
        cell = Cell(run.index, kill, retry, 0)
        run.cells.append(cell)
        try:
            armed = arm(run, kill)
            cell.attempt, cell.phase, cell.killed_at = armed.number, armed.phase or "", kill_run(kill, armed.pid)
            follow(run, cell, armed)
        except Exception as e:  # the cell fails, saying why; the chain stops (its run is in an unknown state)
            cell.problems.append(f"{type(e).__name__}: {e}")
            return


def drive_together(runs: list[Run], plans: list[list[tuple[str, str]]], live: LiveServer) -> None:
    """Global kill points: each strikes every run at once (wherever each is), then each run is retried its
    own way, side by side."""
    for step in range(len(plans[0])):
        kill = plans[0][step][0]
        cells = [Cell(run.index, kill, plan[step][1], 0) for run, plan in zip(runs, plans)]
        for run, cell in zip(runs, cells):
            run.cells.append(cell)
        armed = [arm(run, "session") for run in runs]  # each seen in its session (an early one may move on)
        killed_at = kill_everything(kill, live)
        threads = []
        for run, cell, a in zip(runs, cells, armed):
            cell.attempt, cell.phase, cell.killed_at = a.number, a.phase or "", killed_at
            threads.append(threading.Thread(target=guarded_follow, args=(run, cell, a)))
            threads[-1].start()
        if kill == "worker_tree":
            live.start_worker()  # an operator starts a new one; a retry pressed before it waits for it
        for t in threads:
            t.join()


def guarded_follow(run: Run, cell: Cell, armed: Armed) -> None:
    try:
        follow(run, cell, armed)
    except Exception as e:  # the cell fails, saying why
        cell.problems.append(f"{type(e).__name__}: {e}")


def run_matrix(live: LiveServer, tiny: Path, tmp: Path, kills: tuple[str, ...], agent_env: dict, budget_s: float,
               report: Path) -> list[Cell]:  # fmt: skip
    together = set(kills) <= set(GLOBAL_KILLS)
    runs = []
    for c in range(CHAINS):
        run = Run(live, tiny, tmp / f"chain-{c}", f"kills-{kills[0]}-{c}", budget_s, agent_env,
                  GLOBAL_SUBMISSION_CAP if together else SUBMISSION_CAP)
        run.index, run.ui_forces = c, c % 2 == 1
        runs.append(run)
    t0, started = time.monotonic(), time.time()
    plans = [schedule(run.index, kills, FULL_MATRIX) for run in runs]
    if together:
        drive_together(runs, plans, live)
    else:
        threads = [threading.Thread(target=drive, args=(run, plan)) for run, plan in zip(runs, plans)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    endings = {run.name: check_completed(run) for run in runs}
    for run in runs:
        check_resumed_clock(run)
    cells = [cell for run in runs for cell in run.cells]
    lines = [Cell.HEADER, *[c.row() for c in cells], "",
             f"{len(cells)} cells in {time.monotonic() - t0:.0f} s",
             *[f"{run.name}: {', '.join(endings[run.name]) or 'one completed run'}, ended after "
               f"{run.ended_at - started:.0f} s" for run in runs]]  # fmt: skip
    report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [c for c in cells if c.problems] + [p for p in endings.values() if p]
    assert len(cells) == sum(len(p) for p in plans) and not failed, "\n".join(lines)
    return cells


def test_every_kill_point_of_a_run_comes_back_with_one_retry(live, tiny_model_dir, tmp_path):
    """Eight kill points inside a run × six retries, 48 cells on three runs side by side (8 by default)."""
    # Rounds end on time, not steps. The training kill points strike once the trainer's process appears (it loads
    # for seconds before it steps), so its steps only lengthen the rounds the kills have passed; SUBMISSION_CAP
    # submissions end the session.
    agent_env = {"A2RL_SFT_TRAIN_S": "2", "A2RL_SFT_MAX_STEPS": "100000"}
    run_matrix(live, tiny_model_dir, tmp_path, RUN_KILLS, agent_env, budget_s=240, report=tmp_path / "cells.md")


def test_a_killed_server_or_worker_tree_brings_every_run_back_with_one_retry(live, tiny_model_dir, tmp_path):
    """The two global kill points × six retries, 12 cells (6 by default): each kill hits the three runs at once."""
    agent_env = {"A2RL_SFT_TRAIN_S": "6", "A2RL_SFT_MAX_STEPS": "100000"}
    run_matrix(live, tiny_model_dir, tmp_path, GLOBAL_KILLS, agent_env, budget_s=240, report=tmp_path / "cells.md")
