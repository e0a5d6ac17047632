"""LLM and tool calls of a run as store rows: `read_llm_calls` / `read_tool_calls` read the agents'
`llm_calls.jsonl` / `tool_calls.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from a2rl_bench.jsonl import read_jsonl

# Agents write `harness/llm_calls.jsonl` and `harness/tool_calls.jsonl` (records `LLMCallEvent` and
# `ToolCallEvent` in agents/base.py). They are read here as plain JSON, so this module does not import agents;
# `read_jsonl(tolerant=True)` skips the torn last line a crashed agent may leave.


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_llm_calls(path: Path | str) -> list[dict[str, Any]]:
    """Rows for the `llm_calls` table, one per line of `llm_calls.jsonl`; `seq` is the line number."""
    return [
        {
            "seq": seq,
            "created_at": r.get("at"),
            "agent_elapsed_s": r.get("agent_elapsed_s"),
            "model": r.get("model"),
            "input_tokens": _int(r.get("input_tokens")) or 0,
            "output_tokens": _int(r.get("output_tokens")) or 0,
            "cache_read_tokens": _int(r.get("cache_read_tokens")) or 0,
            "cache_write_tokens": _int(r.get("cache_write_tokens")) or 0,
            "cost_usd": r.get("cost_usd"),
            "latency_s": r.get("latency_s"),
            "error": r.get("error"),
            "call": _int(r.get("call")),
            "attempt": _int(r.get("attempt")),
            "status": _int(r.get("status")),
            "stop_reason": r.get("stop_reason"),
            "source": r.get("source"),
        }  # fmt: skip
        for seq, r in enumerate(read_jsonl(path, tolerant=True))
    ]


def read_tool_calls(path: Path | str) -> list[dict[str, Any]]:
    """Rows for the `tool_calls` table, one per line of `tool_calls.jsonl`; `seq` is the line number."""
    return [
        {
            "seq": seq,
            "created_at": r.get("at"),
            "call": _int(r.get("call")),
            "tool": r.get("tool"),
            "ok": r.get("ok"),
            "exit_code": _int(r.get("exit_code")),
            "duration_s": r.get("duration_s"),
            "output_chars": _int(r.get("output_chars")),
            "error": r.get("error"),
            "source": r.get("source"),
            "input_json": json.dumps(r.get("input") or {}, sort_keys=True, default=str),
        }  # fmt: skip
        for seq, r in enumerate(read_jsonl(path, tolerant=True))
    ]


def summarize_llm_calls(rows: list[dict[str, Any]]) -> dict[str, float | int | None]:
    """Totals for the run report (tokens as input + output + cache read + cache write)."""
    if not rows:
        return {}
    parts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    tokens = sum(r[p] for r in rows for p in parts)
    costs = [r["cost_usd"] for r in rows if isinstance(r["cost_usd"], (int, float))]
    latencies = [r["latency_s"] for r in rows if isinstance(r["latency_s"], (int, float))]
    return {
        "llm_requests": len(rows),
        "llm_failed_requests": sum(bool(r["error"]) for r in rows),
        "llm_tokens_total": tokens,
        "llm_input_tokens": sum(r["input_tokens"] for r in rows),
        "llm_output_tokens": sum(r["output_tokens"] for r in rows),
        "llm_cache_read_tokens": sum(r["cache_read_tokens"] for r in rows),
        "llm_cost_usd": round(sum(costs), 6) if costs else None,
        "llm_latency_s_mean": round(sum(latencies) / len(latencies), 3) if latencies else None,
    }
