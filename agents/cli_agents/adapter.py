"""CLI agents (`claude-code`, `codex`, `gemini`, `opencode`, `openhands`): the harness starts
`python -m agents.cli_agents.runner`, which runs the CLI in the workspace behind a key-holding, call-recording
LLM proxy and parses the CLI's event stream."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from a2rl.isolation.sandbox import SandboxPolicy
from agents.base import HARNESS_ENV_PREFIX, AgentEnv, AgentLaunchError, agent_environment
from agents.claude_tools.adapter import LLMAgent
from agents.cli_agents.install import PROJECT_ROOT, TOO_BUSY, check_starts, find_cli, node_mismatch


class CLIAgent(LLMAgent):
    runner_module = "agents.cli_agents.runner"
    executable: str
    install_hint: str
    apis: tuple[str, ...]
    """Driver API kinds the CLI speaks (`LLMDriver.api`)."""
    version_args: tuple[str, ...] = ("--version",)
    offline_env: dict[str, str] = {}
    """Settings that keep the CLI from reaching out at start-up (the sandbox has no network but its proxy)."""

    @property
    def needs(self) -> str:
        """What the agent needs to run, in one line (for `a2rl agents`)."""
        return f"a driver speaking the {' or '.join(self.apis)} API; the `{self.executable}` CLI ({self.install_hint})"

    def command(self, workspace: Path) -> list[str]:
        # The runner from this same checkout (not whichever `agents` the interpreter would import first): the
        # harness and its runner are one program.
        bootstrap = (f"import runpy, sys; sys.path.insert(0, {str(PROJECT_ROOT)!r}); "
                     f"runpy.run_module({self.runner_module!r}, run_name='__main__', alter_sys=True)")  # fmt: skip
        return [sys.executable, "-c", bootstrap]

    def find(self, path: str | None = None) -> Path | None:
        """The CLI's real file (links resolved): on PATH, else in the project-local prefix that `make tools` fills."""
        return find_cli(self.executable, path)

    def check(self, sandbox: SandboxPolicy | None = None, path: str | None = None) -> str | None:
        """None if the CLI is installed and starts (`--version`) as the session would run it (inside `sandbox`
        when given); else one line saying what is wrong and how to fix it. For a preflight before the session."""
        if self.driver is not None and self.driver.api not in self.apis:
            return (f"agent {self.id} speaks the {' or '.join(self.apis)} API, but driver {self.driver.model!r} "
                    f"is configured with api={self.driver.api!r}")  # fmt: skip
        command = self.find(path)
        if command is None:
            return f"agent {self.id} needs the `{self.executable}` CLI, which is not installed; {self.install_hint}"
        with tempfile.TemporaryDirectory(prefix="a2rl-check-") as scratch:
            env = {"PATH": path or os.environ.get("PATH", os.defpath), "HOME": scratch, "LANG": "C.UTF-8",
                   **self.offline_env}  # fmt: skip
            policy = None
            if sandbox is not None:
                policy = replace(sandbox, workspace=Path(scratch), read_only=(), forward_ports=(),
                                 max_workspace_bytes=None, status_path=None)  # fmt: skip
            why = check_starts([str(command), *self.version_args], env, policy)
        if why is None:
            return None
        where = "in the sandbox" if sandbox is not None else "on this host"
        if why.endswith(TOO_BUSY):  # slow, not broken: reinstalling would not help
            return f"agent {self.id}: {why}"
        if node := node_mismatch(command, env["PATH"]):  # an old Node, not a broken install
            return f"agent {self.id}: `{command.name}` does not start {where}: {node}"
        return f"agent {self.id}: `{command}` does not start {where} ({why}); {self.install_hint}"

    def launch_env(self, env: AgentEnv) -> dict[str, str]:
        extra = super().launch_env(env)
        if self.driver.api not in self.apis:
            raise AgentLaunchError(self.check())
        command = self.find(agent_environment(env)["PATH"])
        if command is None:
            raise AgentLaunchError(f"agent {self.id} needs the `{self.executable}` CLI, which is not installed; "
                                   f"{self.install_hint}")  # fmt: skip
        key = f"{HARNESS_ENV_PREFIX}CONFIG"
        extra[key] = json.dumps({**json.loads(extra[key]), "cli": str(command)})
        return extra


NPM_HINT = "install it with `make tools` (pinned, into .tools/npm) or: npm install -g {package}"


class ClaudeCode(CLIAgent):
    """Anthropic's Claude Code CLI, headless (`claude -p`), in the sandbox behind the logging proxy."""

    id = "claude-code"
    executable = "claude"
    install_hint = NPM_HINT.format(package="@anthropic-ai/claude-code")
    apis = ("anthropic",)


class Codex(CLIAgent):
    """OpenAI's Codex CLI (`codex exec`), in the sandbox behind the logging proxy."""

    id = "codex"
    executable = "codex"
    install_hint = NPM_HINT.format(package="@openai/codex")
    apis = ("openai",)


class GeminiCLI(CLIAgent):
    """Google's Gemini CLI (`gemini -p --yolo`), in the sandbox behind the logging proxy."""

    id = "gemini"
    executable = "gemini"
    install_hint = NPM_HINT.format(package="@google/gemini-cli")
    apis = ("gemini",)


class OpenCode(CLIAgent):
    """The OpenCode CLI (`opencode run`), in the sandbox behind the logging proxy."""

    id = "opencode"
    executable = "opencode"
    install_hint = NPM_HINT.format(package="opencode-ai")
    apis = ("openai", "anthropic")


class OpenHands(CLIAgent):
    """The OpenHands CLI (`openhands --headless`, its own Python >= 3.12 venv), in the sandbox behind the logging proxy."""

    id = "openhands"
    executable = "openhands"
    install_hint = ("install it with `make tools` (pinned, its own Python >= 3.12 venv in .tools/openhands) or: "
                    "pip install openhands in a Python >= 3.12 venv on PATH")  # fmt: skip
    apis = ("openai", "anthropic", "gemini")
    offline_env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENHANDS_SUPPRESS_BANNER": "1"}
