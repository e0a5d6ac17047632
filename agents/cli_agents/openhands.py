"""The openhands CLI agent: OpenHands (`openhands --headless --json`, its own Python >= 3.12 venv), its stream
parser and its install facts."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from a2rl_bench.agents.base import AgentOptions, LLMDriver, ToolCallEvent, shorten
from a2rl_bench.agents.cli_agents.adapter import CLIAgent
from a2rl_bench.agents.cli_agents.spec import CliAgentSpec, CliInstall
from a2rl_bench.agents.cli_agents.streams import PairingParser, content_text

if TYPE_CHECKING:
    from a2rl_bench.agents.cli_agents.proxy import LLMProxy


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
            text = content_text(event.get("error") if kind == "AgentErrorEvent" else observation.get("content"))
            return [self.tool_event(tool=name, tool_use_id=call_id, input=shorten(args, 500), ok=not failed,
                                    exit_code=exit_code, duration_s=round(time.monotonic() - started, 3),
                                    output_chars=len(text), error=text[:300] if failed else None)]  # fmt: skip
        elif kind == "ConversationErrorEvent" or (kind == "AgentErrorEvent" and not call_id):
            self.result = {"error": event.get("error") or event.get("detail")}
        return []


LITELLM_PREFIX = {"openai": "openai", "anthropic": "anthropic", "gemini": "gemini"}


def openhands_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                      ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`openhands --headless --json` (its own Python 3.12 venv), its LLM (LiteLLM) at the proxy in the driver's
    API: `openai/…` (OpenAI-compatible Chat Completions), `anthropic/…` or `gemini/…`."""
    base = proxy.url + ("/v1" if driver.api == "anthropic" else "")
    argv = ["openhands", "--headless", "--json", "--override-with-envs", *options.extra_args, "-t", prompt]
    # offline_env: LiteLLM's price table from the package, not fetched (no network but the proxy).
    return argv, {"LLM_MODEL": f"{LITELLM_PREFIX[driver.api]}/{driver.model}", "LLM_API_KEY": proxy.token,
                  "LLM_BASE_URL": base, **SPEC.offline_env}  # fmt: skip


SPEC = CliAgentSpec(
    id="openhands",
    executable="openhands",
    apis=("openai", "anthropic", "gemini"),
    command=openhands_command,
    parser=OpenHandsStreamParser,
    install=CliInstall("openhands", "1.16.0", manager="pip",
                       hint="install it with `make tools` (pinned, its own Python >= 3.12 venv in .tools/openhands) "
                            "or: pip install openhands in a Python >= 3.12 venv on PATH"),  # fmt: skip
    offline_env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENHANDS_SUPPRESS_BANNER": "1"},
)


class OpenHands(CLIAgent):
    """The OpenHands CLI (`openhands --headless`, its own Python >= 3.12 venv), in the sandbox behind the logging proxy."""

    spec = SPEC
