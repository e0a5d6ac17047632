"""The agent protocol: how the harness installs, starts, watches and stops an agent under test."""

from __future__ import annotations

import abc
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from a2rl_bench.isolation import procs
from a2rl_bench.isolation.freezer import AgentFreezer
from a2rl_bench.ngrams import StreamMatcher
from a2rl_bench.capture.agent_log import AgentLog, Capture
from a2rl_bench.grading.clock import BudgetClock
from a2rl_bench.isolation.sandbox import SandboxPolicy, agent_uid, sandbox_mode
from a2rl_bench.isolation.sandbox import describe as describe_sandbox
from a2rl_bench.isolation.sandbox import wrap as wrap_in_sandbox

# Only these variables of the harness's environment reach an agent: no API keys, no tokens.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                   "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                   "CUDA_VISIBLE_DEVICES")
# Knobs the reference agents read (tests shrink them for tiny models). `A2RL_RL_MIN_SHARE` and
# `A2RL_VALIDATION_ITEMS` were documented knobs that never reached the agent before `A2RL_RL_` and
# `A2RL_VALIDATION_` were listed.
PASSTHROUGH_PREFIXES = ("A2RL_AGENT_", "A2RL_SFT_", "A2RL_GRPO_", "A2RL_RL_", "A2RL_VALIDATION_")
# Variables a harness-side runner gets on top of the agent's environment (`Agent.launch_env`). The runner
# removes them from its environment before it starts anything in the workspace.
HARNESS_ENV_PREFIX = "A2RL_HARNESS_"

# Files LLM agents write into the run's harness directory (outside the workspace).
LLM_CALLS_FILE = "llm_calls.jsonl"
TOOL_CALLS_FILE = "tool_calls.jsonl"
TRANSCRIPT_FILE = "transcript.jsonl"


class SessionOutcome(BaseModel):
    exit_code: int | None
    ended_by: Literal["exited", "budget", "launch-error", "interrupted"]
    agent_seconds: float
    """The agent's time within its budget (never more than the budget)."""
    wall_seconds: float
    error: str | None = None
    grace_seconds: float = 0.0
    """The agent's time past its budget: the grace it gets to stop and make a last submission."""
    clock_rule: dict | None = None
    """How grading pauses were kept free of agent work (`a2rl_bench.isolation.freezer`): the rule, freezes, seconds."""


@dataclass(frozen=True)
class AgentEnv:
    """The variables every agent gets (the agent's side of them: a2rl_bench/templates/instructions.md)."""

    task: str
    base_model: str
    workspace: Path
    grading_url: str
    grading_token: str
    seed: int
    harness_dir: Path | None = None
    """Where a harness-side runner writes transcripts and call logs; default: `<workspace>/../harness`."""

    @property
    def harness_path(self) -> Path:
        return Path(self.harness_dir) if self.harness_dir else Path(self.workspace).parent / "harness"

    def as_dict(self) -> dict[str, str]:
        ws = self.workspace
        return {
            "TASK": self.task,
            "BASE_MODEL": self.base_model,
            "WORKSPACE": str(ws),
            "MODEL_PATH": str(ws / "models" / "base"),
            "DATA_PATH": str(ws / "data"),
            "OUTPUT_DIR": str(ws / "output"),
            "GRADING_SERVER_URL": self.grading_url,
            "GRADING_TOKEN": self.grading_token,
            "AGENT_SEED": str(self.seed),
            "HOME": str(ws),
            "PYTHONUNBUFFERED": "1",
        }


class Agent(abc.ABC):
    """A scaffold under test. Subclasses say what to install in `code/` and what to run."""

    id: str
    uses_llm: bool = False

    @abc.abstractmethod
    def install(self, workspace: Path) -> None:
        """Put the agent's own files into the workspace (idempotent)."""

    @abc.abstractmethod
    def command(self, workspace: Path) -> list[str]:
        """The command line that starts the agent, run with cwd = workspace."""

    def launch_env(self, env: AgentEnv) -> dict[str, str]:
        """Extra variables for the started process only (harness-side runners: API key, harness dir).

        Names must start with `HARNESS_ENV_PREFIX`; the runner strips them before running anything in the
        workspace, so the agent's own processes never inherit them.
        """
        return {}


def agent_environment(env: AgentEnv) -> dict[str, str]:
    base = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    base.update({k: v for k, v in os.environ.items() if k.startswith(PASSTHROUGH_PREFIXES)})
    base.setdefault("HF_HUB_OFFLINE", "1")
    # The agent runs with the harness's interpreter, so its venv's tools are on PATH.
    base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '/usr/bin:/bin')}"
    base.update(env.as_dict())
    return base


class AgentLaunchError(ValueError):
    """The agent cannot start here (missing CLI, missing driver); the message says how to fix it."""


