"""One module per CLI agent (issue #38): each built-in's `CliAgentSpec` gives the same command line, environment,
parsed events and install facts as before the split (tests/cli_agent_snapshot.json, taken from the code before
it), its pins are the ones `make tools` installs, and a sixth CLI agent comes from an outside package as one file
and an entry point, run through the real runner with a stand-in CLI."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import a2rl_bench.agents
from a2rl_bench.grading import BudgetClock
from a2rl_bench.agents import AgentEnv, AgentOptions, LLMDriver, get_agent, run_agent
from a2rl_bench.agents.cli_agents.adapter import CLIAgent

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = Path(__file__).with_name("cli_agent_snapshot.json")

PROMPT = "Train a model. Quote ' and \" and $HOME."
PROXY = SimpleNamespace(url="http://127.0.0.1:45678", token="a2rl-proxy-TOKEN")
OPTIONS = AgentOptions(extra_args=["--flag", "v"], command_timeout_s=120.5, max_command_timeout_s=3600)
# Events of every CLI's stream in one list: each parser reads its own and passes over the others'.
EVENTS = [
    {"type": "system", "subtype": "init"},
    {"type": "assistant", "message": {"id": "m1", "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2}, "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a"}}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "boom"}], "is_error": True}]}},
    {"type": "assistant", "message": {"id": "m2", "content": [{"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "x" * 900}}]}},
    {"type": "item.started", "item": {"id": "i1", "type": "command_execution", "command": "ls"}},
    {"type": "item.completed", "item": {"id": "i1", "type": "command_execution", "command": "ls", "aggregated_output": "x", "exit_code": 2, "status": "failed"}},
    {"type": "item.completed", "item": {"id": "i2", "type": "file_change", "changes": [{"path": "a"}], "status": "completed"}},
    {"type": "turn.completed", "usage": {"input_tokens": 200, "cached_input_tokens": 80, "output_tokens": 9}},
    {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "g1", "parameters": {"command": "ls"}},
    {"type": "tool_result", "tool_id": "g1", "status": "error", "error": {"message": "denied"}},
    {"type": "tool_use", "part": {"tool": "bash", "callID": "c1", "state": {"status": "completed", "input": {"command": "false"}, "output": "", "metadata": {"exit": 1}, "time": {"start": 1000, "end": 1500}}}},
    {"type": "step_finish", "part": {"tokens": {"input": 60, "output": 12, "reasoning": 3, "cache": {"read": 40, "write": 0}}, "cost": 0.01, "reason": "stop"}},
    {"kind": "ActionEvent", "tool_name": "terminal", "tool_call_id": "h1", "tool_call": {"arguments": json.dumps({"command": "ls"})}},
    {"kind": "ObservationEvent", "tool_call_id": "h1", "observation": {"content": [{"type": "text", "text": "a b"}], "is_error": False, "exit_code": 0}},
    {"kind": "ActionEvent", "tool_name": "terminal", "tool_call_id": "h2", "tool_call": {"arguments": "{"}},
    {"kind": "ConversationErrorEvent", "error": "gone"},
    {"type": "error", "error": "rate limited", "message": "m"},
    {"type": "result", "subtype": "success", "is_error": False, "num_turns": 3, "total_cost_usd": 0.5, "status": "success", "stats": {"input_tokens": 200, "cached": 80, "output_tokens": 9, "tool_calls": 1, "duration_ms": 5}, "usage": {"input_tokens": 10, "output_tokens": 350, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2}},
]  # fmt: skip


def snapshot(build, parser_class, cls: type, workspace: Path) -> dict:
    """argv, env and the files written, for each API the agent speaks; the parsed events; the install facts. The
    workspace path is masked; durations and timestamps are dropped."""
    mask = lambda value: json.loads(json.dumps(value).replace(str(workspace), "<ws>"))  # noqa: E731
    commands = {}
    for api in cls.apis:
        argv, env = build(PROMPT, LLMDriver(model="model-1", api=api, api_key="sk-REAL"), OPTIONS, PROXY)
        files = {str(p.relative_to(workspace)): p.read_text() for p in sorted(workspace.rglob("*")) if p.is_file()}
        commands[api] = mask({"argv": argv, "env": env, "files": files})
    parser = parser_class()
    calls = [c for e in EVENTS for c in parser.feed(e)] + parser.finish()
    calls = [c.model_dump(mode="json", exclude={"at", "duration_s"}) for c in calls]
    facts = {k: getattr(cls, k) for k in ("id", "executable", "install_hint", "apis", "version_args", "offline_env",
                                          "runner_module", "uses_llm")}  # fmt: skip
    facts["doc"] = cls.__doc__
    return {"commands": commands, "tool_calls": calls, "summary": parser.summary(), "facts": mask(facts)}


def cli_agents() -> dict[str, type[CLIAgent]]:
    classes = {name: a2rl_bench.agents.agent_class(name) for name in a2rl_bench.agents.list_agents()}
    return {name: cls for name, cls in classes.items() if issubclass(cls, CLIAgent)}


def test_each_cli_agent_builds_the_same_command_parses_the_same_events_and_keeps_its_install_facts(
        tmp_path, monkeypatch):  # fmt: skip
    expected = json.loads(SNAPSHOT.read_text())
    found = cli_agents()
    assert found and sorted(found) == sorted(expected), "each CLI agent the registry has keeps a snapshot"
    for name, cls in found.items():
        workspace = tmp_path / name
        workspace.mkdir()
        monkeypatch.setenv("WORKSPACE", str(workspace))
        got = json.loads(json.dumps(snapshot(cls.spec.command, cls.spec.parser, cls, workspace)))
        assert got == expected[name], name


def test_make_tools_installs_the_pins_the_cli_agents_declare():
    """The Makefile reads the pins from the agents' modules (with sed, before any Python is set up): the packages
    `make tools` installs are the ones the specs declare, none missed and none misread."""
    from test_tools_cache import pin

    specs = [cls.spec for cls in cli_agents().values()]
    npm = [s.install.pin for s in specs if s.install.manager == "npm"]
    assert sorted(pin("CLI_PACKAGES").split()) == sorted(npm) and len(npm) == 4
    assert [s.install.pin for s in specs if s.install.manager == "pip"] == [f"openhands=={pin('OPENHANDS_VERSION')}"]


# -- a sixth CLI agent from an outside package: one file and an entry point ---------------------------------------
TOY_AGENT = '''
"""A toy CLI agent: `toycli run PROMPT`, its events one JSON object a line."""

import time

from a2rl_bench.agents.cli_agents.adapter import CLIAgent
from a2rl_bench.agents.cli_agents.spec import CliAgentSpec, CliInstall
from a2rl_bench.agents.cli_agents.streams import PairingParser


class ToyStreamParser(PairingParser):
    """`call` opens a tool call, `done` closes it; `usage` counts tokens."""

    def feed(self, event):
        self.events += 1
        if event.get("type") == "call":
            self.pending[event["id"]] = (event["tool"], event["args"], time.monotonic())
        elif event.get("type") == "done":
            tool, args, started = self.pending.pop(event["id"])
            return [self.tool_event(tool=tool, tool_use_id=event["id"], input=args, ok=event["ok"],
                                    output_chars=len(event["output"]), duration_s=time.monotonic() - started)]
        elif event.get("type") == "usage":
            self.usage["input_tokens"] += event["input"]
            self.usage["output_tokens"] += event["output"]
        return []


def toy_command(prompt, driver, options, proxy):
    return ["toycli", "run", "--model", driver.model, prompt], {"TOY_BASE_URL": proxy.url, "TOY_KEY": proxy.token}


SPEC = CliAgentSpec(id="toy-cli", executable="toycli", apis=("anthropic",), command=toy_command,
                    parser=ToyStreamParser, install=CliInstall("toy-cli", "0.1", manager="pip", hint="pip install toy-cli"))


class ToyCLI(CLIAgent):
    """A toy CLI agent from an outside package."""

    spec = SPEC
'''

# The stand-in `toycli`: one model call through the proxy it was given, then a tool call and its usage.
TOY_CLI = """#!{python}
import json, os, sys, urllib.request

