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
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

from a2rl.sandbox import SandboxPolicy, wrap
from agents.base import LLM_CALLS_FILE, TOOL_CALLS_FILE, TRANSCRIPT_FILE, AgentOptions, LLMDriver, append_jsonl
from agents.claude_tools.prompts import task_prompt
from agents.claude_tools.runner import SessionStopped, make_undumpable, sandbox_policy, take_harness_env
from agents.cli_agents.proxy import LLMProxy
from agents.cli_agents.streams import ClaudeStreamParser, CodexStreamParser, StreamParser

SUMMARY_FILE = "cli_summary.json"
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
    overrides = ["model_provider=a2rl", 'web_search="disabled"']
    overrides += [f"model_providers.a2rl.{k}={json.dumps(v)}" for k, v in provider.items()]
    argv = ["codex", "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-m", driver.model, *[x for o in overrides for x in ("-c", o)], *options.extra_args, prompt]  # fmt: skip
    return argv, {"OPENAI_API_KEY": proxy.token}


COMMANDS = {"claude-code": (claude_code_command, ClaudeStreamParser),
            "codex": (codex_command, CodexStreamParser)}  # fmt: skip


def sandboxed(argv: list[str], env: dict[str, str], policy: SandboxPolicy, proxy: LLMProxy
              ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """The CLI wrapped in the sandbox: the proxy's port forwarded too, the CLI's install directories bound
    read-only, and the proxy's token (whichever variable carries it) kept in its environment."""
    policy = replace(policy, forward_ports=(*policy.forward_ports, urlparse(proxy.url).port),
                     extra_ro=(*policy.extra_ro, *install_dirs(argv[0], env.get("PATH"))),
                     env_keep=(*policy.env_keep, *(k for k, v in env.items() if v == proxy.token)))  # fmt: skip
    return wrap(argv, env, policy)


def install_dirs(executable: str, path: str | None) -> list[Path]:
    """Host directories a CLI needs to start: its command's directory, its package (for an npm package, the
    topmost directory below node_modules with a package.json; else the directory of the command's target), and
    the same for the interpreter its `#!` line names (node). /usr is in every sandbox anyway; neither / nor the
    home directory is ever bound whole."""
    found = shutil.which(executable, path=path)
    if found is None:
        return []
    target = Path(found).resolve()
    package = target.parent
    for d in target.parents if "node_modules" in target.parts else ():
        if d.name == "node_modules":
            break
        if (d / "package.json").is_file():
            package = d
    dirs = [Path(found).parent, package]
    with open(found, "rb") as f:
        line = f.readline(200)
    words = line[2:].split() if line.startswith(b"#!") else []
    interpreter = Path(words[-1].decode(errors="replace")).name if words else executable
    if interpreter != executable:  # `#!/usr/bin/env node`: node's directories too
        dirs += install_dirs(interpreter, path)
    usr, never = Path("/usr"), {Path("/"), Path.home()}
    return [d for d in dict.fromkeys(dirs) if d not in never and d != usr and usr not in d.parents]


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

    def stop(signum, frame):
        raise SessionStopped(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    code, reason = 0, ""
    with LLMProxy(driver, harness / LLM_CALLS_FILE) as proxy:
        argv, extra = build(PREFACE + task_prompt(workspace, grading_tools=False), driver, options, proxy)
        print(f"[{agent_id}] {argv[0]} {argv[1]} ... (model {driver.model}, LLM proxy {proxy.url})", flush=True)
        env = {**os.environ, **extra}
        if policy is not None:
            argv, env = sandboxed(argv, env, policy, proxy)
        # Same process group as this runner (no new session): the harness's group signals reach the CLI (the
        # sandbox's shim passes them on inside).
        proc = subprocess.Popen(argv, cwd=workspace, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        try:
            pump(proc, parser, harness)
            code = proc.wait()
            reason = f"the CLI exited with code {code}"
        except SessionStopped as e:
            reason = f"stopped by the harness ({e})"
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        finally:
            for call in parser.finish():
                append_jsonl(harness / TOOL_CALLS_FILE, call)
            summary = {"agent": agent_id, "reason": reason, "ended_at": datetime.now(timezone.utc).isoformat(),
                       "proxy_calls": proxy.calls, "proxy_cost_usd": round(proxy.cost_usd, 6),
                       "stream": parser.summary()}  # fmt: skip
            (harness / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str))
            print(f"[{agent_id}] session ended: {reason}; {proxy.calls} LLM calls, ${proxy.cost_usd:.4f}", flush=True)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
