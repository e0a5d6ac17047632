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
    starved_config, fine_config, crowded_config = RunConfig(seed=0), RunConfig(seed=1), RunConfig(seed=2)
    for run_id, config, failure, reason in (
        ("starved", starved_config, "environment", "the machine starved the run: 197 s to start"),
        ("fine", fine_config, "none", "improved: Δ test = +10.00"),
        ("crowded", crowded_config, "environment", "the machine cut the run short: the session ended at 41% of its "
                                                   "budget, 8 s after other processes held 123.0 of GPU 0's 140.0 GiB"),
    ):  # fmt: skip
        store.start_run(run_id, config, None, "offline")
        store.finish_run(RunSummary(run_id=run_id, config=config, status="completed", protocol=config.protocol,
                                    variant_label="offline", baseline_val=0.0, baseline_test=10.0, best_val=None,
                                    best_submission_id=None, final_submission_id=None, final_test=10.0,
                                    delta_test=0.0, n_submissions=0, n_scored=0, agent_seconds=120.0,
                                    grading_seconds=0.0, wall_seconds=300.0))
        store.record_metrics(run_id, {"failure_class": failure, "failure_reason": reason})
    analysed = set(store.query("SELECT run_id FROM analysed_runs")["run_id"])
    excluded = store.query("SELECT reason, n_runs FROM excluded_runs ORDER BY reason")
    assert analysed == {"fine"}
    # each says which way the machine failed the run (the eleventh RL pass's full card is not "starved")
    assert list(excluded["reason"]) == ["environment (the machine cut the run short)",
                                        "environment (the machine starved the run)"]  # fmt: skip
    assert list(excluded["n_runs"]) == [1, 1]
    assert completed_hashes(tmp_path / "a.duckdb") == {fine_config.config_hash()}


# -- a card other processes filled (issue 42, eleventh RL pass) -------------------------------------------------------
GIB = 2**30
IMPROVED = dict(n_submissions=2, n_scored=2, baseline_feedback=0.0, submission_ids=[1, 2], scored_submission_ids=[1, 2],
                feedback_split="validation", delta_test=70.1, delta_test_ci_low=62.3, delta_test_ci_high=78.0,
                delta_test_n_items=134)  # fmt: skip


def _gpu_samples(n: int = 40, *, others_gib: float, mine_gib: float | None = 16.5, procs: int = 7,
                 crowded_from: int = 0) -> list[ResourceSample]:  # fmt: skip
    """Samples every 5 s of an agent on GPU 0 of 140 GiB; from sample `crowded_from` on, other processes hold
    `others_gib` (before it, 60 GiB)."""
    from a2rl_bench.capture.resources import GpuSample

    out = []
    for i in range(n):
        others = others_gib if i >= crowded_from else 60.0
        used = (others + (mine_gib or 16.5)) * GIB
        gpu = GpuSample(index=0, util_percent=90.0, mem_used_bytes=int(min(used, 140 * GIB)),
                        mem_total_bytes=140 * GIB, procs=procs, agent_procs=1)  # fmt: skip
        out.append(ResourceSample(seq=i, elapsed_s=5.0 * i, n_procs=3, cpu_percent=100.0, rss_bytes=1, gpus=[gpu],
                                  gpu_mem_tree_bytes=None if mine_gib is None else int(mine_gib * GIB)))  # fmt: skip
    return out


@pytest.mark.parametrize(("samples", "used", "expected"), [
    # the eleventh pass's runs: 123 GiB of others on a 140 GiB card at the end, the agent dead at 41% of its budget
    (_gpu_samples(others_gib=123.0, crowded_from=35), 0.41, "environment"),
    # the same card, but the session used its budget: whatever the card was, the run is the agent's
    (_gpu_samples(others_gib=123.0, crowded_from=35), 0.97, "none"),
    # full long before an early end (60 s earlier, then room again): the end is not the card's doing
    (_gpu_samples(others_gib=123.0, crowded_from=20)[:26] + _gpu_samples(others_gib=60.0)[26:], 0.41, "none"),
    # full, but by the agent itself (others 30 GiB, the agent 110): its own out-of-memory error is its failure
    (_gpu_samples(others_gib=30.0, mine_gib=110.0, crowded_from=35), 0.41, "none"),
    # the driver did not say what the agent's tree held: nothing is concluded
    (_gpu_samples(others_gib=123.0, mine_gib=None, crowded_from=35), 0.41, "none"),
    # a card of its own (no other process): never crowded by others
    (_gpu_samples(others_gib=123.0, procs=1, crowded_from=35), 0.41, "none"),
])  # fmt: skip
def test_a_session_a_full_card_cut_short_is_the_machines_not_the_agents(samples, used, expected):
    from a2rl_bench.summary.process_facts import crowded_early_end
    from a2rl_bench.summary.verdicts import explain_failure

    metrics = RunMetrics(**IMPROVED, time_used_ratio=used)
    why = crowded_early_end(metrics, samples)
    verdict = explain_failure(metrics, {1: "SFT", 2: "SFT"}, {"ended_by": "agent-exit", "gpu_crowded": why})
    assert verdict.label == expected, verdict.reason
    if expected == "environment":  # the reason names what the harness measured
        assert "41% of its budget" in verdict.reason and "123.0 of GPU 0's 140.0 GiB" in verdict.reason
        assert "the agent 16.5 GiB" in verdict.reason


def test_the_summary_step_reads_the_crowded_card_from_the_runs_resource_samples(tmp_path: Path):
    """Through `summarize_process`: the run's `resources.jsonl` as the sampler writes it, a session that ended at 41%
    of its budget, and a run that improved on its baseline: class `environment`, and the analysis leaves it out."""
    from a2rl_bench.summary.process_facts import summarize_process

    harness = tmp_path / "harness"
    harness.mkdir()
    with (harness / "resources.jsonl").open("w") as f:
        for s in _gpu_samples(others_gib=123.0, crowded_from=35):
            f.write(s.model_dump_json() + "\n")
    config = RunConfig(budget_s=420.0)
    entries = [_session_start(1.0)]
    report = summarize_process("r", harness, entries, config, {"agent_seconds": 172.0, "ended_by": "agent-exit"},
                               narrative=False)  # fmt: skip
    assert report.failure_class == "environment", report.failure_reason
    assert "the machine cut the run short" in report.failure_reason
    calm = tmp_path / "calm"
    calm.mkdir()
    with (calm / "resources.jsonl").open("w") as f:
        for s in _gpu_samples(others_gib=60.0):
            f.write(s.model_dump_json() + "\n")
    other = summarize_process("r", calm, entries, config, {"agent_seconds": 172.0, "ended_by": "agent-exit"},
                              narrative=False)  # fmt: skip
    assert other.failure_class != "environment", other.failure_reason
