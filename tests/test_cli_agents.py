"""CLI agents: the real Claude Code, Codex, Gemini CLI and OpenCode programs (pinned, installed by `make
tools` into .tools/npm), run by `run_agent` behind the harness-side LLM proxy, against a loopback endpoint
that streams scripted answers in each CLI's wire format (tests/cli_loopback.py), with the real grading server."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from cli_loopback import USAGE, ScriptedLLM
from sandbox_support import needs_bwrap

from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl_bench.capture.calls import read_llm_calls, read_tool_calls
from a2rl_bench.records import EvalResult, RunConfig
from a2rl_bench.isolation.sandbox import SandboxPolicy
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.workspace import RunPaths, build_workspace
from a2rl_bench.agents import AgentEnv, LLMDriver, get_agent, run_agent
from a2rl_bench.agents.cli_agents import install
from a2rl_bench.agents.cli_agents.proxy import UsageParser
from a2rl_bench.agents.cli_agents.claude_code import ClaudeStreamParser
from a2rl_bench.agents.cli_agents.codex import CodexStreamParser
from a2rl_bench.agents.cli_agents.gemini import GeminiStreamParser
from a2rl_bench.agents.cli_agents.opencode import OpenCodeStreamParser
from a2rl_bench.agents.cli_agents.openhands import OpenHandsStreamParser

KEY = "sk-cli-SECRET-5150"
PRICES = {"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0, "cache_read_usd_per_mtok": 0.3,
          "cache_write_usd_per_mtok": 3.75}  # fmt: skip


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def workspace(tmp_path: Path) -> AgentEnv:
    ws = tmp_path / "run" / "workspace"
    for sub in ("code", "output", "data"):
        (ws / sub).mkdir(parents=True)
    (ws / "description.md").write_text("# Task\nAdd numbers.\n")
    (ws / "instructions.md").write_text("# Instructions\nSubmit with curl.\n")
    return AgentEnv("gsm8k", "tiny", ws, "http://127.0.0.1:9", "grading-token", 0)


def assert_key_never_reached_the_workspace(env: AgentEnv) -> None:
    for path in [*env.workspace.rglob("*"), *env.harness_path.rglob("*")]:
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


ON_AND_OFF = [pytest.param(False, id="unsandboxed"), pytest.param(True, id="sandboxed", marks=needs_bwrap)]


# -- the real CLIs, each through a short episode against the real grading server ---------------------------
# A "training" script the scripted model writes and runs: it saves the base model as output/v1 (the grader's
# evaluator is a constant stand-in, so what matters is that a real checkpoint is submitted and graded).
TRAIN_SCRIPT = "import shutil; shutil.copytree('models/base', 'output/v1'); print('saved output/v1')"
AUTH = '-H "Authorization: Bearer $GRADING_TOKEN"'


@dataclass(frozen=True)
class CLICase:
    agent: str
    api: str
    shell_tool: str
    """The CLI's own shell tool, which the scripted model calls."""
    command_key: str = "command"
    tool_record: str = ""
    """The tool name the CLI's stream reports for a shell call (default: `shell_tool`)."""

    extra: tuple[tuple[str, str], ...] = (("description", "a step"),)
    """Further arguments the shell tool requires."""
    stop: dict | None = None
    """The step that ends the session (default: a text answer)."""

    def shell(self, n: int, command: str) -> dict:
        return {"tool": self.shell_tool, "id": f"call_{n}", "input": {self.command_key: command, **dict(self.extra)}}


CASES = [CLICase("claude-code", "anthropic", "Bash"), CLICase("codex", "openai", "exec_command", "cmd",
         "command_execution", extra=()), CLICase("gemini", "gemini", "run_shell_command"),
         CLICase("opencode", "openai", "bash"),
         CLICase("openhands", "openai", "terminal", extra=(("security_risk", "LOW"),),
                 stop={"tool": "finish", "id": "call_9", "input": {"message": "Submitted output/v1. Done."}})]  # fmt: skip


