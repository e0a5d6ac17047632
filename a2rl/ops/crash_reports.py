"""Crash reports that agree with retries: a late "Crashed" for an attempt that is over never undoes a Retry.

A process worker reports a flow run's crash twice: once when the flow-run process exits, and again 5-20 s
later, after it has loaded the flow's code for its crash hooks. A Retry pressed in between (the UI's, an
automation's, `a2rl retry`) is overwritten by the second report, and a retried attempt that ends the processes
an earlier one left is reported crashed by the worker that had started them. Two guards, one on each side:

* Server (`a2rl server start` runs Prefect's server through `python -m a2rl.ops.crash_reports server start
  ...`): Prefect's own flow policy plus one orchestration rule: a Crashed report (not forced) for a run that
  is Scheduled is aborted. A scheduled run has no process that could have crashed: the report is about the
  attempt a Retry has just closed. Installed through Prefect's injection point for flow policies
  (`prefect.server.orchestration.dependencies`), so the server is Prefect's, unchanged otherwise.
* Worker (`python -m a2rl.ops.crash_reports worker start ...`): before it reports a crash, the worker checks
  that the attempt it launched is still the run's current one: no Scheduled state (a Retry) came after the one
  it picked the run up from. A report for an earlier attempt is dropped with a log line, so ending an earlier
  attempt's processes never touches the current attempt's state. Flows with in-process `retries` (none of
  a2rl's) would have their later crashes dropped too: their retry is a Scheduled state as well.

Forced state changes (the UI's "Mark as crashed", `a2rl retry`, Prefect's zombie automation) pass both.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

GUARDED = "a2rl crash-report guard"
"""What `a2rl status` and the tests look for: the server runs with the rule (its log says so at start)."""


# -- server side -------------------------------------------------------------------------------------------
def flow_policy() -> type:
    """Prefect's CoreFlowPolicy with `AbortCrashReportsOfScheduledRuns` first."""
    from prefect.server.orchestration.core_policy import CoreFlowPolicy
    from prefect.server.orchestration.rules import FlowRunOrchestrationRule
    from prefect.server.schemas.states import StateType

    class AbortCrashReportsOfScheduledRuns(FlowRunOrchestrationRule):
        """A Crashed report for a run that is Scheduled (a Retry is waiting for a worker) is about an attempt
        that is over: no state is written, the retry stands."""

        FROM_STATES = {StateType.SCHEDULED}
        TO_STATES = {StateType.CRASHED}

        async def before_transition(self, initial_state, proposed_state, context) -> None:
            if initial_state is None or proposed_state is None:
                return
            await self.abort_transition(
                f"the run is {initial_state.name} (a retry waits for a worker): a crash report for its earlier "
                "attempt is not applied"
            )

    class A2rlFlowPolicy(CoreFlowPolicy):
        @staticmethod
        def priority() -> list:
            return [AbortCrashReportsOfScheduledRuns, *CoreFlowPolicy.priority()]

    return A2rlFlowPolicy


def install_server_rule() -> None:
    """Make this process's Prefect server orchestrate flow runs with `flow_policy()`."""
    import prefect.server.models  # noqa: F401  (first, as the server does: the orchestration modules import it in a cycle)
    from prefect.server.orchestration.dependencies import ORCHESTRATION_DEPENDENCIES

    policy = flow_policy()

    async def provide() -> type:
        return policy

    ORCHESTRATION_DEPENDENCIES["flow_policy_provider"] = provide
    logging.getLogger("a2rl").warning("%s: crash reports for scheduled runs are not applied", GUARDED)


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
    """`python -m a2rl.ops.crash_reports server start ...` or `... worker start ...`: Prefect's CLI with the
    guard of that side installed first (the server runs in the foreground, in this process)."""
    if argv[:1] == ["server"]:
        if "--workers" in argv:  # uvicorn's worker processes would not have the rule
            raise SystemExit("a2rl: the crash-report rule needs a single server process (no --workers)")
        install_server_rule()
    elif argv[:1] == ["worker"]:
        install_worker_guard()
    else:
        raise SystemExit("usage: python -m a2rl.ops.crash_reports {server|worker} start [prefect options]")
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    app()


if __name__ == "__main__":
    main(sys.argv[1:])
