"""The `sweep` flow: a matrix of benchmark runs, each its own `benchmark-run` flow run.

Its one parameter is a SweepConfig (the runs' shared RunConfig, the matrix, their options, how to start them).
Configurations already completed in the results store (same `config_hash`, status 'completed') are skipped
unless `force`. With a server (`local=False`) every run is started through the `benchmark-run` deployment, so
each one is watchable and retryable on its own in the UI, and runs share the GPUs through the global
concurrency limit `gpu` (created here if missing, `gpu_slots` slots; `benchmark-run` holds one slot for its
agent session). `local=True` runs the same matrix in this process, one subflow after another.
"""

from __future__ import annotations

import time
from itertools import product
from pathlib import Path
from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field

from a2rl_bench.safetext import cells
from a2rl_bench.ops.prefect_local import RUN_DEPLOYMENT
from a2rl_bench.records import Mode, RunConfig
from a2rl_bench.run_options import MATRIX_FIELDS, RunOptions, resolve_results, run_parameters
from a2rl_bench.store.results import ResultsStore

from a2rl_bench.ops.gpu_slots import GPU_LIMIT  # noqa: E402
FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
STALL_S = 600.0
"""A sweep whose runs have all been waiting this long says that no worker seems to take them."""

SweepStatus = Literal["skipped", "planned", "launched", "completed", "failed"]


class SweepItem(BaseModel):
    """One cell of the sweep matrix and what became of it."""

    config: RunConfig
    parameters: dict[str, Any]
    """The `benchmark-run` parameters that reproduce `config`."""
    status: SweepStatus = "planned"
    state: str | None = None
    """The Prefect state name of its flow run (Completed, Failed, Crashed, ...)."""
    flow_run_id: str | None = None
    detail: str | None = None

    @property
    def label(self) -> str:
        c = self.config
        driver = "" if c.driver == "none" else f"-{c.driver}"
        return f"{c.task}-{c.agent}{driver}-{c.mode}-s{c.seed}"


class SweepMatrix(BaseModel):
    """The axes of a sweep; an axis left empty takes the sweep's `run` value (RunConfig's default unless set)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    tasks: list[str] | None = None
    agents: list[str] | None = None
    drivers: list[str] | None = None
    """driver LLMs, paired with LLM agents only (a scripted agent runs once per cell with driver `none`)"""
    modes: list[Mode] | None = None
    seeds: list[Annotated[int, Field(ge=0)]] | None = None


class SweepConfig(BaseModel):
    """The one parameter of the `sweep` flow: the runs (`run` × `matrix`), where they write (`options`), and how
    the sweep starts and follows them."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    run: RunConfig = Field(default_factory=RunConfig)
    """the settings every run shares; the matrix's axes vary its task, agent, driver, mode and seed"""
    matrix: SweepMatrix = Field(default_factory=SweepMatrix)
    options: RunOptions = Field(default_factory=RunOptions)
    """every run's options (a relative `results` is taken from the repository root)"""
    local: bool = False
    """run here, one subflow after another (no server, no worker needed); otherwise start every run through
    `deployment` on its work pool and (with `wait`) follow them until they end"""
    force: bool = False
    """also run configurations already completed in the results store"""
    gpu_slots: int = Field(default=1, ge=1)
    """slots of the global concurrency limit `gpu`, i.e. agent sessions at once across workers"""
    deployment: str = RUN_DEPLOYMENT
    job_variables: dict[str, Any] | None = None
    """per-run infrastructure overrides for the deployment (e.g. {"env": {...}})"""
    wait: bool = True
    poll_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    watch_timeout_s: float | None = Field(default=None, gt=0)
    """stop following after this long (the runs go on, the sweep fails saying so); None = a bound from the
    matrix: each run's budget three times over plus an hour, per run"""
    merge_from: list[str] | None = None
    """host stores (paths or glob patterns; relative ones from the repository root) merged into `results` before
    planning and after the runs end, when runs write their hosts' own stores (A2RL_HOST_RESULTS;
    docs/scale-out.md)"""

    def configs(self) -> list[RunConfig]:
        """Every run of the matrix (`expand_matrix`)."""
        m, r = self.matrix, self.run
        common = {name: getattr(r, name) for name in RunConfig.model_fields if name not in MATRIX_FIELDS}
        return expand_matrix(m.tasks or [r.task], m.agents or [r.agent], m.drivers or [r.driver],
                             m.modes or [r.mode], m.seeds or [r.seed], **common)  # fmt: skip


