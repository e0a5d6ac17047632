"""An ALFWorld-style household text game: our own simulation of the ALFWorld (TextWorld side) domain.

A game (see `a2rl_bench.benchmarks.alfworld.games`) is a room: receptacles (some openable), objects on or in them,
lamps, and a goal of one of ALFWorld's six task types. Commands follow ALFWorld's grammar: `go to {recep}`,
`open/close {recep}`, `take {obj} from {recep}`, `move {obj} to {recep}` (not `put`), `heat {obj} with
{microwave}`, `cool {obj} with {fridge}`, `clean {obj} with {sinkbasin}`, `use {lamp}`, `examine {x}`,
`look`, `inventory`, `think: ...`. The agent holds one object at a time. Reward 1 and done when the goal
holds. Stdlib only; copied into workspaces.

The rules are those of ALFWorld's PDDL domain (the alfworld wheel's `data/alfred.pddl`) and its goals are
the formulas of `gen/goal_library.py`; a command whose action's precondition does not hold answers "Nothing
happens." and changes nothing. In particular: `open` needs a closed receptacle and `close` an open one; `move`
needs a receptacle whose type can hold the object (CAN_CONTAIN, ALFWorld's canContain from its constants'
VAL_RECEPTACLE_OBJECTS); heat/cool/clean need a heatable/coolable/cleanable object (ABLE, its
VAL_ACTION_OBJECTS); `examine {obj}` needs the object held or visible where the agent is; heating makes an
object no longer cool and cooling no longer hot; an object that starts in a fridge is cool; "put two" wants
both objects in one receptacle; a lamp counts as used once toggled (ALFWorld's isToggled), even if toggled off
again. `benchmarks/alfworld/pddl.py` maps games and commands onto the domain; tests/test_alfworld_pddl.py
checks, over random command sequences, that this simulation accepts exactly the commands the PDDL validator
accepts and wins exactly when the goal formula holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import StepResult, TextEnv
from .react import Messages, history_prompt

APPLIANCE = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
STATE_WORD = {"heat": "hot", "cool": "cool", "clean": "clean"}
UNDOES = {"heat": {"cool"}, "cool": {"hot"}, "clean": set()}
"""HeatObject deletes isCool and CoolObject isHot."""
SIMULATION_VERSION = "2"
"""Part of the alfworld task's evaluator id: bump when the rules change. 1: more lenient than ALFWorld's PDDL
(any move, heat/cool/clean, open/close, examine; heat did not undo cool; put-two over several receptacles);
2: ALFWorld's PDDL domain and goals."""

