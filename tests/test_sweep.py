"""The sweep flow's planning and its local mode (a stand-in benchmark run; the real one with a server and a
GPU slot is in test_deployments.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2rl_bench.records import RunConfig, RunSummary
from a2rl_bench.run_options import RunOptions, config_from_parameters, run_parameters
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.flows.sweep import check_parameters, completed_hashes, expand_matrix, plan_sweep

R = RunOptions(results=Path("r.duckdb"))


def _complete(results: Path, config: RunConfig, run_id: str) -> None:
    """A completed run of `config` in the store, as the benchmark-run flow leaves it."""
    ResultsStore(results).finish_run(RunSummary(
        run_id=run_id, config=config, status="completed", protocol=config.protocol, variant_label="",
        baseline_val=None, baseline_test=None, best_val=None, best_submission_id=None, final_submission_id=None,
        final_test=None, delta_test=None, n_submissions=0, n_scored=0, agent_seconds=0.0, grading_seconds=0.0,
        wall_seconds=0.0,
    ))  # fmt: skip


def test_the_matrix_has_every_combination_once_in_order():
    configs = expand_matrix(["gsm8k"], ["reference-sft", "reference-grpo"], ["none"], ["free", "sft-only"],
                            [0, 1, 0], budget_s=60)  # fmt: skip
    assert len(configs) == 2 * 2 * 2  # the repeated seed 0 adds nothing
    assert [(c.agent, c.mode, c.seed) for c in configs[:3]] == [
        ("reference-sft", "free", 0), ("reference-sft", "free", 1), ("reference-sft", "sft-only", 0)]
    assert all(c.budget_s == 60 for c in configs)


def test_run_parameters_give_the_benchmark_run_the_same_config_hash():
    from a2rl_bench.flows.benchmark_run import benchmark_run
    from a2rl_bench.flows.sweep import benchmark_run_parameters

    config = RunConfig(task="gsm8k", agent="reference-grpo", mode="rl-only", seed=3, budget_s=90, val_limit=None)
    params = run_parameters(config, RunOptions(results=Path("results/a2rl.duckdb"), grace_s=10))
    check_parameters([_item(config, params)], benchmark_run_parameters(True, ""))  # the flow takes every one
    # benchmark-run's RunConfig is exactly this one.
    rebuilt = benchmark_run.validate_parameters(params)["config"]
    assert rebuilt == config and rebuilt.config_hash() == config.config_hash()
    assert set(params["config"]) == set(RunConfig.model_fields)  # every field: a deployment's defaults never apply
    swapped = config.model_copy(update={"driver": "claude-x"})
    assert config_from_parameters(run_parameters(swapped, R)).driver == "claude-x"


def _item(config: RunConfig, params: dict):
    from a2rl_bench.flows.sweep import SweepItem

    return SweepItem(config=config, parameters=params)


def test_completed_configurations_are_skipped_unless_forced(tmp_path):
    results = tmp_path / "results.duckdb"
    assert completed_hashes(results) == set() and not results.exists()
    configs = expand_matrix(["gsm8k"], ["reference-sft"], ["none"], ["free"], [0, 1, 2])
    _complete(results, configs[1], "done-1")
    ResultsStore(results).start_run("running-2", configs[2], None, "")  # started, not completed: runs again

    items = plan_sweep(configs, completed_hashes(results), False, RunOptions(results=results))
    assert [i.status for i in items] == ["planned", "skipped", "planned"]
    forced = plan_sweep(configs, completed_hashes(results), True, RunOptions(results=results))
    assert [i.status for i in forced] == ["planned"] * 3


def test_a_local_sweep_runs_the_rest_one_after_another_and_reports_failures(
    prefect_harness, tmp_path, monkeypatch
):
    from prefect import flow

    import a2rl_bench.flows.benchmark_run
    from a2rl_bench.flows.sweep import SweepConfig, SweepMatrix, sweep

    calls: list[int] = []
    d = RunConfig()

    @flow(name="benchmark-run")
    def stand_in(config: RunConfig = RunConfig(), options: RunOptions = RunOptions()) -> None:
        calls.append(config.seed)
        if config.seed == 1:
            raise RuntimeError("the agent broke")
        _complete(options.results, config, f"run-{config.seed}")

    monkeypatch.setattr(a2rl_bench.flows.benchmark_run, "benchmark_run", stand_in)
    results = tmp_path / "results.duckdb"
    config = SweepConfig(run=RunConfig(budget_s=30), matrix=SweepMatrix(seeds=[0, 1, 2]),
                         options=RunOptions(results=results), local=True)  # fmt: skip
    _complete(results, expand_matrix([d.task], [d.agent], ["none"], [d.mode], [2], budget_s=30)[0], "earlier-2")

    state = sweep(config, return_state=True)
    assert state.is_failed() and "s1" in state.message
    assert calls == [0, 1]  # seed 2 was already completed

    calls.clear()
    items = sweep(config.model_copy(update={"matrix": SweepMatrix(seeds=[0, 2])}))
    assert calls == [] and [i.status for i in items] == ["skipped", "skipped"]
    items = sweep(config.model_copy(update={"matrix": SweepMatrix(seeds=[0]), "force": True}))
    assert calls == [0] and items[0].status == "completed"


def test_a_parameter_the_flow_does_not_take_fails_before_anything_runs():
    from a2rl_bench.flows.sweep import benchmark_run_parameters

    items = plan_sweep(expand_matrix(["gsm8k"], ["claude-tools"], ["claude-x"], ["free"], [0]), set(), False, R)
    accepted = benchmark_run_parameters(True, "")
    with pytest.raises(ValueError, match="config.driver"):  # a deployment made before drivers
        check_parameters(items, accepted - {"config.driver"})
    flat = {name.split(".")[1] for name in accepted if name.startswith("config.")} | {"results", "grace_s"}
    with pytest.raises(ValueError, match=r"'config'.*register it again with `a2rl deploy`"):  # made before #38
        check_parameters(items, flat)
    check_parameters(items, accepted)


def test_a2rl_sweep_hands_each_run_its_config_and_options(prefect_harness, tmp_path, monkeypatch, capsys):
    """`a2rl sweep` (here, one run after another) gives every run of the matrix a RunConfig with the shared
    options set and the axes varied, and an absolute results path."""
    from prefect import flow

    import a2rl_bench.flows.benchmark_run
    from a2rl_bench.cli import main

    got: list[tuple[RunConfig, RunOptions]] = []

    @flow(name="benchmark-run")
    def stand_in(config: RunConfig = RunConfig(), options: RunOptions = RunOptions()) -> None:
        got.append((config, options))
        _complete(options.results, config, f"run-{config.mode}-{config.seed}")

    monkeypatch.setattr(a2rl_bench.flows.benchmark_run, "benchmark_run", stand_in)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--seeds", "0", "1", "--modes", "free", "sft-only", "--budget", "30", "--val-limit", "0",
                 "--results", "r.duckdb"]) == 0  # fmt: skip
    assert [(c.mode, c.seed) for c, _ in got] == [("free", 0), ("free", 1), ("sft-only", 0), ("sft-only", 1)]
    assert all(c.budget_s == 30 and c.val_limit is None for c, _ in got)
    assert {o.results for _, o in got} == {tmp_path / "r.duckdb"}
    assert capsys.readouterr().out.count("completed") == 4


def test_a2rl_sweep_dry_run_shows_what_would_run(tmp_path, monkeypatch, capsys):
    from a2rl_bench.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    results = tmp_path / "results.duckdb"
    _complete(results, RunConfig(seed=1), "done")
    assert main(["sweep", "--dry-run", "--seeds", "0", "1", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "1 to run, 1 skipped" in out
    assert [line.split()[0] for line in out.splitlines()[:2]] == ["run", "skip"]
