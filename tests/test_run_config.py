"""RunConfig is the one source of a run's settings: every field is an option of `a2rl run` and `a2rl sweep`, a
parameter of the `benchmark-run` and `sweep` flows and of prefect.yaml's `benchmark-run`, with the same
default everywhere, so one run has one config hash from any entry point."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from a2rl.cli import build_parser
from a2rl.records import RunConfig
from a2rl.run_options import (
    DEFAULT_RESULTS,
    MATRIX_FIELDS,
    config_from_args,
    config_from_parameters,
    field_choices,
    field_type,
    option_name,
    resolve_results,
)
from flows.benchmark_run import benchmark_run
from flows.sweep import run_parameters, sweep

PREFECT_YAML = Path(__file__).resolve().parent.parent / "prefect.yaml"
FIELDS = list(RunConfig.model_fields)


def flow_defaults(flow) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(flow.fn).parameters.items()}


def deployments() -> dict[str, dict]:
    return {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}


def other_value(name: str) -> Any:
    """A valid value of the field that is not its default."""
    default = RunConfig.model_fields[name].default
    if choices := field_choices(name):
        return next(c for c in choices if c != default)
    kind = field_type(name)
    if kind is bool:
        return not default
    if kind in (int, float):
        return (default or 0) + (3 if kind is int else 7.5)
    return f"{default}-x"


def option_args(name: str, value: Any, plural: bool = False) -> list[str]:
    if isinstance(value, bool):
        return [option_name(name) if value else "--no-" + option_name(name)[2:]]
    return [option_name(name, plural), str(value)]


def test_every_field_is_a_flow_parameter_with_the_same_default():
    run, sw = flow_defaults(benchmark_run), flow_defaults(sweep)
    for name, info in RunConfig.model_fields.items():
        assert run[name] == info.default, f"benchmark-run's {name} default differs from RunConfig's"
        if name in MATRIX_FIELDS:
            assert name + "s" in sw, f"sweep has no {name}s axis"
        else:
            assert sw[name] == info.default, f"sweep's {name} default differs from RunConfig's"
    assert run["results"] == sw["results"] == DEFAULT_RESULTS


def test_prefect_yaml_benchmark_run_parameters_are_runconfigs_defaults():
    params = deployments()["benchmark-run"]["parameters"]
    assert set(FIELDS) <= set(params), f"prefect.yaml lacks {sorted(set(FIELDS) - set(params))}"
    assert set(params) <= set(flow_defaults(benchmark_run)), "prefect.yaml names a parameter the flow lacks"
    assert config_from_parameters(params) == RunConfig()
    assert Path(params["results"]) == DEFAULT_RESULTS


def test_prefect_yaml_sweep_parameters_are_parameters_of_the_sweep_flow():
    params = deployments()["nightly-sweep"]["parameters"]
    assert set(params) <= set(flow_defaults(sweep))
    assert Path(params["results"]) == DEFAULT_RESULTS


def test_every_field_is_settable_from_a2rl_run():
    parser = build_parser(["run"])
    assert config_from_args(parser.parse_args(["run"])) == RunConfig()
    wanted = {name: other_value(name) for name in FIELDS}
    argv = ["run"] + [a for name, v in wanted.items() for a in option_args(name, v)]
    assert config_from_args(parser.parse_args(argv)).model_dump() == RunConfig(**wanted).model_dump()


def test_every_field_is_settable_from_a2rl_sweep():
    from a2rl.run_options import common_from_args

    parser = build_parser(["sweep"])
    args = parser.parse_args(["sweep"])
    assert common_from_args(args) == {k: v for k, v in RunConfig().model_dump().items() if k not in MATRIX_FIELDS}
    wanted = {name: other_value(name) for name in FIELDS}
    argv = ["sweep"] + [a for name, v in wanted.items() for a in option_args(name, v, plural=name in MATRIX_FIELDS)]
    args = parser.parse_args(argv)
    assert common_from_args(args) == {k: v for k, v in wanted.items() if k not in MATRIX_FIELDS}
    assert all(getattr(args, name) == [wanted[name]] for name in MATRIX_FIELDS)


@pytest.mark.parametrize("changed", [{}, {"val_limit": 0, "test_limit": 0, "grading_workers": 2, "strict_mode": True}])
def test_one_run_has_one_config_hash_from_the_cli_a_deployment_and_a_sweep(changed):
    argv = ["run"] + [a for name, v in changed.items() for a in option_args(name, v)]
    from_cli = config_from_args(build_parser(["run"]).parse_args(argv))
    deployment = {**deployments()["benchmark-run"]["parameters"], **changed}
    from_deployment = config_from_parameters(deployment)
    from_sweep = config_from_parameters(run_parameters(from_cli, "results/x.duckdb", None, 30.0))
    assert from_cli.config_hash() == from_deployment.config_hash() == from_sweep.config_hash()
    if "val_limit" in changed:  # 0 means all, from any entry point
        assert from_cli.val_limit is None and from_deployment.test_limit is None


def test_a_deployments_relative_results_is_taken_from_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a process worker runs flows in a temporary directory
    assert resolve_results("results/a2rl.duckdb") == PREFECT_YAML.parent / "results" / "a2rl.duckdb"
    assert resolve_results(tmp_path / "r.duckdb") == tmp_path / "r.duckdb"
