"""Text environments for the interactive tasks and the lockstep ReAct loop (stdlib + numpy only).

Shipped to agents as `data/envlib.zip` (imported as `envlib`), so its modules use only relative imports: the
shared modules and the environment module(s) the workspace's task declares (`export.py`); `task.py` (the evaluator
glue, which imports the harness) is left out of that copy.
"""

from __future__ import annotations

from .api import MAX_STEPS, STOP, TASKS, load_goals, make_env, prompter
from .base import StepResult, TextEnv
from .react import BatchPolicy, Episode, parse_action, run_episodes

__all__ = [
    "MAX_STEPS",
    "STOP",
    "TASKS",
    "BatchPolicy",
    "Episode",
    "StepResult",
    "TextEnv",
    "load_goals",
    "make_env",
    "parse_action",
    "prompter",
    "run_episodes",
]