if sys.argv[1:] == ["--version"]:
    print("toycli 0.1")
    sys.exit(0)
body = json.dumps({{"model": sys.argv[3], "max_tokens": 5, "messages": [{{"role": "user", "content": "hi"}}]}}).encode()
req = urllib.request.Request(os.environ["TOY_BASE_URL"] + "/v1/messages", data=body, method="POST",
                             headers={{"x-api-key": os.environ["TOY_KEY"], "content-type": "application/json"}})
with urllib.request.urlopen(req, timeout=30) as resp:
    answered = "message_stop" in resp.read().decode()
say = lambda event: print(json.dumps(event), flush=True)
say({{"type": "call", "id": "c1", "tool": "shell", "args": {{"command": "ls", "answered": answered,
     "prompt_has_task": "Add numbers" in sys.argv[-1] or "description.md" in sys.argv[-1]}}}})
print("not json: a CLI's stray line")
say({{"type": "done", "id": "c1", "ok": True, "output": "code data output"}})
say({{"type": "usage", "input": 7, "output": 3}})
"""


@pytest.fixture
def toy_cli_package(tmp_path, monkeypatch):
    """An outside package as pip would leave it in site-packages: one module and a dist-info whose entry point
    names the agent; and its CLI, a stand-in script, on PATH."""
    site = tmp_path / "site"
    (site / "a2rl_toy_cli").mkdir(parents=True)
    (site / "a2rl_toy_cli" / "__init__.py").write_text("")
    (site / "a2rl_toy_cli" / "agent.py").write_text(TOY_AGENT)
    info = site / "a2rl_toy_cli-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: a2rl-toy-cli\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""
        [a2rl.agents]
        toy-cli = a2rl_toy_cli.agent:ToyCLI
        """))  # fmt: skip
    bin_dir = tmp_path / "cli-bin"
    bin_dir.mkdir()
    (bin_dir / "toycli").write_text(TOY_CLI.format(python=sys.executable))
    (bin_dir / "toycli").chmod(0o755)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    a2rl_bench.agents.AGENTS.refresh()
    yield site
    monkeypatch.undo()
    sys.modules.pop("a2rl_toy_cli.agent", None)
    sys.modules.pop("a2rl_toy_cli", None)
    a2rl_bench.agents.AGENTS.refresh()


