"""WebShop-style shop: committed split, catalog, oracle and random policies, reward and success, `full` message."""

from __future__ import annotations

import random

import pytest

from a2rl_bench.benchmarks.base import TaskData
from a2rl_bench.benchmarks.envs.shop import ShopEnv, oracle_actions, shop_reward
from a2rl_bench.benchmarks.webshop import WebShop, WebShopDataError
from a2rl_bench.benchmarks.webshop.task import (
    MANIFEST, build_offline_manifest, load_full, load_offline, offline_catalog,
)


@pytest.fixture(scope="module")
def data() -> TaskData:
    return load_offline()


def _play(env: ShopEnv, goal: dict, actions: list[str]):
    env.reset(goal)
    for action in actions:
        result = env.step(action)
        if result.done:
            return result
    return result


def test_split_matches_the_committed_manifest(data: TaskData) -> None:
    import json

    assert json.loads(MANIFEST.read_text()) == build_offline_manifest()
    ids = [{g["id"] for g in split} for split in (data.train, data.validation, data.test)]
    assert [len(x) for x in ids] == [391, 100, 100]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])


def test_catalog_has_distractors_of_each_goal_type() -> None:
    listings, goals, _ = offline_catalog()
    for goal in goals[:50]:
        same_type = [x for x in listings if x["product_type"] == goal["product_type"]]
        assert len(same_type) >= 4  # several brands, and dearer twins: the first hit is not always right


def test_oracle_wins_every_goal(data: TaskData) -> None:
    make_env = WebShop().make_env("offline")
    goals = data.train + data.validation + data.test
    won = sum(_play(make_env(), goal, oracle_actions(goal)).info.get("won", False) for goal in goals)
    assert won / len(goals) >= 0.95


def test_random_policy_scores_low(data: TaskData) -> None:
    rng = random.Random(0)
    make_env = WebShop().make_env("offline")
    wins = 0
    for goal in data.validation:
        env = make_env()
        env.reset(goal)
        for _ in range(15):
            actions = env.admissible_actions()
            action = rng.choice(actions).replace("...", goal["product_type"])
            result = env.step(action)
            if result.done:
                wins += result.info["won"]
                break
    assert wins <= 10


def test_webshop_success_needs_reward_one(data: TaskData) -> None:
    goal = data.validation[0]
    actions = oracle_actions(goal)
    partial = _play(WebShop().make_env("offline")(), goal, actions[:2] + actions[3:])  # one option left unchosen
    assert 0.5 <= partial.reward < 1.0 and partial.info["won"] is False
    assert WebShop().aggregate([]) == 0.0


def test_reward_follows_the_webshop_formula() -> None:
    goal = {"product_type": "laptop", "options": {"color": "black", "ram": "8GB"}, "price_upper": 100.0}
    listing = {"product_type": "laptop"}
    assert shop_reward(goal, listing, {"color": "black", "ram": "8GB"}, 99.0)[0] == 1.0
    assert shop_reward(goal, listing, {"color": "black"}, 150.0)[0] == pytest.approx(1 / 3)
    assert shop_reward(goal, {"product_type": "laptop protective case"}, goal["options"], 10.0)[0] == 0.0


def test_episodes_are_deterministic(data: TaskData) -> None:
    goal = data.test[3]
    actions = ["search[" + goal["product_type"] + "]", "click[" + goal["target"] + "]", "click[< prev]"]
    runs = []
    for _ in range(2):
        env = WebShop().make_env("offline")()
        runs.append([env.reset(goal)[0]] + [env.step(a).observation for a in actions])
    assert runs[0] == runs[1]


def test_invalid_actions_keep_the_page_and_end_nothing(data: TaskData) -> None:
    env = WebShop().make_env("offline")()
    env.reset(data.validation[1])
    result = env.step("buy the cheapest one")
    assert result.info["invalid"] and not result.done and "[Search]" in result.observation


def test_full_variant_says_what_to_install() -> None:
    with pytest.raises(WebShopDataError, match="web_agent_site"):
        load_full()
