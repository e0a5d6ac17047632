"""ALFWorld (L3): offline, ALFWorld-style games generated from the alfworld wheel (our own simulation of
its domain); `full`, the real ALFWorld TextWorld games when downloaded. Regenerate the committed manifest with
`python -c "from a2rl_bench.benchmarks.alfworld.task import write_offline_manifest; write_offline_manifest()"`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2rl_bench.benchmarks.alfworld.games import (
    PACKAGE, VERSION, ALFWorldDataError, game_hash, generate_game, layout_names,
)
from a2rl_bench.benchmarks.base import Item, Messages, TaskData
from a2rl_bench.benchmarks.envs.base import StepResult, TextEnv
from a2rl_bench.benchmarks.envs.household import SIMULATION_VERSION, HouseholdEnv, household_prompt
from a2rl_bench.benchmarks.envs.splits import read_manifest, write_manifest
from a2rl_bench.benchmarks.envs.task import AgentEnvironment, InteractiveTask
from a2rl_bench.paths import data_file

MANIFEST = data_file("alfworld", "split-offline.json")
REGENERATE = "a2rl_bench.benchmarks.alfworld.task.write_offline_manifest()"
SEEDS = {"train": (0, 600), "validation": (100_000, 60), "test": (200_000, 134)}
"""(first seed, number of games) per split; test has as many games as ALFWorld's valid_unseen."""


def layout_split(layout: str) -> str:
    """Rooms are split like ALFWorld's seen/unseen scenes: FloorPlan numbers ending in 1 or 6 are test-only
    rooms, ending in 3 validation-only, the rest training rooms (in every room type)."""
    last = int(layout[len("FloorPlan") :]) % 10
    return "test" if last in (1, 6) else "validation" if last == 3 else "train"


@functools.lru_cache(maxsize=1)
def offline_games() -> dict[str, list[dict[str, Any]]]:
    layouts = layout_names()
    games = {}
    for split, (first, count) in SEEDS.items():
        rooms = [x for x in layouts if layout_split(x) == split]
        games[split] = [generate_game(seed, rooms) for seed in range(first, first + count)]
    return games


def build_offline_manifest() -> dict[str, Any]:
    games = offline_games()
    layouts = layout_names()
    return {
        "task": "alfworld",
        "variant": "offline",
        "source": {"package": PACKAGE, "version": VERSION, "layouts": len(layouts)},
        "seeds": {k: list(v) for k, v in SEEDS.items()},
        "layouts": {s: [x for x in layouts if layout_split(x) == s] for s in SEEDS},
        "games": {s: [f"{g['seed']}:{g['layout']}:{game_hash(g)}" for g in games[s]] for s in SEEDS},
    }


def write_offline_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    manifest = build_offline_manifest()
    write_manifest(path, manifest)
    return manifest


def load_offline(path: Path = MANIFEST) -> TaskData:
    """Regenerate the games (a few seconds) and check each against its committed hash."""
    committed = read_manifest(path, ALFWorldDataError, REGENERATE)
    current = build_offline_manifest()
    if current != committed:
        bad = [k for k in current if current[k] != committed.get(k)]
        raise ALFWorldDataError(
            f"regenerated games differ from {path} in {bad}; install {PACKAGE}=={VERSION} (--no-deps) "
            f"or, after a deliberate generator change, regenerate with {REGENERATE}"
        )
    games = {
        s: [{**g, "target": g["goal_text"], "variant": "offline"} for g in gs] for s, gs in offline_games().items()
    }
    return TaskData(
        train=games["train"], validation=games["validation"], test=games["test"],
        source=f"ALFWorld-style games generated offline from {PACKAGE}=={VERSION} layouts and constants "
        "(own simulation of the ALFWorld text domain; walkthroughs by a scripted planner)",
    )  # fmt: skip


