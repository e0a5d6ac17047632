"""Automatic retry of crashed benchmark runs: a Prefect Automation that `a2rl deploy --auto-retry N` creates.

Off by default. Prefect keeps Crashed out of a flow's own `retries` (PrefectHQ/prefect#10211); an Automation is
its way to retry crashed runs (#11431). Ours reacts to `prefect.flow-run.Crashed` events of the
`benchmark-run` deployment's runs and does what the UI's Retry does (state Scheduled/AwaitingRetry, the same
flow run resumed by a worker), for a run that has run at most N times (the event's `prefect.run-count`): a run
that keeps crashing stops being retried after N automatic retries and stays Crashed for an operator to look at.
A run stopped on request (`a2rl server stop`: Cancelled) and a failed run (an error of the run itself) are
never retried automatically. Through Prefect's client (a2rl_bench.ops.prefect_api).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from a2rl_bench.ops import prefect_api

if TYPE_CHECKING:
    from prefect.events.schemas.automations import Automation

AUTOMATION_NAME = "a2rl: retry crashed benchmark runs"
RETRY_MESSAGE = "Automatic retry (a2rl deploy --auto-retry)"


def find(api_url: str) -> Automation | None:
    with prefect_api.client(api_url) as c:
        return next(iter(c.read_automations_by_name(AUTOMATION_NAME)), None)


def automation(deployment_id: str, limit: int) -> dict[str, Any]:
    """The automation's definition: retry a crashed run of `deployment_id` while it has run at most `limit` times."""
    return {
        "name": AUTOMATION_NAME,
        "description": f"Retries a crashed benchmark run (as the UI's Retry) while it has run at most {limit} "
                       "time(s); made by `a2rl deploy --auto-retry`, removed by `a2rl deploy --auto-retry 0`.",
        "enabled": True,
        "trigger": {
            "type": "event", "posture": "Reactive", "expect": ["prefect.flow-run.Crashed"],
            "match": {"prefect.resource.id": "prefect.flow-run.*",
                      "prefect.run-count": [str(n) for n in range(limit + 1)]},
            "match_related": {"prefect.resource.id": f"prefect.deployment.{deployment_id}",
                              "prefect.resource.role": "deployment"},
            "for_each": ["prefect.resource.id"], "threshold": 1, "within": 0,
        },
        "actions": [{"type": "change-flow-run-state", "state": "SCHEDULED", "name": "AwaitingRetry",
                     "message": f"{RETRY_MESSAGE}: at most {limit}"}],
    }  # fmt: skip


def set_auto_retry(api_url: str, deployment: str, limit: int) -> str:
    """Create (or replace) the automation for `deployment` ("flow/name") with `limit` retries; 0 removes it.
    Returns one line saying what is now in place."""
    from prefect.events.schemas.automations import AutomationCore

    existing = find(api_url)
    with prefect_api.client(api_url) as c:
        if existing is not None:
            c.delete_automation(existing.id)
        if limit <= 0:
            return "automatic retry of crashed runs: off" + (" (automation removed)" if existing else "")
        deployment_id = c.read_deployment_by_name(deployment).id
        created = c.create_automation(AutomationCore.model_validate(automation(str(deployment_id), limit)))
    return f"automatic retry of crashed runs: on, up to {limit} per run (automation {AUTOMATION_NAME!r}, {created})"
