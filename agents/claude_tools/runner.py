"""The harness-side loop of `claude-tools`: `python -m a2rl_bench.agents.claude_tools.runner`, started by `run_agent`.

It holds the driver's API key (from `A2RL_HARNESS_API_KEY`, removed from its environment before any tool
runs) and talks to the LLM from the host; tools run in the workspace with the agent's scrubbed environment,
each bash command in the run's sandbox (the policy `run_agent` passes in `A2RL_HARNESS_SANDBOX`). Every LLM call
goes to `harness/llm_calls.jsonl` (tokens, cache, cost, latency, retries), every tool call to
`harness/tool_calls.jsonl`, every message to `harness/transcript.jsonl`. `run_agent` owns the lifetime: on
its SIGTERM the loop stops, kills the commands it started and exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anthropic

from a2rl_bench.jsonl import append_jsonl
from a2rl_bench.isolation.sandbox import SandboxPolicy, policy_from_dict, sandbox_label
from a2rl_bench.agents.base import (
    HARNESS_ENV_PREFIX,
    LLM_CALLS_FILE,
    TOOL_CALLS_FILE,
    TRANSCRIPT_FILE,
    AgentOptions,
    LLMCallEvent,
    LLMDriver,
    ToolCallEvent,
    shorten,
)
from a2rl_bench.agents.claude_tools import context
from a2rl_bench.agents.claude_tools.prompts import NUDGE, SYSTEM_PROMPT, task_prompt
from a2rl_bench.agents.claude_tools.tools import TOOL_SPECS, Toolbox

TRANSIENT_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}
MAX_BACKOFF_S = 60.0


class SessionStopped(Exception):
    """The harness asked the session to end (SIGTERM at the end of the budget)."""


def take_harness_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Remove and return the `A2RL_HARNESS_*` variables, so that nothing started later inherits them."""
    environ = os.environ if environ is None else environ
    return {k[len(HARNESS_ENV_PREFIX) :]: environ.pop(k) for k in list(environ) if k.startswith(HARNESS_ENV_PREFIX)}


