"""RunConfig as command-line options and as flow parameters, derived from its fields (one list, one set of
defaults and choices): a field added to RunConfig is an option of `a2rl run` and `a2rl sweep` and a field of
the typed `config` parameter of both flows (the Prefect UI's run form; tests/test_run_config.py).

A `benchmark-run` flow run has two parameters: `config` (a RunConfig: what the run measures) and `options` (a
RunOptions: where it writes and how an attempt behaves, never part of its identity or its stored config)."""

from __future__ import annotations

import argparse
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from a2rl_bench.paths import checkout_root
from a2rl_bench.records import RunConfig

DEFAULT_RESULTS = Path("results/a2rl.duckdb")
"""The results store every entry point uses unless told otherwise (relative: see `resolve_results`)."""
MATRIX_FIELDS = ("task", "agent", "driver", "mode", "seed")
"""The axes of a sweep: `a2rl sweep` takes several values of each (`--tasks`, ...)."""
FLAG_NAMES = {"budget_s": "budget"}
"""Options whose name is not the field's (kept short where users type them)."""
GRACE_S = 30.0
"""Seconds an agent gets after its budget to save and submit, before it is stopped (not part of the config)."""
ResumePolicy = Literal["continue", "interrupted"]


class RunOptions(BaseModel):
    """Where a run writes and how one attempt behaves: not what the run measures, so not in RunConfig (nor in its
    hash, run id or stored config): a retry may change them and still resumes the same run."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    results: Path = DEFAULT_RESULTS
    """the results store (DuckDB); a relative path is taken from the repository root"""
    runs_dir: Path | None = None
    """where run directories go (default: `runs/` beside the results store)"""
    grace_s: float = Field(default=GRACE_S, ge=0, allow_inf_nan=False)
    """seconds the agent gets after its budget to save and submit, before it is stopped"""
    on_resume: ResumePolicy = "continue"
    """a retried run continues an interrupted agent session with what remains of its budget, or records it
    interrupted"""


def repo_root() -> Path:
    """The checkout a2rl runs from; for an installed wheel, the directory it was started in."""
    return checkout_root() or Path.cwd()


def resolve_results(path: Path | str) -> Path:
    """A flow's results path: absolute as given; a relative one (a deployment's default `results/...`) is taken
    from the repository root, where `a2rl deploy` registered the deployments and `a2rl status` looks, not from
    the temporary directory a process worker runs the flow in (an installed wheel has no repository: from the
    directory it runs in, never from site-packages). The CLI passes absolute paths."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else repo_root() / path


HOST_RESULTS_ENV = "A2RL_HOST_RESULTS"
"""Set on a GPU host's workers: the host's own results store, where every run started there writes (docs/scale-out.md)."""


def run_results(results: Path | str, deployed: bool) -> tuple[Path, str | None]:
    """Where a run writes, and why when it is not `results`: several hosts never share one DuckDB file, so a host
    whose workers set A2RL_HOST_RESULTS keeps the runs its workers take (`deployed`: runs of a deployment) in its
    own store, merged centrally by `a2rl store merge`, whatever store their parameters name (a sweep names the
    central one, which it reads). A run started by hand (`a2rl run --results`) writes where it was told."""
    host = os.environ.get(HOST_RESULTS_ENV)
    if not host or not deployed:
        return resolve_results(results), None
    mine = resolve_results(host)
    given = resolve_results(results)
    return mine, None if mine == given else f"this host's store {mine} ({HOST_RESULTS_ENV}), not {given}"


def field_choices(name: str) -> list[Any] | None:
    """The values a Literal field allows, else None."""
    ann = _unwrap_optional(RunConfig.model_fields[name].annotation)
    return list(typing.get_args(ann)) if typing.get_origin(ann) is Literal else None


def field_type(name: str) -> type:
    ann = _unwrap_optional(RunConfig.model_fields[name].annotation)
    if typing.get_origin(ann) is Literal:
        return type(typing.get_args(ann)[0])
    return ann if isinstance(ann, type) else str


def option_name(name: str, plural: bool = False) -> str:
    return "--" + (FLAG_NAMES.get(name, name) + ("s" if plural else "")).replace("_", "-")


