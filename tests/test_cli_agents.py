"""CLI agents: the real Claude Code and Codex CLIs, run by `run_agent` behind the harness-side LLM proxy,
against loopback endpoints that stream scripted answers (Anthropic Messages SSE, OpenAI Responses SSE)."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sandbox_support import needs_bwrap

from a2rl.grading import BudgetClock
from a2rl.sandbox import SandboxPolicy
from agents import AgentEnv, LLMDriver, get_agent, run_agent
from agents.cli_agents.proxy import UsageParser
from agents.cli_agents.streams import ClaudeStreamParser, CodexStreamParser

KEY = "sk-cli-SECRET-5150"
PRICES = {"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0, "cache_read_usd_per_mtok": 0.3,
          "cache_write_usd_per_mtok": 3.75}  # fmt: skip


class StreamingLoopback:
    """Answers model calls with server-sent events from a script (one entry per main-loop call; the last
    repeats). `api="anthropic"` serves /v1/messages, `api="openai"` serves /responses. Requests without tools
    (a CLI's side calls) get a short text answer and do not advance the script."""

    def __init__(self, api: str, script: list[dict]):
        self.api, self.script, self.requests, self.pos = api, script, [], 0
        self._lock = threading.Lock()  # the script position, across handler threads
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StreamingLoopback:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def next_entry(self, body: dict) -> dict:
        if not body.get("tools"):
            return {"text": "ok"}
        with self._lock:
            entry = self.script[min(self.pos, len(self.script) - 1)]
            self.pos += 1
        return entry

    def anthropic_events(self, body: dict, entry: dict) -> list[dict]:
        usage = {"input_tokens": 100, "output_tokens": 1, "cache_read_input_tokens": 50,
                 "cache_creation_input_tokens": 20}  # fmt: skip
        events = [{"type": "message_start", "message": {"id": f"msg_{self.pos}_{len(self.requests)}", "type": "message",
                   "role": "assistant", "model": body["model"], "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": usage}}]  # fmt: skip
        if "tool" in entry:
            block = {"type": "tool_use", "id": entry["id"], "name": entry["tool"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(entry["input"])}
        else:
            block, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": entry["text"]}
        events += [{"type": "content_block_start", "index": 0, "content_block": block},
                   {"type": "content_block_delta", "index": 0, "delta": delta},
                   {"type": "content_block_stop", "index": 0},
                   {"type": "message_delta", "delta": {"stop_reason": "tool_use" if "tool" in entry else "end_turn",
                                                       "stop_sequence": None}, "usage": {"output_tokens": 12}},
                   {"type": "message_stop"}]  # fmt: skip
        return events

    def openai_events(self, body: dict, entry: dict) -> list[dict]:
        n = len(self.requests)
        if "tool" in entry:
            item = {"type": "function_call", "id": f"fc_{n}", "call_id": entry["id"], "name": entry["tool"],
                    "arguments": json.dumps(entry["input"]), "status": "completed"}  # fmt: skip
        else:
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": entry["text"], "annotations": []}]}  # fmt: skip
        response = {"id": f"resp_{n}", "object": "response", "model": body.get("model"), "status": "in_progress",
                    "output": []}  # fmt: skip
        usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 40}, "output_tokens": 7,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 107}  # fmt: skip
        return [{"type": "response.created", "response": response},
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                {"type": "response.output_item.done", "output_index": 0, "item": item},
                {"type": "response.completed", "response": {**response, "status": "completed", "output": [item],
                                                            "usage": usage}}]  # fmt: skip

    def _handler(self):
        loopback = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                loopback.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                          "body": body})  # fmt: skip
                entry = loopback.next_entry(body)
                make = loopback.anthropic_events if loopback.api == "anthropic" else loopback.openai_events
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for event in make(body, entry):
                    data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")

        return Handler


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


# The real CLIs, on the host and in the sandbox (where they reach only the proxy: no grader in these sessions).
ON_AND_OFF = [pytest.param(False, id="unsandboxed"), pytest.param(True, id="sandboxed", marks=needs_bwrap)]


@pytest.mark.skipif(shutil.which("claude") is None,
                    reason="claude CLI not installed (npm install -g @anthropic-ai/claude-code)")  # fmt: skip
