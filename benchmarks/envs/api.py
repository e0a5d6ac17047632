"""Online rollouts in an agent's workspace: `import envlib` (from `data/envlib.zip`) and play TRAINING goals.

    import sys; sys.path.insert(0, "data/envlib.zip")
    import envlib
    goals = envlib.load_goals("data")                 # train goals only (data/train.jsonl)
    make_env = envlib.make_env("webshop", "data")     # the workspace's task: envlib.TASKS names it
    episodes = envlib.run_episodes(make_env, goals[:8], my_batched_policy, envlib.prompter("webshop"),
                                   max_steps=envlib.MAX_STEPS["webshop"])
    rewards = [ep.reward for ep in episodes]          # ep.turns holds the transcript

`my_batched_policy(list_of_chat_messages) -> list_of_completions` is yours (e.g. one batched generate call).
The environments, prompts, action parsing and step limits are the evaluator's own; validation and hidden test
goals are not in the workspace.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import TextEnv, read_jsonl
from .react import Prompter


def _registered() -> dict[str, dict[str, Any]]:
    try:
        from ._tasks import TASKS  # type: ignore[import-not-found]  # written into each envlib.zip by export.py
    except ImportError:  # the harness's own copy of these modules: tasks hold their environments there
        return {}
    return TASKS


TASKS = _registered()
"""The workspace's interactive task(s): name -> {"factory", "prompter": "module:function", "max_steps"}."""
MAX_STEPS = {task: int(entry["max_steps"]) for task, entry in TASKS.items()}
"""The evaluator's step limits."""
STOP = "\n"
"""Completions are cut at the first newline by the evaluator (one action per reply)."""


def load_goals(data_dir: str | Path) -> list[dict[str, Any]]:
    """The training goals (shop instructions, questions or games) in `data_dir/train.jsonl`."""
    return read_jsonl(Path(data_dir) / "train.jsonl")


def _declared(task: str, key: str) -> Callable[..., Any]:
    if task not in TASKS:
        raise ValueError(f"unknown interactive task {task!r}; this envlib holds {', '.join(sorted(TASKS)) or 'none'}")
    module, _, name = TASKS[task][key].partition(":")
    return getattr(importlib.import_module(f".{module}", __package__), name)


def make_env(task: str, data_dir: str | Path) -> Callable[[], TextEnv]:
    """A factory of fresh environments; heavy shared state (catalog, search index) is built once."""
    return _declared(task, "factory")(Path(data_dir))


def prompter(task: str) -> Prompter:
    """The evaluator's prompt builder for a task: (goal, first observation, turns) -> chat messages."""
    return _declared(task, "prompter")
