"""Agents under test: scaffolds the harness installs into a workspace, starts, and stops."""

from __future__ import annotations

from a2rl_bench.registry import Registry
from a2rl_bench.agents.base import (
    Agent,
    AgentEnv,
    AgentLaunchError,
    AgentOptions,
    LLMCallEvent,
    LLMDriver,
    SessionOutcome,
    ToolCallEvent,
    run_agent,
)

# id -> "module:class"; modules are imported on use, so the registry loads no SDK. An installed package adds an
# agent under the `a2rl.agents` entry point group (docs/architecture.md, "Adding an agent").
AGENTS: Registry[type[Agent]] = Registry("agent", "a2rl.agents", {
    "reference-sft": "a2rl_bench.agents.reference_sft.adapter:ReferenceSFT",
    "reference-grpo": "a2rl_bench.agents.reference_grpo.adapter:ReferenceGRPO",
    "reference-sft-grpo": "a2rl_bench.agents.reference_sft_grpo.adapter:ReferenceSFTGRPO",
    "reference-sft-gigpo": "a2rl_bench.agents.reference_sft_grpo.adapter:ReferenceSFTGiGPO",
    "claude-tools": "a2rl_bench.agents.claude_tools.adapter:ClaudeTools",
    "claude-code": "a2rl_bench.agents.cli_agents.claude_code:ClaudeCode",
    "codex": "a2rl_bench.agents.cli_agents.codex:Codex",
    "gemini": "a2rl_bench.agents.cli_agents.gemini:GeminiCLI",
    "opencode": "a2rl_bench.agents.cli_agents.opencode:OpenCode",
    "openhands": "a2rl_bench.agents.cli_agents.openhands:OpenHands",
})


def agent_class(agent_id: str) -> type[Agent]:
    return AGENTS.load(agent_id)


def get_agent(agent_id: str, driver: object | None = None, options: object | None = None) -> Agent:
    """The agent `agent_id`; LLM agents take a driver (an `LLMDriver`, or a `a2rl_bench.blocks.DriverConfig` block) and
    options (`AgentOptions` or a `a2rl_bench.blocks.AgentConfig` block). Without a driver an LLM agent can be installed
    but not started (`run_agent` reports a launch error that says so)."""
    cls = agent_class(agent_id)
    if cls.uses_llm:
        return cls(driver=driver, options=options)
    if driver is not None:
        raise ValueError(f"agent {agent_id!r} is scripted and takes no driver LLM")
    return cls()


def uses_llm(agent_id: str) -> bool:
    """Whether the agent needs a driver LLM."""
    return agent_class(agent_id).uses_llm


def list_agents() -> list[str]:
    """Every usable agent (a name two plug-ins declare is left out: `AGENTS.clashes()` says why)."""
    clashes = AGENTS.clashes()
    return [name for name in AGENTS.names() if name not in clashes]


__all__ = [
    "Agent", "AgentEnv", "AgentLaunchError", "AgentOptions", "LLMCallEvent", "LLMDriver", "SessionOutcome",
    "ToolCallEvent", "agent_class", "get_agent", "list_agents", "run_agent", "uses_llm",
]  # fmt: skip
