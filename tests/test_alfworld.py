"""ALFWorld-style games: committed manifest, walkthroughs, random policy, splits by layout, the move grammar."""

from __future__ import annotations

import json
import random

import pytest

from a2rl_bench.benchmarks.alfworld import ALFWorld, ALFWorldDataError
from a2rl_bench.benchmarks.alfworld.games import TASK_TYPES, generate_game, layout_names
from a2rl_bench.benchmarks.alfworld.task import MANIFEST, build_offline_manifest, load_full, load_offline
from a2rl_bench.benchmarks.base import TaskData
from a2rl_bench.benchmarks.envs.household import SYSTEM_PROMPT, HouseholdEnv


@pytest.fixture(scope="module")
def data() -> TaskData:
    return load_offline()


def test_games_match_the_committed_manifest(data: TaskData) -> None:
    assert json.loads(MANIFEST.read_text()) == build_offline_manifest()
    assert [len(data.train), len(data.validation), len(data.test)] == [600, 60, 134]


def test_splits_use_disjoint_rooms_and_seeds(data: TaskData) -> None:
    rooms = [{g["layout"] for g in s} for s in (data.train, data.validation, data.test)]
    seeds = [{g["seed"] for g in s} for s in (data.train, data.validation, data.test)]
    assert not (rooms[0] & rooms[1] or rooms[0] & rooms[2] or rooms[1] & rooms[2])
    assert not (seeds[0] & seeds[2] or seeds[1] & seeds[2])
    assert {g["task_type"] for g in data.test} == set(TASK_TYPES)


def test_stored_walkthroughs_win_every_game(data: TaskData) -> None:
    games = data.train + data.validation + data.test
    wins = 0
    for game in games:
        env = HouseholdEnv()
        env.reset(game)
        for action in game["walkthrough"]:
            result = env.step(action)
        wins += result.info["won"]
    assert wins / len(games) >= 0.95


def test_random_admissible_policy_rarely_wins(data: TaskData) -> None:
    rng = random.Random(0)
    wins = 0
    for game in data.validation:
        env = HouseholdEnv()
        env.reset(game)
        for _ in range(50):
            result = env.step(rng.choice(env.admissible_actions()))
            if result.done:
                wins += 1
                break
    assert wins <= 0.2 * len(data.validation)


def test_generation_is_deterministic_under_a_seed() -> None:
    layouts = layout_names()
    assert generate_game(17, layouts) == generate_game(17, layouts)
    assert generate_game(17, layouts) != generate_game(18, layouts)


def test_alfworld_prompt_uses_move_not_put(data: TaskData) -> None:
    assert "move {obj} to {recep}" in SYSTEM_PROMPT and "no `put` command" in SYSTEM_PROMPT
    game = next(g for g in data.validation if g["task_type"] == "pick_and_place_simple")
    env = HouseholdEnv()
    env.reset(game)
    for action in game["walkthrough"][:-1]:
        env.step(action)
    held, target = game["walkthrough"][-1].removeprefix("move ").split(" to ")
    assert env.step(f"put {held} in {target}").observation == "Nothing happens."
    assert env.step(f"move {held} to {target}").info["won"]


def test_closed_receptacles_hide_their_contents(data: TaskData) -> None:
    game = next(g for g in data.train if any(step.startswith("open ") for step in g["walkthrough"]))
    env = HouseholdEnv()
    env.reset(game)
    opening = game["walkthrough"].index(next(s for s in game["walkthrough"] if s.startswith("open ")))
    env.step(game["walkthrough"][opening - 1])  # go to the closed receptacle
    take = game["walkthrough"][opening + 1]
    assert env.step(take).observation == "Nothing happens."


def _game(data: TaskData, game_id: str) -> dict:
    return next(g for g in data.train if g["id"] == game_id)


def _play(env: HouseholdEnv, commands: list[str]) -> list[str]:
    return [env.step(command).observation for command in commands]


NOTHING = "Nothing happens."


