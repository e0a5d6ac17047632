"""Agents under test: scaffolds the harness installs into a workspace, starts, and stops."""

from __future__ import annotations

from agents.base import Agent, AgentEnv, SessionOutcome, run_agent


def get_agent(agent_id: str) -> Agent:
    from agents.reference_sft.adapter import ReferenceSFT

    known: dict[str, type[Agent]] = {"reference-sft": ReferenceSFT}
    if agent_id not in known:
        raise KeyError(f"unknown agent {agent_id!r}; known agents: {', '.join(sorted(known))}")
    return known[agent_id]()


def list_agents() -> list[str]:
    return ["reference-sft"]


__all__ = ["Agent", "AgentEnv", "SessionOutcome", "get_agent", "list_agents", "run_agent"]
