"""ALFWorld-style games generated offline from the `alfworld==0.4.2` wheel's room layouts and constants.

For a seed: a FloorPlan (its receptacles from `gen/layouts/FloorPlan*-openable.json`, object types from
`*-objects.json`), a task type (seed mod 6: all six ALFWorld types), a goal object and target receptacle
allowed by `gen/constants.py` (VAL_RECEPTACLE_OBJECTS, VAL_ACTION_OBJECTS, OPENABLE_CLASS_LIST), objects
placed at random in compatible receptacles (never the goal already true), and the expert walkthrough,
computed once here by a scripted planner and stored in the game. Not the ALFWorld game files (they are not
obtainable offline) and not its Fast-Downward planner. Every stored walkthrough is checked to be a valid plan
reaching its goal under the wheel's own PDDL domain (`alfworld/data/alfred.pddl`, see `pddl.py`). The games are
played in `benchmarks/envs/household.py`, which follows that domain's rules and goal formulas (its own copy of
the constants it needs, CAN_CONTAIN and ABLE, is tested equal to the wheel's).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import random
import runpy
from functools import lru_cache
from pathlib import Path
from typing import Any

from a2rl_bench.benchmarks.envs.household import APPLIANCE, STATE_WORD

PACKAGE, VERSION = "alfworld", "0.4.2"
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
TASK_STATE = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "heat",
              "pick_cool_then_place_in_recep": "cool"}  # fmt: skip
LAMPS = ("DeskLamp", "FloorLamp")
LAMP_HOLDERS = ("SideTable", "Desk", "Dresser", "Shelf", "DiningTable", "CoffeeTable", "TVStand")
MAX_OBJECT_TYPES = 8
"""Distractor object types per room (besides the goal's): keeps observations short, as planned ALFWorld games are."""


class ALFWorldDataError(RuntimeError):
    """The alfworld wheel (layouts, constants) is missing."""


def wheel_dir() -> Path:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise ALFWorldDataError(
            f"ALFWorld-style games are generated from the {PACKAGE} wheel's layouts; "
            f"run: pip install --no-deps {PACKAGE}=={VERSION}"
        ) from e
    return Path(str(dist.locate_file("alfworld")))


@lru_cache(maxsize=1)
def constants() -> dict[str, Any]:
    """alfworld/gen/constants.py, executed on its own (it imports only the standard library)."""
    return runpy.run_path(str(wheel_dir() / "gen" / "constants.py"))


def layout_names() -> list[str]:
    files = (wheel_dir() / "gen" / "layouts").glob("FloorPlan*-openable.json")
    return sorted((f.name.split("-")[0] for f in files), key=lambda n: int(n[len("FloorPlan") :]))


def room(layout: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(receptacles with ALFWorld names, object types present) of a FloorPlan."""
    c = constants()
    base = wheel_dir() / "gen" / "layouts"
    ids = sorted(json.loads((base / f"{layout}-openable.json").read_text()))
    kinds = [i.split("|")[-1] if i.count("|") > 3 else i.split("|")[0] for i in ids]
    counts: dict[str, int] = {}
    receptacles = []
    for kind in sorted(k for k in kinds if k in c["VAL_RECEPTACLE_OBJECTS"] and k not in c["MOVABLE_RECEPTACLES_SET"]):
        counts[kind] = counts.get(kind, 0) + 1
        receptacles.append(
            {"name": f"{kind.lower()} {counts[kind]}", "type": kind, "openable": kind in c["OPENABLE_CLASS_LIST"]}
        )
    objects = json.loads((base / f"{layout}-objects.json").read_text())
    return receptacles, sorted(set(objects))


def _pickupable(types: list[str]) -> list[str]:
    c = constants()
    placeable = set().union(*c["VAL_RECEPTACLE_OBJECTS"].values())
    return [t for t in types if t in placeable and "Sliced" not in t and t not in c["VAL_RECEPTACLE_OBJECTS"]]


def _homes(obj: str, receptacles: list[dict[str, Any]]) -> list[str]:
    accepts = constants()["VAL_RECEPTACLE_OBJECTS"]
    return [r["name"] for r in receptacles if obj in accepts[r["type"]]]


def _candidates(task_type: str, receptacles: list[dict], types: list[str]) -> list[tuple[str, str]]:
    """(object type, target receptacle type) pairs feasible for a task type in a room."""
    c = constants()
    kinds = {r["type"] for r in receptacles}
    objs = _pickupable(types)
    if task_type == "look_at_obj_in_light":
        holders = kinds & set(LAMP_HOLDERS)
        return [(o, "") for o in objs if _homes(o, receptacles)] if holders else []
    state = TASK_STATE.get(task_type)
    if state:
        needed = {"heat": "Microwave", "cool": "Fridge", "clean": "SinkBasin"}[state]
        action_set = c["VAL_ACTION_OBJECTS"][{"heat": "Heatable", "cool": "Coolable", "clean": "Cleanable"}[state]]
        if needed not in kinds:
            return []
        objs = [o for o in objs if o in action_set]
    pairs = []
    for o in objs:
        homes = _homes(o, receptacles)
        for target in sorted(kinds):
            # The object must start somewhere else, and a state task never targets its own appliance.
            elsewhere = any(not h.startswith(target.lower() + " ") for h in homes)
            appliance = state and target in ("SinkBasin", "Microwave", "Fridge")
            if o in c["VAL_RECEPTACLE_OBJECTS"][target] and elsewhere and not appliance:
                pairs.append((o, target))
    return pairs


def generate_game(seed: int, layouts: list[str]) -> dict[str, Any]:
    """One solvable game for a seed, on the first layout (in seeded order) that allows its task type."""
    rng = random.Random(seed)
    task_type = TASK_TYPES[seed % len(TASK_TYPES)]
    order = list(layouts)
    rng.shuffle(order)
    for layout in order:
        receptacles, types = room(layout)
        pairs = _candidates(task_type, receptacles, types)
        if pairs:
            obj, target = rng.choice(pairs)
            return _populate(seed, rng, layout, task_type, obj, target, receptacles, types)
    raise ALFWorldDataError(f"no layout among {len(layouts)} allows {task_type}")


def _populate(seed, rng, layout, task_type, obj, target, receptacles, types) -> dict[str, Any]:
    others = [t for t in _pickupable(types) if t != obj and _homes(t, receptacles)]
    chosen = [obj] + rng.sample(others, min(MAX_OBJECT_TYPES, len(others)))
    objects = []
    for kind in chosen:
        homes = _homes(kind, receptacles)
        if kind == obj and target:  # the goal must not hold at the start
            homes = [h for h in homes if not h.startswith(target.lower() + " ")]
        low = 2 if kind == obj and task_type == "pick_two_obj_and_place" else 1
        for n in range(1, rng.randint(low, 3 if kind == obj else 2) + 1):
            objects.append({"name": f"{kind.lower()} {n}", "type": kind, "location": rng.choice(homes)})
    lamps = []
    if task_type == "look_at_obj_in_light":
        lamp_kind = rng.choice([k for k in LAMPS if k in types] or ["DeskLamp"])
        holders = [r["name"] for r in receptacles if r["type"] in LAMP_HOLDERS]
        lamps.append({"name": f"{lamp_kind.lower()} 1", "type": lamp_kind, "location": rng.choice(holders)})
    state = TASK_STATE.get(task_type)
    goal = {"object": obj, "target": target, "state": state, "count": 2 if task_type == "pick_two_obj_and_place" else 1}
    game = {
        "id": f"alfworld-{seed:06d}",
        "seed": seed,
        "layout": layout,
        "task_type": task_type,
        "goal_text": goal_text(task_type, obj, target, lamps),
        "goal": goal,
        "receptacles": receptacles,
        "objects": objects,
        "lamps": lamps,
    }
    game["walkthrough"] = plan(game)
    return game


def goal_text(task_type: str, obj: str, target: str, lamps: list[dict]) -> str:
    o, r = obj.lower(), target.lower()
    if task_type == "look_at_obj_in_light":
        return f"look at {o} under the {lamps[0]['type'].lower()}."
    if task_type == "pick_two_obj_and_place":
        return f"put two {o} in {r}."
    state = TASK_STATE.get(task_type)
    return f"put a {STATE_WORD[state]} {o} in {r}." if state else f"put a {o} in {r}."


def plan(game: dict[str, Any]) -> list[str]:
    """The expert walkthrough: fetch each goal object, apply the state change, bring it to the target."""
    goal, openable = game["goal"], {r["name"] for r in game["receptacles"] if r["openable"]}
    opened: set[str] = set()
    steps: list[str] = []

    def go(recep: str) -> None:
        if (
            not any(s.startswith("go to ") for s in steps)
            or [s for s in steps if s.startswith("go to ")][-1] != f"go to {recep}"
        ):
            steps.append(f"go to {recep}")

    def visit(recep: str) -> None:
        go(recep)
        if recep in openable and recep not in opened:
            steps.append(f"open {recep}")
            opened.add(recep)

    wanted = sorted((o for o in game["objects"] if o["type"] == goal["object"]), key=lambda o: o["name"])
    if game["task_type"] == "look_at_obj_in_light":
        first, lamp = wanted[0], game["lamps"][0]
        visit(first["location"])
        steps.append(f"take {first['name']} from {first['location']}")
        go(lamp["location"])
        steps.append(f"use {lamp['name']}")
        return steps
    target = next(r["name"] for r in game["receptacles"] if r["type"] == goal["target"])
    for item in wanted[: goal["count"]]:
        visit(item["location"])
        steps.append(f"take {item['name']} from {item['location']}")
        if goal["state"]:
            tool = next(r["name"] for r in game["receptacles"] if r["type"].lower() == APPLIANCE[goal["state"]])
            go(tool)
            steps.append(f"{goal['state']} {item['name']} with {tool}")
        visit(target)
        steps.append(f"move {item['name']} to {target}")
    return steps


def game_hash(game: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(game, sort_keys=True).encode()).hexdigest()[:16]
