"""The base of every CLI agent's stream parser (each agent's own is in its module: `claude_code.py`, ...): tool
calls as `ToolCallEvent`s and the token usage the CLI itself reports (a cross-check of the proxy's, which is the
one accounted)."""

from __future__ import annotations

from typing import Any

from a2rl_bench.agents.base import ToolCallEvent, shorten


class StreamParser:
    """Feed it one decoded JSON event per line; it returns the tool calls that completed."""

    def __init__(self):
        self.tool_calls = 0
        self.usage = {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0}
        """Summed over the model messages the stream reports."""
        self.reported_cost_usd: float | None = None
        self.result: dict[str, Any] | None = None
        self.events = 0

    def feed(self, event: dict[str, Any]) -> list[ToolCallEvent]:
        raise NotImplementedError

    def finish(self) -> list[ToolCallEvent]:
        """Tool calls still open when the stream ended (the session was stopped)."""
        return []

    def summary(self) -> dict[str, Any]:
        return {"events": self.events, "tool_calls": self.tool_calls, "usage": self.usage,
                "reported_cost_usd": self.reported_cost_usd, "result": self.result}  # fmt: skip

    def tool_event(self, **fields: Any) -> ToolCallEvent:
        self.tool_calls += 1
        return ToolCallEvent(call=self.tool_calls, source="stream", **fields)


class PairingParser(StreamParser):
    """A stream that announces a tool call and its result in separate events: calls wait in `pending`."""

    def __init__(self):
        super().__init__()
        self.pending: dict[str, tuple[str, dict, float]] = {}
        """tool id -> (tool name, input, monotonic start)"""

    def finish(self) -> list[ToolCallEvent]:
        """Tool calls that never got a result (the session was stopped)."""
        done = [self.tool_event(tool=name, tool_use_id=tid, input=shorten(args, 500), ok=False,
                                error="no result: the session ended first")
                for tid, (name, args, _) in self.pending.items()]  # fmt: skip
        self.pending.clear()
        return done


def content_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
    return "" if content is None else str(content)
