"""What `a2rl status` shows an operator, as rows: top-level flow runs by flow name with their true state and
elapsed time, the next scheduled runs, and the latest store rows with the state their flow run is really in.

REST and files only (no `import prefect`), so the command answers in a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx


@dataclass
class FlowRunRow:
    id: str
    flow: str
    name: str
    state: str
    state_type: str
    start: str
    elapsed_s: float | None
    deployment: str | None = None

    def cells(self) -> list[str]:
        elapsed = "-" if self.elapsed_s is None else _duration(self.elapsed_s)
        return [f"{self.flow} / {self.name}", self.state, self.start or "-", elapsed, self.id]


def top_level_flow_runs(api_url: str, limit: int = 10) -> list[FlowRunRow]:
    """The latest flow runs that are not subflows and not waiting for their time, newest first."""
    body = {"flow_runs": {"state": {"type": {"not_any_": ["SCHEDULED"]}}, "parent_task_run_id": {"is_null_": True}},
            "limit": limit, "sort": "EXPECTED_START_TIME_DESC"}  # fmt: skip
    return _rows(api_url, _post(api_url, "/flow_runs/filter", body))


def scheduled_flow_runs(api_url: str, limit: int = 3) -> list[FlowRunRow]:
    """The next scheduled flow runs (soonest first); a run scheduled as a retry is among them."""
    body = {"flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}, "limit": limit,
            "sort": "EXPECTED_START_TIME_ASC"}  # fmt: skip
    return _rows(api_url, _post(api_url, "/flow_runs/filter", body))


def flow_run_label(api_url: str) -> Any:
    """A function flow-run id → "flow / name (state)" for lines that name a flow run (e.g. GPU slot holders)."""

    def label(flow_run_id: str) -> str:
        try:
            r = httpx.get(f"{api_url}/flow_runs/{flow_run_id}", timeout=10)
            r.raise_for_status()
            row = _rows(api_url, [r.json()])[0]
        except (httpx.HTTPError, IndexError):
            return f"flow run {flow_run_id} (not found)"
        return f"{row.flow} / {row.name} ({row.state}, {row.id})"

    return label


def flow_runs_by_suffix(api_url: str, suffixes: list[str]) -> dict[str, FlowRunRow]:
    """The flow runs whose id starts with one of the 8-hex `suffixes` of a2rl run ids (`...-<8 hex>`): top-level
    ones (`a2rl run`), and runs of deployments, which a sweep's runs are though linked under the sweep."""
    runs = {r["id"]: r for where in ({"parent_task_run_id": {"is_null_": True}}, {"deployment_id": {"is_null_": False}})
            for r in _post(api_url, "/flow_runs/filter", {"flow_runs": where, "limit": 200,
                                                          "sort": "EXPECTED_START_TIME_DESC"})}  # fmt: skip
    rows = _rows(api_url, list(runs.values()))
    wanted = set(suffixes)
    return {r.id.replace("-", "")[:8]: r for r in rows if r.id.replace("-", "")[:8] in wanted}


def true_status(row_status: str, flow_run: FlowRunRow | None, running_label: str) -> str:
    """A store row's status as it really is: a `running` row whose flow run crashed, failed or was cancelled
    says so (and how to go on); one whose flow run runs shows the phase from its progress file."""
    if row_status != "running":
        return row_status
    if flow_run is not None and flow_run.state_type in ("CRASHED", "FAILED", "CANCELLED"):
        return f"{flow_run.state.lower()} (row not finished): a2rl retry {flow_run.id}"
    if flow_run is not None and flow_run.state_type == "SCHEDULED":
        return f"waiting to resume ({flow_run.state})"
    return running_label


def _rows(api_url: str, runs: list[dict[str, Any]]) -> list[FlowRunRow]:
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
            elapsed_s=elapsed,
        ))  # fmt: skip
    return rows


def _flow_names(api_url: str, ids: set[str]) -> dict[str, str]:
    if not ids:
        return {}
    flows = _post(api_url, "/flows/filter", {"flows": {"id": {"any_": sorted(ids)}}, "limit": len(ids)})
    return {f["id"]: f["name"] for f in flows}


def _post(api_url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.post(f"{api_url}{path}", json=body, timeout=10)
    r.raise_for_status()
    return r.json()


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


def store_rows(results: Path, limit: int) -> list[dict[str, Any]]:
    from a2rl.store.results import ResultsStore

    df = ResultsStore(results).query(
        "SELECT run_id, status, task, agent, mode, (SELECT count(*) FROM mode_violations v "
        "WHERE v.run_id = runs.run_id) AS mode_breaches, seed, round(delta_test, 2) AS delta_test, "
        "strftime(started_at, '%Y-%m-%d %H:%M') AS started, harness_dir FROM runs ORDER BY started_at DESC LIMIT ?",
        [limit],
    )
    return df.to_dict("records")