def episode(case: CLICase, outside: Path) -> list[dict]:
    """Inspect the workspace, write and run a script, submit over HTTP, read the budget, try to write outside
    the workspace, stop."""
    commands = [
        "ls && head -3 description.md",
        f'printf "%s\\n" "{TRAIN_SCRIPT}" > code/train.py && cat code/train.py',
        "python code/train.py",
        f"curl -s -X POST {AUTH} -H 'content-type: application/json' "
        '-d \'{"model_path": "output/v1", "wait": true}\' "$GRADING_SERVER_URL/submit"',
        f'curl -s {AUTH} "$GRADING_SERVER_URL/budget"',
        f"touch {outside}; echo touched=$?",
    ]
    return [case.shell(n, c) for n, c in enumerate(commands, 1)] + [case.stop or {"text": "Submitted output/v1. Done."}]


def grading_run(tmp_path: Path, tiny_model_dir: Path) -> RunPaths:
    public = tmp_path / "public"
    public.mkdir()
    (public / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    paths = RunPaths.for_run(tmp_path / "runs", "run-cli")
    build_workspace(paths, public, tiny_model_dir, "# Task\nAdd numbers.\n",
                    "# Instructions\nSubmit output/vN with POST /submit.\nMode: `free`.\n")  # fmt: skip
    return paths


def constant_evaluator(model_dir: Path, weights_hash: str, spec, device=None) -> EvalResult:
    return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="constant",
                      weights_hash=weights_hash)  # fmt: skip


# Each CLI on the host and in the sandbox; openhands (~60 s a session here: Python start-up, LiteLLM) in the
# sandbox only, as benchmark runs use it.
EPISODES = [pytest.param(case, sandboxed, id=f"{case.agent}-{'sandboxed' if sandboxed else 'unsandboxed'}",
                         marks=[needs_bwrap] if sandboxed else [])
            for case in CASES for sandboxed in (False, True) if sandboxed or case.agent != "openhands"]  # fmt: skip


@pytest.mark.parametrize(("case", "sandboxed"), EPISODES)
def test_a_real_cli_works_an_episode_behind_the_proxy_and_is_recorded(tmp_path, tiny_model_dir, case, sandboxed):
    paths = grading_run(tmp_path, tiny_model_dir)
    outside = tmp_path / "escaped.txt"
    clock = BudgetClock(300)
    ctx = GradingContext("run-cli", RunConfig(max_submissions=3), paths.workspace, paths.harness_dir,
                         baseline={"validation": 25.0}, base_model_dir=tiny_model_dir)  # fmt: skip
    service = GradingService(ctx, clock, evaluate=constant_evaluator)
    with ScriptedLLM(episode(case, outside)) as llm, GradingServer(service) as server:
        driver = LLMDriver(model="test-model", api=case.api, api_key=KEY, base_url=llm.url, **PRICES)
        agent = get_agent(case.agent, driver=driver)
        agent.install(paths.workspace)
        env = AgentEnv("gsm8k", "tiny", paths.workspace, server.url, server.token, 0, harness_dir=paths.harness_dir)
        policy = SandboxPolicy.for_grader(paths.workspace, server.url) if sandboxed else None
        assert agent.check(sandbox=policy) is None  # the preflight: it starts as the session will run it
        outcome = run_agent(agent, env, clock, paths.harness_dir / "agent.log", grace_s=5, sandbox=policy)
        service.close(drain_timeout_s=10)
    harness = paths.harness_dir
    log = (harness / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]  # e.g. from the port forwarder

    # The model's script ran for real and its checkpoint was graded through the HTTP API.
    assert (paths.workspace / "code" / "train.py").is_file() and (paths.workspace / "output" / "v1").is_dir()
    assert [(e.model_path, e.status, e.score) for e in service.submissions()] == [("output/v1", "scored", 50.0)]
    tools = read_jsonl(harness / "tool_calls.jsonl")
    shell_calls = [t for t in tools if t["tool"] == (case.tool_record or case.shell_tool)]
    assert len(shell_calls) == 6 and len(tools) == 6 + (case.stop is not None), tools
    assert all(t["ok"] for t in shell_calls[:5]), tools
    # The grader's answers went back to the model as tool results: the score, then the budget.
    last_prompt = json.dumps(llm.main_calls[-1]["body"])
    assert "scored" in last_prompt and "submissions_used" in last_prompt
    if sandboxed:  # nothing the CLI ran reached outside its workspace
        assert not outside.exists()

    # The proxy: the real key upstream only, every model call recorded with its tokens and cost ...
    assert len(llm.main_calls) == 7
    offered = [r["headers"].get("x-api-key") or r["headers"].get("x-goog-api-key")
               or r["headers"].get("authorization", "").removeprefix("Bearer ") for r in llm.requests]  # fmt: skip
    assert offered == [KEY] * len(llm.requests)
    assert_key_never_reached_the_workspace(env)
    calls = read_jsonl(harness / "llm_calls.jsonl")
    assert len(calls) == len(llm.requests) and all(c["source"] == "proxy" and c["status"] == 200 for c in calls)
    uncached = USAGE["input"] - USAGE["cached"]
    assert {(c["input_tokens"], c["cache_read_tokens"], c["output_tokens"]) for c in calls} == \
        {(uncached, USAGE["cached"], USAGE["output"])}  # fmt: skip
    cost = (uncached * 3.0 + USAGE["cached"] * 0.3 + USAGE["output"] * 15.0) / 1e6
    assert all(c["cost_usd"] == pytest.approx(cost) for c in calls)
    # ... and in DuckDB, as the run's ingestion writes them.
    store = ResultsStore(tmp_path / "results.duckdb")
    store.replace_run_rows("llm_calls", "run-cli", read_llm_calls(harness / "llm_calls.jsonl"))
    store.replace_run_rows("tool_calls", "run-cli", read_tool_calls(harness / "tool_calls.jsonl"))
    row = store.query("SELECT count(*) AS n, sum(output_tokens) AS out, sum(cost_usd) AS usd FROM llm_calls "
                      "WHERE run_id = 'run-cli'").iloc[0]  # fmt: skip
    assert (row["n"], row["out"]) == (len(calls), USAGE["output"] * len(calls))
    assert row["usd"] == pytest.approx(cost * len(calls))
    assert store.query("SELECT count(*) AS n FROM tool_calls WHERE run_id = 'run-cli'").iloc[0]["n"] == len(tools)
    summary = json.loads((harness / "cli_summary.json").read_text())
    assert summary["proxy_calls"] == len(calls) and summary["stream"]["tool_calls"] == len(tools)

