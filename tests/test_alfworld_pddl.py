"""The offline ALFWorld games against the alfworld wheel's own PDDL domain (`alfworld/data/alfred.pddl`), grammar
(`alfred.twl2`) and goals (`gen/goal_library.py`): the domain reader, the VAL-style validator, and every stored
walkthrough as a plan that reaches its goal."""

from __future__ import annotations

import pytest

from benchmarks import get_task
from benchmarks.alfworld.pddl import (
    PDDLError,
    Step,
    check_walkthrough,
    game_plan,
    game_problem,
    ground,
    parse,
    parse_first,
    read_domain,
    show,
    validate,
)
from benchmarks.base import TaskData


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
