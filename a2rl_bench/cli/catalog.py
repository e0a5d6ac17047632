"""`a2rl agents` and `a2rl drivers add|list|rm`: what can run, and the driver LLMs saved for it.

The driver options are made from `a2rl_bench.blocks.DriverConfig`'s fields, so a field added there (a provider kind,
a price) appears on the command line without a change here.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import typing
from dataclasses import dataclass

KEY_FIELD = "api_key"
KEY_ENV_FIELD = "api_key_env"
"""A block may name the variable to read its key from at run time; from the command line the key is given
once (`--key-env` reads it now), so there is one option for it, not two that differ in when they read."""


@dataclass(frozen=True)
class AgentInfo:
    """What an agent needs before it can run."""

    id: str
    summary: str
    driver_api: str | None
    """Wire protocol its driver must speak; None: a scripted agent, no driver."""
    program: str | None
    """The CLI it runs, which must be on PATH."""
    install_hint: str | None

    @property
    def needs(self) -> str:
        if self.driver_api is None:
            return "nothing (scripted; no --driver)"
        how = ("a model id with ANTHROPIC_API_KEY, or a saved driver" if self.driver_api.startswith("anthropic")
               else "a saved driver: a2rl drivers add NAME --model M --api "
               f"{self.driver_api.split(' or ')[0]} --key-env VAR")
        needs = [f"--driver speaking the {self.driver_api} API ({how})"]
        if self.program:
            needs.append(f"`{self.program}` on PATH" + (f" ({self.install_hint})" if self.install_hint else ""))
        return "; ".join(needs)


def agent_infos() -> list[AgentInfo]:
    from a2rl_bench.agents import agent_class, list_agents

    infos = []
    for agent_id in list_agents():
        cls = agent_class(agent_id)
        apis = getattr(cls, "apis", None) or (("anthropic",) if cls.uses_llm else ())
        api = " or ".join(apis) if cls.uses_llm else None
        infos.append(AgentInfo(agent_id, _first_sentence(cls), api,
                               getattr(cls, "executable", None), getattr(cls, "install_hint", None)))  # fmt: skip
    return infos


def _first_sentence(cls: type, limit: int = 120) -> str:
    own = cls.__dict__.get("__doc__")  # not an inherited base-class docstring
    doc = " ".join((own or sys.modules[cls.__module__].__doc__ or "").split())
    sentence = doc.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[: limit - 3] + "..."


def agents_help() -> str:
    """For `a2rl run --help`: every agent id and whether it needs `--driver`."""
    try:
        infos = agent_infos()
    except Exception:  # --help must work even where an adapter cannot be imported
        return ""
    scripted = [i.id for i in infos if i.driver_api is None]
    llm = [i.id for i in infos if i.driver_api is not None]
    return f"scripted: {', '.join(scripted)}; need --driver: {', '.join(llm)} (details: a2rl agents)"


def cmd_agents(args: argparse.Namespace) -> int:
    for info in agent_infos():
        print(f"{info.id:20} {info.summary}\n{'':20} needs: {info.needs}")
        if info.program:
            print(f"{'':20} {installed(info.program)}")
    return 0


def installed(program: str) -> str:
    """Where the agent's CLI is (PATH first, then the project's tools), with its version where the install
    records one (an npm package.json; nothing is run), or that it is missing and how to get it."""
    from a2rl_bench.agents.cli_agents.install import find_cli, npm_package

    found = find_cli(program)
    if found is None:
        return f"`{program}`: NOT installed (make tools)"
    package = npm_package(found.resolve())
    version = ""
    if package is not None:
        try:
            version = " " + json.loads((package / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            pass
    return f"`{program}`{version}: installed at {found}"


# ---- drivers ---------------------------------------------------------------------------------------------------


def add_driver_parsers(sub) -> None:
    """`a2rl drivers add|list|rm`; the options of `add` come from the driver's fields without Prefect."""
    drivers = sub.add_parser("drivers", help="save, list and remove driver LLMs (DriverConfig blocks)",
                             description="Driver LLMs of LLM agents, saved as Prefect DriverConfig blocks on the "
                             "Prefect server in use (the local one under PREFECT_HOME unless PREFECT_API_URL is set). "
                             "A run names one with --driver NAME.")  # fmt: skip
    drivers.set_defaults(print_help=drivers.print_help)  # `a2rl drivers` alone: the help, not an error
    actions = drivers.add_subparsers(dest="action")
    from a2rl_bench.cli.errors import DefaultsHelpFormatter

    add = actions.add_parser("add", help="save a driver", formatter_class=DefaultsHelpFormatter)
    add.add_argument("name", help="name to save it under (what --driver takes)")
    _add_field_options(add)
    key = add.add_mutually_exclusive_group()
    key.add_argument("--key-env", metavar="VAR", help="read the API key from this environment variable now and save "
                     "it with the driver (secret; never shown)")
    key.add_argument("--key-prompt", action="store_true", help="ask for the API key (not echoed)")
    add.add_argument("--force", action="store_true", help="replace a saved driver of the same name")
    actions.add_parser("list", help="list the saved drivers (keys never shown)")
    rm = actions.add_parser("rm", help="remove a saved driver")
    rm.add_argument("name")