@dataclass
class ALFWorld(InteractiveTask):
    """Declarative fields (id, title, decoding, variant labels, ...): task.toml beside this file."""
    agent_environment = AgentEnvironment(
        ("a2rl_bench.benchmarks.envs.household",), "household:make_env", "household:household_prompt"
    )

    def loaders(self) -> dict[str, Callable[[], TaskData]]:
        return {"offline": load_offline, "full": load_full}

    def evaluator_id(self) -> str:
        """Includes the offline simulation's version: its rules decide which episodes win."""
        return f"{super().evaluator_id()}/household-v{SIMULATION_VERSION}"

    def make_env(self, variant: str) -> Callable[[], TextEnv]:
        return RealALFWorldEnv if variant == "full" else HouseholdEnv

    def oracle_actions(self, variant: str, goal: Item) -> list[str] | None:
        return list(goal["walkthrough"]) if variant == "offline" and goal.get("walkthrough") else None

    def prompt(self, goal: Item, observation: str, turns: list[dict[str, Any]]) -> Messages:
        return household_prompt(goal, observation, turns)

    def summarize(self, results) -> dict:
        summary = super().summarize(results)
        by_type: dict[str, list[bool]] = {}
        for r in results:
            by_type.setdefault(r.detail.get("task_type", ""), []).append(r.correct)
        summary["success_by_type"] = {k: 100.0 * sum(v) / len(v) for k, v in sorted(by_type.items()) if k}
        return summary

    def score_episode(self, item, episode):
        result = super().score_episode(item, episode)
        result.detail["task_type"] = item.get("task_type", "")
        return result


# -- full variant ------------------------------------------------------------------------------------

FULL_MESSAGE = (
    "the `full` ALFWorld variant needs `pip install alfworld==0.4.2` (builds fast-downward) and its games "
    "(`alfworld-download`, ~2 GB, from GitHub) under $ALFWORLD_DATA/json_2.1.1; without them use `offline`"
)


def full_root() -> Path:
    return Path(os.environ.get("ALFWORLD_DATA", Path.home() / ".cache" / "alfworld")) / "json_2.1.1"


def load_full() -> TaskData:
    """train -> agent; valid_seen -> validation; valid_unseen (134) -> hidden test, as in the paper."""
    root = full_root()
    if not (root / "valid_unseen").is_dir():
        raise ALFWorldDataError(f"{FULL_MESSAGE} (looked in {root})")

    def games(split: str) -> list[Item]:
        files = sorted((root / split).glob("*/*/game.tw-pddl"))
        return [
            {"id": f"alfworld-{split}-{i:04d}", "game_file": str(f), "variant": "full"} for i, f in enumerate(files)
        ]

    return TaskData(games("train"), games("valid_seen"), games("valid_unseen"), source=f"ALFWorld games in {root}")


class RealALFWorldEnv(TextEnv):
    """One real ALFWorld TextWorld game per episode (AlfredDemangler + AlfredInfos, admissible commands)."""

    def __init__(self) -> None:
        try:
            import textworld  # noqa: F401
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos  # noqa: F401
        except ImportError as e:
            raise ALFWorldDataError(FULL_MESSAGE) from e
        self.env: Any = None
        self.last: dict[str, Any] = {}

    def reset(self, goal: dict[str, Any], seed: int = 0) -> tuple[str, dict[str, Any]]:
        import textworld
        import textworld.gym
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        env_id = textworld.gym.register_game(
            goal["game_file"], infos, max_episode_steps=50, wrappers=[AlfredDemangler, AlfredInfos]
        )
        self.env = textworld.gym.make(env_id)
        observation, self.last = self.env.reset()
        return observation, {}

    def step(self, action: str) -> StepResult:
        observation, _score, done, self.last = self.env.step(action)
        won = bool(self.last.get("won"))
        return StepResult(observation, float(won), bool(done or won), {"won": won})

    def admissible_actions(self) -> list[str]:
        return list(self.last.get("admissible_commands", []))
