"""The agent class of every CLI agent: the harness starts `python -m a2rl_bench.agents.cli_agents.runner`, which runs
the CLI in the workspace behind a key-holding, call-recording LLM proxy and parses the CLI's event stream. Each CLI
agent is a subclass in its own module that sets `spec` (a `CliAgentSpec`: `claude_code.py`, `codex.py`, ...)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from a2rl_bench.isolation.sandbox import SandboxPolicy
from a2rl_bench.agents.base import HARNESS_ENV_PREFIX, AgentEnv, AgentLaunchError, agent_environment
from a2rl_bench.agents.claude_tools.adapter import LLMAgent
from a2rl_bench.agents.cli_agents.install import PROJECT_ROOT, TOO_BUSY, check_starts, find_cli, node_mismatch
from a2rl_bench.agents.cli_agents.spec import CliAgentSpec


class CLIAgent(LLMAgent):
    runner_module = "a2rl_bench.agents.cli_agents.runner"
    spec: ClassVar[CliAgentSpec]
    """Set by each CLI agent's class; the attributes below are copied from it, as `a2rl agents` reads them."""
    executable: str
    install_hint: str
    apis: tuple[str, ...]
    """Driver API kinds the CLI speaks (`LLMDriver.api`)."""
    version_args: tuple[str, ...] = ("--version",)
    offline_env: dict[str, str] = {}
    """Settings that keep the CLI from reaching out at start-up (the sandbox has no network but its proxy)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            cls.id, cls.executable, cls.apis = spec.id, spec.executable, spec.apis
            cls.install_hint, cls.version_args = spec.install.install_hint, spec.version_args
            cls.offline_env = dict(spec.offline_env)

    @property
    def needs(self) -> str:
        """What the agent needs to run, in one line (for `a2rl agents`)."""
        return f"a driver speaking the {' or '.join(self.apis)} API; the `{self.executable}` CLI ({self.install_hint})"

    def command(self, workspace: Path) -> list[str]:
        # The runner from this same checkout (not whichever `a2rl` another install would give first): the harness
        # and its runner are one program. A plug-in's module is imported from where the harness found it (for a
        # built-in agent that is the same checkout).
        roots = [str(root) for root in dict.fromkeys([PROJECT_ROOT, import_root(type(self))]) if root is not None]
        paths = "".join(f"sys.path.insert(0, {root!r}); " for root in reversed(roots))
        bootstrap = (f"import runpy, sys; {paths}"
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


def import_root(cls: type) -> Path | None:
    """The sys.path entry `cls`'s top-level package was imported from (None for a namespace package)."""
    top = sys.modules.get(cls.__module__.partition(".")[0])
    file = getattr(top, "__file__", None)
    if file is None:
        return None
    return Path(file).resolve().parent.parent if Path(file).name == "__init__.py" else Path(file).resolve().parent
