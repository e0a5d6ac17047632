"""`claude-tools`: the harness starts `python -m a2rl_bench.agents.claude_tools.runner`; the runner holds the driver's
key and runs the model's tool calls inside the workspace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from a2rl_bench.agents.base import HARNESS_ENV_PREFIX, Agent, AgentEnv, AgentLaunchError, AgentOptions, LLMDriver


class LLMAgent(Agent):
    """An agent with a driver LLM; the driver (with its key) reaches only the harness-side process."""

    uses_llm = True
    runner_module: str

    def __init__(self, driver: LLMDriver | None = None, options: AgentOptions | None = None):
        self.driver = LLMDriver.model_validate(driver) if driver is not None else None
        self.options = AgentOptions.model_validate(options) if options is not None else AgentOptions()

    def install(self, workspace: Path) -> None:
        (workspace / "code").mkdir(parents=True, exist_ok=True)

    def command(self, workspace: Path) -> list[str]:
        return [sys.executable, "-m", self.runner_module]

    def launch_env(self, env: AgentEnv) -> dict[str, str]:
        if self.driver is None:
            raise AgentLaunchError(
                f"agent {self.id} needs a driver LLM: set the run's `driver` to the name of a DriverConfig block "
                "(a2rl_bench.blocks.DriverConfig(model=..., api_key=...).save(name))"
            )
        env.harness_path.mkdir(parents=True, exist_ok=True)
        config = {"driver": self.driver.public(), "options": self.options.model_dump(mode="json"),
                  "harness_dir": str(env.harness_path), "agent": self.id}  # fmt: skip
        return {f"{HARNESS_ENV_PREFIX}API_KEY": self.driver.api_key.get_secret_value(),
                f"{HARNESS_ENV_PREFIX}CONFIG": json.dumps(config)}  # fmt: skip


class ClaudeTools(LLMAgent):
    """A tool-using agent on the anthropic SDK: the model loop runs harness-side, its tools in the sandbox."""

    id = "claude-tools"
    runner_module = "a2rl_bench.agents.claude_tools.runner"