def _add_field_options(add: argparse.ArgumentParser) -> None:
    from a2rl_bench.records import DriverFields  # the block's fields without Prefect: `--help` stays light

    for name, field in DriverFields.model_fields.items():
        if name in (KEY_FIELD, KEY_ENV_FIELD):  # one way to give a key here: --key-env or --key-prompt
            continue
        kind, choices = _arg_type(field.annotation)
        add.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, choices=choices,
                         required=field.is_required(), default=None if field.is_required() else field.default,
                         help=field.description)  # fmt: skip


def _arg_type(annotation) -> tuple[typing.Callable | None, list | None]:
    """argparse type and choices for a field's annotation (`X | None` unwrapped, Literals as choices)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return type(args[0]), list(args)
    if args and typing.get_origin(annotation) is not None:
        return _arg_type(args[0])
    return (annotation if annotation in (int, float, str) else str), None


def cmd_drivers(args: argparse.Namespace) -> int:
    from a2rl_bench.cli.display import set_prefect_console_level

    if args.action is None:
        args.print_help()
        return 0
    set_prefect_console_level("off")  # the server's start and stop lines are not what the user asked for
    if args.action == "add":
        return _drivers_add(args)  # it may prompt for the key first: its wait is said after that
    with _server_wait("asking"):
        return {"list": _drivers_list, "rm": _drivers_rm}[args.action](args)


def _server_wait(doing: str):
    """The wait for the Prefect server that holds the drivers, said and counted (a local one starts first)."""
    from a2rl_bench.cli.display import Waiting

    where = os.environ.get("PREFECT_API_URL") or "a local Prefect server (started for this command)"
    return Waiting(f"{doing} {where}")


def _drivers_add(args: argparse.Namespace) -> int:
    from a2rl_bench.blocks import DriverConfig

    fields = {name: getattr(args, name) for name in DriverConfig.model_fields if name not in (KEY_FIELD, KEY_ENV_FIELD)}
    if args.key_env:
        if not os.environ.get(args.key_env):
            print(f"a2rl: --key-env {args.key_env}: that variable is not set here; export it, or use --key-prompt",
                  file=sys.stderr)  # fmt: skip
            return 2
        fields[KEY_FIELD] = os.environ[args.key_env]
    elif args.key_prompt:
        fields[KEY_FIELD] = getpass.getpass(f"API key for {args.name}: ")
    block = DriverConfig(**{k: v for k, v in fields.items() if v is not None})
    with _server_wait("saving the driver on"):
        if not args.force and _saved_driver_names().count(args.name):
            print(f"a2rl: a driver named {args.name!r} is saved already; add --force to replace it", file=sys.stderr)
            return 2
        block.save(args.name, overwrite=True)
    print(f"saved driver {args.name!r}: {describe_driver(block)}; use it with: a2rl run --driver {args.name}")
    return 0


def describe_driver(block) -> str:
    """What a user set: model, API, endpoint, prices, whether a key is saved (never the key)."""
    prices = [f"{getattr(block, f)} {label}" for f, label in (("input_usd_per_mtok", "in"), ("output_usd_per_mtok", "out"),
              ("cache_read_usd_per_mtok", "cache read"), ("cache_write_usd_per_mtok", "cache write")) if getattr(block, f)]  # fmt: skip
    parts = [f"model {block.model}", f"{block.api} API", f"endpoint {block.base_url or 'the vendor default'}",
             f"USD per million tokens: {', '.join(prices)}" if prices else "no prices (costs read 0)"]  # fmt: skip
    if block.api_key_env:
        parts.append(f"key read from ${block.api_key_env} when a run starts")
    else:
        parts.append("with an API key" if block.api_key.get_secret_value() else "WITHOUT an API key")
    return "; ".join(parts)


def _saved_drivers():
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    from a2rl_bench.tasks.preflight import saved_blocks_possible
    from a2rl_bench.blocks import DriverConfig

    if not saved_blocks_possible():
        return []
    with get_client(sync_client=True) as client:
        try:
            return client.read_block_documents_by_type(DriverConfig.get_block_type_slug(), include_secrets=False)
        except (ObjectNotFound, PrefectHTTPStatusError) as e:  # 404: the block type was never registered
            if isinstance(e, PrefectHTTPStatusError) and e.response.status_code != 404:
                raise
            return []


def _saved_driver_names() -> list[str]:
    return [doc.name for doc in _saved_drivers()]


def _drivers_list(args: argparse.Namespace) -> int:
    docs = _saved_drivers()
    if not docs:
        print("no saved drivers; save one with: a2rl drivers add NAME --model MODEL --key-env ANTHROPIC_API_KEY")
        return 0
    for doc in sorted(docs, key=lambda d: d.name):
        data = {k: v for k, v in doc.data.items() if k != KEY_FIELD and v not in (None, 0.0)}
        print(f"{doc.name:20} " + " ".join(f"{k}={v}" for k, v in data.items()))
    return 0


def _drivers_rm(args: argparse.Namespace) -> int:
    from a2rl_bench.blocks import DriverConfig

    if args.name not in _saved_driver_names():
        print(f"a2rl: no saved driver named {args.name!r} (see: a2rl drivers list)", file=sys.stderr)
        return 2
    DriverConfig.delete(args.name)
    print(f"removed driver {args.name!r}")
    return 0
