"""prefect.yaml on a real local Prefect server with a process worker: schedules, a crash and a UI retry, a
sweep that shares one GPU slot.

Slow (about 4-5 minutes on 2 cores): one server for the whole module, deployments from prefect.yaml, runs of
the reference agent on the tiny model. Deselect with `-m "not prefect_server"`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import duckdb
import pytest

from a2rl_bench.ops import prefect_local
from a2rl_bench.grading.ledger import read_ledger
from a2rl_bench.run_options import nest_parameters
from live_server import SERVER_ENV, SHORT_LEASE, SHORT_LEASE_RUNS, SMALL_AGENT, LiveServer, kill_worker_host
from live_server import ledger_with, live_server, wait_for
from live_server import final_run as _final_run
from live_server import flow_run as _flow_run
from live_server import set_state as _set_state
import prefect_http

pytestmark = pytest.mark.prefect_server

RUN_ENV = {**SMALL_AGENT, **SHORT_LEASE_RUNS}
"""The runs' environment: a small agent, and lease renewals as often as the server's shortened lease needs."""


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveServer]:
    """One Prefect server (own PREFECT_HOME), the deployments of prefect.yaml, one process worker; the server's
    lease times shortened (`SHORT_LEASE`): the crashes here are found by the lease, its length is not under test."""
    with live_server(tmp_path_factory.mktemp("prefect-server"), {**SERVER_ENV, **SHORT_LEASE}) as server:
        yield server


def test_prefect_yaml_registers_the_three_deployments_on_the_local_pool(live):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_deployment_by_name("benchmark-run/benchmark-run")
        nightly = client.read_deployment_by_name("sweep/nightly-sweep")
        analysis = client.read_deployment_by_name("analysis/analysis")
    for dep in (run, nightly, analysis):
        assert dep.work_pool_name == prefect_local.DEFAULT_POOL
    assert analysis.entrypoint == "flows/analysis_flow.py:analysis"
    # The run form is the flow's: a typed `config` (every RunConfig field) and its `options`.
    from prefect.utilities.callables import parameter_schema

    from a2rl_bench.flows.benchmark_run import benchmark_run
    from a2rl_bench.flows.sweep import schema_names

    form = parameter_schema(benchmark_run).model_dump()
    assert {k: run.parameter_openapi_schema[k] for k in ("properties", "definitions")} == \
        {k: form[k] for k in ("properties", "definitions")}  # fmt: skip
    assert {"config.driver", "options.results"} <= schema_names(run.parameter_openapi_schema)
    assert run.parameters["config"]["task"] == "gsm8k" and set(run.parameters) == {"config", "options"}
    assert run.enforce_parameter_schema  # a run out of RunConfig's limits is refused before it exists (#46)
    sweep_config = nightly.parameters["config"]
    assert sweep_config["matrix"]["seeds"] == [0, 1, 2] and sweep_config["local"] is False
    assert nightly.work_queue_name == "sweeps"
    assert nightly.global_concurrency_limit is not None and nightly.global_concurrency_limit.limit == 1


def test_the_nightly_sweep_is_scheduled_for_two_am_berlin_time(live):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("sweep/nightly-sweep")
    (schedule,) = nightly.schedules
    assert schedule.active
    assert (schedule.schedule.cron, schedule.schedule.timezone) == ("0 2 * * *", "Europe/Berlin")

    berlin = ZoneInfo("Europe/Berlin")
    now = datetime.now(berlin)
    day = now.date() if now.time() < clock_time(2) else now.date() + timedelta(days=1)
    expected = _berlin_2am(day, berlin)
    # The server's scheduler creates the upcoming runs a few seconds after the deployment appears.
    scheduled = wait_for(lambda: _scheduled_runs(live.url, nightly.id), timeout_s=90, what="scheduled runs")
    first = datetime.fromisoformat(scheduled[0]["expected_start_time"])
    assert first == expected, f"first nightly run at {first.astimezone(berlin)}, expected {expected}"
    second = datetime.fromisoformat(scheduled[1]["expected_start_time"])
    assert second == _berlin_2am(day + timedelta(days=1), berlin)


def test_a_run_killed_mid_session_completes_after_a_retry_from_the_ui(live, tiny_model_dir, tmp_path):
    """The worker host dies (SIGKILL to the worker, the flow-run process and the agent) while the agent
    session runs; after the UI's Retry and a new worker the same flow run finishes, with one row in `runs`
    and every submission recorded once."""
    fr, params, ledger = _run_until_the_agent_trains(live, tiny_model_dir, tmp_path)
    suffix = fr.id.hex[:8]
    killed = kill_worker_host(live.home)
    assert len(killed) >= 3, f"expected worker, flow-run process and agent, killed {killed}"

    # Nothing notices a SIGKILLed run by itself; mark it crashed as Prefect's zombie detection would, then
    # press "Retry" (the UI offers it on crashed runs of deployments).
    _set_state(live.url, fr.id, {"type": "CRASHED", "name": "Crashed", "message": "worker host lost"})
    prefect_local.retry_flow_run(live.url, str(fr.id))
    live.start_worker()
    final = wait_for(lambda: _final_run(live.url, fr.id), timeout_s=360, what="the retried run to finish")

    assert final["state_type"] == "COMPLETED", final["state"]
    assert final["run_count"] >= 2
    with duckdb.connect(params["results"], read_only=True) as con:
        runs = con.execute("SELECT run_id, status FROM runs").fetchall()
        subs = con.execute("SELECT submission_id FROM submissions ORDER BY submission_id").fetchall()
    assert len(runs) == 1 and runs[0][0].endswith(suffix) and runs[0][1] == "completed", runs
    entries = read_ledger(ledger)  # verifies the hash chain
    kinds = [e.kind for e in entries]
    assert kinds.count("baseline") == 2 and kinds.count("final") == 1
    queued = [e.submission_id for e in entries if e.kind == "submission" and e.status == "queued"]
    assert len(queued) == len(set(queued)), f"a submission was queued twice: {queued}"
    assert [s for (s,) in subs] == sorted(set(queued))


def test_a_worker_stopped_mid_session_records_the_run_interrupted_and_one_retry_completes_it(
    live, tiny_model_dir, tmp_path
):
    """`a2rl server stop` / SIGTERM to the worker while the agent trains: the flow run records `interrupted` with
    its report and ends Cancelled, saying so, before the worker goes (not Crashed: it was stopped on request), no
    process of it survives, and a Retry pressed at once resumes it to one completed run with graded submissions
    only and a monotone agent clock. A Retry of the completed run is refused."""
    from a2rl_bench.ops import gpu_slots
    from a2rl_bench.capture.resources import workspace_pids

    if gpu_slots.read_limit(live.url) is None:  # as a sweep makes it: the session holds one of its slots
        prefect_http.post(f"{live.url}/v2/concurrency_limits/",
                          json={"name": gpu_slots.GPU_LIMIT, "limit": 1}).raise_for_status()
    fr, params, ledger = _run_until_the_agent_trains(live, tiny_model_dir, tmp_path)
    limit = gpu_slots.read_limit(live.url)
    holders = [lease.holder for lease in gpu_slots.read_leases(live.home, limit.id) if not lease.expired]
    assert holders == [str(fr.id)]  # on disk, in Prefect's own file format, naming the benchmark-run
    assert prefect_local.stop_worker(live.home, flow_run_grace_s=90)
    assert gpu_slots.read_limit(live.url).active_slots == 0  # the stopped run gave its slot back

    stopped = _flow_run(live.url, fr.id)["state"]  # reported before the worker went
    assert stopped["type"] == "CANCELLED" and "a2rl recorded the run interrupted" in stopped["message"], stopped
    with duckdb.connect(params["results"], read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
    harness = ledger.parent
    assert (harness / "report.md").exists()
    assert workspace_pids(harness.parent / "workspace")() == []  # no process of the stopped attempt

    assert prefect_local.retry_flow_run(live.url, str(fr.id)) in ("AwaitingRetry", "Scheduled")
    live.start_worker()
    final = wait_for(lambda: _final_run(live.url, fr.id), timeout_s=360, what="the retried run to finish")
    assert final["state_type"] == "COMPLETED", final["state"]
    with duckdb.connect(params["results"], read_only=True) as con:
        runs = con.execute("SELECT status, finished_at, wall_seconds FROM runs").fetchall()
        subs = con.execute("SELECT DISTINCT status FROM submissions").fetchall()
    assert len(runs) == 1 and runs[0][0] == "completed", runs
    assert set(subs) <= {("scored",), ("error",)}, subs  # graded, none left queued
    entries = read_ledger(ledger)
    latest = {e.submission_id: e for e in entries if e.kind == "submission"}
    assert all(e.status in ("scored", "error") for e in latest.values())
    arrivals = [e.agent_elapsed_s for e in entries if e.kind == "submission" and e.status == "queued"]
    assert arrivals == sorted(arrivals) and all(t >= 0 for t in arrivals), arrivals  # the clock moved forward

    with pytest.raises(prefect_local.OpsError, match="completed: a retry is refused"):
        prefect_local.retry_flow_run(live.url, str(fr.id))


def test_a_sweep_runs_one_agent_session_at_a_time_with_one_gpu_slot(live, tiny_model_dir, tmp_path):
    """Two runs start together on a worker without a run limit; the `gpu` limit (1 slot) lets only one agent
    session run at a time. A second sweep over the same matrix starts nothing."""
    from prefect.client.orchestration import get_client

    from a2rl_bench.records import RunConfig
    from a2rl_bench.run_options import RunOptions
    from a2rl_bench.flows.sweep import GPU_LIMIT, SweepConfig, SweepMatrix, sweep

    config = SweepConfig(
        run=RunConfig(budget_s=20, base_model=str(tiny_model_dir), val_limit=2, test_limit=2),
        matrix=SweepMatrix(seeds=[0, 1]),
        options=RunOptions(results=tmp_path / "results.duckdb", runs_dir=tmp_path / "runs", grace_s=5),
        gpu_slots=1, job_variables={"env": RUN_ENV}, poll_s=2, watch_timeout_s=420,
    )  # fmt: skip
    items = sweep(config)
    assert [i.status for i in items] == ["completed", "completed"], [(i.label, i.state, i.detail) for i in items]
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(GPU_LIMIT).limit == 1

    sessions = sorted(_session_interval(p) for p in (tmp_path / "runs").glob("*/harness/ledger.jsonl"))
    assert len(sessions) == 2
    (_, first_end), (second_start, _) = sessions
    assert first_end <= second_start, f"agent sessions overlap: {sessions}"

    again = sweep(config)
    assert [i.status for i in again] == ["skipped", "skipped"]


def test_a2rl_status_shows_the_server_and_its_flow_runs(live, monkeypatch, capsys):
    from a2rl_bench.cli import main

    monkeypatch.setenv("PREFECT_API_URL", live.url)
    assert main(["status", "--results", str(live.home / "none.duckdb")]) == 0
    out = capsys.readouterr().out
    assert f"server {live.url}: up" in out and f"flow runs on {live.url}" in out and "GPU slots:" in out


def test_a2rl_deploy_auto_retry_retries_a_crashed_run_up_to_its_limit_and_is_off_by_default(
    live, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """#29.3: no automation unless asked; `a2rl deploy --auto-retry 1` adds one that retries a crashed run of
    `benchmark-run` (as the UI's Retry) while it has run at most once: the first crash is retried by itself, the
    second stays Crashed for an operator, whose one Retry completes the run; `--auto-retry 0` removes it."""
    import json

    from a2rl_bench.cli import main
    from a2rl_bench.ops import auto_retry
    from prefect.deployments import run_deployment

    assert auto_retry.find(live.url) is None  # `a2rl deploy` (the fixture's) made none
    monkeypatch.setenv("PREFECT_API_URL", live.url)
    try:
        assert main(["deploy", "--name", "benchmark-run", "--auto-retry", "1"]) == 0
        assert "automatic retry of crashed runs: on, up to 1 per run" in capsys.readouterr().out
        # A cap of one submission ends the session of the attempt that completes: its retries, not its rounds, are
        # under test (the cap is a run parameter; the crashed attempts never reach their session).
        params = dict(base_model=str(tiny_model_dir), budget_s=30, results=str(tmp_path / "results.duckdb"),
                      runs_dir=str(tmp_path / "runs"), val_limit=2, test_limit=2, grace_s=5,
                      max_submissions=1)  # fmt: skip
        fr = run_deployment("benchmark-run/benchmark-run", parameters=nest_parameters(params),
                            job_variables={"env": RUN_ENV}, timeout=0)  # fmt: skip
        killed: list[int] = []

        def kill_in_provision() -> bool:
            for progress in (tmp_path / "runs").glob(f"*-{fr.id.hex[:8]}/harness/progress.json"):
                p = json.loads(progress.read_text())
                if p["phase"] == "provision" and p["pid"] not in killed:
                    os.kill(p["pid"], signal.SIGKILL)
                    killed.append(p["pid"])
                    return True
            return False

        wait_for(kill_in_provision, timeout_s=300, what="attempt 1 in provision", poll_s=0.05)
        # The automation retries it: a second attempt starts without anyone pressing Retry.
        wait_for(kill_in_provision, timeout_s=300, what="attempt 2 (the automatic retry) in provision", poll_s=0.05)
        crashed = wait_for(lambda: (r := _flow_run(live.url, fr.id))["state_type"] == "CRASHED" and r, 120,
                           what="attempt 2 to be reported crashed")  # fmt: skip
        # No third attempt: the run has run twice, more than the limit allows. The automation answers a Crashed event
        # with AwaitingRetry (counted below as soon as it is written, before any worker starts an attempt), and it
        # answered the first crash (the same lease sweep's forced Crashed) that many seconds after it: 0.15 s on the
        # 2-core machine, Prefect evaluates a reactive trigger as its event arrives. Twenty times that, never under
        # 5 s, from the moment the crash was seen: a retry of this crash would be written by then, on a loaded
        # machine too, whose slowness the measured reaction carries (was a fixed 15 s).
        time.sleep(max(5.0, 20 * _auto_retry_reaction_s(live.url, fr.id)))
        after = _flow_run(live.url, fr.id)
        assert after["state_type"] == "CRASHED" and after["run_count"] == crashed["run_count"] == 2, after
        states = prefect_http.get(f"{live.url}/flow_run_states/", params={"flow_run_id": str(fr.id)}).json()
        assert sum((s["message"] or "").startswith(auto_retry.RETRY_MESSAGE) for s in states) == 1
        _set_state(live.url, fr.id, {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"})
        final = wait_for(lambda: _final_run(live.url, fr.id), timeout_s=420, what="the retried run to finish")
        assert final["state_type"] == "COMPLETED" and final["run_count"] == 3, final
    finally:
        assert main(["deploy", "--name", "benchmark-run", "--auto-retry", "0"]) == 0
    assert "automatic retry of crashed runs: off (automation removed)" in capsys.readouterr().out
    assert auto_retry.find(live.url) is None


# ---- helpers -----------------------------------------------------------------------------------------


def _run_until_the_agent_trains(live: LiveServer, tiny_model_dir: Path, tmp_path: Path) -> tuple[Any, dict, Path]:
    """Start a small benchmark run through the deployment; return once its agent has trained for 3 s:
    (flow run, parameters, ledger path)."""
    from prefect.deployments import run_deployment

    params = dict(base_model=str(tiny_model_dir), budget_s=30, results=str(tmp_path / "results.duckdb"),
                  runs_dir=str(tmp_path / "runs"), val_limit=2, test_limit=2, grace_s=5)  # fmt: skip
    fr = run_deployment("benchmark-run/benchmark-run", parameters=nest_parameters(params),
                        job_variables={"env": RUN_ENV}, timeout=0)  # fmt: skip
    ledger = wait_for(lambda: ledger_with(tmp_path / "runs", fr.id.hex[:8], '"session-start"'), timeout_s=240,
                       what="the agent session to start", run=(live.url, fr.id))  # fmt: skip
    time.sleep(3)  # the agent process is up and training
    return fr, params, ledger


def _auto_retry_reaction_s(url: str, flow_run_id: Any) -> float:
    """Seconds from the run's first Crashed state to the automation's AwaitingRetry that followed it."""
    from a2rl_bench.ops import auto_retry

    states = sorted(prefect_http.get(f"{url}/flow_run_states/", params={"flow_run_id": str(flow_run_id)}).json(),
                    key=lambda s: s["timestamp"])  # fmt: skip
    at = [datetime.fromisoformat(s["timestamp"]) for s in states]
    first_crash = next(i for i, s in enumerate(states) if s["type"] == "CRASHED")
    retry = next(i for i, s in enumerate(states) if (s["message"] or "").startswith(auto_retry.RETRY_MESSAGE))
    assert retry > first_crash, states
    return (at[retry] - at[first_crash]).total_seconds()


def _scheduled_runs(url: str, deployment_id: Any) -> list[dict]:
    body = {"deployments": {"id": {"any_": [str(deployment_id)]}},
            "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}},
            "sort": "EXPECTED_START_TIME_ASC", "limit": 2}  # fmt: skip
    runs = prefect_http.post(f"{url}/flow_runs/filter", json=body).json()
    return runs if len(runs) == 2 else []


def _berlin_2am(day: date, berlin: ZoneInfo) -> datetime:
    return datetime.combine(day, clock_time(2), tzinfo=berlin)


def _session_interval(ledger: Path) -> tuple[datetime, datetime]:
    events = {e.detail.get("event"): e.at for e in read_ledger(ledger) if e.kind == "event"}
    return events["session-start"], events["session-end"]

