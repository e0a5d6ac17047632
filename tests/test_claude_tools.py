"""claude-tools: a whole session through `run_agent` against a loopback Messages API (real SDK, real HTTP,
real tools: a real training step on the tiny model, a real submission to the grading API)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from anthropic_loopback import AnthropicLoopback, Reply
from sandbox_support import appears, gone, needs_bwrap, processes_with

from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl_bench.paths import a2rl_home
from a2rl_bench.records import EvalResult, RunConfig
from a2rl_bench.isolation.sandbox import SandboxPolicy, gpu_env
from a2rl_bench.workspace import RunPaths, build_workspace
from a2rl_bench.agents import AgentEnv, AgentOptions, LLMDriver, get_agent, run_agent
from a2rl_bench.agents.base import agent_environment
from a2rl_bench.agents.claude_tools import context
from a2rl_bench.agents.claude_tools.tools import UNSANDBOXED_NOTE, Toolbox, cut_middle

API_KEY = "sk-ant-test-SECRET-7d41"
PRICES = {"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0, "cache_read_usd_per_mtok": 0.3,
          "cache_write_usd_per_mtok": 3.75}  # fmt: skip

# What the scripted model writes and runs: two real SFT steps on the tiny model, saved as output/v1.
TRAIN_SCRIPT = """\
import json, os
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

