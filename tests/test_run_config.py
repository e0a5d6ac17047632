"""RunConfig is the one source of a run's settings: every field is an option of `a2rl run` and `a2rl sweep`, a
typed field of the `config` parameter of the `benchmark-run` and `sweep` flows (the Prefect UI's run form) and
of prefect.yaml's `config:`, with the same default everywhere, so one run has one config hash from any entry
point."""

from __future__ import annotations

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
    RunOptions,
    config_from_parameters,
    field_choices,
    field_type,
    nest_parameters,
    option_name,
    options_from_parameters,
    resolve_results,
    run_parameters,
)
from a2rl.flows.benchmark_run import benchmark_run
from a2rl.flows.sweep import SweepConfig, sweep

PREFECT_YAML = Path(__file__).resolve().parent.parent / "prefect.yaml"
FIELDS = list(RunConfig.model_fields)


def form(flow) -> dict[str, Any]:
    """The flow's parameter schema, as the Prefect UI's run form and a deployment's schema have it."""
    from prefect.utilities.callables import parameter_schema

    return parameter_schema(flow).model_dump()


def model_of(schema: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref") or prop["allOf"][0]["$ref"]
    return schema["definitions"][ref.rsplit("/", 1)[-1]]


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


def test_the_run_forms_config_is_runconfig_with_every_field_typed_and_its_default():
    schema = form(benchmark_run)
    assert set(schema["properties"]) == {"config", "options"}
    run_config, options = (model_of(schema, schema["properties"][p]) for p in ("config", "options"))
    expected = RunConfig.model_json_schema()["properties"]
    assert run_config["properties"] == expected  # typed (enums, bounds) and described as RunConfig says
    for name, info in RunConfig.model_fields.items():
        assert expected[name].get("default") == info.default, name
        assert expected[name].get("description"), f"{name} has no help text in the form"
    assert expected["mode"]["enum"] == list(field_choices("mode"))
    assert schema["properties"]["config"]["default"] == RunConfig().model_dump(mode="json")
    assert set(options["properties"]) == set(RunOptions.model_fields)
    assert schema["properties"]["options"]["default"]["results"] == str(DEFAULT_RESULTS)


def test_the_sweep_form_is_one_typed_config_whose_run_is_runconfig():
    schema = form(sweep)
    assert set(schema["properties"]) == {"config"}
    sweep_config = model_of(schema, schema["properties"]["config"])
    assert set(sweep_config["properties"]) == set(SweepConfig.model_fields)
    run = sweep_config["properties"]["run"]
    assert model_of(schema, run)["properties"] == RunConfig.model_json_schema()["properties"]
    assert set(model_of(schema, sweep_config["properties"]["matrix"])["properties"]) == {f + "s" for f in MATRIX_FIELDS}


def test_the_flows_take_typed_configs_from_json_parameters():
    """What a deployment, a sweep or a UI retry hands the flow (the stored JSON) becomes the typed models."""
    params = run_parameters(RunConfig(seed=3, val_limit=0), RunOptions(results=Path("r.duckdb"), grace_s=5))
    bound = benchmark_run.validate_parameters(params)
    assert bound["config"] == RunConfig(seed=3, val_limit=None) and bound["options"].grace_s == 5
    swept = sweep.validate_parameters({"config": {"run": {"budget_s": 60}, "matrix": {"seeds": [0, 1]}}})
    assert [c.seed for c in swept["config"].configs()] == [0, 1]
    assert all(c.budget_s == 60 for c in swept["config"].configs())


def test_old_flat_parameters_migrate_where_read_and_are_refused_clearly_by_the_flow():
    """A flow run or deployment made before the typed parameters has flat keywords: a2rl reads them (status,
    the parameters' config); the flow itself refuses them naming what it takes (register again: a2rl deploy)."""
    flat = {"task": "gsm8k", "seed": 3, "val_limit": 0, "results": "r.duckdb", "grace_s": 5, "on_resume": "continue"}
    assert config_from_parameters(flat) == RunConfig(seed=3, val_limit=None)
    assert options_from_parameters(flat) == RunOptions(results=Path("r.duckdb"), grace_s=5)
    assert nest_parameters(flat) == {"config": {"task": "gsm8k", "seed": 3, "val_limit": 0},
                                     "options": {"results": "r.duckdb", "grace_s": 5, "on_resume": "continue"}}
    with pytest.raises(ValueError, match="colour is neither a field of RunConfig nor of RunOptions"):
        config_from_parameters({**flat, "colour": "red"})
    with pytest.raises(ValueError, match="mix `config` with flat keywords seed"):
        config_from_parameters({"config": {}, "seed": 3})
    with pytest.raises(Exception, match=r"expects parameters \['config', 'options'\]"):
        benchmark_run.validate_parameters(flat)


def test_prefect_yaml_benchmark_run_config_is_runconfigs_defaults():
    params = deployments()["benchmark-run"]["parameters"]
    assert set(params) == {"config", "options"}
    assert set(params["config"]) == set(FIELDS), "prefect.yaml's config lists every RunConfig field"
    assert RunConfig.model_validate(params["config"]) == RunConfig()
    assert RunOptions.model_validate(params["options"]) == RunOptions()
    assert benchmark_run.validate_parameters(params)["config"] == RunConfig()


def test_prefect_yaml_sweep_config_is_a_sweepconfig():
    params = deployments()["nightly-sweep"]["parameters"]
    config = sweep.validate_parameters(params)["config"]
    assert SweepConfig.model_validate(params["config"]) == config
    assert config.options.results == DEFAULT_RESULTS and not config.local
    assert len(config.configs()) == 2 * 3  # two agents × three seeds


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
    deployment = deployments()["benchmark-run"]["parameters"]
    from_deployment = config_from_parameters({**deployment, "config": {**deployment["config"], **changed}})
    from_sweep = config_from_parameters(run_parameters(from_cli, RunOptions(results=Path("results/x.duckdb"))))
    assert from_cli.config_hash() == from_deployment.config_hash() == from_sweep.config_hash()
    if "val_limit" in changed:  # 0 means all, from any entry point
        assert from_cli.val_limit is None and from_deployment.test_limit is None


def test_a_deployments_relative_results_is_taken_from_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a process worker runs flows in a temporary directory
    assert resolve_results("results/a2rl.duckdb") == PREFECT_YAML.parent / "results" / "a2rl.duckdb"
    assert resolve_results(tmp_path / "r.duckdb") == tmp_path / "r.duckdb"


@pytest.mark.parametrize("shape", ["nested", "flat"])
def test_a2rl_status_finds_a_runs_harness_from_its_flow_runs_parameters_of_either_shape(tmp_path, shape):
    from a2rl.ops.status import FlowRunRow, harness_dir_of

    flow_run_id = "0b1c2d3e-0000-4000-8000-000000000000"
    harness = tmp_path / "runs" / "gsm8k-reference-sft-abc123-0b1c2d3e" / "harness"
    harness.mkdir(parents=True)
    options = RunOptions(results=tmp_path / "r.duckdb", runs_dir=tmp_path / "runs")
    params = run_parameters(RunConfig(), options)
    if shape == "flat":  # a flow run of an a2rl before the typed parameters
        params = {**params["config"], "results": str(options.results), "runs_dir": str(options.runs_dir)}
    row = FlowRunRow(id=flow_run_id, flow="benchmark-run", name="x", state="Running", state_type="RUNNING",
                     start="", elapsed_s=None, parameters=params)  # fmt: skip
    assert harness_dir_of(row) == harness