@pytest.mark.parametrize("sandboxed", ON_AND_OFF)
def test_claude_code_runs_behind_the_proxy_and_its_stream_is_recorded(tmp_path, sandboxed):
    script = [
        {"tool": "Bash", "id": "toolu_1", "input": {"command": "echo hello > code/note.txt && cat code/note.txt",
                                                    "description": "write a note"}},  # fmt: skip
        {"tool": "Bash", "id": "toolu_2", "input": {"command": "ls no-such-dir", "description": "fails"}},
        {"text": "Done."},
    ]
    env = workspace(tmp_path)
    with StreamingLoopback("anthropic", script) as llm:
        driver = LLMDriver(model="claude-test-1", api_key=KEY, base_url=llm.url, **PRICES)
        agent = get_agent("claude-code", driver=driver)
        agent.install(env.workspace)
        outcome = run_agent(agent, env, BudgetClock(120), env.harness_path / "agent.log", grace_s=5,
                            sandbox=SandboxPolicy(env.workspace) if sandboxed else None)  # fmt: skip
    harness = env.harness_path
    log = (harness / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    assert (env.workspace / "code" / "note.txt").read_text() == "hello\n"  # the CLI ran the tool for real

    # Upstream saw the real key (from the proxy); the CLI only ever had the proxy's token.
    main_calls = [r for r in llm.requests if r["body"].get("tools")]
    assert len(main_calls) == 3 and all(r["headers"]["x-api-key"] == KEY for r in llm.requests)
    assert_key_never_reached_the_workspace(env)

    calls = read_jsonl(harness / "llm_calls.jsonl")
    assert len(calls) == len(llm.requests) and all(c["source"] == "proxy" and c["status"] == 200 for c in calls)
    for c in calls:
        tokens = (c["input_tokens"], c["output_tokens"], c["cache_read_tokens"], c["cache_write_tokens"])
        assert tokens == (100, 12, 50, 20)
        assert c["cost_usd"] == pytest.approx((100 * 3 + 12 * 15 + 50 * 0.3 + 20 * 3.75) / 1e6)
    tools = read_jsonl(harness / "tool_calls.jsonl")
    assert [(t["tool"], t["tool_use_id"], t["ok"]) for t in tools] == [("Bash", "toolu_1", True),
                                                                        ("Bash", "toolu_2", False)]  # fmt: skip
    assert tools[0]["input"]["command"].startswith("echo hello")
    events = read_jsonl(harness / "transcript.jsonl")
    assert events[0]["type"] == "system" and events[-1]["type"] == "result"
    summary = json.loads((harness / "cli_summary.json").read_text())
    assert summary["proxy_calls"] == len(calls) and summary["stream"]["tool_calls"] == 2
    assert summary["stream"]["usage"]["input_tokens"] >= 300 and summary["stream"]["result"]["subtype"] == "success"


@pytest.mark.skipif(shutil.which("codex") is None, reason="codex CLI not installed (npm install -g @openai/codex)")
@pytest.mark.parametrize("sandboxed", ON_AND_OFF)
def test_codex_runs_behind_the_proxy_and_its_stream_is_recorded(tmp_path, sandboxed):
    script = [{"tool": "exec_command", "id": "call_1", "input": {"cmd": "echo hi > code/hi.txt && ls code"}},
              {"text": "All done."}]  # fmt: skip
    env = workspace(tmp_path)
    with StreamingLoopback("openai", script) as llm:
        driver = LLMDriver(model="gpt-test", api="openai", api_key=KEY, base_url=llm.url, **PRICES)
        agent = get_agent("codex", driver=driver)
        outcome = run_agent(agent, env, BudgetClock(120), env.harness_path / "agent.log", grace_s=5,
                            sandbox=SandboxPolicy(env.workspace) if sandboxed else None)  # fmt: skip
    log = (env.harness_path / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    assert (env.workspace / "code" / "hi.txt").read_text() == "hi\n"
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in llm.requests)
    assert not any(t.get("type") == "web_search" for r in llm.requests for t in r["body"].get("tools", []))
    assert_key_never_reached_the_workspace(env)
    calls = read_jsonl(env.harness_path / "llm_calls.jsonl")
    assert len(calls) == 2 and all((c["input_tokens"], c["cache_read_tokens"], c["output_tokens"]) == (60, 40, 7)
                                   for c in calls)  # fmt: skip
    tools = read_jsonl(env.harness_path / "tool_calls.jsonl")
    assert [(t["tool"], t["ok"], t["exit_code"]) for t in tools] == [("command_execution", True, 0)]


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
    with StreamingLoopback("anthropic", [{"text": "ok"}]) as llm, StreamingLoopback("anthropic", []) as grader:
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


@pytest.mark.parametrize(("agent_id", "hint"), [("claude-code", "npm install -g @anthropic-ai/claude-code"),
                                                ("codex", "npm install -g @openai/codex")])  # fmt: skip
def test_a_missing_cli_is_a_launch_error_that_says_how_to_install_it(tmp_path, monkeypatch, agent_id, hint):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    api = "anthropic" if agent_id == "claude-code" else "openai"
    agent = get_agent(agent_id, driver=LLMDriver(model="m", api=api, api_key=KEY))
    env = workspace(tmp_path)
    outcome = run_agent(agent, env, BudgetClock(5), tmp_path / "agent.log")
    assert outcome.ended_by == "launch-error" and hint in outcome.error


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