def test_a_cli_agent_from_an_outside_package_runs_through_the_real_runner(tmp_path, toy_cli_package):
    from cli_loopback import ScriptedLLM

    assert (a2rl_bench.agents.AGENTS.ref("toy-cli").source == "a2rl-toy-cli"
            and "toy-cli" in a2rl_bench.agents.list_agents())
    ws = tmp_path / "run" / "workspace"
    for sub in ("code", "output", "data"):
        (ws / sub).mkdir(parents=True)
    (ws / "description.md").write_text("# Task\nAdd numbers.\n")
    (ws / "instructions.md").write_text("# Instructions\nSubmit with curl.\n")
    env = AgentEnv("gsm8k", "tiny", ws, "http://127.0.0.1:9", "grading-token", 0)
    with ScriptedLLM([{"text": "ok"}]) as llm:
        driver = LLMDriver(model="toy-model-1", api_key="sk-toy-SECRET", base_url=llm.url)
        agent = get_agent("toy-cli", driver=driver)
        assert "`toycli` CLI (pip install toy-cli)" in agent.needs and agent.check() is None  # `toycli --version` starts
        outcome = run_agent(agent, env, BudgetClock(60), env.harness_path / "agent.log", grace_s=5)
    log = (env.harness_path / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    assert "[toy-cli] toycli run ... (model toy-model-1" in log
    # Its parser read its stream: the tool call, the usage, the stray line kept out of the transcript.
    [call] = [json.loads(line) for line in (env.harness_path / "tool_calls.jsonl").read_text().splitlines()]
    assert (call["tool"], call["tool_use_id"], call["ok"], call["output_chars"], call["source"]) == \
        ("shell", "c1", True, 16, "stream")  # fmt: skip
    assert call["input"] == {"command": "ls", "answered": True, "prompt_has_task": True}
    summary = json.loads((env.harness_path / "cli_summary.json").read_text())
    assert summary["agent"] == "toy-cli" and summary["stream"]["events"] == 3 and summary["proxy_calls"] == 1
    assert summary["stream"]["usage"]["input_tokens"] == 7 and summary["stream"]["usage"]["output_tokens"] == 3
    # The model call went through the harness's proxy, which holds the key; the CLI had only its token.
    assert llm.requests and llm.requests[0]["headers"]["x-api-key"] == "sk-toy-SECRET"
    for path in [*ws.rglob("*"), *env.harness_path.rglob("*")]:
        assert not path.is_file() or b"sk-toy-SECRET" not in path.read_bytes(), path
