"""Parsers of CLI agents' JSON event streams (`claude -p --output-format stream-json`, `codex exec --json`,
`gemini -p --output-format stream-json`, `opencode run --format json`): tool calls as `ToolCallEvent`s and the
token usage the CLI itself reports (a cross-check of the proxy's, which is the one accounted)."""

from __future__ import annotations

import json
import time
from typing import Any

from agents.base import ToolCallEvent, shorten


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
                text, failed = _text(block.get("content")), bool(block.get("is_error"))
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



class CodexStreamParser(StreamParser):
    """`codex exec --json`: `item.completed` events for commands, file changes, MCP tools and web searches;
    `turn.completed` events carry the usage of a turn."""

    TOOL_ITEMS = {"command_execution": "command", "file_change": "changes", "mcp_tool_call": "tool",
                  "web_search": "query"}  # fmt: skip

    def __init__(self):
        super().__init__()
        self.started: dict[str, float] = {}

    def feed(self, event: dict[str, Any]) -> list[ToolCallEvent]:
        self.events += 1
        kind = event.get("type", "")
        item = event.get("item") or {}
        if kind == "item.started":
            self.started[item.get("id", "")] = time.monotonic()
        elif kind == "item.completed" and item.get("type") in self.TOOL_ITEMS:
            key = self.TOOL_ITEMS[item["type"]]
            started = self.started.pop(item.get("id", ""), time.monotonic())
            exit_code = item.get("exit_code")
            failed = item.get("status") in ("failed", "declined") or (exit_code not in (None, 0))
            output = _text(item.get("aggregated_output") or item.get("result") or "")
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
            text = _text(event.get("output") or (error.get("message") if isinstance(error, dict) else error))
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
            text = _text(state.get("output") if not failed else state.get("error"))
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



class OpenHandsStreamParser(PairingParser):
    """`openhands --headless --json`: an `ActionEvent` per tool call (tool_name, tool_call_id, arguments),
    answered by an `ObservationEvent` (its observation: content, is_error, exit_code) or an `AgentErrorEvent`
    (a call the agent could not make). The stream carries no usage: the proxy's count is the only one."""

    def feed(self, event: dict[str, Any]) -> list[ToolCallEvent]:
        self.events += 1
        kind, call_id = event.get("kind"), event.get("tool_call_id") or ""
        if kind == "ActionEvent" and event.get("tool_name"):
            try:
                args = json.loads((event.get("tool_call") or {}).get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {"arguments": (event.get("tool_call") or {}).get("arguments")}
            self.pending[call_id] = (event["tool_name"], args if isinstance(args, dict) else {"arguments": args},
                                     time.monotonic())  # fmt: skip
        elif kind in ("ObservationEvent", "AgentErrorEvent") and call_id in self.pending:
            name, args, started = self.pending.pop(call_id)
            observation = event.get("observation") or {}
            exit_code = observation.get("exit_code") if isinstance(observation.get("exit_code"), int) else None
            failed = kind == "AgentErrorEvent" or bool(observation.get("is_error")) or exit_code not in (None, 0)
            text = _text(event.get("error") if kind == "AgentErrorEvent" else observation.get("content"))
            return [self.tool_event(tool=name, tool_use_id=call_id, input=shorten(args, 500), ok=not failed,
                                    exit_code=exit_code, duration_s=round(time.monotonic() - started, 3),
                                    output_chars=len(text), error=text[:300] if failed else None)]  # fmt: skip
        elif kind == "ConversationErrorEvent" or (kind == "AgentErrorEvent" and not call_id):
            self.result = {"error": event.get("error") or event.get("detail")}
        return []


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
    return "" if content is None else str(content)
