"""A run the machine starved is never the agent's failure (issue #45): `make run` at load 87 made no submission
(the session took 197 s to start, the clock at 0/120) and was called "early coding failure", got a Δ 0.00 row in
the leaderboard, and a sweep skipped its configuration as done. Now: failure class `environment`, from what the
harness recorded (the session's start delay, the load and the agent's CPU in its resource samples), left out of
every aggregate, and run again by a sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2rl_bench.capture.resources import ResourceSample
from a2rl_bench.records import LedgerEntry, RunConfig, RunSummary
from a2rl_bench.summary.metrics import RunMetrics


def _session_start(delay_s: float) -> LedgerEntry:
    return LedgerEntry(seq=1, kind="event", run_id="r", detail={"event": "session-start", "start_delay_s": delay_s})


def _samples(load: float, cpu_percent: float, n: int = 12) -> list[ResourceSample]:
    return [ResourceSample(seq=i, elapsed_s=10.0 * i, n_procs=3, cpu_percent=cpu_percent, rss_bytes=1,
                           extra={"load_per_core": load}) for i in range(n)]  # fmt: skip


NO_SUBMISSION = dict(n_submissions=0, n_scored=0, baseline_feedback=0.0, submission_ids=[], scored_submission_ids=[],
                     feedback_split="validation")  # fmt: skip


@pytest.mark.parametrize(("delay_s", "load", "cpu", "expected"), [
    (197.0, 43.5, 4.0, "environment"),  # the run: a slow start on a machine at load 87 (2 cores)
    (197.0, 0.5, 150.0, "environment"),  # the start alone: the budget ran while the harness could not launch
    (2.0, 6.0, 5.0, "environment"),  # a quick start, then a quarter core or less for the whole session
    (2.0, 0.8, 180.0, "early coding failure"),  # a machine that gave the agent its cores: the agent's own failure
])  # fmt: skip
def test_a_starved_run_is_classed_environment_from_what_the_harness_recorded(delay_s, load, cpu, expected):
    from a2rl_bench.summary.process_facts import starved
    from a2rl_bench.summary.verdicts import explain_failure

    why = starved([_session_start(delay_s)], _samples(load, cpu), {"agent_seconds": 120.0, "ended_by": "budget"})
    verdict = explain_failure(RunMetrics(**NO_SUBMISSION), {}, {"ended_by": "budget", "environment_fault": why})
    assert verdict.label == expected, verdict.reason
    if expected == "environment":
        assert f"{delay_s:.0f} s to start" in verdict.reason and f"{load:.1f}" in verdict.reason
        assert "CPU-s in 120 s of its clock" in verdict.reason


def test_an_environment_run_is_left_out_of_the_aggregates_and_run_again_by_a_sweep(tmp_path: Path):
    from a2rl_bench.flows.sweep import completed_hashes
    from a2rl_bench.store.results import ResultsStore

    store = ResultsStore(tmp_path / "a.duckdb")
    starved_config, fine_config = RunConfig(seed=0), RunConfig(seed=1)
    for run_id, config, failure in (("starved", starved_config, "environment"), ("fine", fine_config, "none")):
        store.start_run(run_id, config, None, "offline")
        store.finish_run(RunSummary(run_id=run_id, config=config, status="completed", protocol=config.protocol,
                                    variant_label="offline", baseline_val=0.0, baseline_test=10.0, best_val=None,
                                    best_submission_id=None, final_submission_id=None, final_test=10.0,
                                    delta_test=0.0, n_submissions=0, n_scored=0, agent_seconds=120.0,
                                    grading_seconds=0.0, wall_seconds=300.0))
        store.record_metrics(run_id, {"failure_class": failure})
    analysed = set(store.query("SELECT run_id FROM analysed_runs")["run_id"])
    excluded = store.query("SELECT reason, n_runs FROM excluded_runs")
    assert analysed == {"fine"}
    assert list(excluded["reason"]) == ["environment (the machine starved the run)"] and list(excluded["n_runs"]) == [1]
    assert completed_hashes(tmp_path / "a.duckdb") == {fine_config.config_hash()}