def test_commands_follow_alfworlds_pddl_preconditions(data: TaskData) -> None:
    # Bread 1 in (closed) fridge 1, lettuce 1 on countertop 1; a drawer holds no bread, a microwave heats no lettuce.
    env = HouseholdEnv()
    env.reset(_game(data, "alfworld-000004"))
    assert _play(env, ["go to fridge 1", "close fridge 1", "examine bread 1", "take bread 1 from fridge 1"]) == [
        "You arrive at fridge 1. The fridge 1 is closed.", NOTHING, NOTHING, NOTHING
    ]  # fmt: skip
    assert _play(env, ["open fridge 1", "open fridge 1", "examine bread 1"])[1:] == [NOTHING, "This is a cool bread 1."]
    assert _play(env, ["take bread 1 from fridge 1", "close fridge 1", "close fridge 1"])[1:] == [
        "You close the fridge 1.", NOTHING
    ]  # fmt: skip
    _play(env, ["go to drawer 1", "open drawer 1"])
    assert "move bread 1 to drawer 1" not in env.admissible_actions()
    assert _play(env, ["move bread 1 to drawer 1"]) == [NOTHING] and env.held() == "bread 1"
    _play(env, ["go to diningtable 1", "move bread 1 to diningtable 1"])  # (on the countertop it would win)
    _play(env, ["go to countertop 1", "take lettuce 1 from countertop 1"])
    _play(env, ["go to microwave 1"])
    assert "heat lettuce 1 with microwave 1" not in env.admissible_actions()
    assert _play(env, ["heat lettuce 1 with microwave 1", "examine lettuce 1"]) == [NOTHING, "This is a lettuce 1."]


def test_a_cool_task_is_won_by_a_cool_object_only(data: TaskData) -> None:
    game = _game(data, "alfworld-000004")  # put a cool bread in countertop; bread 1 starts in the fridge
    assert game["goal"] == {"object": "Bread", "target": "CounterTop", "state": "cool", "count": 1}
    start = ["go to fridge 1", "open fridge 1", "take bread 1 from fridge 1"]
    env = HouseholdEnv()
    env.reset(game)
    _play(env, [*start, "go to countertop 1"])
    assert env.step("move bread 1 to countertop 1").info["won"]  # cool from the fridge: no need to cool it
    env.reset(game)
    heated = _play(env, [*start, "cool bread 1 with fridge 1", "go to microwave 1", "heat bread 1 with microwave 1",
                         "examine bread 1", "go to countertop 1", "move bread 1 to countertop 1"])  # fmt: skip
    assert heated[-3] == "This is a hot bread 1." and not env.won()  # heating undid the cooling
    _play(env, ["take bread 1 from countertop 1", "go to fridge 1", "cool bread 1 with fridge 1"])
    assert _play(env, ["examine bread 1", "go to countertop 1"])[0] == "This is a cool bread 1."
    assert env.step("move bread 1 to countertop 1").info["won"]


def test_put_two_wants_both_objects_in_one_receptacle(data: TaskData) -> None:
    game = _game(data, "alfworld-000011")  # put two butterknife in countertop; the room has countertops 1 and 2
    env = HouseholdEnv()
    env.reset(game)
    _play(env, game["walkthrough"][:-2] + ["go to countertop 2", "move butterknife 2 to countertop 2"])
    assert env.where["butterknife 1"] == "countertop 1" and env.where["butterknife 2"] == "countertop 2"
    assert not env.won()
    _play(env, ["take butterknife 2 from countertop 2", "go to countertop 1"])
    assert env.step("move butterknife 2 to countertop 1").info["won"]


def test_summary_breaks_success_down_by_task_type(data: TaskData) -> None:
    task = ALFWorld()
    walkthrough = {g["goal_text"] + g["id"]: list(g["walkthrough"]) for g in data.validation[:6]}
    progress: dict[str, int] = {}

    def replay(conversations: list[list[dict]]) -> list[str]:
        out = []
        for c in conversations:
            key = next(k for k in walkthrough if k.split("alfworld-")[0] in c[1]["content"])
            out.append(walkthrough[key][progress.setdefault(key, 0)])
            progress[key] += 1
        return out

    results = task.play(data.validation[:6], replay)
    assert task.aggregate(results) == 100.0
    assert set(task.summarize(results)["success_by_type"]) == {g["task_type"] for g in data.validation[:6]}


def test_full_variant_says_what_to_download(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(ALFWorldDataError, match="alfworld-download"):
        load_full()
