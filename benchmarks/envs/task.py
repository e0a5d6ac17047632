"""Interactive benchmark tasks: episodes run by the lockstep ReAct loop, a model as the batched policy.

Not copied into workspaces (it imports the harness); the environment modules beside it are.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from a2rl_bench.records import ItemResult
from a2rl_bench.benchmarks.base import BenchmarkTask, Decoding, Item, Messages, PreparedData, write_jsonl
from a2rl_bench.benchmarks.envs.base import TextEnv
from a2rl_bench.benchmarks.envs.export import AgentEnvironment, write_envlib
from a2rl_bench.benchmarks.envs.react import BatchPolicy, Episode, parse_action, run_episodes

EPISODE_SEED = 0
"""Seed of episode 0; episode i is reset with EPISODE_SEED + i (the environments here are deterministic)."""


class ModelPolicy:
    """A checkpoint as a batched policy: one `generate` call per step, for all live episodes at once."""

    def __init__(self, model: Any, decoding: Decoding, batch_size: int):
        self.model, self.decoding, self.batch_size = model, decoding, batch_size
        self.generated_tokens = 0
        self.calls = 0

    def __call__(self, conversations: list[Messages]) -> list[str]:
        from a2rl_bench.inference.generation import generate

        d = self.decoding
        out = generate(
            self.model,
            conversations,
            max_new_tokens=d.max_new_tokens,
            temperature=d.temperature,
            stop=d.stop,
            batch_size=self.batch_size,
        )
        self.generated_tokens += out.generated_tokens
        self.calls += 1
        return out.completions


@dataclass
class InteractiveTask(BenchmarkTask):
    """A task whose items are goals of a `TextEnv`; evaluation runs episodes instead of one generation."""

    max_steps: int = 15
    agent_environment: ClassVar[AgentEnvironment]
    """The modules and functions of the task's environment that agents get in `data/envlib.zip` (export.py)."""

    @abc.abstractmethod
    def make_env(self, variant: str) -> Callable[[], TextEnv]:
        """A factory of fresh environments for a variant (sharing heavy state such as a search index)."""

    @abc.abstractmethod
    def prompt(self, goal: Item, observation: str, turns: list[dict[str, Any]]) -> Messages:
        """Chat messages asking for the next action."""

    def score_episode(self, item: Item, episode: Episode) -> ItemResult:
        """One episode as an item result: success = `won`, value = final reward, transcript in `detail`."""
        return ItemResult(
            item_id=item["id"],
            completion=episode.turns[-1]["completion"] if episode.turns else "",
            prediction=str(episode.info.get("answer", episode.info.get("purchased", ""))) or None,
            target=str(item.get("target", "")),
            correct=episode.won,
            value=episode.reward,
            detail=episode.to_dict(),
        )

    def parse_action(self, completion: str) -> str:
        return parse_action(completion)

    def oracle_actions(self, variant: str, goal: Item) -> list[str] | None:
        """A winning action sequence for a training goal (stored walkthrough, scripted oracle); None if unknown."""
        return None

    def demonstrations(self, variant: str, train: list[Item]) -> list[dict]:
        """One prompt-completion row per step of each oracle episode that wins, the prompt exactly as the
        evaluator shows it at that step (so SFT on them is behaviour cloning in the evaluation's format)."""
        make_env, rows = self.make_env(variant), []
        for goal in train:
            actions = self.oracle_actions(variant, goal)
            if not actions:
                continue
            env = make_env()
            observation, _ = env.reset(goal, seed=EPISODE_SEED)
            turns: list[dict[str, Any]] = []
            steps, result = [], None
            for action in actions[: self.max_steps]:
                steps.append({"prompt": self.prompt(goal, observation, turns),
                              "completion": [{"role": "assistant", "content": action}], "goal_id": goal["id"]})  # fmt: skip
                result = env.step(action)
                turns.append({"completion": action, "action": action, "observation": result.observation,
                              "reward": result.reward})  # fmt: skip
                if result.done:
                    break
            if result is not None and result.info.get("won"):
                rows.extend(steps)
        return rows

    def public_files(self, variant: str) -> dict[str, list[dict[str, Any]]]:
        """Extra agent-visible files an environment needs beside the train goals (a catalog, a corpus)."""
        return {}

    def prepare_files(self, variant: str) -> PreparedData:
        """The static preparation, plus the environment's public files and `envlib.zip` for online rollouts."""
        prepared = super().prepare_files(variant)
        for name, rows in self.public_files(variant).items():
            if not (prepared.public_dir / name).exists():
                write_jsonl(prepared.public_dir / name, rows)
        # Rewritten when the modules changed since preparation: workspaces get the evaluator's current rules.
        environment = getattr(self, "agent_environment", None)
        if not isinstance(environment, AgentEnvironment):
            raise TypeError(f"interactive task {self.id!r} declares no agent_environment = AgentEnvironment(...): "
                            "agents could not play its episodes")
        write_envlib(prepared.public_dir / "envlib.zip", self.id, self.max_steps, environment)
        return prepared

    def evaluator_id(self) -> str:
        return f"{super().evaluator_id()}/steps{self.max_steps}"

    # -- BenchmarkTask -----------------------------------------------------------------------------
    def build_prompt(self, item: Item) -> Messages:
        observation, _ = self.make_env(item.get("variant", "offline"))().reset(item, seed=EPISODE_SEED)
        return self.prompt(item, observation, [])

    def score_item(self, item: Item, completion: str) -> ItemResult:
        raise TypeError(f"{self.id} is interactive: it is scored per episode (run_episodes), not per completion")

    def summarize(self, results: list[ItemResult]) -> dict:
        n = max(1, len(results))
        return {
            "mean_reward": sum(r.value or 0.0 for r in results) / n,
            "mean_steps": sum(r.detail.get("steps", 0) for r in results) / n,
        }

    def play(self, items: list[Item], policy: BatchPolicy, variant: str | None = None,
             on_done: Callable[[int], None] | None = None) -> list[ItemResult]:  # fmt: skip
        """Run episodes for items with any batched policy (a model, an oracle, a random policy)."""
        if not items:
            return []
        variant = variant or items[0].get("variant", "offline")
        episodes = run_episodes(
            self.make_env(variant), items, policy, self.prompt, self.max_steps, EPISODE_SEED, self.parse_action,
            on_done=on_done,
        )
        return [self.score_episode(item, ep) for item, ep in zip(items, episodes)]

    def run_episodes(self, model_dir: Path | Any, items: list[Item], batch_size: int,
                     on_done: Callable[[int], None] | None = None) -> list[ItemResult] | None:  # fmt: skip
        from a2rl_bench.inference.generation import load_model

        model = model_dir if isinstance(model_dir, tuple) else load_model(model_dir)
        policy = ModelPolicy(model, self.decoding, batch_size)
        results = self.play(items, policy, on_done=on_done)
        for r in results:
            r.detail["policy_calls"] = policy.calls
        if results:
            results[0].detail["generated_tokens"] = policy.generated_tokens
        return results
