"""The sweep flow's planning and its local mode (a stand-in benchmark run; the real one with a server and a
GPU slot is in test_deployments.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from a2rl.records import RunConfig, RunSummary
from a2rl.store.results import ResultsStore
from flows.sweep import check_parameters, completed_hashes, expand_matrix, plan_sweep, run_parameters


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
    from flows.benchmark_run import benchmark_run

    config = RunConfig(task="gsm8k", agent="reference-grpo", mode="rl-only", seed=3, budget_s=90, val_limit=None)
    params = run_parameters(config, "results/a2rl.duckdb", None, grace_s=10)
    assert set(params) <= set(inspect.signature(benchmark_run.fn).parameters)
    # benchmark-run builds its RunConfig from exactly these fields.
    rebuilt = RunConfig(**{k: v for k, v in params.items() if k in RunConfig.model_fields})
    assert rebuilt.config_hash() == config.config_hash()
    assert set(RunConfig.model_fields) <= set(params)  # every field, so a deployment's own defaults never apply
    assert run_parameters(config.model_copy(update={"driver": "claude-x"}), "r", None, 10)["driver"] == "claude-x"


def test_completed_configurations_are_skipped_unless_forced(tmp_path):
    results = tmp_path / "results.duckdb"
    assert completed_hashes(results) == set() and not results.exists()
    configs = expand_matrix(["gsm8k"], ["reference-sft"], ["none"], ["free"], [0, 1, 2])
    _complete(results, configs[1], "done-1")
    ResultsStore(results).start_run("running-2", configs[2], None, "")  # started, not completed: runs again

    items = plan_sweep(configs, completed_hashes(results), False, results, None, 30.0)
    assert [i.status for i in items] == ["planned", "skipped", "planned"]
    forced = plan_sweep(configs, completed_hashes(results), True, results, None, 30.0)
    assert [i.status for i in forced] == ["planned"] * 3


def test_a_local_sweep_runs_the_rest_one_after_another_and_reports_failures(
    prefect_harness, tmp_path, monkeypatch
):
    from prefect import flow

    import flows.benchmark_run
    from flows.sweep import sweep

    calls: list[int] = []
    d = RunConfig()

    @flow(name="benchmark-run")
    def stand_in(task: str = d.task, agent: str = d.agent, budget_s: float = d.budget_s, seed: int = d.seed,
                 results: Path = Path("r.duckdb"), runs_dir: Path | None = None, variant: str = d.variant,
                 base_model: str = d.base_model, protocol: str = d.protocol, mode: str = d.mode,
                 val_limit: int | None = d.val_limit, test_limit: int | None = d.test_limit,
                 max_submissions: int = d.max_submissions, grace_s: float = 30.0, driver: str = d.driver,
                 strict_mode: bool = d.strict_mode, eval_batch_size: int = d.eval_batch_size,
                 eval_backend: str = d.eval_backend, sandbox: str = d.sandbox,
                 max_workspace_bytes: int = d.max_workspace_bytes, grading_workers: int = d.grading_workers,
                 max_checkpoint_bytes: int = d.max_checkpoint_bytes,
                 test_every_submission: bool = d.test_every_submission) -> None:  # fmt: skip
        calls.append(seed)
        if seed == 1:
            raise RuntimeError("the agent broke")
        given = locals()
        config = RunConfig(**{name: given[name] for name in RunConfig.model_fields})
        _complete(Path(results), config, f"run-{seed}")

    monkeypatch.setattr(flows.benchmark_run, "benchmark_run", stand_in)
    results = tmp_path / "results.duckdb"
    matrix = dict(seeds=[0, 1, 2], budget_s=30, results=results, local=True)
    _complete(results, expand_matrix([d.task], [d.agent], ["none"], [d.mode], [2], budget_s=30)[0], "earlier-2")

    state = sweep(**matrix, return_state=True)
    assert state.is_failed() and "s1" in state.message
    assert calls == [0, 1]  # seed 2 was already completed

    calls.clear()
    items = sweep(**{**matrix, "seeds": [0, 2]})
    assert calls == [] and [i.status for i in items] == ["skipped", "skipped"]
    items = sweep(**{**matrix, "seeds": [0], "force": True})
    assert calls == [0] and items[0].status == "completed"


def test_a_parameter_the_flow_does_not_take_fails_before_anything_runs():
    items = plan_sweep(expand_matrix(["gsm8k"], ["claude-tools"], ["claude-x"], ["free"], [0]), set(), False,
                       "r.duckdb", None, 30.0)  # fmt: skip
    accepted = set(items[0].parameters) - {"driver"}
    with pytest.raises(ValueError, match="driver"):
        check_parameters(items, accepted)
    check_parameters(items, accepted | {"driver"})


def test_a2rl_sweep_dry_run_shows_what_would_run(tmp_path, monkeypatch, capsys):
    from a2rl.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    results = tmp_path / "results.duckdb"
    _complete(results, RunConfig(seed=1), "done")
    assert main(["sweep", "--dry-run", "--seeds", "0", "1", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "1 to run, 1 skipped" in out
    assert [line.split()[0] for line in out.splitlines()[:2]] == ["run", "skip"]
