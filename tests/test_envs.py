"""The lockstep ReAct loop, BM25, the envlib workspace package, and one end-to-end evaluation on the tiny model."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from a2rl_bench.benchmarks.envs.bm25 import BM25
from a2rl_bench.benchmarks.envs.export import envlib_bytes, write_envlib
from a2rl_bench.benchmarks.envs.react import parse_action, run_episodes
from a2rl_bench.benchmarks.webshop.task import WebShop


def _hash_policy(conversations: list[list[dict]]) -> list[str]:
    """A scripted policy that depends only on each conversation: deterministic, order-independent."""
    actions = ["search[red t-shirt]", "click[back to search]", "search[laptop 16GB]", "click[buy now]"]
    return [actions[int(hashlib.sha256(json.dumps(c).encode()).hexdigest(), 16) % len(actions)] for c in conversations]


@pytest.mark.parametrize(
    ("completion", "action"),
    [
        ("search[red shirt]", "search[red shirt]"),  # a bare action
        ("Thought: find it\nAction: click[B12]\nObservation: x", "click[B12]"),  # ReAct: the text after Action:
        ("> go to fridge 1\nmore", "go to fridge 1"),  # ALFWorld's prompt marker is dropped
        ("", ""),  # nothing: an invalid (empty) action, never an exception
    ],
)
def test_parse_action_takes_the_action_line(completion: str, action: str) -> None:
    assert parse_action(completion) == action


def test_bm25_ranks_the_matching_document_first() -> None:
    index = BM25(["the red apple", "a blue car on the road", "apple pie recipe with apple"])
    assert index.top_k("apple", 3)[0] == 2
    assert index.top_k("car", 3) == [1]
    assert index.top_k("zebra", 3) == []


def test_lockstep_loop_asks_the_policy_once_per_step_for_live_episodes_only() -> None:
    task = WebShop()
    goals = task.load_split("offline", "validation", 4)
    calls: list[int] = []

    def policy(conversations: list[list[dict]]) -> list[str]:
        calls.append(len(conversations))
        return ["search[" + goals[0]["product_type"] + "]"] * len(conversations)

    episodes = run_episodes(task.make_env("offline"), goals, policy, task.prompt, max_steps=3)
    assert calls == [4, 4, 4] and all(len(ep.turns) == 3 for ep in episodes)

    from a2rl_bench.benchmarks.envs.shop import oracle_actions

    progress = {g["instruction"]: 0 for g in goals}  # steps taken per episode (prompts keep only a window)

    def finishing(conversations: list[list[dict]]) -> list[str]:
        calls.append(len(conversations))
        actions = []
        for conversation in conversations:
            goal = next(g for g in goals if g["instruction"] in conversation[1]["content"])
            actions.append(oracle_actions(goal)[progress[goal["instruction"]]])
            progress[goal["instruction"]] += 1
        return actions

    calls.clear()
    episodes = run_episodes(task.make_env("offline"), goals, finishing, task.prompt, max_steps=20)
    steps = [len(oracle_actions(g)) for g in goals]
    assert calls == [sum(s > k for s in steps) for k in range(max(steps))]
    assert all(ep.won and ep.done for ep in episodes)


def test_batched_and_sequential_runs_give_the_same_episodes() -> None:
    task = WebShop()
    goals = task.load_split("offline", "validation", 6)
    together = task.play(goals, _hash_policy)
    alone = [task.play([goal], _hash_policy)[0] for goal in goals]
    assert [r.model_dump() for r in together] == [r.model_dump() for r in alone]


def test_envlib_zip_runs_training_episodes_outside_the_harness(tmp_path: Path) -> None:
    task = WebShop()
    prepared = task.prepare("offline")
    zip_path = write_envlib(tmp_path / "envlib.zip", task.id, task.max_steps, task.agent_environment)
    assert "envlib/task.py" not in zipfile.ZipFile(zip_path).namelist()  # the evaluator glue stays out
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import envlib\n"
        "goals = envlib.load_goals(sys.argv[2])[:3]\n"
        "def oracle(convs): return ['search[' + goals[0]['product_type'] + ']'] * len(convs)\n"
        "eps = envlib.run_episodes(envlib.make_env('webshop', sys.argv[2]), goals, oracle, envlib.prompter('webshop'), 2)\n"
        "assert 'a2rl_bench' not in sys.modules and 'benchmarks' not in sys.modules\n"
        "assert envlib.MAX_STEPS == {'webshop': 15}, envlib.MAX_STEPS\n"
        "print(len(eps), eps[0].turns[0]['observation'].count('['))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(zip_path), str(prepared.public_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "3"


def test_prepare_refreshes_an_envlib_zip_made_from_older_modules() -> None:
    from a2rl_bench.benchmarks import get_task

    task = get_task("alfworld")
    path = task.prepare("offline").public_dir / "envlib.zip"
    declared = (task.id, task.max_steps, task.agent_environment)
    assert path.read_bytes() == envlib_bytes(*declared) == envlib_bytes(*declared)  # reproducible bytes
    assert "envlib/shop.py" not in zipfile.ZipFile(path).namelist()  # the task's own environment only
    path.write_bytes(b"an envlib.zip of an older simulation")
    task.prepare("offline")  # already prepared: only the envlib is rewritten
    assert path.read_bytes() == envlib_bytes(*declared)


@pytest.mark.parametrize("task_id", ["webshop", "deepsearchqa", "alfworld"])
def test_public_data_holds_no_validation_or_test_goal(task_id: str) -> None:
    from a2rl_bench.benchmarks import get_task

    task = get_task(task_id)
    public = task.prepare("offline").public_dir
    hidden = {item["id"] for split in ("validation", "test") for item in task.load_split("offline", split)}
    text = "".join(p.read_text() for p in public.glob("*.jsonl") if p.name == "train.jsonl")
    assert not any(f'"id": "{i}"' in text for i in hidden)
    assert sorted(p.name for p in public.iterdir()) == sorted(
        ["train.jsonl", "envlib.zip", "sft.jsonl"]  # sft.jsonl: worked examples from training goals
        + {"webshop": ["catalog.jsonl"], "deepsearchqa": ["corpus.jsonl"]}.get(task_id, [])
    )


def test_evaluate_runs_an_interactive_task_end_to_end_on_the_tiny_model(tiny_model_dir: Path) -> None:
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate
    from a2rl_bench.benchmarks.base import Decoding

    # 2 steps and 8 tokens: the tiny model never wins, and this keeps the test to seconds on a loaded CPU.
    task = dataclasses.replace(WebShop(), max_steps=2, decoding=Decoding(max_new_tokens=8, stop=("\n",)))
    result = evaluate(tiny_model_dir, EvalSpec.of(task, "offline", "validation", limit=2, batch_size=2))
    assert result.n == 2 and result.score == 0.0 and result.generated_tokens > 0
    assert all(len(item.detail["turns"]) == 2 for item in result.items)
    assert result.evaluator_id.rsplit("@", 1)[0].endswith("/steps2") and result.evaluator_id.endswith("@cpu-fp32")


def test_tiny_model_batched_and_sequential_evaluation_agree(tiny_model_dir: Path) -> None:
    from a2rl_bench.inference.generation import load_model
    from a2rl_bench.benchmarks.base import Decoding
    from a2rl_bench.benchmarks.envs.task import ModelPolicy

    task = dataclasses.replace(WebShop(), max_steps=2, decoding=Decoding(max_new_tokens=6, stop=("\n",)))
    model = load_model(tiny_model_dir)
    goals = task.load_split("offline", "validation", 2)
    together = task.play(goals, ModelPolicy(model, task.decoding, batch_size=2))
    alone = [task.play([g], ModelPolicy(model, task.decoding, batch_size=1))[0] for g in goals]
    assert [r.detail["turns"] for r in together] == [r.detail["turns"] for r in alone]