base, out = os.environ["MODEL_PATH"], os.path.join(os.environ["OUTPUT_DIR"], "v1")
tok = AutoTokenizer.from_pretrained(base)
model = AutoModelForCausalLM.from_pretrained(base)
rows = [json.loads(line) for line in open(os.path.join(os.environ["DATA_PATH"], "train.jsonl"))][:4]
texts = [f"Question: {r['question']}\\nAnswer: {r['answer']}" for r in rows]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    batch = tok(texts, return_tensors="pt", padding=True)
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.3f}")
model.save_pretrained(out)
tok.save_pretrained(out)
print("saved", out)
"""


@dataclass
class ToolReply(Reply):
    """A scripted answer with content blocks (tool calls) and prompt-cache usage."""

    content: list[dict] = field(default_factory=list)
    cache_read: int = 0
    cache_write: int = 0


class ToolLoopback(AnthropicLoopback):
    """The shared loopback, answering with tool_use blocks and cache usage where the script says so."""

    def _message(self, request, reply):
        message = super()._message(request, reply)
        if isinstance(reply, ToolReply):
            message["content"] = reply.content or message["content"]
            message["usage"]["cache_read_input_tokens"] = reply.cache_read
            message["usage"]["cache_creation_input_tokens"] = reply.cache_write
        return message


def tool(name: str, tool_id: str, **args) -> dict:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": args}


def calls(*blocks: dict, cache_read: int = 900, cache_write: int = 0) -> ToolReply:
    return ToolReply(stop_reason="tool_use", content=list(blocks), output_tokens=40, input_tokens=120,
                     cache_read=cache_read, cache_write=cache_write)  # fmt: skip


def _constant_evaluator(score: float):
    def evaluate(model_dir: Path, weights_hash: str, spec, device=None) -> EvalResult:
        return EvalResult(task=spec.task, split=spec.split, score=score, n=4, n_correct=2,
                          evaluator_id="constant", weights_hash=weights_hash)  # fmt: skip

    return evaluate


@pytest.fixture
def run_dirs(tmp_path, tiny_model_dir) -> RunPaths:
    public = tmp_path / "public"
    public.mkdir()
    rows = [{"id": i, "question": f"Tom has {i} apples and buys 2 more. How many?",
             "answer": f"{i}+2={i + 2}\n#### {i + 2}", "target": str(i + 2)} for i in range(8)]  # fmt: skip
    (public / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = RunPaths.for_run(tmp_path / "runs", "run-ct")
    build_workspace(paths, public, tiny_model_dir, "# Task\nAdd numbers.\n",
                    "# Instructions\nSubmit output/vN with POST /submit.\nMode: `free`.\n")  # fmt: skip
    return paths


def start_grading(paths: RunPaths, tiny_model_dir: Path, clock: BudgetClock) -> GradingService:
    ctx = GradingContext("run-ct", RunConfig(max_submissions=5), paths.workspace, paths.harness_dir,
                         baseline={"validation": 25.0}, base_model_dir=tiny_model_dir)  # fmt: skip
    return GradingService(ctx, clock, evaluate=_constant_evaluator(50.0))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_tool_pairs_consistent(messages: list[dict]) -> None:
    """What the real API enforces: user first, alternating roles, every tool_result answers a tool_use of
    the message before it, and every tool_use (but in the last message) is answered by the next one."""
    assert messages[0]["role"] == "user"
    for i, m in enumerate(messages):
        assert m["role"] == ("user" if i % 2 == 0 else "assistant"), [x["role"] for x in messages]
        blocks = m["content"] if isinstance(m["content"], list) else []
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if results:
            prev = messages[i - 1]["content"]
            assert results == {b["id"] for b in prev if b.get("type") == "tool_use"}
        uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        if uses and i + 1 < len(messages):
            nxt = messages[i + 1]["content"]
            assert uses == {b["tool_use_id"] for b in nxt if b.get("type") == "tool_result"}


ON_AND_OFF = [pytest.param(False, id="unsandboxed"), pytest.param(True, id="sandboxed", marks=needs_bwrap)]


@pytest.mark.parametrize("sandboxed", ON_AND_OFF)
def test_claude_tools_session_trains_submits_and_accounts_every_call(run_dirs, tiny_model_dir, sandboxed):
    script = [
        calls(tool("write_file", "t1", path="code/train.py", content=TRAIN_SCRIPT), cache_read=0, cache_write=1200),
        calls(tool("bash", "t2", command="env | sort")),
        calls(tool("bash", "t3", command="python code/train.py", timeout_s=300)),
        calls(tool("submit", "t4", model_path="output/v1")),
        calls(tool("check_budget", "t5"), tool("read_file", "t6", path="code/train.py", limit=3)),
        calls(tool("edit_file", "t7", path="code/train.py", old_str="range(2)", new_str="range(3)"),
              tool("write_file", "t8", path="../escape.txt", content="x")),
        calls(tool("bash", "t9", command="echo started; sleep 30", timeout_s=1)),
        ToolReply(text="Trained and submitted output/v1.", input_tokens=150, output_tokens=9, cache_read=900),
        ToolReply(text="DONE", input_tokens=160, output_tokens=1, cache_read=900),
    ]
    driver = LLMDriver(model="claude-test-1", api_key=API_KEY, **PRICES)
    # A small context limit, so that the conversation is compacted during this short session.
    options = AgentOptions(max_nudges=1, context_limit_tokens=2500, keep_last_messages=4, retry_base_s=0.01,
                           command_timeout_s=120)  # fmt: skip
    clock = BudgetClock(300)
    service = start_grading(run_dirs, tiny_model_dir, clock)
    with ToolLoopback(script=script) as llm:
        llm.fail_next(529, times=1)
        llm.fail_next(429, times=1)
        agent = get_agent("claude-tools", driver=driver.model_copy(update={"base_url": llm.base_url}), options=options)
        agent.install(run_dirs.workspace)
        with GradingServer(service) as server:
            env = AgentEnv("gsm8k", "tiny", run_dirs.workspace, server.url, server.token, 0,
                           harness_dir=run_dirs.harness_dir)  # fmt: skip
            policy = SandboxPolicy.for_grader(run_dirs.workspace, server.url) if sandboxed else None
            outcome = run_agent(agent, env, clock, run_dirs.harness_dir / "agent.log", grace_s=5, sandbox=policy)
        service.close(drain_timeout_s=10)
    log = (run_dirs.harness_dir / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    assert "the agent said DONE" in log

    # The LLM: every attempt recorded; the key only in the API's header; caching asked for.
    assert [r.status for r in llm.requests] == [529, 429] + [200] * len(script)
    assert all(API_KEY in (r.headers.get("x-api-key"), r.headers.get("authorization", "").removeprefix("Bearer "))
               for r in llm.requests)  # fmt: skip
    first = llm.served[0].body
    assert first["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert {t["name"] for t in first["tools"]} == {"bash", "read_file", "write_file", "edit_file", "submit",
                                                   "check_budget"}  # fmt: skip
    assert "Add numbers." in first["messages"][0]["content"][0]["text"]  # description.md in the task prompt
    calls_log = read_jsonl(run_dirs.harness_dir / "llm_calls.jsonl")
    assert [(c["call"], c["attempt"], c["status"]) for c in calls_log[:3]] == [(1, 1, 529), (1, 2, 429), (1, 3, 200)]
    ok = [c for c in calls_log if c["status"] == 200]
    assert len(ok) == len(script)
    assert ok[0]["cache_write_tokens"] == 1200 and ok[1]["cache_read_tokens"] == 900
    for c in ok:
        expected = (c["input_tokens"] * 3.0 + c["output_tokens"] * 15.0 + c["cache_read_tokens"] * 0.3
                    + c["cache_write_tokens"] * 3.75) / 1e6  # fmt: skip
        assert c["cost_usd"] == pytest.approx(expected) and c["cost_usd"] > 0 and c["latency_s"] >= 0
        assert c["input_tokens"] > 0 and c["output_tokens"] > 0 and c["model"] == "claude-test-1"

    # Tools: results went back to the model, in the workspace, with the agent's scrubbed environment.
    def result_of(tool_id: str) -> dict:
        for r in llm.served:
            for m in r.body["messages"]:
                for b in m["content"] if isinstance(m["content"], list) else []:
                    if b.get("type") == "tool_result" and b["tool_use_id"] == tool_id:
                        return b
        raise AssertionError(f"no result for {tool_id}")

    env_lines = result_of("t2")["content"].split("\n", 1)[1]
    tool_env = dict(line.split("=", 1) for line in env_lines.splitlines() if "=" in line)
    for name in ("PWD", "SHLVL", "_", "OLDPWD"):
        tool_env.pop(name, None)
    inside = {"TMPDIR": "/tmp", **gpu_env((), sandboxed=True)} if sandboxed else {}  # what bubblewrap sets
    assert tool_env == agent_environment(env) | inside
    assert (UNSANDBOXED_NOTE in env_lines) != sandboxed  # said once, with the first command
    assert all(UNSANDBOXED_NOTE not in result_of(t)["content"] for t in ("t3", "t9"))
    assert API_KEY not in env_lines and "A2RL_HARNESS" not in env_lines
    train = result_of("t3")
    assert not train["is_error"] and "step 1 loss" in train["content"] and "saved" in train["content"]
    submitted = result_of("t4")["content"]
    assert "HTTP 200" in submitted and '"status": "scored"' in submitted and '"score": 50.0' in submitted
    assert '"submissions_used": 1' in result_of("t5")["content"]
    assert "     1\timport json, os" in result_of("t6")["content"]
    assert "replaced 1" in result_of("t7")["content"]
    assert "range(3)" in (run_dirs.workspace / "code" / "train.py").read_text()
    escape = result_of("t8")
    assert escape["is_error"] and "outside the workspace" in escape["content"]
    assert not (run_dirs.run_dir / "escape.txt").exists()
    slow = result_of("t9")
    assert slow["is_error"] and "killed after 1 s" in slow["content"] and "started" in slow["content"]
    assert "seconds of your time budget" in llm.served[-1].prompt  # the nudge after the first stop

    # The grader saw one real submission of the trained checkpoint.
    scored = [e for e in service.submissions() if e.status == "scored"]
    assert [(e.model_path, e.score) for e in scored] == [("output/v1", 50.0)]

    # Context management kept every request valid, and did compact the conversation.
    for r in llm.served:
        assert_tool_pairs_consistent(r.body["messages"])
    compacted = [r for r in llm.served if "removed to save context" in json.dumps(r.body["messages"][0])]
    assert compacted, "the conversation was never compacted"
    assert len(compacted[-1].body["messages"]) < len(llm.served[-1].body["messages"]) + 20

    # Records: tool calls, transcript; the key appears in none of them nor in the workspace.
    tools_log = read_jsonl(run_dirs.harness_dir / "tool_calls.jsonl")
    assert [t["tool"] for t in tools_log] == ["write_file", "bash", "bash", "submit", "check_budget", "read_file",
                                              "edit_file", "write_file", "bash"]  # fmt: skip
    assert [t["ok"] for t in tools_log] == [True] * 7 + [False, False]
    assert tools_log[2]["exit_code"] == 0 and tools_log[2]["duration_s"] > 0
    transcript = read_jsonl(run_dirs.harness_dir / "transcript.jsonl")
    assert transcript[0]["kind"] == "start" and transcript[-1]["kind"] == "end"
    assert transcript[0]["sandbox"].startswith("bubblewrap" if sandboxed else "none")
    assert transcript[-1]["llm_calls"] == len(script) and transcript[-1]["cost_usd"] > 0
    assert any(t["kind"] == "compaction" for t in transcript)
    for path in [*run_dirs.harness_dir.rglob("*"), *run_dirs.workspace.rglob("*")]:
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert API_KEY.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("sandboxed", ON_AND_OFF)
def test_budget_stop_ends_the_loop_and_every_command_it_started(run_dirs, tiny_model_dir, sandboxed):
    marker = f"611.{secrets.randbelow(1000)}5"
    script = [calls(tool("bash", "t1", command=f"sleep {marker} & sleep {marker}", timeout_s=600))]
    driver = LLMDriver(model="claude-test-1", api_key=API_KEY, **PRICES)
    clock = ExpiresOnceRunning(600, marker)
    service = start_grading(run_dirs, tiny_model_dir, clock)
    with ToolLoopback(script=script) as llm:
        agent = get_agent("claude-tools", driver=driver.model_copy(update={"base_url": llm.base_url}))
        with GradingServer(service) as server:
            env = AgentEnv("gsm8k", "tiny", run_dirs.workspace, server.url, server.token, 0,
                           harness_dir=run_dirs.harness_dir)  # fmt: skip
            t0 = time.monotonic()
            policy = SandboxPolicy.for_grader(run_dirs.workspace, server.url) if sandboxed else None
            outcome = run_agent(agent, env, clock, run_dirs.harness_dir / "agent.log", grace_s=5, sandbox=policy)
        service.close(drain_timeout_s=5)
    assert outcome.ended_by == "budget"
    assert time.monotonic() - t0 < 60  # the runner stopped within its grace period, not after the command
    assert gone(marker), "a command outlived the session"
    log = (run_dirs.harness_dir / "agent.log").read_text()
    assert "stopped by the harness" in log
    assert read_jsonl(run_dirs.harness_dir / "transcript.jsonl")[-1]["kind"] == "end"


class ExpiresOnceRunning(BudgetClock):
    """A budget that runs out as soon as a process with `marker` in its command line exists: the stop then
    always lands while the tool command runs, however slowly the runner starts on a busy machine."""

    def __init__(self, budget_s: float, marker: str):
        super().__init__(budget_s)
        self.marker = marker

    @property
    def expired(self) -> bool:
        return bool(processes_with(self.marker)) or super().expired


def test_an_llm_agent_without_driver_is_a_launch_error(run_dirs):
    agent = get_agent("claude-tools")
    env = AgentEnv("gsm8k", "tiny", run_dirs.workspace, "http://127.0.0.1:9", "t", 0)
    outcome = run_agent(agent, env, BudgetClock(5), run_dirs.harness_dir / "agent.log")
    assert outcome.ended_by == "launch-error" and "DriverConfig" in outcome.error


# -- pieces -------------------------------------------------------------------------------------------------
def _conversation(turns: int) -> list[dict]:
    messages = [{"role": "user", "content": "the task"}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"step {i}"},
                                                          tool("bash", f"t{i}", command=f"echo {i}")]})  # fmt: skip
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                      "content": f"out {i} " + "x" * 3000}]})  # fmt: skip
    return messages


@pytest.mark.parametrize("keep_last", [1, 2, 3, 4, 7])
def test_drop_middle_keeps_the_task_and_whole_tool_pairs(keep_last):
    messages = _conversation(10)
    digest: list[str] = []
    kept = context.drop_middle(messages, keep_last, digest)
    assert_tool_pairs_consistent(context.for_request(kept))
    assert kept[0]["content"][0]["text"] == "the task" and len(kept) < len(messages)
    assert digest and digest[0].startswith("- said: step 0") and "bash" in digest[1]
    again = context.drop_middle([*kept, *_conversation(12)[-6:]], keep_last, digest)
    assert again[0]["content"][0]["text"] == "the task"  # the original task, not a digest of a digest


def test_shorten_old_results_spares_the_recent_ones():
    messages = _conversation(5)
    assert context.shorten_old_results(messages, keep_last=4) == 3
    assert len(messages[2]["content"][0]["content"]) < 2000 and len(messages[-1]["content"][0]["content"]) > 3000


def test_for_request_marks_the_last_block_for_caching_and_drops_private_keys():
    messages = [{"role": "user", "content": "hi", "_original": "hi"}]
    sent = context.for_request(messages)
    assert sent == [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                   "cache_control": {"type": "ephemeral"}}]}]  # fmt: skip
    assert messages[0]["content"] == "hi"


def test_toolbox_refuses_paths_outside_the_workspace_and_into_the_base_model(tmp_path):
    ws = tmp_path / "ws"
    (ws / "models" / "base").mkdir(parents=True)
    (ws / "link").symlink_to(tmp_path)
    box = Toolbox(ws, {"PATH": os.environ["PATH"]})
    for path in ("../x", str(tmp_path / "x"), "link/x"):
        assert box.run("write_file", {"path": path, "content": "x"}).is_error
    refused = box.run("write_file", {"path": "models/base/config.json", "content": "{}"})
    assert refused.is_error and "read-only" in refused.text
    assert box.run("write_file", {"path": "code/a.py", "content": "print(1)"}).text.startswith("wrote 8")
    assert box.run("read_file", {"path": "code/a.py"}).text == "     1\tprint(1)"
    assert box.run("nope", {}).is_error and box.run("bash", {"cmd": "x"}).is_error


@pytest.mark.parametrize("sandboxed", ON_AND_OFF)
def test_bash_output_is_cut_in_the_middle_and_background_jobs_do_not_block(tmp_path, sandboxed):
    box = Toolbox(tmp_path, {"PATH": os.environ["PATH"]}, output_limit=1000,
                  sandbox=SandboxPolicy(tmp_path) if sandboxed else None)  # fmt: skip
    result = box.run("bash", {"command": "seq 1 5000; echo END"})
    assert result.exit_code == 0 and "1\n2\n" in result.text and "END" in result.text and "cut" in result.text
    assert (UNSANDBOXED_NOTE in result.text) != sandboxed
    assert box.run("bash", {"command": "exit 3"}).exit_code == 3
    marker = f"30.{secrets.randbelow(1000)}5"
    t0 = time.monotonic()
    result = box.run("bash", {"command": f"sleep {marker} & echo launched"})
    # Returned while its background job sleeps on (30 s): the bound is loose for a sandbox started on a busy machine.
    assert "launched" in result.text and time.monotonic() - t0 < 20 and UNSANDBOXED_NOTE not in result.text
    assert appears(marker)  # sandboxed too: the sandbox lives on while its background jobs run
    box.close(grace_s=1)
    assert gone(marker)
    assert cut_middle("abcdef", 4).startswith("ab") and cut_middle("abc", 4) == "abc"


def test_file_tools_refuse_links_out_of_the_workspace_even_when_swapped_in_late(tmp_path, monkeypatch):
    """The file tools run in the runner, with the harness's rights: no link may take them outside."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "code").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    (ws / "code" / "leak.txt").symlink_to(outside / "secret.txt")
    (ws / "out").symlink_to(outside)
    box = Toolbox(ws, {"PATH": os.environ["PATH"]})
    for name, args in [("read_file", {"path": "code/leak.txt"}), ("read_file", {"path": "out/secret.txt"}),
                       ("edit_file", {"path": "out/secret.txt", "old_str": "SECRET", "new_str": "x"}),
                       ("write_file", {"path": "code/leak.txt", "content": "x"}),
                       ("write_file", {"path": "out/new/a.py", "content": "x"})]:  # fmt: skip
        result = box.run(name, args)
        assert result.is_error and "outside the workspace" in result.text, (name, args, result)
    assert (outside / "secret.txt").read_text() == "SECRET" and sorted(os.listdir(outside)) == ["secret.txt"]

    os.mkfifo(ws / "code" / "pipe")  # would block a plain open() for reading forever
    assert "not a regular file" in box.run("read_file", {"path": "code/pipe"}).text

    checked = box.resolve

    def swapped_after_the_check(path: str, for_writing: bool = False) -> Path:
        """What an agent's background job could do between the check and the open."""
        resolved = checked(path, for_writing)
        (ws / "code").rename(ws / "code.old")
        (ws / "code").symlink_to(outside)
        return resolved

    monkeypatch.setattr(box, "resolve", swapped_after_the_check)
    for name, args in [("write_file", {"path": "code/secret.txt", "content": "x"}),
                       ("read_file", {"path": "code/secret.txt"})]:  # fmt: skip
        (ws / "code" / "secret.txt").write_text("inside")
        result = box.run(name, args)
        assert result.is_error and "SECRET" not in result.text, result
        (ws / "code").unlink()
        (ws / "code.old").rename(ws / "code")
    assert (outside / "secret.txt").read_text() == "SECRET"


