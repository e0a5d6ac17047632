"""The harness-side runner of a CLI agent: `python -m agents.cli_agents.runner`, started by `run_agent`.

It starts an `LLMProxy` holding the driver's key, then the CLI in the workspace (same process group as the
runner, so the harness's budget stop reaches it) with the proxy's URL and a per-session token instead of the
key. With the run's sandbox policy (`A2RL_HARNESS_SANDBOX`) the CLI, and so every tool it runs, is sandboxed:
it reaches the grader and the proxy only, and sees its own install directories read-only. The CLI's JSON event
stream is saved as `harness/transcript.jsonl` and parsed: tool calls go to `harness/tool_calls.jsonl`, the
usage the CLI reports to `harness/cli_summary.json`; the proxy writes every model call to
`harness/llm_calls.jsonl`.
"""

from __future__ import annotations

import json
import os
import threading
import signal
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

from a2rl.isolation import procs
from a2rl.isolation.sandbox import SandboxPolicy, wrap
from a2rl.jsonl import append_jsonl
from agents.base import LLM_CALLS_FILE, TOOL_CALLS_FILE, TRANSCRIPT_FILE, AgentOptions, LLMDriver
from agents.claude_tools.prompts import task_prompt
from agents.claude_tools.runner import make_undumpable, sandbox_policy, take_harness_env
from agents.cli_agents.adapter import OpenHands
from agents.cli_agents.install import install_dirs
from agents.cli_agents.proxy import LLMProxy
from agents.cli_agents.streams import (
    ClaudeStreamParser,
    CodexStreamParser,
    GeminiStreamParser,
    OpenCodeStreamParser,
    OpenHandsStreamParser,
    StreamParser,
)

SUMMARY_FILE = "cli_summary.json"
GRACE_S = 10.0
"""How long the CLI may go on after the harness's SIGTERM (its last submission) before it is killed."""
PREFACE = (
    "You are an autonomous machine-learning engineer working alone in this workspace: nobody will answer "
    "questions, so decide and act until the time budget is used. Keep all training code in `code/` (it is "
    "snapshotted and checked against the run's mode at every submission), save merged checkpoints to "
    "`output/vN` and submit them with curl as described in instructions.md.\n\n"
)


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


def cli_home(workspace: Path, agent_id: str) -> Path:
    """A per-session home for a CLI's settings and state, in the workspace (the only place it may write when
    sandboxed), so that no CLI reads or writes the harness user's own configuration."""
    home = workspace / ".a2rl-cli" / agent_id
    home.mkdir(parents=True, exist_ok=True)
    return home


def gemini_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                   ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`gemini -p --output-format stream-json --yolo` on the Gemini API at the proxy (its key header is
    `x-goog-api-key`); settings pick API-key auth, switch off telemetry and updates, and leave out the web
    tools (no network but the proxy and the grader, as for codex)."""
    home = cli_home(Path(os.environ.get("WORKSPACE", os.getcwd())), "gemini")
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


def opencode_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                     ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`opencode run --format json` with one provider, `a2rl`, at the proxy: OpenAI-compatible Chat
    Completions (`@ai-sdk/openai-compatible`) or Anthropic Messages, both built into opencode's binary.
    Every tool is allowed without asking, but web fetches (no network but the proxy and the grader)."""
    home = cli_home(Path(os.environ.get("WORKSPACE", os.getcwd())), "opencode")
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


LITELLM_PREFIX = {"openai": "openai", "anthropic": "anthropic", "gemini": "gemini"}