def expand_matrix(
    tasks: list[str], agents: list[str], drivers: list[str], modes: list[str], seeds: list[int], **common: Any
) -> list[RunConfig]:
    """Every (task, agent, driver, mode, seed) combination as a RunConfig, duplicates dropped, order kept.
    Drivers pair with LLM agents only: a scripted agent runs once per cell with driver `none` (and an LLM agent
    never with `none`), so a driver-swap sweep may list scripted baselines beside the LLM agents."""
    from a2rl_bench.agents import uses_llm

    llm = {agent: uses_llm(agent) for agent in agents}
    configs: dict[str, RunConfig] = {}
    for task, agent, driver, mode, seed in product(tasks, agents, drivers, modes, seeds):
        if not llm[agent]:
            driver = "none"
        elif driver == "none":
            continue
        config = RunConfig(task=task, agent=agent, driver=driver, mode=mode, seed=seed, **common)
        configs.setdefault(config.config_hash(), config)
    return list(configs.values())


def completed_hashes(results: Path) -> set[str]:
    """Config hashes with a completed run in the results store (none if the store does not exist yet); a run the
    machine starved (failure class `environment`) is not done: its configuration runs again."""
    if not Path(results).exists():
        return set()
    df = ResultsStore(results).query("SELECT DISTINCT config_hash FROM runs WHERE status = 'completed' "
                                     "AND failure_class IS DISTINCT FROM 'environment'")
    return set(df["config_hash"])


def merge_hosts(results: Path, patterns: list[str], when: str) -> None:
    """Merge the host stores the patterns name into the sweep's store (`a2rl_bench.store.merge`), so the skip check and
    the analysis see every host's runs. A refused run directory is a warning: it must not stop the sweep."""
    from a2rl_bench.ops.prefect_local import server_flow_run_lookup
    from a2rl_bench.store.merge import expand_sources, merge_stores

    logger = get_run_logger()
    sources = expand_sources([str(resolve_results(p)) for p in patterns], results)
    if not sources:
        logger.info("merge %s: no host store matches %s", when, patterns)
        return
    report = merge_stores(results, sources, flow_runs=server_flow_run_lookup())
    logger.info("merge %s: %s", when, report.summary())
    for o in report.refused:
        logger.warning("merge refused %s from %s: %s", o.run_id, o.source, o.detail)


def plan_sweep(configs: list[RunConfig], done: set[str], force: bool, options: RunOptions) -> list[SweepItem]:
    items = []
    for config in configs:
        item = SweepItem(config=config, parameters=run_parameters(config, options))
        if not force and config.config_hash() in done:
            item.status, item.detail = "skipped", "already completed in the results store"
        items.append(item)
    return items


def check_parameters(items: list[SweepItem], accepted: set[str]) -> None:
    """Fail before anything starts if a run needs a parameter `benchmark-run` does not take (e.g. `config.driver`
    on a deployment made before drivers; `config` itself on one made before the typed parameters)."""
    for item in items:
        params = item.parameters
        given = set(params) | {f"{k}.{f}" for k, v in params.items() if isinstance(v, dict) for f in v}
        if missing := given - accepted:
            raise ValueError(
                f"{item.label}: benchmark-run takes no parameter(s) {sorted(missing)}; the deployment is older "
                "than this code: register it again with `a2rl deploy`"
            )


