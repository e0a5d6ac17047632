"""RunConfig is the one source of a run's settings: every field is an option of `a2rl run` and `a2rl sweep`, a
typed field of the `config` parameter of the `benchmark-run` and `sweep` flows (the Prefect UI's run form) and
of prefect.yaml's `config:`, with the same default everywhere, so one run has one config hash from any entry
point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from a2rl_bench.cli import build_parser
from a2rl_bench.records import RunConfig
from a2rl_bench.run_options import (
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
from a2rl_bench.flows.benchmark_run import benchmark_run
from a2rl_bench.flows.sweep import SweepConfig, sweep

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
    from a2rl_bench.run_options import common_from_args

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


def test_the_default_eval_batch_keeps_the_hash_of_16_and_the_help_says_what_it_does(capsys):
    """The default batch (None: by numeric path) gives batch 16's answers on every path, so a run's hash counts it
    as 16: stored runs and a sweep's completed settings keep their meaning; another batch is another setting."""
    assert RunConfig().eval_batch_size is None
    assert RunConfig().config_hash() == RunConfig(eval_batch_size=16).config_hash()
    assert RunConfig().config_hash() != RunConfig(eval_batch_size=32).config_hash()
    assert RunConfig(eval_batch_size=None, seed=1).config_hash() == RunConfig(eval_batch_size=16, seed=1).config_hash()
    with pytest.raises(SystemExit):
        build_parser(["run"]).parse_args(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "on the CPU (fp32, whose answers do not depend on the batch) a split's prompts up to 48 at once" in help_text
    assert "else 16 (GPU and CPU bf16 answers may depend on it)" in help_text


def test_a_deployments_relative_results_is_taken_from_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a process worker runs flows in a temporary directory
    assert resolve_results("results/a2rl.duckdb") == PREFECT_YAML.parent / "results" / "a2rl.duckdb"
    assert resolve_results(tmp_path / "r.duckdb") == tmp_path / "r.duckdb"


@pytest.mark.parametrize("shape", ["nested", "flat"])
def test_a2rl_status_finds_a_runs_harness_from_its_flow_runs_parameters_of_either_shape(tmp_path, shape):
    from a2rl_bench.ops.status import FlowRunRow, harness_dir_of

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


# Limits are constraints of the types (issue #46): each bad value, the field that refuses it.
BAD_VALUES = {"budget_s": [-5, 0, float("nan"), float("inf"), 8 * 24 * 3600], "seed": [-1], "max_submissions": [0],
              "val_limit": [-3], "test_limit": [-1], "max_workspace_bytes": [0], "max_checkpoint_bytes": [-1],
              "grading_workers": [0], "eval_batch_size": [0], "base_model": ["", "   "]}  # fmt: skip


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in BAD_VALUES.items() for v in vs])
def test_a_config_out_of_its_limits_is_refused_where_it_is_made_naming_its_field(field, value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        RunConfig(**{field: value})
    assert [e["loc"] for e in refused.value.errors()] == [(field,)]
    from prefect.exceptions import ParameterTypeError

    with pytest.raises(ParameterTypeError, match=rf"config\.{field}:"):  # the flows' parameters (a deployment's)
        benchmark_run.validate_parameters({"config": {field: value}, "options": {}})
    with pytest.raises(ParameterTypeError, match=rf"config\.run\.{field}:"):  # and a sweep's
        sweep.validate_parameters({"config": {"run": {field: value}}})


def test_options_and_sweep_limits_are_constraints_too():
    from pydantic import ValidationError

    for bad in ({"options": {"grace_s": -1}}, {"gpu_slots": 0}, {"poll_s": 0}, {"watch_timeout_s": -1},
                {"matrix": {"seeds": [0, -1]}}):  # fmt: skip
        with pytest.raises(ValidationError):
            SweepConfig.model_validate(bad)


def test_the_run_form_shows_the_limits():
    """The Prefect UI renders the form from the parameter schema: its bounds are what it refuses."""
    run_config = model_of(form(benchmark_run), form(benchmark_run)["properties"]["config"])["properties"]
    assert run_config["budget_s"]["exclusiveMinimum"] == 0 and run_config["budget_s"]["maximum"] == 7 * 24 * 3600
    assert run_config["seed"]["minimum"] == 0 and run_config["max_submissions"]["minimum"] == 1
    assert {"minimum": 0} in [{k: v for k, v in alt.items() if k == "minimum"} for alt in run_config["val_limit"]["anyOf"]]


def test_the_cli_names_its_own_flag_for_a_refused_sweep_value(tmp_path, capsys):
    """`a2rl sweep --budget -5` is refused naming --budget (the flag typed), not the field's name."""
    from a2rl_bench.cli import main

    assert main(["sweep", "--budget", "-5", "--dry-run", "--results", str(tmp_path / "r.duckdb")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("a2rl: --budget -5") and "greater than 0" in line, line
    assert main(["sweep", "--seeds", "0", "-2", "--dry-run", "--results", str(tmp_path / "r.duckdb")]) == 2
    assert capsys.readouterr().err.strip().startswith("a2rl: --seeds"), "the matrix's flag"
    assert not (tmp_path / "r.duckdb").exists()


def test_a_deployment_refuses_a_bad_config_before_a_flow_run_exists(prefect_harness, tmp_path):
    """A deployment's parameter schema is the flow's, enforced by the server: a run of it with a negative budget
    is refused at creation, naming the field (no flow run, so no run directory and no row)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.utilities.callables import parameter_schema

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(benchmark_run)
        deployment_id = client.create_deployment(flow_id, f"limits-{tmp_path.name}",
                                                 parameter_openapi_schema=parameter_schema(benchmark_run).model_dump(),
                                                 enforce_parameter_schema=True)  # fmt: skip
        options = RunOptions(results=tmp_path / "r.duckdb").model_dump(mode="json")
        with pytest.raises(PrefectHTTPStatusError) as refused:
            client.create_flow_run_from_deployment(deployment_id, parameters={"config": {"budget_s": -5},
                                                                              "options": options})  # fmt: skip
        assert refused.value.response.status_code == 409 and "budget_s" in refused.value.response.text
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        made = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
        assert made == []
        ok = client.create_flow_run_from_deployment(deployment_id, parameters={"config": {"budget_s": 5},
                                                                                "options": options})  # fmt: skip
        client.delete_flow_run(ok.id)  # a good one is taken (and removed: no worker here)
    assert not (tmp_path / "r.duckdb").exists() and not (tmp_path / "runs").exists()