def make_undumpable() -> None:
    """Keep same-user processes from reading this process's memory and /proc/<pid>/environ (Linux).

    Defence in depth for the API key: it does not stop root, nor the agent's commands where no sandbox policy
    puts them in other namespaces (and, for a root harness, under another uid).
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


class ToolSession:
    """One conversation: call the model, run the tools it asks for, repeat until the session ends."""

    def __init__(self, client, driver: LLMDriver, options: AgentOptions, toolbox: Toolbox, harness_dir: Path):
        self.client = client
        self.driver = driver
        self.options = options
        self.tools = toolbox
        self.harness = Path(harness_dir)
        self.system = [{"type": "text", "text": SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}]
        self.tool_specs = [dict(t) for t in TOOL_SPECS]
        self.tool_specs[-1]["cache_control"] = {"type": "ephemeral"}
        self.messages: list[dict[str, Any]] = []
        self.digest: list[str] = []
        self.calls = 0
        self.tool_calls = 0
        self.cost_usd = 0.0
        self.last_prompt_tokens = 0
        self.nudges = 0
        self.compactions = 0

    # -- records ----------------------------------------------------------------------------------------
    def transcript(self, kind: str, **fields: Any) -> None:
        append_jsonl(self.harness / TRANSCRIPT_FILE, {"at": datetime.now(timezone.utc).isoformat(), "kind": kind,
                                                      **fields})  # fmt: skip

    def add_message(self, role: str, content: Any) -> None:
        self.messages.append({"role": role, "content": content})
        self.transcript("message", role=role, content=content)

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self, first_message: str) -> str:
        """Returns why the session ended."""
        sandbox = sandbox_label(self.tools.sandbox) if self.tools.sandbox else "none: commands run on the host"
        self.transcript("start", driver=self.driver.public(), options=self.options.model_dump(), sandbox=sandbox)
        self.add_message("user", first_message)
        while True:
            if self.calls >= self.options.max_turns:
                return f"max_turns ({self.options.max_turns}) reached"
            if self.options.max_cost_usd is not None and self.cost_usd >= self.options.max_cost_usd:
                return f"cost limit ${self.options.max_cost_usd:.2f} reached (${self.cost_usd:.4f})"
            self.fit_context()
            response = self.call_llm()
            content = [block_param(block) for block in response.content]
            self.add_message("assistant", content)
            uses = [b for b in content if b.get("type") == "tool_use"]
            if uses:
                self.add_message("user", [self.run_tool(b) for b in uses])
                continue
            if response.stop_reason == "max_tokens":
                self.add_message("user", "Your reply was cut off at the output limit; continue.")
                continue
            text = " ".join(b.get("text", "") for b in content if b.get("type") == "text").strip()
            nudge = self.nudge_text()
            if text == "DONE" or nudge is None:
                return "the agent ended its turn" if text != "DONE" else "the agent said DONE"
            self.add_message("user", nudge)

    def nudge_text(self) -> str | None:
        """What to tell a model that stopped while budget remains; None when it may stop."""
        if self.nudges >= self.options.max_nudges:
            return None
        budget = self.tools.budget() or {}
        remaining = float(budget.get("remaining_s", 0.0))
        if remaining < max(60.0, 0.05 * float(budget.get("budget_s", 0.0))):
            return None
        self.nudges += 1
        cap = budget.get("max_submissions")
        used = budget.get("submissions_used", 0)
        subs = f"{cap - used} submissions" if cap is not None else "unlimited submissions"
        return NUDGE.format(remaining_s=remaining, submissions=subs)

    def run_tool(self, block: dict) -> dict:
        self.tool_calls += 1
        name, args = block.get("name", ""), block.get("input") or {}
        t0 = time.monotonic()
        result = self.tools.run(name, args)
        event = ToolCallEvent(call=self.tool_calls, tool=name, tool_use_id=block.get("id"), input=shorten(args, 500),
                              ok=not result.is_error, exit_code=result.exit_code,
                              duration_s=round(time.monotonic() - t0, 3), output_chars=len(result.text),
                              error=result.text[:300] if result.is_error else None)  # fmt: skip
        append_jsonl(self.harness / TOOL_CALLS_FILE, event)
        print(f"[tool {self.tool_calls}] {name} {json.dumps(shorten(args, 120))[:200]} -> "
              f"{'error' if result.is_error else 'ok'} in {event.duration_s:.1f}s", flush=True)  # fmt: skip
        return {"type": "tool_result", "tool_use_id": block.get("id"), "content": result.text,
                "is_error": result.is_error}  # fmt: skip

    def fit_context(self) -> None:
        """Shorten old outputs, then drop the middle, when the last prompt was over the context limit."""
        limit = self.options.context_limit_tokens
        size = max(self.last_prompt_tokens, context.estimate_tokens(self.messages, len(SYSTEM_PROMPT)))
        if size <= limit:
            return
        keep = self.options.keep_last_messages
        shortened = context.shorten_old_results(self.messages, keep)
        after = context.estimate_tokens(self.messages, len(SYSTEM_PROMPT))
        dropped = 0
        if after > 0.8 * limit or (not shortened and size > limit):
            before = len(self.messages)
            self.messages = context.drop_middle(self.messages, keep, self.digest)
            dropped = before - len(self.messages)
        self.compactions += 1
        self.last_prompt_tokens = 0  # unknown until the next call reports it
        self.transcript("compaction", prompt_tokens=size, shortened_results=shortened, dropped_messages=dropped,
                        kept_messages=len(self.messages))  # fmt: skip

    # -- the LLM ----------------------------------------------------------------------------------------
    def call_llm(self):
        """One Messages API call, retried with exponential backoff on transient failures; every attempt logged."""
        self.calls += 1
        request = {
            "model": self.driver.model,
            "max_tokens": self.options.max_output_tokens,
            "system": self.system,
            "tools": self.tool_specs,
            "messages": context.for_request(self.messages),
        }
        for attempt in range(1, self.options.max_attempts + 1):
            t0 = time.monotonic()
            try:
                response = self.client.messages.create(**request)
            except (anthropic.APIConnectionError, anthropic.APIStatusError) as e:
                status = getattr(e, "status_code", None)
                transient = status is None or status in TRANSIENT_STATUS
                self.log_call(attempt, time.monotonic() - t0, status=status, error=f"{type(e).__name__}: {e}"[:500])
                if not transient or attempt == self.options.max_attempts:
                    raise
                delay = self.backoff_s(attempt, e)
                print(f"[llm {self.calls}] {type(e).__name__} ({status}); retry {attempt} in {delay:.1f}s", flush=True)
                time.sleep(delay)
                continue
            self.log_call(attempt, time.monotonic() - t0, response=response)
            return response
        raise AssertionError("unreachable")

    def backoff_s(self, attempt: int, error: Exception) -> float:
        """Exponential with jitter; a server's `retry-after` wins when it asks for longer."""
        delay = min(MAX_BACKOFF_S, self.options.retry_base_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
        headers = getattr(getattr(error, "response", None), "headers", None) or {}
        try:
            asked = float(headers.get("retry-after-ms") or 0) / 1000 or float(headers.get("retry-after") or 0)
        except (TypeError, ValueError):
            asked = 0.0
        return max(delay, min(asked, MAX_BACKOFF_S))

    def log_call(self, attempt: int, latency_s: float, response=None, status: int | None = None,
                 error: str | None = None) -> None:  # fmt: skip
        usage = getattr(response, "usage", None)
        tokens = {
            "input_tokens": getattr(usage, "input_tokens", 0) or 0,
            "output_tokens": getattr(usage, "output_tokens", 0) or 0,
            "cache_read_tokens": getattr(usage, "cache_read_input_tokens", 0) or 0,
            "cache_write_tokens": getattr(usage, "cache_creation_input_tokens", 0) or 0,
        }
        cost = self.driver.cost_usd(tokens["input_tokens"], tokens["output_tokens"], tokens["cache_read_tokens"],
                                    tokens["cache_write_tokens"])  # fmt: skip
        self.cost_usd += cost
        if response is not None:
            prompt_keys = ("input_tokens", "cache_read_tokens", "cache_write_tokens")
            self.last_prompt_tokens = sum(tokens[k] for k in prompt_keys)
        event = LLMCallEvent(call=self.calls, attempt=attempt, model=getattr(response, "model", self.driver.model),
                             **tokens, cost_usd=round(cost, 8), latency_s=round(latency_s, 3),
                             stop_reason=getattr(response, "stop_reason", None),
                             status=200 if response is not None else status, error=error)  # fmt: skip
        append_jsonl(self.harness / LLM_CALLS_FILE, event)


def block_param(block) -> dict[str, Any]:
    """A response content block as a request block: only the fields the API accepts back."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return {"type": "text", "text": block.text}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if kind == "thinking":
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    return block.model_dump(exclude_none=True)


def sandbox_policy(harness_env: dict[str, str]) -> SandboxPolicy | None:
    """The sandbox policy `run_agent` passed for what this runner starts (None: run it on the host)."""
    data = harness_env.get("SANDBOX")
    return policy_from_dict(json.loads(data)) if data else None


def main() -> int:
    """Read the harness-side settings, strip them from the environment, run the session."""
    secrets = take_harness_env()
    make_undumpable()
    config = json.loads(secrets.get("CONFIG", "{}"))
    driver = LLMDriver(**config["driver"], api_key=secrets.get("API_KEY", ""))
    options = AgentOptions(**config.get("options", {}))
    harness = Path(config["harness_dir"])
    harness.mkdir(parents=True, exist_ok=True)
    workspace = Path(os.environ.get("WORKSPACE", os.getcwd()))

    client = anthropic.Anthropic(api_key=driver.api_key.get_secret_value() or "none", base_url=driver.base_url,
                                 max_retries=0, timeout=600.0)  # fmt: skip
    toolbox = Toolbox(workspace, dict(os.environ), options.command_timeout_s, options.max_command_timeout_s,
                      options.output_limit_chars, sandbox_policy(secrets))  # fmt: skip
    session = ToolSession(client, driver, options, toolbox, harness)
    code, reason = 0, ""

    def stop(signum, frame):
        raise SessionStopped(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        reason = session.run(task_prompt(workspace))
    except SessionStopped as e:
        reason = f"stopped by the harness ({e})"
    except anthropic.APIError as e:
        reason, code = f"LLM API error: {type(e).__name__}: {e}", 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        toolbox.close()
        summary = {"reason": reason, "llm_calls": session.calls, "tool_calls": session.tool_calls,
                   "cost_usd": round(session.cost_usd, 6), "compactions": session.compactions}  # fmt: skip
        session.transcript("end", **summary)
        print(f"[claude-tools] session ended: {json.dumps(summary)}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
