"""Crash reports that agree with retries: a crash report about an attempt that is over never undoes a Retry
or lands on the attempt running now, whatever worker sends it.

A process worker reports a flow run's crash twice: once when the flow-run process exits, and again 5-20 s
later, after it has loaded the flow's code for its crash hooks. A plain `prefect worker start` on a host whose
attempt was retried elsewhere sends both while the retry is Scheduled, Pending or already Running on another
host, and its report names no attempt. So the server decides (`a2rl server start` runs Prefect's server through
`python -m a2rl_bench.ops.crash_reports server start ...`): Prefect's own flow policy plus one orchestration rule,
installed through Prefect's injection point for flow policies (`prefect.server.orchestration.dependencies`):

* a Crashed report (not forced) for a run that is Scheduled is aborted: a scheduled run has no process that could
  have crashed, the report is about the attempt a Retry has just closed;
* one for a run that is Pending or Running is aborted while the run's lease (a2rl_bench.ops.run_lease) is live: an
  attempt is at work, the current one or the earlier one the report is about. If the current attempt is the one
  that died, its renewals stop, and once LEASE_S of heard time passed the server's lease sweep (a thread of the
  same process) marks the run Crashed, as it does for a run whose whole host died: nothing reports those. A Retry
  pressed meanwhile (the UI's, on a run that reads Running) is applied: the new attempt takes the lease, and the
  old one, should it still live, stops itself.

A request that failed because the server's database could not be reached (PostgreSQL down or restarting) is
answered as Prefect's clients understand a database outage: 503 with `Prefect-Maintenance: true` and a
`Retry-After`, which they wait out however long it lasts (plain Prefect answers 500, and a flow run's engine dies
on it: a healthy run ends Crashed). a2rl's own reads (`a2rl_bench.ops.prefect_api`) still fail at once.

Forced state changes (the UI's "Mark as crashed", `a2rl retry`, the lease sweep, automations) pass the rule.
`python -m a2rl_bench.ops.crash_reports worker start ...` (what `a2rl server start`'s own worker runs) also drops, on
the worker's side, a report about an attempt a Retry has superseded; hosts need only `prefect worker start`.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any

GUARDED = "a2rl crash-report guard"
"""What `a2rl status` and the tests look for: the server runs with the rule (its log says so at start)."""


# -- server side -------------------------------------------------------------------------------------------
def flow_policy() -> type:
    """Prefect's CoreFlowPolicy with `AbortCrashReportsOfScheduledRuns` first."""
    from prefect.server.orchestration.core_policy import CoreFlowPolicy
    from prefect.server.orchestration.rules import FlowRunOrchestrationRule
    from prefect.server.schemas.states import StateType

    from a2rl_bench.ops.run_lease import crash_report_verdict

    class AbortCrashReportsOfScheduledRuns(FlowRunOrchestrationRule):
        """A Crashed report for a run that is Scheduled (a Retry waits for a worker), or Pending/Running while an
        attempt holds the run's lease, is about an attempt that is over: no state is written."""

        FROM_STATES = {StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING}
        TO_STATES = {StateType.CRASHED}

        async def before_transition(self, initial_state, proposed_state, context) -> None:
            if initial_state is None or proposed_state is None:
                return
            if initial_state.type == StateType.SCHEDULED:
                await self.abort_transition(
                    f"the run is {initial_state.name} (a retry waits for a worker): a crash report for its earlier "
                    "attempt is not applied"
                )
                return
            why = crash_report_verdict(await _lease_of(context), int(context.run.run_count or 0))
            if why is not None:
                await self.abort_transition(why)

    class OneEndingPerRun(FlowRunOrchestrationRule):
        """A completed run stays completed: no attempt starts on it (Pending, Running) and no late attempt writes a
        second ending over it. A Retry (Scheduled) is still taken: the flow then returns the run's summary."""

        FROM_STATES = {StateType.COMPLETED}
        TO_STATES = {StateType.PENDING, StateType.RUNNING, StateType.COMPLETED, StateType.FAILED,
                     StateType.CANCELLED}  # fmt: skip

        async def before_transition(self, initial_state, proposed_state, context) -> None:
            if initial_state is None or proposed_state is None:
                return
            await self.abort_transition(
                f"the run is already Completed: {proposed_state.type.value} from an attempt that is over is not "
                "applied (one ending per run)"
            )

    class FailRunsWithOldParameters(FlowRunOrchestrationRule):
        """A benchmark run whose parameters the flow cannot take (the flat keywords of an older a2rl's deployment)
        dies before the flow starts and its worker reports it Crashed; it is Failed instead, with the reason, so
        nothing retries it."""

        FROM_STATES = {StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING}
        TO_STATES = {StateType.CRASHED}

        async def before_transition(self, initial_state, proposed_state, context) -> None:
            if initial_state is None or proposed_state is None:
                return
            if (why := await _parameter_mismatch(context)) is not None:
                from prefect.server.schemas.states import Failed

                await self.reject_transition(Failed(message=why), why)

    class A2rlFlowPolicy(CoreFlowPolicy):
        @staticmethod
        def priority() -> list:
            return [FailRunsWithOldParameters, OneEndingPerRun, AbortCrashReportsOfScheduledRuns,
                    *CoreFlowPolicy.priority()]  # fmt: skip

    return A2rlFlowPolicy


