"""The harness-side runner of a CLI agent: `python -m a2rl_bench.agents.cli_agents.runner`, started by `run_agent`.

It starts an `LLMProxy` holding the driver's key, then the CLI in the workspace (same process group as the
runner, so the harness's budget stop reaches it) with the proxy's URL and a per-session token instead of the
key. With the run's sandbox policy (`A2RL_HARNESS_SANDBOX`) the CLI, and so every tool it runs, is sandboxed:
it reaches the grader and the proxy only, and sees its own install directories read-only. The CLI's JSON event
stream is saved as `harness/transcript.jsonl` and parsed: tool calls go to `harness/tool_calls.jsonl`, the
usage the CLI reports to `harness/cli_summary.json`; the proxy writes every model call to
`harness/llm_calls.jsonl`. What differs between CLIs (their command line, their stream) is each agent's
`CliAgentSpec` (`agents/cli_agents/spec.py`).
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

from a2rl_bench.isolation import procs
from a2rl_bench.isolation.sandbox import SandboxPolicy, wrap
from a2rl_bench.jsonl import append_jsonl
from a2rl_bench.agents import agent_class
from a2rl_bench.agents.base import LLM_CALLS_FILE, TOOL_CALLS_FILE, TRANSCRIPT_FILE, AgentOptions, LLMDriver
from a2rl_bench.agents.claude_tools.prompts import task_prompt
from a2rl_bench.agents.claude_tools.runner import make_undumpable, sandbox_policy, take_harness_env
from a2rl_bench.agents.cli_agents.install import install_dirs
from a2rl_bench.agents.cli_agents.proxy import LLMProxy
from a2rl_bench.agents.cli_agents.streams import StreamParser

SUMMARY_FILE = "cli_summary.json"
GRACE_S = 10.0
"""How long the CLI may go on after the harness's SIGTERM (its last submission) before it is killed."""
PREFACE = (
    "You are an autonomous machine-learning engineer working alone in this workspace: nobody will answer "
    "questions, so decide and act until the time budget is used. Keep all training code in `code/` (it is "
    "snapshotted and checked against the run's mode at every submission), save merged checkpoints to "
    "`output/vN` and submit them with curl as described in instructions.md.\n\n"
)


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
    spec = agent_class(agent_id).spec  # the agent's CliAgentSpec, found through the agent registry
    policy = sandbox_policy(secrets)
    parser = spec.parser()

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
        argv, extra = spec.command(PREFACE + task_prompt(workspace, grading_tools=False), driver, options, proxy)
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