class LLMDriver(BaseModel):
    """A driver LLM: which model, behind which endpoint, at what price. Made from a `DriverConfig` block
    (`LLMDriver.model_validate(block)`: same field names) or directly in tests."""

    model_config = ConfigDict(frozen=True, from_attributes=True, extra="ignore")

    model: str
    """Model id as the endpoint knows it, e.g. `claude-sonnet-4-5`."""
    api_key: SecretStr = SecretStr("")
    base_url: str | None = None
    """Any compatible endpoint (a vLLM server, a proxy, a loopback test server); None = the vendor's."""
    api: Literal["anthropic", "openai", "gemini"] = "anthropic"
    """Wire protocol: Anthropic Messages; OpenAI-compatible (Responses / Chat Completions: OpenAI, a local
    `vllm serve`, any compatible server); or the Gemini API (`generateContent`)."""
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    cache_read_usd_per_mtok: float = 0.0
    cache_write_usd_per_mtok: float = 0.0

    def cost_usd(self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0) -> float:
        """Dollars for one call; `input_tokens` excludes the cached ones (Anthropic's usage convention)."""
        return (input_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok
                + cache_read * self.cache_read_usd_per_mtok + cache_write * self.cache_write_usd_per_mtok) / 1e6

    def public(self) -> dict[str, Any]:
        """Everything but the key: safe to log, to put in a manifest or on a command line."""
        return self.model_dump(mode="json", exclude={"api_key"})


class AgentOptions(BaseModel):
    """Scaffold settings of an LLM agent (from an `AgentConfig` block); the defaults suit a 12 h session."""

    model_config = ConfigDict(from_attributes=True, extra="ignore")

    max_turns: int = 500
    """LLM calls per session (a safety stop; the time budget normally ends the session)."""
    max_output_tokens: int = 8192
    command_timeout_s: float = 900.0
    """Default per-command timeout of the bash tool; the model may ask for up to `max_command_timeout_s`."""
    max_command_timeout_s: float = 3 * 3600.0
    output_limit_chars: int = 20_000
    """Tool output beyond this is cut in the middle (head and tail kept)."""
    context_limit_tokens: int = 150_000
    """Above this prompt size the conversation is compacted (first message + last turns kept)."""
    keep_last_messages: int = 30
    max_nudges: int = 3
    """Times the agent is told to go on when it stops talking while budget remains."""
    max_cost_usd: float | None = None
    """Stop the session once the driver's calls have cost this much."""
    retry_base_s: float = 2.0
    """First backoff delay after a transient API error (429, 5xx, 529, connection); doubles per attempt."""
    max_attempts: int = 8
    extra_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments for CLI agents."""


class LLMCallEvent(BaseModel):
    """One request to the driver LLM (a line of `harness/llm_calls.jsonl`)."""

    at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    call: int
    """1-based request counter of the session; retried attempts of one call share it."""
    attempt: int = 1
    model: str
    input_tokens: int = 0
    """Uncached input tokens."""
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    stop_reason: str | None = None
    status: int | None = None
    """HTTP status where known (proxy, SDK errors)."""
    error: str | None = None
    source: Literal["sdk", "proxy", "stream"] = "sdk"
    """Who measured it: our SDK loop, the harness-side proxy of a CLI agent, or the CLI's own event stream."""


class ToolCallEvent(BaseModel):
    """One tool call of an LLM agent (a line of `harness/tool_calls.jsonl`)."""

    at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    call: int
    tool: str
    tool_use_id: str | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    """Arguments, long strings shortened."""
    ok: bool = True
    exit_code: int | None = None
    duration_s: float | None = None
    output_chars: int = 0
    error: str | None = None
    source: Literal["sdk", "stream"] = "sdk"


