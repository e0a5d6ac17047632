"""The codex CLI agent: OpenAI's Codex CLI (`codex exec --json`), its stream parser and its install facts."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from a2rl_bench.agents.base import AgentOptions, LLMDriver, ToolCallEvent, shorten
from a2rl_bench.agents.cli_agents.adapter import CLIAgent
from a2rl_bench.agents.cli_agents.spec import CliAgentSpec, CliInstall
from a2rl_bench.agents.cli_agents.streams import StreamParser, content_text

if TYPE_CHECKING:
    from a2rl_bench.agents.cli_agents.proxy import LLMProxy


class CodexStreamParser(StreamParser):
    """`codex exec --json`: `item.completed` events for commands, file changes, MCP tools and web searches;
    `turn.completed` events carry the usage of a turn."""

    TOOL_ITEMS = {"command_execution": "command", "file_change": "changes", "mcp_tool_call": "tool",
                  "web_search": "query"}  # fmt: skip

    def __init__(self):
        super().__init__()
        self.started: dict[str, float] = {}
        self.open_items: dict[str, dict[str, Any]] = {}
        """Tool items started and not completed: the last one (often the `/submit` call the budget's end cut off)
        is still a tool call of the session (`finish`)."""

    def feed(self, event: dict[str, Any]) -> list[ToolCallEvent]:
        self.events += 1
        kind = event.get("type", "")
        item = event.get("item") or {}
        if kind == "item.started":
            self.started[item.get("id", "")] = time.monotonic()
            if item.get("type") in self.TOOL_ITEMS:
                self.open_items[item.get("id", "")] = item
        elif kind == "item.completed" and item.get("type") in self.TOOL_ITEMS:
            key = self.TOOL_ITEMS[item["type"]]
            self.open_items.pop(item.get("id", ""), None)
            started = self.started.pop(item.get("id", ""), time.monotonic())
            exit_code = item.get("exit_code")
            failed = item.get("status") in ("failed", "declined") or (exit_code not in (None, 0))
            output = content_text(item.get("aggregated_output") or item.get("result") or "")
            return [self.tool_event(tool=item["type"], tool_use_id=item.get("id"),
                                    input=shorten({key: item.get(key)}, 500), ok=not failed, exit_code=exit_code,
                                    duration_s=round(time.monotonic() - started, 3), output_chars=len(output),
                                    error=output[:300] if failed else None)]  # fmt: skip
        elif kind == "turn.completed":
            u = event.get("usage") or {}
            cached = u.get("cached_input_tokens") or 0
            self.usage["input_tokens"] += (u.get("input_tokens") or 0) - cached
            self.usage["cache_read_tokens"] += cached
            self.usage["output_tokens"] += u.get("output_tokens") or 0
            self.usage["cache_write_tokens"] += u.get("cache_write_input_tokens") or 0
        elif kind in ("turn.failed", "error"):
            self.result = {"error": event.get("error") or event.get("message")}
        return []

    def finish(self) -> list[ToolCallEvent]:
        """Tool items that never completed (the session was stopped while they ran)."""
        done = []
        for tid, item in self.open_items.items():
            key = self.TOOL_ITEMS[item["type"]]
            done.append(self.tool_event(tool=item["type"], tool_use_id=tid, input=shorten({key: item.get(key)}, 500),
                                        ok=False, error="no result: the session ended first"))  # fmt: skip
        self.open_items.clear()
        return done


def codex_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                  ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`codex exec --json` with a model provider that points at the proxy (no web search, unlike the original)."""
    provider = {"name": "a2rl", "base_url": proxy.url, "env_key": "OPENAI_API_KEY", "wire_api": "responses"}
    # No login shell for its commands: a login shell's profile resets PATH (the run's Python, its tools).
    overrides = ["model_provider=a2rl", 'web_search="disabled"', "allow_login_shell=false"]
    overrides += [f"model_providers.a2rl.{k}={json.dumps(v)}" for k, v in provider.items()]
    argv = ["codex", "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-m", driver.model, *[x for o in overrides for x in ("-c", o)], *options.extra_args, prompt]  # fmt: skip
    return argv, {"OPENAI_API_KEY": proxy.token}


SPEC = CliAgentSpec(id="codex", executable="codex", apis=("openai",), command=codex_command,
                    parser=CodexStreamParser, install=CliInstall("@openai/codex", "0.171.0"))


class Codex(CLIAgent):
    """OpenAI's Codex CLI (`codex exec`), in the sandbox behind the logging proxy."""

    spec = SPEC