async def _parameter_mismatch(context: Any) -> str | None:
    """One line naming the parameters a benchmark run has that its flow does not take; None for any other run."""
    from prefect.server.models.flows import read_flow

    from a2rl_bench.ops.run_lease import BENCHMARK_FLOW
    from a2rl_bench.run_options import parameter_mismatch

    parameters = dict(context.run.parameters or {})
    if not set(parameters) - {"config", "options"}:
        return None
    flow = await read_flow(session=context.session, flow_id=context.run.flow_id)
    return parameter_mismatch(parameters) if flow is not None and flow.name == BENCHMARK_FLOW else None


async def _lease_of(context: Any) -> Any:
    """The run's lease as the server's database holds it (a Prefect Variable)."""
    from prefect.server.models.variables import read_variable_by_name

    from a2rl_bench.ops.run_lease import RunLease, variable_name

    variable = await read_variable_by_name(session=context.session, name=variable_name(str(context.run.id)))
    return RunLease.from_value(variable.value) if variable is not None else None


def install_server_rule() -> None:
    """Make this process's Prefect server orchestrate flow runs with `flow_policy()`."""
    import prefect.server.models  # noqa: F401  (first, as the server does: the orchestration modules import it in a cycle)
    from prefect.server.orchestration.dependencies import ORCHESTRATION_DEPENDENCIES

    policy = flow_policy()

    async def provide() -> type:
        return policy

    ORCHESTRATION_DEPENDENCIES["flow_policy_provider"] = provide
    logging.getLogger("a2rl").warning("%s: crash reports of attempts that are over are not applied", GUARDED)


OUTAGE_RETRY_AFTER_S = 5
"""A client told the database is unreachable asks again after this long (and goes on asking)."""


def database_unreachable(exc: BaseException) -> bool:
    """The request failed because the server could not reach its database (refused, reset, shut down, restarting),
    not because of the request: asking again once the database is back succeeds."""
    import socket

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ConnectionError, socket.gaierror)) or _postgres_gone(e):
            return True
        if getattr(e, "connection_invalidated", False):  # SQLAlchemy: the connection was lost under the query
            return True
        e = e.__cause__ or e.__context__
    return False


POSTGRES_GONE = frozenset({("asyncpg.exceptions", "PostgresConnectionError"),
                           ("asyncpg.exceptions", "OperatorInterventionError")})
"""asyncpg's errors for a lost or refused connection and an administrator's shutdown or restart, by class (asyncpg
is Prefect's PostgreSQL driver, not one of a2rl's dependencies: matched by name, not imported)."""


def _postgres_gone(e: BaseException) -> bool:
    return any((c.__module__, c.__name__) in POSTGRES_GONE for c in type(e).__mro__)