def schema_names(schema: dict[str, Any]) -> set[str]:
    """The parameters a flow's parameter schema accepts, and `parameter.field` for each field of a typed one."""
    definitions = schema.get("definitions") or schema.get("$defs") or {}
    names = set()
    for name, prop in (schema.get("properties") or {}).items():
        names.add(name)
        refs = [prop.get("$ref"), *(p.get("$ref") for p in prop.get("allOf", []))]
        for ref in filter(None, refs):
            names |= {f"{name}.{field}" for field in definitions.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})}
    return names


def ensure_gpu_limit(slots: int) -> None:
    """Create the global concurrency limit `gpu` with `slots` slots, or set an existing one to `slots`."""
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(GPU_LIMIT)
        except ObjectNotFound:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=GPU_LIMIT, limit=slots))
            logger.info("created the global concurrency limit %r with %d slot(s)", GPU_LIMIT, slots)
            return
        if limit.limit != slots or not limit.active:
            client.update_global_concurrency_limit(
                GPU_LIMIT, GlobalConcurrencyLimitUpdate(limit=slots, active=True)
            )
            logger.info("set the global concurrency limit %r to %d slot(s) (was %d)", GPU_LIMIT, slots, limit.limit)


def launch_runs(items: list[SweepItem], deployment: str, job_variables: dict | None) -> None:
    """Start each planned item as a flow run of `deployment` and return at once.

    The idempotency key ties a run to this sweep's flow-run id and the config, so a retried sweep finds its
    runs again instead of starting them twice.
    """
    logger = get_run_logger()
    sweep_id = flow_run.get_id() or "adhoc"
    for item in items:
        fr = run_deployment(
            deployment, parameters=item.parameters, timeout=0, job_variables=job_variables or None,
            flow_run_name=item.label, tags=["sweep"],
            idempotency_key=f"sweep-{sweep_id}-{item.config.config_hash()}",
        )  # fmt: skip
        item.flow_run_id, item.state, item.status = str(fr.id), fr.state_name, "launched"
        logger.info("started %s as flow run %s (%s)", item.label, fr.name, fr.id)


def watch_runs(items: list[SweepItem], poll_s: float, timeout_s: float | None) -> None:
    """Poll the launched runs until each reaches a final state; log every state change and keep a progress
    artifact up to date. A run retried from the UI is followed again until it ends."""
    logger = get_run_logger()
    launched = {item.flow_run_id: item for item in items if item.flow_run_id}
    if not launched:
        return
    progress = create_progress_artifact(0.0, description=f"sweep: {len(launched)} benchmark runs")
    started = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    stall_warned = False
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(launched))))
            waiting = [fr for fr in runs if fr.state_type and fr.state_type.value in ("SCHEDULED", "PENDING")]
            if not stall_warned and len(waiting) == len(runs) and time.monotonic() - started > STALL_S:
                stall_warned = True
                logger.warning(
                    "none of the %d run(s) has started after %.0f s: is a worker polling the runs' work queue "
                    "with a free place? A worker whose --limit this sweep fills cannot start them "
                    "(docs/scale-out.md: sweeps and runs on separate queues)", len(runs), STALL_S,
                )  # fmt: skip
            for fr in runs:
                item = launched[str(fr.id)]
                if fr.state_name != item.state:
                    item.state = fr.state_name
                    logger.info("%s: %s", item.label, fr.state_name)
            finished = [fr for fr in runs if fr.state_type and fr.state_type.value in FINAL_STATES]
            update_progress_artifact(progress, 100.0 * len(finished) / len(launched))
            if len(finished) == len(launched):
                for fr in runs:
                    item = launched[str(fr.id)]
                    item.status = "completed" if fr.state_type.value == "COMPLETED" else "failed"
                return
            if deadline is not None and time.monotonic() > deadline:
                logger.warning("stopped watching after %.0f s; %d run(s) still going", timeout_s,
                               len(launched) - len(finished))  # fmt: skip
                for fr in runs:
                    if not (fr.state_type and fr.state_type.value in FINAL_STATES):
                        item = launched[str(fr.id)]
                        item.detail = f"still {fr.state_name} when the sweep stopped watching (it goes on)"
                return
            time.sleep(poll_s)


