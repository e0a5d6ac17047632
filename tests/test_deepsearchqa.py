"""DeepSearchQA-style task: committed split, retrievability, grading (empty answers, judge), search env, `full`."""

from __future__ import annotations

import json
import random

import pytest

from a2rl_bench.benchmarks.base import TaskData
from a2rl_bench.benchmarks.deepsearchqa import DeepSearchQA, DeepSearchQADataError
from a2rl_bench.benchmarks.deepsearchqa.task import MANIFEST, _sources, full_task_data, load_offline, retrievable
from a2rl_bench.benchmarks.deepsearchqa.web import SerpApiSearch, WebSearchQAEnv
from a2rl_bench.benchmarks.envs.searchqa import grade_answer, normalize_answer, oracle_actions


@pytest.fixture(scope="module")
def data() -> TaskData:
    return load_offline()


def test_split_follows_the_committed_manifest(data: TaskData) -> None:
    manifest = json.loads(MANIFEST.read_text())
    assert manifest["source"] == _sources()
    assert [len(s) for s in (data.train, data.validation, data.test)] == [987, 200, 400]
    ids = [{q["id"] for q in s} for s in (data.train, data.validation, data.test)]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])


def test_kept_questions_are_answerable_from_the_top_five_summaries(data: TaskData) -> None:
    sample = random.Random(0).sample(data.test, 15)
    assert all(retrievable(q) for q in sample)


def test_empty_answer_is_never_correct_even_when_the_judge_fails() -> None:
    failing_judge = lambda q, a, aliases: None
    yes_judge = lambda q, a, aliases: True
    assert not grade_answer("q", "", ["Paris"], failing_judge)
    assert not grade_answer("q", "  . ", ["Paris"], yes_judge)
    assert not grade_answer("q", None, [""])
    assert grade_answer("q", "the Paris.", ["paris"], failing_judge)  # judge failure -> alias match
    assert not grade_answer("q", "Lyon", ["paris"], failing_judge)


def test_normalisation_follows_triviaqa() -> None:
    assert normalize_answer("The  Beatles!") == "beatles"


def test_oracle_wins_and_a_wrong_answer_loses(data: TaskData) -> None:
    make_env = DeepSearchQA().make_env("offline")
    goals = data.validation
    wins = 0
    for goal in goals:
        env = make_env()
        env.reset(goal)
        for action in oracle_actions(goal):
            result = env.step(action)
        wins += result.info["won"]
    assert wins / len(goals) >= 0.95
    env = make_env()
    env.reset(goals[0])
    assert env.step("answer[zzzz]").info["won"] is False


def test_random_policy_scores_low(data: TaskData) -> None:
    rng = random.Random(0)
    words = ["the", "king", "river", "war", "city", "film", "music", "sea"]
    make_env = DeepSearchQA().make_env("offline")
    wins = 0
    for goal in data.validation[:40]:
        env = make_env()
        env.reset(goal)
        env.step(f"search[{rng.choice(words)}]")
        wins += env.step(f"answer[{rng.choice(words)}]").info["won"]
    assert wins <= 2


def test_search_and_open_show_summaries(data: TaskData) -> None:
    env = DeepSearchQA().make_env("offline")()
    env.reset(data.validation[0])
    hits = env.step("search[Eiffel Tower Paris]").observation
    title = hits.split("]")[0].lstrip("[")
    assert env.step(f"open[{title}]").observation.startswith(f"[{title}]")
    assert "No page" in env.step("open[No Such Page 123]").observation


def test_web_search_backend_with_a_fixture_response() -> None:
    payload = {"organic_results": [{"title": "Paris", "snippet": "Paris is the capital of France."}]}
    urls: list[str] = []

    def fetch(url: str) -> bytes:
        urls.append(url)
        return json.dumps(payload).encode()

    env = WebSearchQAEnv(SerpApiSearch(api_key="k", fetch=fetch))
    env.reset({"question": "Capital of France?", "aliases": ["Paris"]})
    assert "capital of France" in env.step("search[capital of France]").observation
    assert "q=capital+of+France" in urls[0]
    assert env.step("open[Paris]").observation.startswith("[Paris]")
    assert env.step("answer[Paris]").info["won"]


def test_full_variant_needs_a_search_key(monkeypatch) -> None:
    monkeypatch.delenv("SERPAPI_KEY", raising=False)
    with pytest.raises(DeepSearchQADataError, match="SERPAPI_KEY"):
        DeepSearchQA().make_env("full")


def test_full_rows_become_items_split_100_100_200() -> None:
    rows = [{"problem": f"q{i}", "answer": f"a{i}"} for i in range(900)]
    data = full_task_data(rows)
    assert [len(data.train), len(data.validation), len(data.test)] == [100, 100, 200]
