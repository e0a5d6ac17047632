"""The offline ALFWorld games against the alfworld wheel's own PDDL domain (`alfworld/data/alfred.pddl`), grammar
(`alfred.twl2`) and goals (`gen/goal_library.py`): the domain reader, the VAL-style validator, and every stored
walkthrough as a plan that reaches its goal."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from a2rl_bench.benchmarks import get_task
from a2rl_bench.benchmarks.alfworld.games import constants
from a2rl_bench.benchmarks.alfworld.pddl import (
    AGENT,
    START,
    PDDLError,
    Problem,
    Step,
    check_walkthrough,
    command_step,
    game_plan,
    game_problem,
    ground,
    holds,
    location,
    parse,
    parse_first,
    pddl_name,
    read_domain,
    show,
    type_name,
    type_objects,
    validate,
)
from a2rl_bench.benchmarks.base import TaskData
from a2rl_bench.benchmarks.envs.household import ABLE, CAN_CONTAIN, HouseholdEnv


@pytest.fixture(scope="module")
def data() -> TaskData:
    return get_task("alfworld").load("offline")


def _game(data: TaskData, task_type: str, opens: bool = False) -> dict:
    return next(
        g for g in data.train if g["task_type"] == task_type and (not opens or g["walkthrough"][1].startswith("open "))
    )


def test_reads_the_wheels_domain() -> None:
    domain = read_domain()
    assert domain.name == "alfred" and domain.requirements == (":adl", ":action-costs", ":typing")
    # The file's actions, in its order and spelling; the receptacle-object ones are commented out there.
    assert list(domain.actions) == [
        "look", "inventory", "examineReceptacle", "examineObject", "GotoLocation", "OpenObject", "CloseObject",
        "PickupObject", "PutObject", "CleanObject", "HeatObject", "CoolObject", "ToggleObject", "SliceObject",
        "help",
    ]  # fmt: skip
    assert set(domain.types) == {"object", "agent", "location", "receptacle", "rtype", "otype"}
    assert len(domain.predicates) == 32 and domain.predicates["receptacleatlocation"] == (
        ("?r", "receptacle"),
        ("?l", "location"),
    )
    assert domain.action("putobject").parameters == (
        ("?a", "agent"), ("?l", "location"), ("?o", "object"), ("?r", "receptacle"), ("?ot", "otype"), ("?rt", "rtype"),
    )  # fmt: skip
    assert show(ground(domain.action("PickupObject").precondition)) == (
        "(and (pickupable ?o) (atlocation ?a ?l) (receptacleatlocation ?r ?l) (inreceptacle ?o ?r) "
        "(not (holdsany ?a)) (or (not (openable ?r)) (opened ?r)))"
    )
    assert show(ground(domain.action("ToggleObject").effect)) == (
        "(and (increase (total-cost) 5) (when (ison ?o) (not (ison ?o))) (when (not (ison ?o)) (ison ?o)) "
        "(istoggled ?o))"
    )
    # examineObject's `(exists (?l - location, ?r - receptacle) ...)`: the comma separates like a space.
    assert "(exists (?l - location ?r - receptacle)" in show(ground(domain.action("examineObject").precondition))


def test_sexpression_reader() -> None:
    assert parse("(a ; comment\n (b, c) d)") == [["a", ["b", "c"], "d"]]
    assert parse_first("(:goal (x ?y)) )") == [":goal", ["x", "?y"]]
    for bad in ("(a (b)", "a)"):
        with pytest.raises(PDDLError):
            parse(bad)


def test_commands_map_to_the_grammars_actions(data: TaskData) -> None:
    game = _game(data, "pick_heat_then_place_in_recep", opens=True)
    recep, obj = game["walkthrough"][0].removeprefix("go to "), game["walkthrough"][2].split()[1:3]
    obj_name, r, o = " ".join(obj), recep.replace(" ", "_"), "_".join(obj)
    kind = next(x["type"] for x in game["objects"] if x["name"] == obj_name).lower()
    commands = [
        f"go to {recep}", f"open {recep}", f"take {obj_name} from {recep}", "think: now heat it",
        f"heat {obj_name} with microwave 1", f"examine {obj_name}", f"examine {recep}", "look", "inventory",
        f"move {obj_name} to {recep}", f"close {recep}",
    ]  # fmt: skip
    steps = game_plan(game, commands)
    assert [(s.action, s.args) for s in steps] == [
        ("GotoLocation", ("agent1", "loc_start", f"loc_{r}", r)),
        ("OpenObject", ("agent1", f"loc_{r}", r)),
        ("PickupObject", ("agent1", f"loc_{r}", o, r)),
        ("HeatObject", ("agent1", "loc_microwave_1", "microwave_1", o)),
        ("examineObject", ("agent1", o)),
        ("examineReceptacle", ("agent1", r)),
        ("look", ("agent1", f"loc_{r}")),
        ("inventory", ("agent1",)),
        ("PutObject", ("agent1", f"loc_{r}", o, r, f"{kind}type", f"{r.split('_')[0]}type")),
        ("CloseObject", ("agent1", f"loc_{r}", r)),
    ]
    assert steps[0].command == f"go to {recep}"
    with pytest.raises(PDDLError, match="matches no command"):
        game_plan(game, [f"put {obj_name} in {recep}"])


def test_validator_rejects_taking_from_a_receptacle_the_agent_is_not_at(data: TaskData) -> None:
    game = _game(data, "pick_and_place_simple")
    go, take = game["walkthrough"][:2]
    assert go.startswith("go to ") and take.startswith("take ")
    recep = go.removeprefix("go to ").replace(" ", "_")
    result = validate(read_domain(), game_problem(game), game_plan(game, [take]))
    assert not result.ok and result.failed_step == 1
    assert result.failed_part == f"(atlocation agent1 loc_{recep})"
    assert result.error == (
        f"step 1 {game_plan(game, [take])[0]} (`{take}`): precondition (atlocation agent1 loc_{recep}) does not hold"
    )


def test_validator_rejects_taking_from_a_closed_receptacle(data: TaskData) -> None:
    game = _game(data, "pick_and_place_simple", opens=True)
    go, _open, take = game["walkthrough"][:3]
    recep = go.removeprefix("go to ").replace(" ", "_")
    result = validate(read_domain(), game_problem(game), game_plan(game, [go, take]))
    assert not result.ok and result.failed_step == 2 and f"`{take}`" in result.error
    assert result.failed_part == f"(or (not (openable {recep})) (opened {recep}))"
    opened = validate(read_domain(), game_problem(game), game_plan(game, [go, _open, take]))
    assert opened.failed_step is None and opened.goal_reached is False  # every step applies; the goal is further


def test_validator_reports_bad_arguments_an_unknown_action_and_an_unreached_goal(data: TaskData) -> None:
    game = _game(data, "pick_cool_then_place_in_recep")
    domain, problem = read_domain(), game_problem(game)
    assert (
        "takes 4 arguments (?a ?l ?o ?r), got 2" in validate(domain, problem, [Step("PickupObject", ("a", "b"))]).error
    )
    wrong = Step("GotoLocation", ("agent1", "loc_start", "loc_start", "loc_start"))
    assert validate(domain, problem, [wrong]).error.endswith(
        "argument ?r must be a receptacle; loc_start is a location"
    )
    assert "no action 'Fly'" in validate(domain, problem, [Step("Fly", ())]).error
    result = validate(domain, problem, game_plan(game, game["walkthrough"][:-1]))
    assert not result.ok and result.failed_step is None and result.goal_reached is False
    assert result.error.startswith("the goal does not hold after the plan: (and (exists (?r - receptacle)")
    assert "(iscool ?o)" in result.error


def test_conditional_effects_switch_a_lamp_on_and_off(data: TaskData) -> None:
    game = _game(data, "look_at_obj_in_light")
    use = game["walkthrough"][-1]
    lamp = use.removeprefix("use ").replace(" ", "_")
    result = validate(read_domain(), game_problem(game), game_plan(game, game["walkthrough"] + [use]))
    assert ("ison", lamp) in result.states[-2] and ("ison", lamp) not in result.states[-1]
    assert ("istoggled", lamp) in result.states[-1] and result.ok  # the goal wants the lamp toggled, not on
    assert result.cost == len(game["walkthrough"]) - 1 + 5 + 5


def test_every_stored_walkthrough_is_a_valid_plan_reaching_its_goal(data: TaskData) -> None:
    valid, failures = {}, []
    for split in ("train", "validation", "test"):
        games = getattr(data, split)
        for game in games:
            result = check_walkthrough(game)
            if not result.ok:
                failures.append(f"{split} {game['id']} {game['task_type']}: {result.error}")
            elif result.goal_first_reached != len(result.states) - 1:
                failures.append(f"{split} {game['id']}: goal already held after step {result.goal_first_reached}")
        valid[split] = len(games) - sum(f.startswith(split + " ") for f in failures)
    assert not failures, "\n".join(failures[:20])
    assert valid == {"train": 600, "validation": 60, "test": 134}


# -- our simulation against the domain ------------------------------------------------------------------------


def test_the_simulations_tables_are_the_wheels_constants() -> None:
    c = constants()
    _, contain = type_objects()
    ours = {("cancontain", type_name(r), type_name(o)) for r, kinds in CAN_CONTAIN.items() for o in kinds}
    assert ours == set(contain)
    wheel = {verb: set(c["VAL_ACTION_OBJECTS"][kind]) for verb, kind in
             (("heat", "Heatable"), ("cool", "Coolable"), ("clean", "Cleanable"))}  # fmt: skip
    assert ABLE == wheel


DYNAMIC = {"atlocation", "inreceptacle", "objectatlocation", "holds", "holdsany", "opened", "ishot", "iscool",
           "isclean", "ison", "istoggled"}  # fmt: skip
"""The domain's predicates that our games' actions change (`checked` aside, which nothing reads)."""


def simulation_atoms(env: HouseholdEnv) -> frozenset:
    """The simulation's state as the domain's atoms of DYNAMIC predicates."""
    atoms = {("atlocation", AGENT, location(env.at) if env.at else START)}
    for thing, where in [*env.where.items(), *env.lamps.items()]:
        name = pddl_name(thing)
        if where == "inventory":
            atoms |= {("holds", AGENT, name), ("holdsany", AGENT)}
        else:
            atoms |= {("inreceptacle", name, pddl_name(where)), ("objectatlocation", name, location(where))}
    word = {"hot": "ishot", "cool": "iscool", "clean": "isclean"}
    atoms |= {(word[s], pddl_name(o)) for o, states in env.states.items() for s in states}
    atoms |= {("opened", pddl_name(r)) for r in env.opened}
    atoms |= {("ison", pddl_name(x)) for x in env.on} | {("istoggled", pddl_name(x)) for x in env.toggled}
    return frozenset(atoms)


def random_command(game: dict, env: HouseholdEnv, rng: random.Random) -> str:
    """Mostly commands near the current state that the domain may or may not allow, some off the grammar."""
    receps = [r["name"] for r in game["receptacles"]]
    things = [o["name"] for o in game["objects"] + game.get("lamps", [])]
    here = env.at if env.at and rng.random() < 0.8 else rng.choice(receps)
    obj = env.held() if env.held() and rng.random() < 0.7 else rng.choice(things)
    local = env.contents(env.at) if env.at else []
    near = rng.choice(local) if local and rng.random() < 0.7 else rng.choice(things)
    if env.held() and rng.random() < 0.3:  # put the held object here, or treat it here
        return rng.choice([f"move {obj} to {here}", f"heat {obj} with {here}", f"cool {obj} with {here}"])
    if env.at in env.openable and rng.random() < 0.2:
        return rng.choice([f"open {env.at}", f"close {env.at}"])
    return rng.choice([
        f"go to {rng.choice(receps)}", f"open {here}", f"close {here}", f"take {near} from {here}",
        f"move {obj} to {here}", f"heat {obj} with {here}", f"cool {obj} with {here}", f"clean {obj} with {here}",
        f"use {near}", f"examine {near}", f"examine {obj}", f"examine {here}", "look", "inventory", "help",
        f"put {obj} in {here}", f"slice {near} with {obj}", "go to nowhere 1", f"take {near}", "jump",
    ])  # fmt: skip


def variants(game: dict) -> Iterator[tuple[list[str], bool]]:
    """Scripted detours from the walkthrough over the rules where the simulation used to be more lenient, and
    whether they end won: a cool task's object heated before it is placed, then repaired (a heat task's cooled);
    a pick-two task's second object put in another receptacle of the target type, then repaired; an object
    that starts in the fridge placed without cooling it (won: it is cool) or in the microwave without heating
    it (not won: it is not hot)."""
    walk, goal = list(game["walkthrough"]), game["goal"]
    names = {r["type"]: r["name"] for r in reversed(game["receptacles"])}  # the first of each type
    if goal["state"] in ("heat", "cool"):
        k = next(i for i, c in enumerate(walk) if c.startswith(goal["state"] + " "))
        obj, tool = walk[k].split(" ", 1)[1].split(" with ")
        other = {"heat": "cool", "cool": "heat"}[goal["state"]]
        opposite = names.get({"heat": "Fridge", "cool": "Microwave"}[goal["state"]])
        if opposite:
            target = walk[-1].split(" to ")[1]
            yield walk[: k + 1] + [f"go to {opposite}", f"{other} {obj} with {opposite}"] + walk[k + 1 :] + [
                f"take {obj} from {target}", f"go to {tool}", walk[k], f"go to {target}", walk[-1]
            ], True  # fmt: skip
        if walk[k - 1] == f"take {obj} from {tool}":  # it started in the fridge or in the microwave
            yield walk[:k] + walk[k + 1 :], goal["state"] == "cool"
    spare = [r for r in game["receptacles"] if r["type"] == goal["target"]][1:]
    if goal["count"] == 2 and spare:
        obj, target = walk[-1].removeprefix("move ").split(" to ")
        other = spare[0]["name"]
        yield walk[:-2] + [f"go to {other}"] + [f"open {other}"] * spare[0]["openable"] + [
            f"move {obj} to {other}", f"take {obj} from {other}", f"go to {target}", walk[-1]
        ], True  # fmt: skip


def crosscheck(game: dict, commands: Callable[[HouseholdEnv, int], str | None], counts: Counter) -> list[str]:
    """Play `commands(env, steps of the walkthrough done)` (until it says None or the game is won) in our
    simulation and, in lockstep, in the domain; the mismatches."""
    domain, problem = read_domain(), game_problem(game)
    env, state, mismatches, plan_at = HouseholdEnv(), problem.init, [], 0
    env.reset(game)
    walkthrough, goal_spec = game["walkthrough"], game["goal"]

    def check(where: str) -> None:
        goal = holds(domain, problem, problem.goal, state)
        if env.won() != goal:
            mismatches.append(f"{game['id']} {where}: won {env.won()}, PDDL goal {goal}")
        if simulation_atoms(env) != frozenset(a for a in state if a[0] in DYNAMIC):
            mismatches.append(f"{game['id']} {where}: states differ")
        placed = [
            (loc, env.states[o]) for o, loc in env.where.items()
            if env.otype[o] == goal_spec["object"] and env.rtype.get(loc) == goal_spec["target"]
        ]  # fmt: skip
        # States where the simulation used to be more lenient than the goal formula.
        if goal_spec["count"] == 2 and len(placed) >= 2 and len({loc for loc, _ in placed}) == len(placed):
            counts["checked states: pick two spread over receptacles"] += 1
        if goal_spec["state"] in ("heat", "cool") and any(
            {"heat": "cool", "cool": "hot"}[goal_spec["state"]] in states for _, states in placed
        ):
            counts["checked states: heat/cool task, object placed after the opposite"] += 1

    check("start")
    while not env.done and (command := commands(env, plan_at)) is not None:
        at = next(a[2] for a in state if a[0] == "atlocation")
        try:
            step = command_step(game, command, at)
        except PDDLError:  # no action of the grammar
            step, result = None, None
        else:
            result = validate(domain, Problem(problem.objects, state, None), [step])
        pddl_ok = result is not None and result.failed_step is None
        sim_ok = env.step(command).observation != "Nothing happens."
        counts["steps"] += 1
        if step is None:
            counts["refused: off the grammar"] += 1
        elif not pddl_ok:  # by action and failed precondition part, arguments left out
            counts[f"refused: {step.action} {re.sub(r' [^()]+?(?=[ )])', '', str(result.failed_part))}"] += 1
        if pddl_ok:
            state = result.states[-1]
            plan_at += command == walkthrough[plan_at % len(walkthrough)]
        if pddl_ok != sim_ok:
            mismatches.append(f"{game['id']} step {counts['steps']} `{command}`: simulation {sim_ok}, PDDL {pddl_ok}")
        check(f"after `{command}`")
    counts["sequences"] += 1
    counts["won"] += env.done
    return mismatches


def random_commands(game: dict, rng: random.Random, steps: int, expert: float):
    """`steps` commands: the expert's next step with probability `expert`, else an admissible command or a
    `random_command`."""
    left = steps

    def choose(env: HouseholdEnv, plan_at: int) -> str | None:
        nonlocal left
        left, draw = left - 1, rng.random()
        if left < 0:
            return None
        if draw < expert:  # reaches goals, or fails after a detour
            return game["walkthrough"][plan_at % len(game["walkthrough"])]
        if draw < expert + (1 - expert) / 2:
            return rng.choice(env.admissible_actions())
        return random_command(game, env, rng)

    return choose


def scripted(commands: list[str]):
    it = iter(commands)
    return lambda env, plan_at: next(it, None)


def test_the_simulation_accepts_exactly_what_the_domain_allows_and_wins_exactly_at_its_goal(data: TaskData) -> None:
    """Random command sequences (the expert's next step, admissible commands, commands near the state that the
    domain may refuse, commands off the grammar) and scripted detours: at every step our simulation accepts the
    command iff the validator accepts its ground action, its state equals the domain's, and it is won iff the
    goal formula holds."""
    games = data.validation + data.test + data.train[::5]
    counts: Counter = Counter()
    mismatches: list[str] = []
    for game in games:
        for expert in (0.2, 0.5):
            mismatches += crosscheck(
                game, random_commands(game, random.Random(f"{game['id']}/{expert}"), 40, expert), counts
            )
        for script, wins in variants(game):
            won = counts["won"]
            mismatches += crosscheck(game, scripted(script), counts)
            counts["scripted, won" if wins else "scripted, not won"] += 1
            if counts["won"] - won != wins:
                mismatches.append(f"{game['id']}: {script} {'does not win' if wins else 'wins'}")
    print(f"{len(games)} games: {dict(sorted(counts.items()))}")
    assert not mismatches, "\n".join(mismatches[:20])
    assert counts["steps"] > 15_000 and counts["won"] > 200 and counts["refused: off the grammar"] > 500
    assert counts["scripted, won"] > 100 and counts["scripted, not won"] > 10
    # Each rule on which the simulation used to be more lenient was exercised.
    for part in ("PutObject (cancontain)", "OpenObject (not (opened))", "CloseObject (opened)",
                 "HeatObject (heatable)", "CoolObject (coolable)", "CleanObject (cleanable)",
                 "examineObject (or (exists"):  # fmt: skip
        assert sum(n for k, n in counts.items() if k.startswith(f"refused: {part}")) > 10, part
    assert counts["checked states: pick two spread over receptacles"] > 10
    assert counts["checked states: heat/cool task, object placed after the opposite"] > 10
