"""The text-environment interface shared by the interactive tasks (stdlib only, copied into workspaces)."""

from __future__ import annotations

import abc
import json
from collections.abc import Hashable
from pathlib import Path
from typing import Any, NamedTuple


class StepResult(NamedTuple):
    """What one `step` returns, in the gym order."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any]


class TextEnv(abc.ABC):
    """One text environment holding one episode at a time.

    `reset(goal, seed)` starts an episode for a goal (a task item: a shop instruction, a question, a game);
    `step(action)` applies one action string; `admissible_actions()` lists the actions valid now.
    Environments are deterministic: the same goal, seed and actions give the same transcript.
    """

    @abc.abstractmethod
    def reset(self, goal: dict[str, Any], seed: int = 0) -> tuple[str, dict[str, Any]]:
        """Start an episode; return the first observation and an info dict."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one action. After `done`, further steps are an error."""

    def state_key(self) -> Hashable | None:
        """A hashable summary of the current state, equal exactly when two episodes are in the same state
        (e.g. GiGPO's anchor states); None where the environment does not say."""
        return None

    @abc.abstractmethod
    def admissible_actions(self) -> list[str]:
        """Actions that are valid in the current state (templates such as `search[...]` for free text)."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a workspace file (not `a2rl_bench.jsonl`: this module ships to agents and must run without the
    harness)."""
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]