def add_config_options(parser: argparse.ArgumentParser, matrix: bool = False,
                       help_extra: dict[str, str] | None = None) -> None:
    """One option per RunConfig field, default and choices from the field, help from its docstring (plus
    `help_extra[field]`). With `matrix` (a sweep), the MATRIX_FIELDS take one or more values (`--tasks a b`)."""
    for name, info in RunConfig.model_fields.items():
        default, kind, choices = info.default, field_type(name), field_choices(name)
        help_text = " ".join(((info.description or "") + (help_extra or {}).get(name, "")).split())
        if matrix and name in MATRIX_FIELDS:
            parser.add_argument(option_name(name, plural=True), dest=name, nargs="+", type=kind, default=[default],
                                choices=choices, help=help_text)  # fmt: skip
        elif kind is bool:
            parser.add_argument(option_name(name), dest=name, action=argparse.BooleanOptionalAction,
                                default=default, help=help_text)  # fmt: skip
        else:
            parser.add_argument(option_name(name), dest=name, type=kind, default=default, choices=choices,
                                help=help_text)  # fmt: skip


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of `a2rl run`'s options (ValueError with pydantic's message on a bad value)."""
    return RunConfig(**{name: getattr(args, name) for name in RunConfig.model_fields})


def common_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The non-matrix fields of `a2rl sweep`'s options: the settings every run of the matrix shares."""
    return {name: getattr(args, name) for name in RunConfig.model_fields if name not in MATRIX_FIELDS}


def run_parameters(config: RunConfig, options: RunOptions | None = None) -> dict[str, Any]:
    """The `benchmark-run` parameters (JSON) of a config and its options: what a sweep or a caller passes to the
    deployment, and what a retry from the UI reuses. Every field is given, so a deployment's defaults never apply."""
    return {"config": config.model_dump(mode="json"), "options": (options or RunOptions()).model_dump(mode="json")}


def nest_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """`benchmark-run` parameters in today's shape (`config`, `options`) from either shape: today's is returned as
    it is; the flat keywords of before (`task=..., seed=..., results=...`: a flow run or deployment made by an
    older a2rl) are nested. ValueError, one line, naming what is neither."""
    nested = {"config", "options"}
    if not set(parameters) - nested:
        return parameters
    if mixed := sorted(set(parameters) & nested):
        flat = ", ".join(sorted(set(parameters) - nested))
        raise ValueError(f"benchmark-run parameters mix `{'`, `'.join(mixed)}` with flat keywords {flat}: give every "
                         "setting inside `config` or `options`")  # fmt: skip
    fields, option_fields = set(RunConfig.model_fields), set(RunOptions.model_fields)
    if unknown := sorted(set(parameters) - fields - option_fields):
        raise ValueError(f"benchmark-run takes `config` (a RunConfig) and `options` (a RunOptions); "
                         f"{', '.join(unknown)} is neither a field of RunConfig nor of RunOptions")  # fmt: skip
    return {"config": {k: v for k, v in parameters.items() if k in fields},
            "options": {k: v for k, v in parameters.items() if k in option_fields}}  # fmt: skip


def parameter_mismatch(parameters: dict[str, Any]) -> str | None:
    """One line naming the parameters the `benchmark-run` flow does not take (flat keywords of before, or unknown
    ones), and what to do; None when it takes them all."""
    if not (extra := sorted(set(parameters) - {"config", "options"})):
        return None
    return (f"parameters the benchmark-run flow does not take: {', '.join(extra)} (it takes `config` and `options`); "
            "a deployment registered by an older a2rl: register it again with `a2rl deploy` and start the run anew")


def config_from_parameters(parameters: dict[str, Any]) -> RunConfig:
    """The RunConfig of a set of `benchmark-run` parameters (a deployment's, a sweep item's, a flow run's; the
    flat shape of before is read too)."""
    return RunConfig.model_validate(nest_parameters(parameters).get("config") or {})


def options_from_parameters(parameters: dict[str, Any]) -> RunOptions:
    """The RunOptions of a set of `benchmark-run` parameters (either shape, as `config_from_parameters`)."""
    return RunOptions.model_validate(nest_parameters(parameters).get("options") or {})


def _unwrap_optional(ann: Any) -> Any:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return args[0] if len(args) == 1 else ann
    return ann
