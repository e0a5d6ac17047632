"""An ALFWorld-style household text game: our own simulation of the ALFWorld (TextWorld side) domain.

A game (see `benchmarks.alfworld.games`) is a room: receptacles (some openable), objects on or in them, lamps,
and a goal of one of ALFWorld's six task types. Commands follow ALFWorld's grammar: `go to {recep}`,
`open/close {recep}`, `take {obj} from {recep}`, `move {obj} to {recep}` (not `put`), `heat {obj} with
{microwave}`, `cool {obj} with {fridge}`, `clean {obj} with {sinkbasin}`, `use {lamp}`, `examine {x}`,
`look`, `inventory`, `think: ...`. The agent holds one object at a time. Reward 1 and done when the goal
holds. Stdlib only; copied into workspaces.
"""

from __future__ import annotations

from typing import Any

from .base import StepResult, TextEnv
from .react import Messages, history_prompt

APPLIANCE = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
STATE_WORD = {"heat": "hot", "cool": "cool", "clean": "clean"}

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
        self.states: dict[str, set[str]] = {name: set() for name in self.where}
        self.opened: set[str] = set()
        self.at: str | None = None
        self.lit: str | None = None
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

    def _describe(self, recep: str) -> str:
        if not self.visible(recep):
            return f"The {recep} is closed."
        prep = "In it" if recep in self.openable else f"On the {recep}"
        return f"{prep}, you see {_listing(self.contents(recep))}."

    def won(self) -> bool:
        goal = self.game["goal"]
        if self.game["task_type"] == "look_at_obj_in_light":
            held = self.held()
            return (
                held is not None
                and self.otype[held] == goal["object"]
                and self.lit is not None
                and self.lamps[self.lit] == self.at
            )
        placed = [
            o for o, loc in self.where.items()
            if loc in self.rtype and self.rtype[loc] == goal["target"] and self.otype[o] == goal["object"]
            and (goal["state"] is None or STATE_WORD[goal["state"]] in self.states[o])
        ]  # fmt: skip
        return len(placed) >= goal["count"]

    # -- TextEnv -------------------------------------------------------------------------------------
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
            if verb == "open":
                self.opened.add(at)
                return f"You open the {at}. The {at} is open. In it, you see {_listing(self.contents(at))}."
            self.opened.discard(at)
            return f"You close the {at}."
        if verb == "take" and " from " in rest:
            obj, recep = rest.split(" from ", 1)
            if recep == at and held is None and self.where.get(obj) == recep and self.visible(recep):
                self.where[obj] = "inventory"
                return f"You pick up the {obj} from the {recep}."
        if verb == "move" and " to " in rest:
            obj, recep = rest.split(" to ", 1)
            if obj == held and recep == at and self.visible(recep):
                self.where[obj] = recep
                return f"You move the {obj} to the {recep}."
        if verb in APPLIANCE and " with " in rest:
            obj, tool = rest.split(" with ", 1)
            if obj == held and tool == at and self.rtype.get(tool, "").lower() == APPLIANCE[verb]:
                self.states[obj].add(STATE_WORD[verb])
                return f"You {verb} the {obj} using the {tool}."
        if verb == "use" and rest in self.lamps and self.lamps[rest] == at:
            self.lit = rest
            return f"You turn on the {rest}."
        if verb == "examine":
            if rest in self.rtype and rest == at:
                return self._describe(rest)
            if rest in self.where and (rest == held or self.where[rest] == at):
                states = " and ".join(sorted(self.states[rest]))
                return f"This is a {states + ' ' if states else ''}{rest}."
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
                if self.visible(at):
                    actions.append(f"move {held} to {at}")
                for verb, kind in APPLIANCE.items():
                    if self.rtype[at].lower() == kind:
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
