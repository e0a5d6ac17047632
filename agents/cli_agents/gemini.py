"""The gemini CLI agent: Google's Gemini CLI (`gemini -p --output-format stream-json`), its stream parser and its
install facts."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from a2rl_bench.agents.base import AgentOptions, LLMDriver, ToolCallEvent, shorten
from a2rl_bench.agents.cli_agents.adapter import CLIAgent
from a2rl_bench.agents.cli_agents.spec import CliAgentSpec, CliInstall, cli_home
from a2rl_bench.agents.cli_agents.streams import PairingParser, content_text

if TYPE_CHECKING:
    from a2rl_bench.agents.cli_agents.proxy import LLMProxy


class GeminiStreamParser(PairingParser):
    """Gemini CLI's stream-json: `tool_use` (tool_name, tool_id, parameters) then `tool_result` (tool_id,
    status, output or error); `result` ends the session with the usage summed over its model calls."""

    def feed(self, event: dict[str, Any]) -> list[ToolCallEvent]:
        self.events += 1
        kind = event.get("type")
        if kind == "tool_use":
            self.pending[event.get("tool_id", "")] = (event.get("tool_name", "?"), event.get("parameters") or {},
                                                      time.monotonic())  # fmt: skip
        elif kind == "tool_result":
            name, args, started = self.pending.pop(event.get("tool_id", ""), ("?", {}, time.monotonic()))
            failed = event.get("status") != "success"
            error = event.get("error")
            text = content_text(event.get("output") or (error.get("message") if isinstance(error, dict) else error))
            return [self.tool_event(tool=name, tool_use_id=event.get("tool_id"), input=shorten(args, 500),
                                    ok=not failed, duration_s=round(time.monotonic() - started, 3),
                                    output_chars=len(text), error=text[:300] if failed else None)]  # fmt: skip
        elif kind == "result":
            stats = event.get("stats") or {}
            cached = stats.get("cached") or 0
            self.usage.update(input_tokens=(stats.get("input_tokens") or 0) - cached, cache_read_tokens=cached,
                              output_tokens=stats.get("output_tokens") or 0)  # fmt: skip
            self.result = {"status": event.get("status"), "error": event.get("error"),
                           "tool_calls": stats.get("tool_calls"), "duration_ms": stats.get("duration_ms")}  # fmt: skip
        return []


def gemini_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                   ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`gemini -p --output-format stream-json --yolo` on the Gemini API at the proxy (its key header is
    `x-goog-api-key`); settings pick API-key auth, switch off telemetry and updates, and leave out the web
    tools (no network but the proxy and the grader, as for codex)."""
    home = cli_home("gemini")
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                "telemetry": {"enabled": False}, "privacy": {"usageStatisticsEnabled": False},
                "tools": {"exclude": ["google_web_search", "web_fetch"]}}  # fmt: skip
    (home / ".gemini").mkdir(exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings, indent=1))
    argv = ["gemini", "-p", prompt, "--output-format", "stream-json", "--yolo", "-m", driver.model,
            *options.extra_args]  # fmt: skip
    return argv, {"GEMINI_API_KEY": proxy.token, "GOOGLE_GEMINI_BASE_URL": proxy.url, "GEMINI_CLI_HOME": str(home),
                  "GEMINI_CLI_TRUST_WORKSPACE": "true"}  # fmt: skip


SPEC = CliAgentSpec(id="gemini", executable="gemini", apis=("gemini",), command=gemini_command,
                    parser=GeminiStreamParser, install=CliInstall("@google/gemini-cli", "0.61.0"))


class GeminiCLI(CLIAgent):
    """Google's Gemini CLI (`gemini -p --yolo`), in the sandbox behind the logging proxy."""

    spec = SPEC
