"""The agent protocol: how the harness installs, starts, watches and stops an agent under test."""

from __future__ import annotations

import abc
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from a2rl.grading.clock import BudgetClock

# Only these variables of the harness's environment reach an agent: no API keys, no tokens.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                   "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
# Knobs the reference agents read (tests shrink them for tiny models).
PASSTHROUGH_PREFIXES = ("A2RL_AGENT_", "A2RL_SFT_")


class SessionOutcome(BaseModel):
    exit_code: int | None
    ended_by: Literal["exited", "budget", "launch-error"]
    agent_seconds: float
    wall_seconds: float
    error: str | None = None


@dataclass(frozen=True)
class AgentEnv:
    """The variables every agent gets (SPEC §4)."""

    task: str
    base_model: str
    workspace: Path
    grading_url: str
    grading_token: str
    seed: int

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


def agent_environment(env: AgentEnv) -> dict[str, str]:
    base = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    base.update({k: v for k, v in os.environ.items() if k.startswith(PASSTHROUGH_PREFIXES)})
    base.setdefault("HF_HUB_OFFLINE", "1")
    # The agent runs with the harness's interpreter, so its venv's tools are on PATH.
    base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '/usr/bin:/bin')}"
    base.update(env.as_dict())
    return base


def run_agent(
    agent: Agent,
    env: AgentEnv,
    clock: BudgetClock,
    log_path: Path,
    grace_s: float = 30.0,
    poll_s: float = 0.5,
) -> SessionOutcome:
    """Start the agent in its own process group and stop the whole group when the budget is spent.

    The budget is checked against the pausable clock, so time spent grading extends the wall-clock
    deadline. After the budget, the group gets SIGTERM and `grace_s` to make a last submission, then SIGKILL.
    """
    start = time.monotonic()
    clock.start()
    with log_path.open("ab") as log:
        try:
            proc = subprocess.Popen(
                agent.command(env.workspace),
                cwd=env.workspace,
                env=agent_environment(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            clock.stop()
            return SessionOutcome(exit_code=None, ended_by="launch-error", agent_seconds=0.0,
                                  wall_seconds=time.monotonic() - start, error=str(e))
        ended_by: Literal["exited", "budget"] = "exited"
        while proc.poll() is None:
            if clock.expired:
                ended_by = "budget"
                _stop_group(proc, grace_s)
                break
            time.sleep(poll_s)
    clock.stop()
    return SessionOutcome(
        exit_code=proc.returncode,
        ended_by=ended_by,
        agent_seconds=round(clock.elapsed(), 3),
        wall_seconds=round(time.monotonic() - start, 3),
    )


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # Kill the whole group even if the leader exited: children must not outlive the budget.
    _signal_group(proc, signal.SIGKILL)
    proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