def install_database_outage_answer() -> None:
    """This process's Prefect server answers a request its database outage failed with 503, `Prefect-Maintenance:
    true` and `Retry-After`: Prefect's clients (workers, flow-run engines) wait the outage out instead of failing.
    Installed before the server's app is made (its exception handler is read then)."""
    from prefect.server.api import server
    from fastapi.responses import JSONResponse

    original = server.custom_internal_exception_handler

    async def handler(request: Any, exc: Exception) -> Any:
        if database_unreachable(exc):
            return JSONResponse({"exception_message": "Service Unavailable: the database is not answering"},
                                status_code=503, headers={"Prefect-Maintenance": "true",
                                                          "Retry-After": str(OUTAGE_RETRY_AFTER_S)})  # fmt: skip
        return await original(request, exc)

    server.custom_internal_exception_handler = handler


def sweep_expired_leases(api_url: str, watch: Any = None) -> list[str]:
    """One sweep of the server's leases (a2rl_bench.ops.run_lease.LeaseWatch judges what it heard): mark Crashed
    (forced) each Running flow run whose current attempt has been silent for LEASE_S of heard time, or never took the
    lease within UNCLAIMED_S; drop leases whose runs ended. Returns the flow-run ids marked. What notices a dead host:
    nothing else reports its runs. Raises httpx errors when the leases cannot be read (the sweep hears nothing)."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState
    from prefect.client.schemas.filters import FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    from a2rl_bench.ops import prefect_api
    from a2rl_bench.ops.run_lease import BENCHMARK_FLOW, LeaseWatch, all_leases, drop_lease, expired_verdict
    from a2rl_bench.ops.run_lease import unclaimed_verdict

    watch = watch if watch is not None else LeaseWatch()
    t = time.monotonic()
    try:
        leases = {lease.flow_run_id: lease for lease in all_leases(api_url)}
        running: list = []
        with prefect_api.client(api_url) as c:
            while True:  # the server answers at most 200 at a time
                page = c.read_flow_runs(
                    flow_filter=FlowFilter(name=FlowFilterName(any_=[BENCHMARK_FLOW])),
                    flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                        any_=[StateType.RUNNING]))), limit=200, offset=len(running))  # fmt: skip
                running += page
                if len(page) < 200:
                    break
    except Exception:
        watch.failed()
        raise
    heard_s = watch.round(time.monotonic() - t)
    log = logging.getLogger("a2rl.crash_reports")
    marked: list[str] = []

    def crash(flow_run_id: str, why: str) -> None:
        with prefect_api.client(api_url) as c:
            c.set_flow_run_state(flow_run_id, Crashed(message=why), force=True)
        log.warning("flow run %s marked crashed: %s", flow_run_id, why)
        marked.append(flow_run_id)

    unclaimed = set()
    for run in running:  # Running at attempt N without attempt N's lease: its host died before the flow took it
        lease = leases.get(str(run.id))
        if lease is None or lease.attempt < int(run.run_count or 0):
            unclaimed.add(str(run.id))
            if why := unclaimed_verdict(int(run.run_count or 0),
                                        watch.unclaimed(str(run.id), int(run.run_count or 0), heard_s)):
                crash(str(run.id), why)
    running_by_id = {str(run.id): run for run in running}
    for lease in leases.values():
        silent_s = watch.silence(lease, heard_s)
        if lease.flow_run_id in marked or (silent_s <= 0 and lease.live()):
            continue
        run = running_by_id.get(lease.flow_run_id)
        if run is None:  # not a Running benchmark run: any other flow's, or ended; ask for it
            with prefect_api.client(api_url) as c:
                try:
                    run = c.read_flow_run(lease.flow_run_id)
                except ObjectNotFound:
                    run = None
        state_type = run.state.type.value if run is not None and run.state is not None else "?"  # "?": gone
        if run is not None and (why := expired_verdict(lease, int(run.run_count or 0), state_type, silent_s)):
            crash(lease.flow_run_id, why)
            drop_lease(api_url, lease.flow_run_id)  # marked just now: the lease is done
        elif not lease.live() and state_type not in ("RUNNING", "PENDING", "SCHEDULED", "PAUSED"):
            drop_lease(api_url, lease.flow_run_id)  # its run is gone or ended: the lease is done
    watch.forget(leases=set(leases) - set(marked), unclaimed=unclaimed - set(marked))
    return marked


def start_lease_sweep(argv: list[str]) -> None:
    """A daemon thread of the server process that runs `sweep_expired_leases` every SWEEP_S against this server."""
    import os
    import threading

    from a2rl_bench.ops.run_lease import SWEEP_S, LeaseWatch

    def option(name: str, default: str) -> str:
        return argv[argv.index(name) + 1] if name in argv[:-1] else default

    host = option("--host", os.environ.get("PREFECT_SERVER_API_HOST", "127.0.0.1"))
    port = option("--port", os.environ.get("PREFECT_SERVER_API_PORT", "4200"))
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}/api"

    def loop() -> None:
        watch = LeaseWatch()  # empty after a (re)start: every attempt gets a full LEASE_S of heard time to renew
        while True:
            time.sleep(SWEEP_S)
            try:
                sweep_expired_leases(url, watch)
            except Exception as e:  # the server is starting, stopping, or its database is away: next round
                logging.getLogger("a2rl.crash_reports").debug("lease sweep: %s", e)

    threading.Thread(target=loop, name="a2rl-lease-sweep", daemon=True).start()


# -- worker side -------------------------------------------------------------------------------------------
async def superseded(client: Any, launched: Any) -> str | None:
    """Why a crash report for the attempt a worker launched from `launched` (the flow run as it picked it up,
    Scheduled) no longer applies, or None when that attempt is still the run's current one (or we cannot tell:
    then the report goes out as Prefect would send it)."""
    picked = launched.state
    if picked is None or picked.timestamp is None:
        return None
    try:
        states = await client.read_flow_run_states(launched.id)
    except Exception:  # the API is unreachable: report as Prefect would
        return None
    later = [s for s in states if s.timestamp is not None and s.timestamp > picked.timestamp and s.id != picked.id]
    retry = next((s for s in later if s.type.value == "SCHEDULED"), None)
    if retry is None:
        return None
    return f"the run was rescheduled ({retry.name}, {retry.timestamp:%H:%M:%S}) after this attempt started"


def install_worker_guard() -> None:
    """Wrap the two places where a worker proposes Crashed for a flow run it launched (the executor's report
    when the process exits, and the worker's own after its crash hooks) with `superseded`."""
    from prefect.runner._state_proposer import StateProposer
    from prefect.workers.base import BaseWorker

    def guard(report, client_of):
        @functools.wraps(report)
        async def guarded(self, flow_run, message, *args, **kwargs):
            if (why := await superseded(client_of(self, args, kwargs), flow_run)) is not None:
                logging.getLogger("a2rl.crash_reports").warning(
                    "not reporting flow run %s as crashed (%s): %s", flow_run.id, message.split(".")[0], why
                )
                return None
            return await report(self, flow_run, message, *args, **kwargs)

        guarded.__a2rl_guarded__ = True
        return guarded

    if not getattr(StateProposer.propose_crashed, "__a2rl_guarded__", False):
        StateProposer.propose_crashed = guard(StateProposer.propose_crashed, lambda self, args, kw: self._client)
    if not getattr(BaseWorker._propose_crashed_state, "__a2rl_guarded__", False):
        BaseWorker._propose_crashed_state = guard(
            BaseWorker._propose_crashed_state, lambda self, args, kw: kw.get("client") or (args or [None])[0] or self.client
        )
    logging.getLogger("a2rl").warning("%s: this worker reports crashes of current attempts only", GUARDED)


def main(argv: list[str]) -> None:
    """`python -m a2rl_bench.ops.crash_reports server start ...` or `... worker start ...`: Prefect's CLI with the
    guard of that side installed first (the server runs in the foreground, in this process)."""
    if argv[:1] == ["server"]:
        if "--workers" in argv:  # uvicorn's worker processes would not have the rule
            raise SystemExit("a2rl: the crash-report rule needs a single server process (no --workers)")
        install_server_rule()
        install_database_outage_answer()
        start_lease_sweep(argv)
    elif argv[:1] == ["worker"]:
        install_worker_guard()
    else:
        raise SystemExit("usage: python -m a2rl_bench.ops.crash_reports {server|worker} start [prefect options]")
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    app()


if __name__ == "__main__":
    main(sys.argv[1:])