def openhands_command(prompt: str, driver: LLMDriver, options: AgentOptions, proxy: LLMProxy
                      ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """`openhands --headless --json` (its own Python 3.12 venv), its LLM (LiteLLM) at the proxy in the driver's
    API: `openai/…` (OpenAI-compatible Chat Completions), `anthropic/…` or `gemini/…`."""
    base = proxy.url + ("/v1" if driver.api == "anthropic" else "")
    argv = ["openhands", "--headless", "--json", "--override-with-envs", *options.extra_args, "-t", prompt]
    # OpenHands.offline_env: LiteLLM's price table from the package, not fetched (no network but the proxy).
    return argv, {"LLM_MODEL": f"{LITELLM_PREFIX[driver.api]}/{driver.model}", "LLM_API_KEY": proxy.token,
                  "LLM_BASE_URL": base, **OpenHands.offline_env}  # fmt: skip


COMMANDS = {"claude-code": (claude_code_command, ClaudeStreamParser),
            "codex": (codex_command, CodexStreamParser),
            "gemini": (gemini_command, GeminiStreamParser),
            "opencode": (opencode_command, OpenCodeStreamParser),
            "openhands": (openhands_command, OpenHandsStreamParser)}  # fmt: skip


def sandboxed(argv: list[str], env: dict[str, str], policy: SandboxPolicy, proxy: LLMProxy
              ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """The CLI wrapped in the sandbox: the proxy's port forwarded too, the CLI's install directories (and what
    it loads at run time) bound read-only, and the proxy's token (whichever variable carries it) kept."""
    policy = replace(policy, forward_ports=(*policy.forward_ports, urlparse(proxy.url).port),
                     extra_ro=(*policy.extra_ro, *install_dirs(argv[0], env.get("PATH"))),
                     env_keep=(*policy.env_keep, *(k for k, v in env.items() if proxy.token in v)))  # fmt: skip
    return wrap(argv, env, policy)


def pump(proc: subprocess.Popen, parser: StreamParser, harness: Path) -> None:
    """Save each event line, record the tool calls it completes, echo a short line to the agent log."""
    for raw in proc.stdout:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            print(f"[cli] {line[:500]}", flush=True)
            continue
        append_jsonl(harness / TRANSCRIPT_FILE, event if isinstance(event, dict) else {"event": event})
        if not isinstance(event, dict):
            continue
        for call in parser.feed(event):
            append_jsonl(harness / TOOL_CALLS_FILE, call)
            print(f"[tool {call.call}] {call.tool} {json.dumps(call.input)[:160]} -> "
                  f"{'ok' if call.ok else 'error'}", flush=True)  # fmt: skip


def main() -> int:
    secrets = take_harness_env()
    make_undumpable()
    config = json.loads(secrets.get("CONFIG", "{}"))
    agent_id = config["agent"]
    driver = LLMDriver(**config["driver"], api_key=secrets.get("API_KEY", ""))
    options = AgentOptions(**config.get("options", {}))
    harness = Path(config["harness_dir"])
    harness.mkdir(parents=True, exist_ok=True)
    workspace = Path(os.environ.get("WORKSPACE", os.getcwd()))
    build, parser_class = COMMANDS[agent_id]
    policy = sandbox_policy(secrets)
    parser = parser_class()

    stopping = threading.Event()
    proc: subprocess.Popen | None = None

    def stop(signum, frame):
        # Keep reading the CLI's stream through its grace period: a last submission made after SIGTERM is
        # recorded too. The harness's signal reached the CLI's group as well; if it outlives the grace, kill it.
        if not stopping.is_set():
            stopping.set()
            timer = threading.Timer(GRACE_S, lambda: proc is not None and proc.poll() is None and proc.kill())
            timer.daemon = True  # never keeps the runner alive
            timer.start()

    signal.signal(signal.SIGTERM, stop)
    code, reason = 0, ""
    with LLMProxy(driver, harness / LLM_CALLS_FILE) as proxy:
        argv, extra = build(PREFACE + task_prompt(workspace, grading_tools=False), driver, options, proxy)
        argv[0] = config.get("cli") or argv[0]  # the install the adapter found (PATH or the project's prefix)
        print(f"[{agent_id}] {Path(argv[0]).name} {argv[1]} ... (model {driver.model}, LLM proxy {proxy.url})",
              flush=True)  # fmt: skip
        # PWD too: some CLIs (opencode) take their project directory from it rather than from the real cwd.
        env = {**os.environ, **extra, "PWD": str(workspace)}
        if policy is not None:
            argv, env = sandboxed(argv, env, policy, proxy)
        # Same process group as this runner (no new session): the harness's group signals reach the CLI (the
        # sandbox's shim passes them on inside). It dies with the runner (parent-death signal).
        proc = procs.start(argv, group="inherit", cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE)  # fmt: skip
        try:
            pump(proc, parser, harness)
            code = proc.wait()
            reason = f"stopped by the harness (CLI exit code {code})" if stopping.is_set() else \
                f"the CLI exited with code {code}"  # fmt: skip
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for call in parser.finish():
                append_jsonl(harness / TOOL_CALLS_FILE, call)
            summary = {"agent": agent_id, "reason": reason, "ended_at": datetime.now(timezone.utc).isoformat(),
                       "proxy_calls": proxy.calls, "proxy_cost_usd": round(proxy.cost_usd, 6),
                       "stream": parser.summary()}  # fmt: skip
            (harness / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str))
            print(f"[{agent_id}] session ended: {reason}; {proxy.calls} LLM calls, ${proxy.cost_usd:.4f}", flush=True)
    return 0 if code == 0 or stopping.is_set() else 1


if __name__ == "__main__":
    sys.exit(main())
