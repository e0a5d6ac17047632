"""`claude-code` and `codex`: the harness starts `python -m agents.cli_agents.runner`, which runs the CLI in
the workspace behind a key-holding, call-recording LLM proxy and parses the CLI's event stream."""

from __future__ import annotations

import shutil

from agents.base import AgentEnv, AgentLaunchError, agent_environment
from agents.claude_tools.adapter import LLMAgent


class CLIAgent(LLMAgent):
    runner_module = "agents.cli_agents.runner"
    executable: str
    install_hint: str
    api: str

    def launch_env(self, env: AgentEnv) -> dict[str, str]:
        extra = super().launch_env(env)
        if self.driver.api != self.api:
            raise AgentLaunchError(f"agent {self.id} speaks the {self.api} API, but driver {self.driver.model!r} "
                                   f"is configured with api={self.driver.api!r}")  # fmt: skip
        if shutil.which(self.executable, path=agent_environment(env)["PATH"]) is None:
            raise AgentLaunchError(f"agent {self.id} needs the `{self.executable}` CLI, which is not on PATH; "
                                   f"install it with: {self.install_hint}")  # fmt: skip
        return extra


class ClaudeCode(CLIAgent):
    id = "claude-code"
    executable = "claude"
    install_hint = "npm install -g @anthropic-ai/claude-code"
    api = "anthropic"


class Codex(CLIAgent):
    id = "codex"
    executable = "codex"
    install_hint = "npm install -g @openai/codex"
    api = "openai"