def shorten(value: Any, limit: int = 2000) -> Any:
    """Strings over `limit` characters cut in the middle, recursively (for logging tool arguments)."""
    if isinstance(value, str) and len(value) > limit:
        return value[: limit // 2] + f"... [{len(value) - limit} chars cut] ..." + value[-limit // 2 :]
    if isinstance(value, dict):
        return {k: shorten(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [shorten(v, limit) for v in value]
    return value


def run_agent(
    agent: Agent,
    env: AgentEnv,
    clock: BudgetClock,
    log_path: Path,
    grace_s: float = 30.0,
    poll_s: float = 0.5,
    sandbox: SandboxPolicy | None = None,
    log_matcher: StreamMatcher | None = None,
) -> SessionOutcome:
    """Start the agent in its own process group and stop the whole group when the budget is spent.

    The budget is checked against the pausable clock, so time spent grading extends the wall-clock
    deadline. After the budget, the group gets SIGTERM and `grace_s` to make a last submission, then SIGKILL.
    With a `sandbox` policy, a scripted agent runs inside bubblewrap (a2rl_bench.isolation.sandbox); an LLM agent's
    runner holds its key and network access and gets the policy to apply to what it starts.
    The agent's output goes to `log_path`, capped (head and tail kept, the rest counted); every byte of it is first
    searched with `log_matcher` (the run's hidden items), whose findings `harness/agent-log.json` records.
    """
    start = time.monotonic()
    try:
        extra = agent.launch_env(env)
    except AgentLaunchError as e:  # e.g. an LLM agent without a driver, a CLI that is not installed
        return SessionOutcome(exit_code=None, ended_by="launch-error", agent_seconds=0.0,
                              wall_seconds=time.monotonic() - start, error=str(e))
    if bad := [k for k in extra if not k.startswith(HARNESS_ENV_PREFIX)]:
        raise ValueError(f"{agent.id}: launch_env names must start with {HARNESS_ENV_PREFIX}: {bad}")
    # The attempt's tag (run, attempt, harness pid): a retry finds what this session left by it (procs.ATTEMPT_ENV).
    command, child_env = agent.command(env.workspace), {**agent_environment(env), **procs.attempt_env(), **extra}
    # Everything below the session's leader runs in a cgroup of its own where the machine delegates one: the
    # freezer stops it atomically (a2rl_bench.isolation.freezer).
    cgroup = procs.freezer_cgroup()
    if sandbox is not None:
        if agent.uses_llm:
            child_env[f"{HARNESS_ENV_PREFIX}SANDBOX"] = json.dumps(describe_sandbox(sandbox))
        else:
            try:
                command, child_env = wrap_in_sandbox(command, child_env, sandbox, cgroup=cgroup)
            except BaseException:
                if cgroup is not None:
                    procs.remove_cgroup(cgroup)
                raise
    # Root harness with bubblewrap: every process of the agent runs under this uid (recorded for retries).
    uid = agent_uid(sandbox) if sandbox is not None and sandbox_mode(sandbox) == "bwrap-root" else None
    # What runs on the host (an LLM agent's runner, an agent without sandbox) runs under a supervisor that ends
    # all of it, daemons included, should the harness die; a sandbox's shim does that for what runs inside.
    death_signal = signal.SIGKILL
    if sandbox is None or agent.uses_llm:
        command = procs.supervised(command, sys.executable, cgroup=cgroup)
        death_signal = procs.SUPERVISOR_DEATH_SIGNAL
    clock.start()
    # The agent's output goes through a pipe into a capped log, searched for hidden items as it is read
    # (a2rl_bench.capture.agent_log): an agent printing fast cannot fill the harness disk, nor hide what it printed.
    read_fd, write_fd = os.pipe()
    output = Capture(read_fd, AgentLog(log_path, matcher=log_matcher)).start()
    freezer: AgentFreezer | None = None
    try:
        try:
            # Its own session (the harness's group signals do not reach it) and a parent-death signal: a
            # harness that is SIGKILLed or OOM-killed takes the agent down with it.
            proc = procs.start(command, group="session", death_signal=death_signal, cwd=env.workspace, env=child_env,
                               stdout=write_fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        except OSError as e:
            clock.stop()
            return SessionOutcome(exit_code=None, ended_by="launch-error", agent_seconds=0.0,
                                  wall_seconds=time.monotonic() - start, error=str(e))
        finally:
            os.close(write_fd)
        _record_session(env, proc, uid)
        ended_by: Literal["exited", "budget"] = "exited"
        clock.listen(freezer := AgentFreezer(proc.pid, cgroup, uid))  # stopped while the clock is paused for grading
        try:
            while proc.poll() is None:
                if clock.expired:
                    ended_by = "budget"
                    procs.stop_group(proc, grace_s)
                    break
                time.sleep(poll_s)
        except BaseException:
            # The harness itself is going down (signal, crash): the agent must not outlive it.
            procs.stop_group(proc, grace_s=2.0)
            raise
        # Whatever the leader did, no process of the agent's group, nor of its session (process groups a
        # tool runner made for its commands), survives the session.
        procs.end_session_of(proc)
    finally:
        # The agent's time ends with its processes, whatever ended them: what the harness does next (the
        # output's drain, a last code snapshot, the way down after a signal) is not the agent's, and the clock
        # file a retry resumes from is saved after this.
        clock.stop()
        if freezer is not None:
            clock.unlisten(freezer)
            freezer.on_resume()  # never leave a stopped process behind, whatever ended the session
        if cgroup is not None:
            procs.remove_cgroup(cgroup)
        output.finish()
    return SessionOutcome(
        exit_code=proc.returncode,
        ended_by=ended_by,
        agent_seconds=round(clock.agent_seconds(), 3),
        grace_seconds=round(clock.grace_seconds(), 3),
        wall_seconds=round(time.monotonic() - start, 3),
        clock_rule=freezer.describe() if freezer else None,
    )


def _record_session(env: AgentEnv, proc: subprocess.Popen, uid: int | None) -> None:
    """The session's processes, for a retry of this run to end them should this harness die
    (a2rl_bench.isolation.procs)."""
    if env.harness_path.is_dir():
        procs.record_session(env.harness_path, procs.SessionRecord.of(proc.pid, agent_uid=uid))