# A stand-in for `claude`: it reports what it can see and reach as one stream-json event.
FAKE_CLAUDE = """#!{python}
import json, os, socket, sys, urllib.request

def reaches(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False

body = json.dumps({{"model": "m", "max_tokens": 5, "messages": [{{"role": "user", "content": "hi"}}]}}).encode()
req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=body, method="POST",
                             headers={{"x-api-key": os.environ["ANTHROPIC_API_KEY"], "content-type": "application/json"}})
with urllib.request.urlopen(req, timeout=30) as resp:
    proxy_status, proxy_body = resp.status, resp.read().decode()
grader = urllib.request.urlopen(urllib.request.Request(os.environ["GRADING_SERVER_URL"], method="HEAD"), timeout=30)
print(json.dumps({{"type": "probe", "uid": os.getuid(), "env": dict(os.environ), "next_to_workspace": os.listdir(".."),
                  "secret_visible": os.path.exists({secret!r}), "proxy_status": proxy_status, "grader": grader.status,
                  "proxy_answered": "message_stop" in proxy_body, "decoy_reached": reaches("127.0.0.1", {decoy}),
                  "outside_reached": reaches("192.0.2.1", 80)}}), flush=True)
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False}}), flush=True)
"""


@needs_bwrap
def test_a_sandboxed_cli_reaches_its_proxy_and_the_grader_only(tmp_path, monkeypatch):
    env = workspace(tmp_path)
    secret = tmp_path / "private" / "test.jsonl"  # outside the workspace: not bound
    secret.parent.mkdir()
    secret.write_text("HIDDEN")
    decoy = socket.create_server(("127.0.0.1", 0))  # a host port that is not forwarded
    decoy.setblocking(False)
    bin_dir = tmp_path / "cli-bin"  # outside every bound directory: bound because it is the CLI's install dir
    bin_dir.mkdir()
    fake = bin_dir / "claude"
    fake.write_text(FAKE_CLAUDE.format(python=sys.executable, secret=str(secret), decoy=decoy.getsockname()[1]))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)  # as a harness holding the key in its environment would
    with ScriptedLLM([{"text": "ok"}]) as llm, ScriptedLLM([]) as grader:
        env = replace(env, grading_url=grader.url)  # a stand-in: it answers HEAD
        driver = LLMDriver(model="claude-test-1", api_key=KEY, base_url=llm.url, **PRICES)
        policy = SandboxPolicy.for_grader(env.workspace, env.grading_url)
        outcome = run_agent(get_agent("claude-code", driver=driver), env, BudgetClock(60),
                            env.harness_path / "agent.log", grace_s=5, sandbox=policy)  # fmt: skip
    decoy_connections = 0
    try:
        decoy.accept()
        decoy_connections = 1
    except BlockingIOError:
        pass
    decoy.close()
    log = (env.harness_path / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    probe = next(e for e in read_jsonl(env.harness_path / "transcript.jsonl") if e.get("type") == "probe")
    assert probe["uid"] != 0 and probe["next_to_workspace"] == ["workspace"]  # no harness dir next to it
    assert probe["env"]["ANTHROPIC_API_KEY"].startswith("a2rl-proxy-")  # the proxy's token, kept by env_keep
    assert KEY not in json.dumps(probe) and not any(k.startswith("A2RL_HARNESS") for k in probe["env"])
    assert probe["proxy_status"] == 200 and probe["proxy_answered"] and probe["grader"] == 200
    assert not probe["secret_visible"] and not probe["decoy_reached"] and not probe["outside_reached"]
    assert decoy_connections == 0
    assert llm.requests and llm.requests[0]["headers"]["x-api-key"] == KEY  # the proxy swapped the real key in
    assert read_jsonl(env.harness_path / "llm_calls.jsonl")[0]["source"] == "proxy"
    assert_key_never_reached_the_workspace(env)


@pytest.mark.parametrize(("agent_id", "api", "package"), [("claude-code", "anthropic", "@anthropic-ai/claude-code"),
                                                         ("codex", "openai", "@openai/codex"),
                                                         ("gemini", "gemini", "@google/gemini-cli"),
                                                         ("opencode", "openai", "opencode-ai")])  # fmt: skip
def test_a_missing_cli_is_a_launch_error_that_says_how_to_install_it(tmp_path, monkeypatch, agent_id, api, package):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(install, "LOCAL_BINS", (tmp_path / "no-prefix",))  # nor in the project's own prefix
    agent = get_agent(agent_id, driver=LLMDriver(model="m", api=api, api_key=KEY))
    assert "make tools" in agent.check() and f"npm install -g {package}" in agent.check()
    outcome = run_agent(agent, workspace(tmp_path), BudgetClock(5), tmp_path / "agent.log")
    assert outcome.ended_by == "launch-error" and f"npm install -g {package}" in outcome.error


@needs_bwrap
def test_a_cli_whose_platform_package_is_missing_fails_its_check_with_the_reason(tmp_path):
    """codex's launcher loads its native binary from a sibling package: an install without it (as once
    happened to an npm user prefix the sandbox did not bind) is caught before the session, with node's reason."""
    prefix = tmp_path / "npm" / "node_modules"
    real = install.LOCAL_BINS[0].parent / "@openai" / "codex"
    (prefix / "@openai").mkdir(parents=True)
    shutil.copytree(real, prefix / "@openai" / "codex", symlinks=True)  # the launcher only, no platform package
    (prefix / ".bin").mkdir()
    (prefix / ".bin" / "codex").symlink_to("../@openai/codex/bin/codex.js")
    agent = get_agent("codex", driver=LLMDriver(model="m", api="openai", api_key=KEY))
    path = f"{prefix / '.bin'}:/usr/bin:/bin"
    why = agent.check(sandbox=SandboxPolicy(tmp_path), path=path)
    assert why is not None and "does not start in the sandbox" in why and "codex-linux-x64" in why
    # With its platform package next to it, the same layout starts in the sandbox: the adapter binds it.
    (prefix / "@openai" / "codex-linux-x64").symlink_to(real.parent / "codex-linux-x64")
    assert agent.check(sandbox=SandboxPolicy(tmp_path), path=path) is None


def test_a_driver_of_the_wrong_api_is_a_launch_error(tmp_path):
    agent = get_agent("claude-code", driver=LLMDriver(model="gpt-x", api="openai"))
    outcome = run_agent(agent, workspace(tmp_path), BudgetClock(5), tmp_path / "agent.log")
    assert outcome.ended_by == "launch-error" and "speaks the anthropic API" in outcome.error


# -- parsers ------------------------------------------------------------------------------------------------
def test_claude_stream_counts_a_messages_usage_once_and_pairs_tool_results():
    p = ClaudeStreamParser()
    usage = {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2}
    # Claude Code emits one assistant event per content block of the same message.
    p.feed({"type": "assistant", "message": {"id": "m1", "usage": usage, "content": [{"type": "text", "text": "hi"}]}})
    p.feed({"type": "assistant", "message": {"id": "m1", "usage": usage, "content": [
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a"}}]}})  # fmt: skip
    boom = [{"type": "text", "text": "boom"}]
    result = {"type": "tool_result", "tool_use_id": "t1", "content": boom, "is_error": True}
    done = p.feed({"type": "user", "message": {"content": [result]}})
    assert p.usage == {"input_tokens": 10, "output_tokens": 3, "cache_read_tokens": 5, "cache_write_tokens": 2}
    assert [(c.tool, c.ok, c.error) for c in done] == [("Read", False, "boom")]
    p.feed({"type": "assistant", "message": {"id": "m2", "content": [{"type": "tool_use", "id": "t2", "name": "Bash",
                                                                      "input": {}}]}})  # fmt: skip
    assert [(c.tool, c.ok) for c in p.finish()] == [("Bash", False)]
    # The final `result` carries the session's real totals: output tokens as the messages ended, not as
    # their `message_start` snapshots (3) had them.
    final = {"input_tokens": 10, "output_tokens": 350, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2}
    p.feed({"type": "result", "subtype": "success", "usage": final})
    assert p.usage == {"input_tokens": 10, "output_tokens": 350, "cache_read_tokens": 5, "cache_write_tokens": 2}


def test_codex_stream_reads_commands_and_turn_usage():
    p = CodexStreamParser()
    p.feed({"type": "item.started", "item": {"id": "i1", "type": "command_execution", "command": "ls"}})
    item = {"id": "i1", "type": "command_execution", "command": "ls", "aggregated_output": "x", "exit_code": 2,
            "status": "failed"}  # fmt: skip
    done = p.feed({"type": "item.completed", "item": item})
    p.feed({"type": "turn.completed", "usage": {"input_tokens": 200, "cached_input_tokens": 80, "output_tokens": 9}})
    assert [(c.tool, c.ok, c.exit_code) for c in done] == [("command_execution", False, 2)]
    assert p.usage["input_tokens"] == 120 and p.usage["cache_read_tokens"] == 80 and p.usage["output_tokens"] == 9


def test_usage_parser_reads_anthropic_and_openai_bodies():
    a = UsageParser()
    a.event({"type": "message", "model": "m", "stop_reason": "end_turn",
             "usage": {"input_tokens": 5, "output_tokens": 6, "cache_read_input_tokens": 7}})  # fmt: skip
    assert a.usage == {"input_tokens": 5, "output_tokens": 6, "cache_read_tokens": 7} and a.stop_reason == "end_turn"
    o = UsageParser()
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3}
    event = {"type": "response.completed", "response": {"model": "g", "status": "completed", "usage": usage}}
    o.feed_sse(b"event: response.completed\ndata: " + json.dumps(event).encode() + b"\n\n")
    assert o.usage == {"input_tokens": 6, "cache_read_tokens": 4, "output_tokens": 3} and o.model == "g"


# A stand-in for `claude` that, stopped by the harness, makes one last tool call in its grace period.
GRACEFUL_CLAUDE = """#!{python}
import json, signal, sys, time

def last_call(signum, frame):
    use = {{"type": "tool_use", "id": "toolu_last", "name": "Bash", "input": {{"command": "curl .../submit"}}}}
    print(json.dumps({{"type": "assistant", "message": {{"id": "m2", "content": [use]}}}}), flush=True)
    time.sleep(0.5)
    result = {{"type": "tool_result", "tool_use_id": "toolu_last", "content": "scored"}}
    print(json.dumps({{"type": "user", "message": {{"content": [result]}}}}), flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, last_call)
print(json.dumps({{"type": "system", "subtype": "init"}}), flush=True)
time.sleep(60)
"""


def test_a_tool_call_made_in_the_grace_period_after_sigterm_is_recorded(tmp_path, monkeypatch):
    env = workspace(tmp_path)
    bin_dir = tmp_path / "cli-bin"
    bin_dir.mkdir()
    fake = bin_dir / "claude"
    fake.write_text(GRACEFUL_CLAUDE.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    driver = LLMDriver(model="claude-test-1", api_key=KEY)
    outcome = run_agent(get_agent("claude-code", driver=driver), env, BudgetClock(8), env.harness_path / "agent.log",
                        grace_s=15)  # fmt: skip
    log = (env.harness_path / "agent.log").read_text()
    assert outcome.ended_by == "budget", log
    assert (env.harness_path / "tool_calls.jsonl").exists(), log
    tools = read_jsonl(env.harness_path / "tool_calls.jsonl")
    assert [(t["tool_use_id"], t["ok"]) for t in tools] == [("toolu_last", True)], log
    summary = json.loads((env.harness_path / "cli_summary.json").read_text())
    assert summary["reason"].startswith("stopped by the harness") and summary["stream"]["tool_calls"] == 1


def test_usage_parser_reads_chat_chunks_and_gemini_streams():
    chat = UsageParser()
    for chunk in ({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}], "usage": None, "model": "q"},
                  {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": None},
                  {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 4,
                                            "prompt_tokens_details": {"cached_tokens": 10}}}):  # fmt: skip
        chat.feed_sse(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    chat.feed_sse(b"data: [DONE]\n\n")
    assert chat.usage == {"input_tokens": 20, "cache_read_tokens": 10, "output_tokens": 4}
    assert (chat.model, chat.stop_reason) == ("q", "stop")
    gemini = UsageParser()
    for n in (1, 2):  # each chunk carries the usage so far
        chunk = {"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "STOP" if n == 2 else None}],
                 "usageMetadata": {"promptTokenCount": 100, "cachedContentTokenCount": 40,
                                   "candidatesTokenCount": 5 * n, "thoughtsTokenCount": 2},
                 "modelVersion": "gemini-x"}  # fmt: skip
        gemini.feed_sse(b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n")
    assert gemini.usage == {"input_tokens": 60, "cache_read_tokens": 40, "output_tokens": 12}
    assert (gemini.model, gemini.stop_reason) == ("gemini-x", "STOP")


def test_gemini_opencode_and_openhands_streams_pair_tool_calls_with_their_results():
    g = GeminiStreamParser()
    g.feed({"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "t1", "parameters": {"command": "ls"}})
    done = g.feed({"type": "tool_result", "tool_id": "t1", "status": "error", "error": {"message": "denied"}})
    g.feed({"type": "result", "status": "success", "stats": {"input_tokens": 200, "cached": 80, "output_tokens": 9}})
    assert [(c.tool, c.ok, c.error) for c in done] == [("run_shell_command", False, "denied")]
    assert g.usage["input_tokens"] == 120 and g.usage["cache_read_tokens"] == 80 and g.usage["output_tokens"] == 9

    o = OpenCodeStreamParser()
    state = {"status": "completed", "input": {"command": "false"}, "output": "", "metadata": {"exit": 1},
             "time": {"start": 1000, "end": 1500}}  # fmt: skip
    done = o.feed({"type": "tool_use", "part": {"tool": "bash", "callID": "c1", "state": state}})
    o.feed({"type": "step_finish", "part": {"tokens": {"input": 60, "output": 12, "reasoning": 3,
                                                       "cache": {"read": 40, "write": 0}}, "cost": 0.01}})  # fmt: skip
    assert [(c.tool, c.ok, c.exit_code, c.duration_s) for c in done] == [("bash", False, 1, 0.5)]
    assert o.usage["output_tokens"] == 15 and o.usage["cache_read_tokens"] == 40 and o.reported_cost_usd == 0.01

    h = OpenHandsStreamParser()
    h.feed({"kind": "ActionEvent", "tool_name": "terminal", "tool_call_id": "c1",
            "tool_call": {"arguments": json.dumps({"command": "ls"})}})  # fmt: skip
    done = h.feed({"kind": "ObservationEvent", "tool_call_id": "c1",
                   "observation": {"content": [{"type": "text", "text": "a b"}], "is_error": False, "exit_code": 0}})
    h.feed({"kind": "ActionEvent", "tool_name": "terminal", "tool_call_id": "c2", "tool_call": {"arguments": "{"}})
    assert [(c.tool, c.ok, c.input) for c in done] == [("terminal", True, {"command": "ls"})]
    assert [(c.tool_use_id, c.ok) for c in h.finish()] == [("c2", False)]  # stopped before its result