def run_locally(items: list[SweepItem]) -> None:
    """Run the planned items one after another as subflows of this sweep."""
    from a2rl_bench.flows.benchmark_run import benchmark_run

    logger = get_run_logger()
    todo = [i for i in items if i.status == "planned"]
    for n, item in enumerate(todo, 1):
        logger.info("[%d/%d] %s starts", n, len(todo), item.label)
        t = time.perf_counter()
        state = benchmark_run(**item.parameters, return_state=True)
        item.state = state.name
        item.status = "completed" if state.is_completed() else "failed"
        if state.is_completed():
            s = state.result(raise_on_failure=False)
            delta = getattr(s, "delta_test", None)
            item.detail = f"run {getattr(s, 'run_id', '?')}: Δ test {'n/a' if delta is None else f'{delta:+.2f}'}"
        else:
            item.detail = str(state.message or state.name)
        logger.info("[%d/%d] %s %s in %.0f s; %s", n, len(todo), item.label, item.status, time.perf_counter() - t,
                    item.detail)  # fmt: skip


def benchmark_run_parameters(local: bool, deployment: str) -> set[str]:
    """What `benchmark-run` accepts (`schema_names`): from the deployment's schema, or the flow's here."""
    if local:
        from prefect.utilities.callables import parameter_schema

        from a2rl_bench.flows.benchmark_run import benchmark_run

        return schema_names(parameter_schema(benchmark_run).model_dump())
    with get_client(sync_client=True) as client:
        try:
            schema = client.read_deployment_by_name(deployment).parameter_openapi_schema or {}
        except ObjectNotFound:
            raise DeployFirst(f"deploy first: a2rl deploy (the server has no deployment {deployment!r})") from None
    return schema_names(schema)


class DeployFirst(LookupError):
    """A sweep through deployments on a server where they were never registered."""


@flow(name="sweep")
def sweep(config: SweepConfig = SweepConfig()) -> list[SweepItem]:
    """Run the matrix tasks × agents × drivers × modes × seeds of `config` (a SweepConfig); skip configurations
    already completed unless `config.force`."""
    logger = get_run_logger()
    configs = config.configs()
    results = resolve_results(config.options.results)
    options = config.options.model_copy(update={"results": results})
    if config.merge_from:
        merge_hosts(results, config.merge_from, "before planning")
    items = plan_sweep(configs, completed_hashes(results), config.force, options)
    planned = [i for i in items if i.status == "planned"]
    logger.info("sweep of %d configuration(s): %d to run, %d already completed", len(items), len(planned),
                len(items) - len(planned))  # fmt: skip
    watch_timeout_s = config.watch_timeout_s
    if planned:
        check_parameters(planned, benchmark_run_parameters(config.local, config.deployment))
        if config.local:
            run_locally(items)
        else:
            ensure_gpu_limit(config.gpu_slots)
            launch_runs(planned, config.deployment, config.job_variables)
            if config.wait:
                if watch_timeout_s is None:
                    watch_timeout_s = len(planned) * (3 * config.run.budget_s + 3600)
                watch_runs(planned, config.poll_s, watch_timeout_s)
                if config.merge_from:
                    merge_hosts(results, config.merge_from, "after the runs")
    create_table_artifact(
        cells([{"run": i.label, "config_hash": i.config.config_hash(), "status": i.status, "state": i.state,
                "flow_run_id": i.flow_run_id, "detail": i.detail} for i in items]),
        key="sweep-summary", description="a2rl sweep: one row per configuration",
    )  # fmt: skip
    if failed := [i.label for i in items if i.status == "failed"]:
        raise RuntimeError(f"{len(failed)} of {len(items)} run(s) did not complete: {', '.join(failed)}")
    if config.wait and (going := [i.label for i in items if i.status == "launched"]):
        raise TimeoutError(f"{len(going)} run(s) still going after watch_timeout_s={watch_timeout_s:.0f} s: "
                           f"{', '.join(going)} (follow them in the UI or `a2rl status`)")
    return items