_TABLE = (
    "AlarmClock Apple BaseballBat BasketBall Book Bowl Box Bread ButterKnife Candle CD CellPhone Cloth CreditCard "
    "Cup DishSponge Egg Fork Glassbottle HandTowel Kettle KeyChain Knife Ladle Laptop Lettuce Mug Newspaper Pan "
    "PaperTowel Pen Pencil PepperShaker Plate Pot Potato RemoteControl SaltShaker SoapBar SoapBottle Spatula "
    "Spoon SprayBottle Statue TennisRacket TissueBox ToiletPaper ToiletPaperRoll Tomato Vase Watch WateringCan "
    "WineBottle"
)
CAN_CONTAIN: dict[str, frozenset[str]] = {
    kind: frozenset(types.split())
    for kind, types in {
        "ArmChair": "BasketBall Book Box CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl",
        "BathtubBasin": "Cloth DishSponge HandTowel SoapBar",
        "Bed": "BaseballBat BasketBall Book CellPhone Laptop Newspaper Pillow TennisRacket",
        "Cabinet": (
            "Book Bowl Box Candle CD Cloth Cup DishSponge Glassbottle HandTowel Kettle Ladle Mug Newspaper Pan "
            "PepperShaker Plate Plunger Pot SaltShaker SoapBar SoapBottle SprayBottle TissueBox ToiletPaper "
            "ToiletPaperRoll Vase WateringCan WineBottle"
        ),
        "Cart": (
            "Candle Cloth DishSponge HandTowel Mug PaperTowel Plunger SoapBar SoapBottle SprayBottle Statue "
            "TissueBox ToiletPaper ToiletPaperRoll Vase"
        ),
        "CoffeeMachine": "Mug",
        "CoffeeTable": _TABLE,
        "CounterTop": _TABLE,
        "Desk": (
            "AlarmClock BasketBall Book Bowl Box Candle CD CellPhone Cloth CreditCard Cup Glassbottle KeyChain "
            "Laptop Mug Newspaper Pen Pencil Plate RemoteControl SoapBottle SprayBottle Statue TennisRacket "
            "TissueBox ToiletPaper ToiletPaperRoll Vase Watch WateringCan WineBottle"
        ),
        "DiningTable": _TABLE,
        "Drawer": (
            "Book ButterKnife Candle CD CellPhone Cloth CreditCard DishSponge Fork HandTowel KeyChain Knife Ladle "
            "Newspaper Pen Pencil PepperShaker RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon "
            "SprayBottle TissueBox ToiletPaper ToiletPaperRoll Watch WateringCan"
        ),
        "Dresser": (
            "AlarmClock BasketBall Book Bowl Box Candle CD CellPhone Cloth CreditCard Cup Glassbottle KeyChain "
            "Laptop Mug Newspaper Pen Pencil Plate RemoteControl SprayBottle Statue TennisRacket TissueBox "
            "ToiletPaper ToiletPaperRoll Vase Watch WateringCan WineBottle"
        ),
        "Fridge": "Apple Bowl Bread Cup Egg Glassbottle Lettuce Mug Pan Plate Pot Potato Tomato WineBottle",
        "GarbageCan": (
            "Apple Bread CD Cloth DishSponge Egg HandTowel Lettuce Newspaper PaperTowel Pen Pencil Potato SoapBar "
            "SoapBottle SprayBottle TissueBox ToiletPaper ToiletPaperRoll Tomato WineBottle"
        ),
        "HandTowelHolder": "HandTowel",
        "LaundryHamper": "Cloth",
        "Microwave": "Apple Bowl Bread Cup Egg Glassbottle Mug Plate Potato Tomato",
        "Ottoman": "BasketBall Book Box CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl",
        "Safe": "CD CellPhone CreditCard KeyChain Statue Vase Watch",
        "Shelf": (
            "AlarmClock Book Bowl Box Candle CD CellPhone Cloth CreditCard Cup DishSponge Glassbottle HandTowel "
            "Kettle KeyChain Mug Newspaper PaperTowel Pen Pencil PepperShaker Plate Pot RemoteControl SaltShaker "
            "SoapBar SoapBottle SprayBottle Statue TissueBox ToiletPaper ToiletPaperRoll Vase Watch WateringCan "
            "WineBottle"
        ),
        "SideTable": _TABLE,
        "SinkBasin": (
            "Apple Bowl ButterKnife Cloth Cup DishSponge Egg Fork Glassbottle HandTowel Kettle Knife Ladle "
            "Lettuce Mug Pan Plate Pot Potato SoapBar Spatula Spoon Tomato"
        ),
        "Sofa": "BasketBall Book Box CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl",
        "StoveBurner": "Kettle Pan Pot",
        "TVStand": "TissueBox",
        "Toilet": (
            "Candle Cloth DishSponge HandTowel Newspaper PaperTowel SoapBar SoapBottle SprayBottle TissueBox "
            "ToiletPaper ToiletPaperRoll"
        ),
        "ToiletPaperHanger": "ToiletPaper ToiletPaperRoll",
        "TowelHolder": "Towel",
    }.items()
}
"""Receptacle type -> the object types it can hold: ALFWorld's (canContain rtype otype), from the wheel's
constants (VAL_RECEPTACLE_OBJECTS over its non-movable receptacle types and its object types; tested equal)."""
ABLE: dict[str, frozenset[str]] = {
    verb: frozenset(types.split())
    for verb, types in {
        "heat": "Apple AppleSliced Bread BreadSliced Cup Egg Mug Plate Potato PotatoSliced Tomato TomatoSliced",
        "cool": (
            "Apple AppleSliced Bowl Bread BreadSliced Cup Egg Lettuce LettuceSliced Mug Pan Plate Pot Potato "
            "PotatoSliced Tomato TomatoSliced WineBottle"
        ),
        "clean": (
            "Apple AppleSliced Bowl ButterKnife Cloth Cup DishSponge Egg Fork Kettle Knife Ladle Lettuce "
            "LettuceSliced Mug Pan Plate Pot Potato PotatoSliced SoapBar Spatula Spoon Tomato TomatoSliced"
        ),
    }.items()
}
"""Object types that can be heated / cooled / cleaned: the wheel's VAL_ACTION_OBJECTS Heatable, Coolable,
Cleanable (ALFWorld's heatable/coolable/cleanable; tested equal)."""

