"""Searching demonstrations, built by the agent from the task's PUBLIC training games (``data/train.jsonl``).

The task's worked examples are oracle walkthroughs: their first ``go to`` already holds the object, so a policy
trained on them guesses where things are and cannot look for them. Here every fetch of a walkthrough (``go to
R``, maybe ``open R``, ``take O from R``) is replaced by a search: the room's receptacles are visited in a learned
order (how often a receptacle of each type held an object of the wanted type across the training games, most
likely first), each closed one is opened, and the search stops at the first receptacle that shows an object of
the wanted type, which is taken; the rest of the walkthrough follows with that object's name. Each demonstration
is played through the task's own environment and kept only if it wins within the evaluator's step limit; its
steps become prompt-completion rows in the evaluator's own prompt format, as ``data/sft.jsonl`` rows are.

Only the training games are read (validation and hidden games are not in the workspace); the task's data files
are left as they are. Stand-alone: copied into the workspace's ``code/``; imports nothing from the harness.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path


def import_envlib(data_dir: Path):
    """The task's environments, as shipped in the workspace (`data/envlib.zip`)."""
    zip_path = str(Path(data_dir) / "envlib.zip")
    loaded = sys.modules.get("envlib")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(zip_path + "/"):
        # another workspace's envlib (several in one process, as in tests): each zip holds its own task only
        for name in [n for n in sys.modules if n == "envlib" or n.startswith("envlib.")]:
            del sys.modules[name]
    if zip_path in sys.path:
        sys.path.remove(zip_path)
    sys.path.insert(0, zip_path)
    import envlib

    return envlib


def _natural(name: str) -> tuple[str, int]:
    base, _, num = name.rpartition(" ")
    return (base, int(num)) if num.isdigit() else (name, 0)


def receptacle_prior(goals: list[dict]) -> dict[str, Counter]:
    """For each object type, how many objects of it started in a receptacle of each type, over the games.

    >>> g = {"receptacles": [{"name": "fridge 1", "type": "Fridge"}, {"name": "shelf 1", "type": "Shelf"}],
    ...      "objects": [{"name": "egg 1", "type": "Egg", "location": "fridge 1"}]}
    >>> dict(receptacle_prior([g, g])["Egg"])
    {'Fridge': 2}
    """
    prior: dict[str, Counter] = defaultdict(Counter)
    for goal in goals:
        rtype = {r["name"]: r["type"] for r in goal.get("receptacles", [])}
        for obj in goal.get("objects", []):
            if obj.get("location") in rtype:
                prior[obj["type"]][rtype[obj["location"]]] += 1
    return prior


def search_order(goal: dict, object_type: str, prior: dict[str, Counter]) -> list[str]:
    """The game's receptacles, those whose type most often held `object_type` first (ties: by name)."""
    counts = prior.get(object_type, Counter())
    receptacles = [(r["name"], r["type"]) for r in goal["receptacles"]]
    return [name for name, kind in sorted(receptacles, key=lambda x: (-counts[x[1]], _natural(x[0])))]


@dataclass
class Demo:
    goal_id: str
    first: str
    """The first observation (the room and the task)."""
    turns: list[dict]
    """Per step: the action (as completion and action) and the observation that answered it."""
    searched: int
    """Receptacles visited beyond the walkthrough's own (0: the learned order went straight there)."""


def _renamed(action: str, names: dict[str, str]) -> str:
    if not names:
        return action
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w])(" + alternatives + r")(?!\w)")
    return pattern.sub(lambda m: names[m.group(1)], action)


def searching_demo(goal: dict, env, prior: dict[str, Counter], max_steps: int) -> Demo | None:
    """The game's walkthrough with each fetch replaced by a search in the learned order, played through `env`;
    None if it does not win within `max_steps` (or the game has no walkthrough)."""
    walkthrough = goal.get("walkthrough") or []
    if not walkthrough:
        return None
    first, _ = env.reset(goal)
    turns: list[dict] = []
    names: dict[str, str] = {}
    taken: set[str] = set()
    searched = 0
    result = None

    def act(action: str) -> bool:
        nonlocal result
        if len(turns) >= max_steps or (result is not None and result.done):
            return False
        result = env.step(action)
        turns.append({"completion": action, "action": action, "observation": result.observation})
        return not result.observation.startswith("Nothing happens")

    i = 0
    while i < len(walkthrough):
        action = walkthrough[i]
        place = action[len("go to ") :] if action.startswith("go to ") else None
        j = i + 1 + (i + 1 < len(walkthrough) and walkthrough[i + 1] == f"open {place}")
        fetch = place is not None and j < len(walkthrough) and walkthrough[j].startswith("take ") \
            and walkthrough[j].endswith(f" from {place}")  # fmt: skip
        if not fetch:
            if not act(_renamed(action, names)):
                return None
            i += 1
            continue
        oracle = walkthrough[j][len("take ") : -len(f" from {place}")]
        kind = env.otype.get(oracle)
        found = None
        for receptacle in search_order(goal, kind, prior):
            if not act(f"go to {receptacle}"):
                return None
            if not env.visible(receptacle) and not act(f"open {receptacle}"):
                return None
            seen = [o for o in env.contents(receptacle) if env.otype.get(o) == kind and o not in taken]
            if seen:
                found = seen[0]
                break
            searched += 1
        if found is None or not act(f"take {found} from {env.at}"):
            return None
        taken.add(found)
        names[oracle] = found
        i = j + 1
    if result is None or not result.info.get("won", False):
        return None
    return Demo(str(goal.get("id", "")), first, turns, searched)


def demonstrations(envlib, task: str, data_dir) -> list[Demo]:
    """Searching demonstrations of every training game that has a walkthrough and whose search wins."""
    goals = envlib.load_goals(data_dir)
    prior = receptacle_prior(goals)
    make_env = envlib.make_env(task, data_dir)
    max_steps = envlib.MAX_STEPS.get(task, 50)
    demos = []
    for goal in goals:
        env = make_env()
        if not hasattr(env, "contents"):  # an environment this builder cannot look into
            return []
        demo = searching_demo(goal, env, prior, max_steps)
        if demo is not None:
            demos.append(demo)
    return demos


def sft_rows(envlib, task: str, data_dir) -> list[dict]:
    """The demonstrations as prompt-completion rows (one per step) in the evaluator's own prompt format."""
    goals = {str(g.get("id", "")): g for g in envlib.load_goals(data_dir)}
    prompter = envlib.prompter(task)
    rows = []
    for demo in demonstrations(envlib, task, data_dir):
        for t, turn in enumerate(demo.turns):
            prompt = prompter(goals[demo.goal_id], demo.first, demo.turns[:t])
            rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": turn["completion"]}],
                         "goal_id": demo.goal_id})  # fmt: skip
    return rows
