"""The opencode CLI agent: OpenCode (`opencode run --format json`), its stream parser and its install facts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from a2rl_bench.agents.base import AgentOptions, LLMDriver, ToolCallEvent, shorten
from a2rl_bench.agents.cli_agents.adapter import CLIAgent
from a2rl_bench.agents.cli_agents.spec import CliAgentSpec, CliInstall, cli_home
from a2rl_bench.agents.cli_agents.streams import StreamParser, content_text

if TYPE_CHECKING:
    from a2rl_bench.agents.cli_agents.proxy import LLMProxy


class OpenCodeStreamParser(StreamParser):
    """`opencode run --format json`: a `tool_use` event per finished tool call (its part's state has the
    input, output, status and times); `step_finish` events carry each model call's tokens and cost."""

    def feed(self, event: dict[str, Any]) -> list[ToolCallEvent]:
        self.events += 1
        kind = event.get("type")
        part = event.get("part") or {}
        if kind == "tool_use":
            state = part.get("state") or {}
            failed = state.get("status") != "completed"
            meta = state.get("metadata") or {}
            times = state.get("time") or {}
            duration = (times["end"] - times["start"]) / 1000 if {"start", "end"} <= times.keys() else None
            text = content_text(state.get("output") if not failed else state.get("error"))
            exit_code = meta.get("exit") if isinstance(meta.get("exit"), int) else None
            return [self.tool_event(tool=part.get("tool", "?"), tool_use_id=part.get("callID"),
                                    input=shorten(state.get("input") or {}, 500), ok=not failed and exit_code in (None, 0),
                                    exit_code=exit_code, duration_s=duration, output_chars=len(text),
                                    error=text[:300] if failed or exit_code not in (None, 0) else None)]  # fmt: skip
        if kind == "step_finish":
            tokens = part.get("tokens") or {}
            cache = tokens.get("cache") or {}
            self.usage["input_tokens"] += tokens.get("input") or 0
            self.usage["output_tokens"] += (tokens.get("output") or 0) + (tokens.get("reasoning") or 0)
            self.usage["cache_read_tokens"] += cache.get("read") or 0
            self.usage["cache_write_tokens"] += cache.get("write") or 0
            self.reported_cost_usd = (self.reported_cost_usd or 0.0) + float(part.get("cost") or 0.0)
            self.result = {"reason": part.get("reason")}
        elif kind == "error":
            self.result = {"error": event.get("error")}
        return []


def opencode_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                     ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`opencode run --format json` with one provider, `a2rl`, at the proxy: OpenAI-compatible Chat
    Completions (`@ai-sdk/openai-compatible`) or Anthropic Messages, both built into opencode's binary.
    Every tool is allowed without asking, but web fetches (no network but the proxy and the grader)."""
    home = cli_home("opencode")
    if driver.api == "anthropic":
        provider = {"npm": "@ai-sdk/anthropic", "options": {"baseURL": proxy.url + "/v1", "apiKey": proxy.token}}
    else:
        provider = {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": proxy.url, "apiKey": proxy.token}}
    provider |= {"name": "a2rl proxy", "models": {driver.model: {"name": driver.model}}}
    config = {"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
              "model": f"a2rl/{driver.model}", "small_model": f"a2rl/{driver.model}",
              "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny", "external_directory": "deny"},
              "provider": {"a2rl": provider}}  # fmt: skip
    argv = ["opencode", "run", "--format", "json", "-m", f"a2rl/{driver.model}", *options.extra_args, prompt]
    xdg = {f"XDG_{k}_HOME": str(home / k.lower()) for k in ("CONFIG", "DATA", "CACHE", "STATE")}
    return argv, {"OPENCODE_CONFIG_CONTENT": json.dumps(config), "OPENCODE_DISABLE_AUTOUPDATE": "1",
                  "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", **xdg}  # fmt: skip


SPEC = CliAgentSpec(id="opencode", executable="opencode", apis=("openai", "anthropic"), command=opencode_command,
                    parser=OpenCodeStreamParser, install=CliInstall("opencode-ai", "1.18.33"))


class OpenCode(CLIAgent):
    """The OpenCode CLI (`opencode run`), in the sandbox behind the logging proxy."""

    spec = SPEC
