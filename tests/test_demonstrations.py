"""Worked examples (`data/sft.jsonl`): made from training items only, in the evaluator's own prompt format,
and good enough to win (interactive tasks) or pass (humaneval) when replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from a2rl_bench.agents.reference_sft.agent import Settings
from a2rl_bench.agents.reference_sft.train_sft import read_rows, to_conversation
from a2rl_bench.benchmarks import get_task
from a2rl_bench.benchmarks.base import read_jsonl

INTERACTIVE = ["alfworld", "webshop", "deepsearchqa"]


def replay_policy(demos: list[dict], seen: list[list[dict]]):
    """A batched policy that answers each conversation with the demonstration whose prompt it equals."""
    by_prompt = {json.dumps(d["prompt"]): d["completion"][0]["content"] for d in demos}

    def policy(conversations: list[list[dict]]) -> list[str]:
        seen.extend(conversations)
        return [by_prompt.get(json.dumps(c), "look") for c in conversations]

    return policy


@pytest.mark.parametrize("task_id", INTERACTIVE)
def test_interactive_demonstrations_are_the_evaluators_prompts_and_win(task_id: str) -> None:
    task = get_task(task_id)
    prepared = task.prepare("offline")
    train = read_jsonl(prepared.public_dir / "train.jsonl")[:12]
    demos = task.demonstrations("offline", train)
    assert {d["goal_id"] for d in demos} == {g["id"] for g in train}  # every oracle episode wins
    seen: list[list[dict]] = []
    results = task.play(train, replay_policy(demos, seen))  # the evaluator's own loop
    assert all(r.correct for r in results)
    # Every prompt the evaluator showed is a demonstration prompt, and vice versa: same format, same history.
    assert sorted(json.dumps(c) for c in seen) == sorted(json.dumps(d["prompt"]) for d in demos)


@pytest.mark.parametrize("task_id", [*INTERACTIVE, "humaneval", "alpacaeval"])
def test_demonstrations_come_from_training_items_only(task_id: str) -> None:
    task = get_task(task_id)
    prepared = task.prepare("offline")
    demos = read_jsonl(prepared.public_dir / "sft.jsonl")
    train_ids = {row["id"] for row in read_jsonl(prepared.public_dir / "train.jsonl")}
    assert demos and {d["goal_id"] for d in demos} <= train_ids
    hidden = {row["id"] for split in ("validation", "test") for row in read_jsonl(prepared.private_dir / f"{split}.jsonl")}
    assert not hidden & {d["goal_id"] for d in demos}


def test_humaneval_demonstrations_pass_their_unit_tests() -> None:
    task = get_task("humaneval")
    prepared = task.prepare("offline")
    train = {row["id"]: row for row in read_jsonl(prepared.public_dir / "train.jsonl")}
    for demo in read_jsonl(prepared.public_dir / "sft.jsonl")[:5]:
        item = train[demo["goal_id"]]
        assert demo["prompt"] == task.build_prompt(item)
        assert task.score_item(item, demo["completion"][0]["content"]).correct


def test_gsm8k_ships_no_demonstrations_and_the_reference_agent_falls_back(tmp_path: Path) -> None:
    prepared = get_task("gsm8k").prepare("offline")
    assert not (prepared.public_dir / "sft.jsonl").exists()
    env = {"WORKSPACE": str(tmp_path), "GRADING_SERVER_URL": "http://127.0.0.1:1", "DATA_PATH": str(tmp_path)}
    assert Settings.from_env(env).train_file == tmp_path / "train.jsonl"
    assert Settings.from_env(env).max_length == 256
    (tmp_path / "sft.jsonl").write_text("")
    assert Settings.from_env(env).train_file == tmp_path / "sft.jsonl"
    assert Settings.from_env(env).max_length == 1024  # worked examples carry the evaluator's whole prompt


def test_the_reference_trainer_reads_worked_examples_as_they_are(tmp_path: Path) -> None:
    demos = read_jsonl(get_task("webshop").prepare("offline").public_dir / "sft.jsonl")[:3]
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in demos))
    rows = read_rows(path)
    assert [to_conversation(r) for r in rows] == [{"prompt": d["prompt"], "completion": d["completion"]} for d in demos]


@pytest.mark.parametrize("task_id", ["gsm8k", "humaneval", "webshop"])
def test_the_agent_facing_description_names_the_worked_examples_where_they_exist(task_id: str) -> None:
    task = get_task(task_id)
    ships = (task.prepare("offline").public_dir / "sft.jsonl").exists()
    assert ("data/sft.jsonl" in task.description()) == ships == (task_id != "gsm8k")
