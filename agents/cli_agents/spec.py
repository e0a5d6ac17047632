"""What makes one CLI agent: a `CliAgentSpec`, declared in the agent's own module (`claude_code.py`, `codex.py`,
...) beside its command builder and its stream parser. The runner, the sandbox, the proxy and the install checks
are shared and read only the spec (docs/architecture.md, "Adding a CLI agent")."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from a2rl_bench.agents.base import AgentOptions, LLMDriver
    from a2rl_bench.agents.cli_agents.proxy import LLMProxy
    from a2rl_bench.agents.cli_agents.streams import StreamParser

CommandBuilder = Callable[[str, "LLMDriver", "AgentOptions", "LLMProxy"], tuple[list[str], dict[str, str]]]
"""(prompt, driver, options, proxy) -> the CLI's argv and the environment it adds. It points the CLI at
`proxy.url` with `proxy.token` as its key (never the driver's key, which only the proxy holds)."""

NPM_HINT = "install it with `make tools` (pinned, into .tools/npm) or: npm install -g {package}"


@dataclass(frozen=True)
class CliInstall:
    """How the CLI is installed: the package and version `make tools` pins, and the one line a user is told when
    it is missing. The Makefile reads a built-in's npm pin from its module's line
    `install=CliInstall(<quoted package>, <quoted version>)` (with sed: keep that form, on one line)."""

    package: str
    version: str
    manager: Literal["npm", "pip"] = "npm"
    hint: str = ""
    """Default for npm: `make tools` or `npm install -g PACKAGE`."""

    @property
    def install_hint(self) -> str:
        return self.hint or NPM_HINT.format(package=self.package)

    @property
    def pin(self) -> str:
        return f"{self.package}@{self.version}" if self.manager == "npm" else f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CliAgentSpec:
    """One CLI agent, all the harness needs to know about it."""

    id: str
    """The agent's name (`a2rl run --agent ID`), also its registry entry."""
    executable: str
    """The command looked up on PATH, then in the project's pinned tools."""
    apis: tuple[str, ...]
    """Driver API kinds the CLI speaks (`LLMDriver.api`)."""
    command: CommandBuilder
    parser: type[StreamParser]
    """Reads the CLI's JSON event stream (one object a line on stdout): tool calls and the usage it reports."""
    install: CliInstall
    version_args: tuple[str, ...] = ("--version",)
    """What the preflight runs to see that the CLI starts."""
    offline_env: Mapping[str, str] = field(default_factory=dict)
    """Settings that keep the CLI from reaching out at start-up (the sandbox has no network but its proxy)."""


def cli_home(agent_id: str) -> Path:
    """A per-session home for a CLI's settings and state, in the workspace (the only place it may write when
    sandboxed), so that no CLI reads or writes the harness user's own configuration."""
    home = Path(os.environ.get("WORKSPACE", os.getcwd())) / ".a2rl-cli" / agent_id
    home.mkdir(parents=True, exist_ok=True)
    return home