@pytest.fixture
def sandboxed_box(run_dirs, tiny_model_dir):
    """A Toolbox whose commands run in the sandbox of a real grading server's run (as under the flow), with the
    driver's key leaked into its environment on purpose."""
    service = start_grading(run_dirs, tiny_model_dir, BudgetClock(300))
    with GradingServer(service) as server:
        env = AgentEnv("gsm8k", "tiny", run_dirs.workspace, server.url, server.token, 0,
                       harness_dir=run_dirs.harness_dir)  # fmt: skip
        policy = SandboxPolicy.for_grader(run_dirs.workspace, server.url)
        box = Toolbox(run_dirs.workspace, {**agent_environment(env), "ANTHROPIC_API_KEY": API_KEY}, sandbox=policy)
        yield box
        box.close(grace_s=1)
    service.close(drain_timeout_s=5)


@needs_bwrap
def test_sandboxed_commands_reach_the_workspace_and_the_grader_only(sandboxed_box, run_dirs, tmp_path):
    canary = f"HIDDEN-TEST-{secrets.token_hex(4)}"
    planted = [run_dirs.harness_dir / "test.jsonl",  # the run's harness dir: hidden by the policy
               a2rl_home() / "task-data" / "fake" / "private" / "test.jsonl",  # where the real hidden sets live
               tmp_path / "elsewhere" / "test.jsonl"]  # fmt: skip
    for path in planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(canary)
    decoy = socket.create_server(("127.0.0.1", 0))  # a host port that is not forwarded
    decoy.setblocking(False)
    grader = "import os, urllib.request as u; print('grader', u.urlopen(os.environ['GRADING_SERVER_URL'] + '/health').status)"
    script = "; ".join([*(f"cat {p}" for p in planted), "env", "echo made > output/made.txt", f'python -c "{grader}"',
                        f"(exec 3<>/dev/tcp/127.0.0.1/{decoy.getsockname()[1]}) && echo decoy-reached",
                        "timeout 5 bash -c '(exec 3<>/dev/tcp/192.0.2.1/80)' && echo outside-reached"])  # fmt: skip
    result = sandboxed_box.run("bash", {"command": script})
    assert canary not in result.text and "No such file" in result.text
    assert API_KEY not in result.text and "ANTHROPIC_API_KEY" not in result.text and "GRADING_TOKEN=" in result.text
    assert "grader 200" in result.text and "reached" not in result.text, result.text
    assert (run_dirs.workspace / "output" / "made.txt").read_text() == "made\n"
    with pytest.raises(BlockingIOError):
        decoy.accept()
    decoy.close()
    refused = sandboxed_box.run("write_file", {"path": "data/train.jsonl", "content": "x"})
    assert refused.is_error and "read-only" in refused.text  # as read-only for the file tools as inside


@needs_bwrap
def test_a_timed_out_sandboxed_command_leaves_no_process_behind(sandboxed_box):
    marker = f"611.{secrets.randbelow(1000)}7"
    command = f"echo started; sleep {marker} & setsid sleep {marker} & nohup sleep {marker}"
    result = sandboxed_box.run("bash", {"command": command, "timeout_s": 2})
    assert result.is_error and "killed after 2 s" in result.text and "started" in result.text
    assert gone(marker), "a timed-out command outlived its sandbox"  # setsid too: the PID namespace ended
