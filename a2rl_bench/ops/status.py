"""What `a2rl status` shows an operator, as rows: the flow runs an operator started (top-level runs, and the
runs a sweep started through the deployment) by flow name with their true state, elapsed time and one next
step each, the next scheduled runs, and the latest store rows with the state their flow run is really in.

Through Prefect's client (a2rl_bench.ops.prefect_api), whose filters take the same JSON as the API's, and files.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from a2rl_bench.ops import prefect_api


@dataclass
class FlowRunRow:
    id: str
    flow: str
    name: str
    state: str
    state_type: str
    start: str
    elapsed_s: float | None
    deployment_id: str | None = None
    in_sweep: bool = False
    """Started by another flow run through a deployment (a sweep's benchmark run)."""
    work_queue: str | None = None
    parameters: dict[str, Any] | None = None

    def cells(self, next_step: str = "") -> list[str]:
        elapsed = "-" if self.elapsed_s is None else _duration(self.elapsed_s)
        name = f"{self.flow} / {self.name}" + (" (in a sweep)" if self.in_sweep else "")
        return [name, self.state, self.start or "-", elapsed, next_step or "-", self.id]


# Runs an operator looks after: top-level ones, and those another run started through a deployment (a sweep's
# benchmark runs); not the subflows of a run (its phases).
OWN_RUNS = ({"parent_task_run_id": {"is_null_": True}}, {"parent_task_run_id": {"is_null_": False}, "deployment_id": {"is_null_": False}})


NEWEST, SOONEST = "EXPECTED_START_TIME_DESC", "EXPECTED_START_TIME_ASC"
"""Prefect's sorts of flow runs (FlowRunSort) by their expected start time."""


def operator_flow_runs(api_url: str, limit: int = 8) -> list[FlowRunRow]:
    """The latest `limit` flow runs an operator looks after (top-level runs and sweeps' benchmark runs) that are
    not waiting for their time, and every run of the last sweep however many, newest first."""
    runs: dict[str, dict[str, Any]] = {}
    with prefect_api.client(api_url):  # one client for all the reads below
        for which in OWN_RUNS:
            own = {"state": {"type": {"not_any_": ["SCHEDULED"]}}, **which}
            runs |= {r["id"]: r for r in prefect_api.read_flow_runs(api_url, own, limit, sort=NEWEST)}
        newest = sorted(runs.values(), key=lambda r: r.get("expected_start_time") or "", reverse=True)[:limit]
        newest += [r for r in last_sweep_runs(api_url) if r["id"] not in {n["id"] for n in newest}]
        newest.sort(key=lambda r: r.get("expected_start_time") or "", reverse=True)
        return flow_run_rows(api_url, newest)


def last_sweep_runs(api_url: str, page: int = 200) -> list[dict[str, Any]]:
    """The latest sweep's own flow run and every benchmark run it started (as the API returns them)."""
    top = {"state": {"type": {"not_any_": ["SCHEDULED"]}}, **OWN_RUNS[0]}
    sweeps = prefect_api.read_flow_runs(api_url, top, 1, sort=NEWEST,
                                        flows={"name": {"any_": ["sweep"]}})  # fmt: skip
    if not sweeps:
        return []
    runs, offset = list(sweeps), 0
    while True:  # the API hands out at most `page` per call; a sweep can have hundreds
        got = prefect_api.read_flow_runs(api_url, {"parent_flow_run_id": {"any_": [sweeps[0]["id"]]}}, page,
                                         sort=NEWEST, flows={"name": {"any_": ["benchmark-run"]}},
                                         offset=offset)  # fmt: skip
        runs += got
        if len(got) < page:
            return runs
        offset += page


def flow_run_states(api_url: str, ids: list[str]) -> dict[str, Any]:
    """flow-run id → its state now and its attempt count; {} when the server does not answer (the merge then leaves
    `running` attempts unfinished, as without a server)."""
    found: dict[str, prefect_api.FlowRunState] = {}
    try:
        for start in range(0, len(ids), 200):
            for r in prefect_api.read_flow_runs(api_url, {"id": {"any_": ids[start:start + 200]}}, limit=200):
                state = r.get("state") or {}
                found[r["id"]] = prefect_api.FlowRunState(state.get("type") or r.get("state_type") or "?",
                                              r.get("state_name") or state.get("name") or "?", int(r.get("run_count") or 0))  # fmt: skip
    except (httpx.HTTPError, ValueError):
        return {}
    return found


def next_step(row: FlowRunRow) -> str:
    """The one thing to do next about a flow run, as a command where there is one."""
    t = row.state_type
    if t in ("CRASHED", "FAILED", "CANCELLED"):
        return f"a2rl retry {row.id}" if row.deployment_id else "start it again (it has no deployment to retry)"
    if t == "RUNNING":
        process = run_process(harness_dir_of(row))
        if process is not None and process[1] == "gone":
            return f"its process {process[0]} is gone: a2rl retry {row.id} (marks it crashed, then retries)"
        if process is not None and process[1] == "stopped":
            return f"its process {process[0]} is stopped: a2rl retry {row.id} (marks it crashed; the retry ends it)"
        return "running: follow it in the UI (its logs) or here"
    if t == "PENDING":
        return "starting on a worker"
    if t == "SCHEDULED":
        return f"waits for a worker on queue {row.work_queue or '?'} (a2rl server start starts one)"
    if t == "PAUSED":
        return "paused: resume it in the UI"
    if t == "COMPLETED":
        return "done: a2rl results"
    return ""


def scheduled_flow_runs(api_url: str, limit: int = 3) -> list[FlowRunRow]:
    """The next scheduled flow runs (soonest first); a run scheduled as a retry is among them."""
    scheduled = {"state": {"type": {"any_": ["SCHEDULED"]}}}
    with prefect_api.client(api_url):  # one client for both reads
        return flow_run_rows(api_url, prefect_api.read_flow_runs(api_url, scheduled, limit, sort=SOONEST))


def flow_run_label(api_url: str) -> Any:
    """A function flow-run id → "flow / name (state)" for lines that name a flow run (e.g. GPU slot holders)."""

    def label(flow_run_id: str) -> str:
        from prefect.exceptions import ObjectNotFound

        try:
            with prefect_api.client(api_url) as c:
                run = c.read_flow_run(flow_run_id)
            row = flow_run_rows(api_url, prefect_api.flow_runs_json([run]))[0]
        except (httpx.HTTPError, ObjectNotFound, IndexError):
            return f"flow run {flow_run_id} (not found)"
        return f"{row.flow} / {row.name} ({row.state}, {row.id})"

    return label


def harness_dir_of(row: FlowRunRow) -> Path | None:
    """The harness directory of a `benchmark-run` flow run on this machine (from its parameters), if there."""
    if row.flow != "benchmark-run" or not row.parameters:
        return None
    from a2rl_bench.run_options import options_from_parameters, resolve_results

    try:
        options = options_from_parameters(row.parameters)  # a flow run of an older a2rl has the flat shape
    except ValueError:
        return None
    results = resolve_results(options.results)
    runs_dir = resolve_results(options.runs_dir) if options.runs_dir else results.parent / "runs"
    return next(iter(runs_dir.glob(f"*-{row.id.replace('-', '')[:8]}/harness")), None)


def run_process(harness_dir: Path | None) -> tuple[int, str] | None:
    """(pid, "alive" | "stopped" | "gone") of the process that runs the run of `harness_dir`, from its progress
    file; None when unknown (no file, another host)."""
    from a2rl_bench.ops.progress import PROGRESS_FILE, read_announced

    progress = read_announced(harness_dir / PROGRESS_FILE) if harness_dir else None
    alive = progress.process_alive() if progress else None
    if progress is None or alive is None:
        return None
    if not alive:
        return progress.pid, "gone"
    try:
        stopped = Path(f"/proc/{progress.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        stopped = False
    return progress.pid, "stopped" if stopped else "alive"


def flow_runs_by_suffix(api_url: str, suffixes: list[str]) -> dict[str, FlowRunRow]:
    """The flow runs (top-level, or a sweep's) whose id starts with one of the 8-hex `suffixes` of a2rl run ids
    (`...-<8 hex>`)."""
    runs: dict[str, dict[str, Any]] = {}
    with prefect_api.client(api_url):  # one client for all the reads
        for which in OWN_RUNS:
            runs |= {r["id"]: r for r in prefect_api.read_flow_runs(api_url, which, 200, sort=NEWEST)}
        rows = flow_run_rows(api_url, list(runs.values()))
    wanted = set(suffixes)
    return {r.id.replace("-", "")[:8]: r for r in rows if r.id.replace("-", "")[:8] in wanted}


def true_status(row_status: str, flow_run: FlowRunRow | None, running_label: str) -> str:
    """A store row's status as it really is: a `running` row whose flow run crashed, failed or was cancelled
    says so (and how to go on); one whose flow run runs shows the phase from its progress file."""
    if row_status != "running":
        return row_status
    if flow_run is not None and flow_run.state_type in ("CRASHED", "FAILED", "CANCELLED"):
        return f"{flow_run.state.lower()} (row not finished): a2rl retry {flow_run.id}"
    if flow_run is not None and flow_run.state_type in ("PENDING", "RUNNING") and running_label.startswith("running?"):
        return f"{running_label}, its flow run still reads {flow_run.state}: a2rl retry {flow_run.id}"
    if flow_run is not None and flow_run.state_type == "SCHEDULED":
        return f"waiting to resume ({flow_run.state})"
    return running_label


def flow_run_rows(api_url: str, runs: list[dict[str, Any]]) -> list[FlowRunRow]:
    """Rows of flow runs as the API returns them."""
    flows = _flow_names(api_url, {r["flow_id"] for r in runs})
    now = datetime.now(timezone.utc)
    rows = []
    for r in runs:
        start = r.get("start_time")
        state_type = (r.get("state") or {}).get("type") or r.get("state_type") or "?"
        since = (r.get("state") or {}).get("timestamp")
        if state_type == "RUNNING" and since:  # Prefect's total_run_time counts only the attempts that ended
            elapsed: float | None = r.get("total_run_time", 0.0) + (now - _utc(since)).total_seconds()
        else:
            elapsed = r.get("total_run_time") if start else None
        rows.append(FlowRunRow(
            id=r["id"], flow=flows.get(r["flow_id"], "?"), name=r["name"], state=r.get("state_name") or "-",
            state_type=state_type, start=(start or r.get("expected_start_time") or "")[:19].replace("T", " "),
            elapsed_s=elapsed, deployment_id=r.get("deployment_id"),
            in_sweep=bool(r.get("parent_task_run_id") and r.get("deployment_id")),
            work_queue=r.get("work_queue_name"), parameters=r.get("parameters"),
        ))  # fmt: skip
    return rows


def _flow_names(api_url: str, ids: set[str]) -> dict[str, str]:
    if not ids:
        return {}
    from prefect.client.schemas.filters import FlowFilter

    with prefect_api.client(api_url) as c:
        flows = c.read_flows(flow_filter=FlowFilter.model_validate({"id": {"any_": sorted(ids)}}), limit=len(ids))
    return {str(f.id): f.name for f in flows}



def _utc(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def run_id_suffix(run_id: str) -> str:
    """The flow-run part of an a2rl run id (`task-agent-hash-<first 8 hex of the flow-run id>`)."""
    return run_id.rsplit("-", 1)[-1]
