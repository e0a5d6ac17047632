"""Online rollouts in an agent's workspace: `import envlib` (from `data/envlib.zip`) and play TRAINING goals.

    import sys; sys.path.insert(0, "data/envlib.zip")
    import envlib
    goals = envlib.load_goals("data")                 # train goals only (data/train.jsonl)
    make_env = envlib.make_env("webshop", "data")     # or "alfworld", "deepsearchqa"
    episodes = envlib.run_episodes(make_env, goals[:8], my_batched_policy, envlib.prompter("webshop"),
                                   max_steps=envlib.MAX_STEPS["webshop"])
    rewards = [ep.reward for ep in episodes]          # ep.turns holds the transcript

`my_batched_policy(list_of_chat_messages) -> list_of_completions` is yours (e.g. one batched generate call).
The environments, prompts, action parsing and step limits are the evaluator's own; validation and hidden test
goals are not in the workspace.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import TextEnv
from .household import HouseholdEnv, household_prompt
from .react import Prompter
from .searchqa import SearchQAEnv, searchqa_prompt
from .shop import ShopEnv, shop_prompt

MAX_STEPS = {"alfworld": 50, "webshop": 15, "deepsearchqa": 6}
"""The evaluator's step limits."""
STOP = "\n"
"""Completions are cut at the first newline by the evaluator (one action per reply)."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    # Not `a2rl.jsonl`: this module ships to agents in envlib.zip and must run without the harness.
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def load_goals(data_dir: str | Path) -> list[dict[str, Any]]:
    """The training goals (shop instructions, questions or games) in `data_dir/train.jsonl`."""
    return _read_jsonl(Path(data_dir) / "train.jsonl")


def make_env(task: str, data_dir: str | Path) -> Callable[[], TextEnv]:
    """A factory of fresh environments; heavy shared state (catalog, search index) is built once."""
    data_dir = Path(data_dir)
    if task == "alfworld":
        return HouseholdEnv
    if task == "webshop":
        from .bm25 import BM25
        from .shop import listing_text

        listings = _read_jsonl(data_dir / "catalog.jsonl")
        index = BM25([listing_text(x) for x in listings])
        return lambda: ShopEnv(listings, index)
    if task == "deepsearchqa":
        from .bm25 import BM25

        docs = _read_jsonl(data_dir / "corpus.jsonl")
        index = BM25([f"{d['title']} {d['text']}" for d in docs])
        return lambda: SearchQAEnv(docs, index)
    raise ValueError(f"unknown interactive task {task!r}; use alfworld, webshop or deepsearchqa")


def prompter(task: str) -> Prompter:
    """The evaluator's prompt builder for a task: (goal, first observation, turns) -> chat messages."""
    return {"alfworld": household_prompt, "webshop": shop_prompt, "deepsearchqa": searchqa_prompt}[task]
