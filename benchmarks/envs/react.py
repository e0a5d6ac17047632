"""A ReAct loop that steps many episodes in lockstep: one batched policy call per step for the live episodes.

The policy is any `BatchPolicy` (a function from a list of chat conversations to one completion each): a
model wrapped around one batched `generate` call in the evaluator, or a scripted policy in tests and in
an agent's own rollout code. Stdlib only, so it is copied into workspaces with the environments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import TextEnv

Messages = list[dict[str, str]]
BatchPolicy = Callable[[list[Messages]], list[str]]
Prompter = Callable[[dict[str, Any], str, list[dict[str, Any]]], Messages]
"""(goal, first observation, turns so far) -> chat messages for the next action."""

_ACTION = re.compile(r"(?:^|\n)\s*(?:>\s*|Action:\s*)?(?P<action>[^\n]+)")


def parse_action(completion: str) -> str:
    """The action in a ReAct completion: the text after the last `Action:`, else its first line.

    `Thought:` lines are dropped (ALFWorld's `think:` lines are actions of their own and kept).
    """
    text = completion.strip()
    if "Action:" in text:
        text = text.rsplit("Action:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("Thought:")]
    return lines[0].lstrip("> ").strip() if lines else ""


@dataclass
class Episode:
    """One finished (or cut-off) episode: the transcript and its outcome."""

    goal_id: str
    observation: str
    """The first observation."""
    turns: list[dict[str, Any]] = field(default_factory=list)
    """One dict per step: completion, action, observation, reward."""
    reward: float = 0.0
    """Reward of the last step (the environments here give their whole reward at the end)."""
    done: bool = False
    won: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    """The last step's info (e.g. the answer given, the purchased item)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "goal_id": self.goal_id,
            "observation": self.observation,
            "turns": self.turns,
            "reward": self.reward,
            "done": self.done,
            "won": self.won,
            "steps": len(self.turns),
            "info": self.info,
        }


def run_episodes(
    make_env: Callable[[], TextEnv],
    goals: Sequence[dict[str, Any]],
    policy: BatchPolicy,
    prompter: Prompter,
    max_steps: int,
    seed: int = 0,
    action_parser: Callable[[str], str] = parse_action,
    on_done: Callable[[int], None] | None = None,
) -> list[Episode]:
    """Run one episode per goal, all in lockstep; returns episodes in the order of `goals`.

    Each step asks the policy once, for the episodes not yet done, in goal order. An episode that is not
    done after `max_steps` ends with the reward of its last step (0 for the environments here). Episode
    `i` is reset with seed `seed + i`, so a run is reproducible and independent of how goals are batched
    only if the caller keeps the same goal order and seed. `on_done(n)` hears of n more episodes ended
    after each step (and of the rest at the end).
    """
    envs = [make_env() for _ in goals]
    episodes = []
    for i, (env, goal) in enumerate(zip(envs, goals)):
        observation, _ = env.reset(goal, seed=seed + i)
        episodes.append(Episode(goal_id=str(goal.get("id", i)), observation=observation))
    for _ in range(max_steps):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        conversations = [prompter(goals[i], episodes[i].observation, episodes[i].turns) for i in live]
        completions = policy(conversations)
        if len(completions) != len(live):
            raise ValueError(f"the policy returned {len(completions)} completions for {len(live)} conversations")
        for i, completion in zip(live, completions):
            action = action_parser(completion)
            result = envs[i].step(action)
            ep = episodes[i]
            ep.turns.append(
                {"completion": completion, "action": action, "observation": result.observation, "reward": result.reward}
            )
            ep.reward, ep.done, ep.info = result.reward, result.done, result.info
            ep.won = bool(result.info.get("won", False))
        if on_done is not None:
            on_done(sum(episodes[i].done for i in live))
    if on_done is not None:
        on_done(sum(not ep.done for ep in episodes))  # the ones that ran out of steps
    return episodes


def history_prompt(
    system: str, task_text: str, turns: list[dict[str, Any]], window: int, action_prefix: str = "Action: "
) -> Messages:
    """A compact ReAct prompt: system text, the task, and the last `window` steps as user/assistant turns.

    Old steps are dropped (with a note) so that prompts stay short for small models and long episodes.
    """
    messages: Messages = [{"role": "system", "content": system}, {"role": "user", "content": task_text}]
    shown = turns[-window:] if window else turns
    if len(shown) < len(turns):
        messages[1]["content"] += f"\n({len(turns) - len(shown)} earlier steps not shown)"
    for turn in shown:
        messages.append({"role": "assistant", "content": f"{action_prefix}{turn['action']}"})
        messages.append({"role": "user", "content": f"Observation: {turn['observation']}"})
    return messages
