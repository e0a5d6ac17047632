"""The claude-code CLI agent: Claude Code (`claude -p --output-format stream-json`), its stream parser and its
install facts."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from a2rl_bench.agents.base import AgentOptions, LLMDriver, ToolCallEvent, shorten
from a2rl_bench.agents.cli_agents.adapter import CLIAgent
from a2rl_bench.agents.cli_agents.spec import CliAgentSpec, CliInstall
from a2rl_bench.agents.cli_agents.streams import PairingParser, content_text

if TYPE_CHECKING:
    from a2rl_bench.agents.cli_agents.proxy import LLMProxy


class ClaudeStreamParser(PairingParser):
    """Claude Code's stream-json: `assistant` messages carry tool_use blocks and usage (one event per content
    block, so usage is counted once per message id, and only as of the message's start); `user` messages carry
    the tool results; `result` ends with the session's final usage, which replaces the running count."""

    def __init__(self):
        super().__init__()
        self.messages: dict[str, dict[str, int]] = {}

    def feed(self, event: dict[str, Any]) -> list[ToolCallEvent]:
        self.events += 1
        kind = event.get("type")
        done: list[ToolCallEvent] = []
        message = event.get("message") or {}
        if kind == "assistant":
            self._count_usage(message)
            for block in message.get("content") or []:
                if block.get("type") == "tool_use":
                    self.pending[block.get("id", "")] = (block.get("name", "?"), block.get("input") or {},
                                                         time.monotonic())  # fmt: skip
        elif kind == "user":
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("type") != "tool_result":
                    continue
                name, args, started = self.pending.pop(block.get("tool_use_id", ""), ("?", {}, time.monotonic()))
                text, failed = content_text(block.get("content")), bool(block.get("is_error"))
                done.append(self.tool_event(
                    tool=name, tool_use_id=block.get("tool_use_id"), input=shorten(args, 500), ok=not failed,
                    duration_s=round(time.monotonic() - started, 3), output_chars=len(text),
                    error=text[:300] if failed else None,
                ))  # fmt: skip
        elif kind == "result":
            self.result = {k: event.get(k) for k in ("subtype", "is_error", "num_turns", "duration_ms", "result")}
            self.reported_cost_usd = event.get("total_cost_usd")
            if isinstance(event.get("usage"), dict):
                # The session's final totals: the assistant events only carry each message's usage as of its
                # `message_start` (output tokens so far: 1, not the hundreds it ended with).
                u = event["usage"]
                self.usage = {"input_tokens": u.get("input_tokens") or 0, "output_tokens": u.get("output_tokens") or 0,
                              "cache_read_tokens": u.get("cache_read_input_tokens") or 0,
                              "cache_write_tokens": u.get("cache_creation_input_tokens") or 0}  # fmt: skip
        return done

    def _count_usage(self, message: dict) -> None:
        usage = message.get("usage")
        if not isinstance(usage, dict):
            return
        counts = {"input_tokens": usage.get("input_tokens") or 0, "output_tokens": usage.get("output_tokens") or 0,
                  "cache_read_tokens": usage.get("cache_read_input_tokens") or 0,
                  "cache_write_tokens": usage.get("cache_creation_input_tokens") or 0}  # fmt: skip
        previous = self.messages.get(message.get("id", ""), {})
        for k, v in counts.items():
            self.usage[k] += max(0, v - previous.get(k, 0))
        self.messages[message.get("id", "")] = {k: max(v, previous.get(k, 0)) for k, v in counts.items()}


def claude_code_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                        ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`claude -p` with the stream-json output of the original's wrapper, pointed at the proxy."""
    argv = ["claude", "-p", prompt, "--output-format", "stream-json", "--verbose", "--model", driver.model,
            "--dangerously-skip-permissions", *options.extra_args]  # fmt: skip
    env = {
        "ANTHROPIC_BASE_URL": proxy.url,
        "ANTHROPIC_API_KEY": proxy.token,
        # Background calls (titles, summaries) go to the same model: a compatible endpoint may serve only one.
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": driver.model,
        "ANTHROPIC_SMALL_FAST_MODEL": driver.model,
        "BASH_DEFAULT_TIMEOUT_MS": str(int(options.command_timeout_s * 1000)),
        "BASH_MAX_TIMEOUT_MS": str(int(options.max_command_timeout_s * 1000)),
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # Claude Code refuses --dangerously-skip-permissions as root unless told it is sandboxed.
        "IS_SANDBOX": "1",
    }
    return argv, env


SPEC = CliAgentSpec(id="claude-code", executable="claude", apis=("anthropic",), command=claude_code_command,
                    parser=ClaudeStreamParser, install=CliInstall("@anthropic-ai/claude-code", "2.1.332"))


class ClaudeCode(CLIAgent):
    """Anthropic's Claude Code CLI, headless (`claude -p`), in the sandbox behind the logging proxy."""

    spec = SPEC