SYSTEM_PROMPT = (
    "You are in a household. Reach the goal with text commands, one per turn, and reply with the command only.\n"
    "Commands: go to {recep}; open {recep}; close {recep}; take {obj} from {recep}; move {obj} to {recep}; "
    "heat {obj} with {microwave}; cool {obj} with {fridge}; clean {obj} with {sinkbasin}; use {lamp}; "
    "examine {obj or recep}; look; inventory; think: {thought}.\n"
    "To place an object use `move {obj} to {recep}` (there is no `put` command). You can hold one object; "
    "open closed receptacles before taking from them or moving into them."
)


def _listing(names: list[str]) -> str:
    if not names:
        return "nothing"
    items = [f"a {n}" for n in names]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f", and {items[-1]}"


class HouseholdEnv(TextEnv):
    """One game at a time; `reset(game)` copies the game's initial state."""

    def __init__(self) -> None:
        self.game: dict[str, Any] = {}

    def reset(self, goal: dict[str, Any], seed: int = 0) -> tuple[str, dict[str, Any]]:
        self.game = goal
        self.openable = {r["name"] for r in goal["receptacles"] if r["openable"]}
        self.rtype = {r["name"]: r["type"] for r in goal["receptacles"]}
        self.where = {o["name"]: o["location"] for o in goal["objects"]}
        self.otype = {o["name"]: o["type"] for o in goal["objects"]}
        self.lamps = {lamp["name"]: lamp["location"] for lamp in goal.get("lamps", [])}
        self.ltype = {lamp["name"]: lamp["type"] for lamp in goal.get("lamps", [])}
        # ALFWorld's problems state (isCool o) for every object that starts in a fridge.
        self.states: dict[str, set[str]] = {
            name: {"cool"} if self.rtype.get(loc) == "Fridge" else set() for name, loc in self.where.items()
        }
        self.opened: set[str] = set()
        self.at: str | None = None
        self.toggled: set[str] = set()  # lamps used at least once (isToggled)
        self.on: set[str] = set()  # lamps on now (isOn)
        self.done = False
        names = [r["name"] for r in goal["receptacles"]]
        text = (
            "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
            f"you see {_listing(names)}.\n\nYour task is to: {goal['goal_text']}"
        )
        return text, {"task_type": goal["task_type"]}

    # -- state queries -----------------------------------------------------------------------------
    def held(self) -> str | None:
        return next((o for o, loc in self.where.items() if loc == "inventory"), None)

    def contents(self, recep: str) -> list[str]:
        objs = [o for o, loc in self.where.items() if loc == recep]
        return sorted(objs + [lamp for lamp, loc in self.lamps.items() if loc == recep], key=_natural)

    def visible(self, recep: str) -> bool:
        return recep not in self.openable or recep in self.opened

    def can_hold(self, recep: str, obj: str) -> bool:
        return self.otype[obj] in CAN_CONTAIN.get(self.rtype[recep], ())

    def able(self, verb: str, obj: str) -> bool:
        return self.otype[obj] in ABLE[verb]

    def _describe(self, recep: str) -> str:
        if not self.visible(recep):
            return f"The {recep} is closed."
        prep = "In it" if recep in self.openable else f"On the {recep}"
        return f"{prep}, you see {_listing(self.contents(recep))}."

    def won(self) -> bool:
        """ALFWorld's goal formula (goal_library) of the game's task type."""
        goal = self.game["goal"]
        if self.game["task_type"] == "look_at_obj_in_light":
            held, lamp_type = self.held(), self.game["lamps"][0]["type"]
            return (
                held is not None
                and self.otype[held] == goal["object"]
                and any(self.ltype[lamp] == lamp_type and self.lamps[lamp] == self.at for lamp in self.toggled)
            )
        state = goal["state"]
        per_receptacle: dict[str, int] = {}
        for o, loc in self.where.items():
            if (
                self.rtype.get(loc) == goal["target"] and self.otype[o] == goal["object"]
                and (state is None or (STATE_WORD[state] in self.states[o] and self.able(state, o)))
            ):  # fmt: skip
                per_receptacle[loc] = per_receptacle.get(loc, 0) + 1
        return any(n >= goal["count"] for n in per_receptacle.values())

    # -- TextEnv -------------------------------------------------------------------------------------
    def state_key(self) -> tuple:
        """Where the agent is and everything that can change: places, states, open receptacles, lamps."""
        return (
            self.game.get("id", self.game.get("seed")), self.at, tuple(sorted(self.where.items())),
            tuple(sorted((o, tuple(sorted(s))) for o, s in self.states.items() if s)),
            tuple(sorted(self.opened)), tuple(sorted(self.toggled)), tuple(sorted(self.on)),
        )  # fmt: skip

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("the episode is over; call reset()")
        observation = self._apply(" ".join((action or "").strip().lower().rstrip(".").split()))
        if self.won():
            self.done = True
            return StepResult(observation, 1.0, True, {"won": True})
        return StepResult(observation, 0.0, False, {"won": False})

    def _apply(self, cmd: str) -> str:
        held, at = self.held(), self.at
        if cmd.startswith("think:"):
            return "OK."
        if cmd == "look":
            where = f"facing the {at}" if at else "in the middle of a room"
            return f"You are {where}. Next to it, you see nothing."
        if cmd == "inventory":
            return f"You are carrying: a {held}." if held else "You are not carrying anything."
        if cmd == "help":
            return SYSTEM_PROMPT
        verb, _, rest = cmd.partition(" ")
        if verb == "go" and rest.startswith("to ") and rest[3:] in self.rtype:
            self.at = rest[3:]
            return f"You arrive at {self.at}. {self._describe(self.at)}"
        if verb in ("open", "close") and rest == at and at in self.openable:
            if verb == "open" and at not in self.opened:
                self.opened.add(at)
                return f"You open the {at}. The {at} is open. In it, you see {_listing(self.contents(at))}."
            if verb == "close" and at in self.opened:
                self.opened.discard(at)
                return f"You close the {at}."
        if verb == "take" and " from " in rest:
            obj, recep = rest.split(" from ", 1)
            if recep == at and held is None and self.where.get(obj) == recep and self.visible(recep):
                self.where[obj] = "inventory"
                return f"You pick up the {obj} from the {recep}."
        if verb == "move" and " to " in rest:
            obj, recep = rest.split(" to ", 1)
            if obj == held and recep == at and self.visible(recep) and self.can_hold(recep, obj):
                self.where[obj] = recep
                return f"You move the {obj} to the {recep}."
        if verb in APPLIANCE and " with " in rest:
            obj, tool = rest.split(" with ", 1)
            appliance = self.rtype.get(tool, "").lower() == APPLIANCE[verb]
            if obj == held and tool == at and appliance and self.able(verb, obj):
                self.states[obj] = self.states[obj] - UNDOES[verb] | {STATE_WORD[verb]}
                return f"You {verb} the {obj} using the {tool}."
        if verb == "use" and rest in self.lamps and self.lamps[rest] == at:
            self.toggled.add(rest)
            self.on ^= {rest}
            return f"You turn {'on' if rest in self.on else 'off'} the {rest}."
        if verb == "examine":
            if rest in self.rtype and rest == at:
                return self._describe(rest)
            if rest in self.where and (rest == held or (self.where[rest] == at and self.visible(at))):
                states = " and ".join(sorted(self.states[rest]))
                return f"This is a {states + ' ' if states else ''}{rest}."
            if rest in self.lamps and self.lamps[rest] == at and self.visible(at):
                return f"This is a {rest}. It is {'on' if rest in self.on else 'off'}."
        return "Nothing happens."

    def admissible_actions(self) -> list[str]:
        if self.done:
            return []
        held, at = self.held(), self.at
        actions = [f"go to {r}" for r in sorted(self.rtype, key=_natural) if r != at]
        actions += ["inventory", "look"]
        if at is not None:
            actions.append(f"examine {at}")
            if at in self.openable:
                actions.append(f"close {at}" if at in self.opened else f"open {at}")
            if held is None and self.visible(at):
                actions += [f"take {o} from {at}" for o in self.contents(at) if o in self.where]
            if held is not None:
                if self.visible(at) and self.can_hold(at, held):
                    actions.append(f"move {held} to {at}")
                for verb, kind in APPLIANCE.items():
                    if self.rtype[at].lower() == kind and self.able(verb, held):
                        actions.append(f"{verb} {held} with {at}")
            actions += [f"use {lamp}" for lamp, loc in self.lamps.items() if loc == at]
        if held is not None:
            actions.append(f"examine {held}")
        return actions


def _natural(name: str) -> tuple[str, int]:
    base, _, num = name.rpartition(" ")
    return (base, int(num)) if num.isdigit() else (name, 0)


def household_prompt(goal: dict[str, Any], observation: str, turns: list[dict[str, Any]], window: int = 6) -> Messages:
    return history_prompt(SYSTEM_PROMPT, observation, turns, window, action_prefix="")


def make_env(data_dir: Path) -> Callable[[], TextEnv]:
    """envlib's factory for ALFWorld: the games are generated from each goal, no file needed."""
    return HouseholdEnv
