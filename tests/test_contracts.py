"""The plug-in contracts of the library (issue #38): every built-in task, agent and driver is what the library
says it calls, by member and by signature, so grading and inference need no `Any`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import a2rl_bench.agents
import a2rl_bench.benchmarks
from a2rl_bench import contracts
from a2rl_bench.inference.evaluation import EvalSpec, task_class_ref, task_from_ref
from a2rl_bench.agents.base import LLMDriver


def signature_mismatches(obj: object, protocol: type) -> list[str]:
    """Where `obj`'s methods cannot be called as `protocol` declares them: a parameter missing or renamed, one
    the protocol leaves optional that the object requires, or an extra one without a default."""
    wrong = []
    for name, member in vars(protocol).items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        if not callable(getattr(obj, name, None)):
            wrong.append(f"{name}: missing")
            continue
        wanted = list(inspect.signature(member).parameters.values())[1:]  # without self
        given = list(inspect.signature(getattr(obj, name)).parameters.values())  # bound: no self
        if [p.name for p in given[: len(wanted)]] != [p.name for p in wanted]:
            wrong.append(f"{name}: parameters {[p.name for p in given]}, not {[p.name for p in wanted]}")
            continue
        for want, have in zip(wanted, given):
            if want.default is not inspect.Parameter.empty and have.default is inspect.Parameter.empty:
                wrong.append(f"{name}: {have.name} has no default")
        extra = [p for p in given[len(wanted):] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        wrong += [f"{name}: extra parameter {p.name} without a default" for p in extra if p.default is p.empty]
    return wrong


@pytest.mark.parametrize("task_id", a2rl_bench.benchmarks.TASKS.names())
def test_every_task_is_a_benchmark_task_as_the_library_calls_it(task_id):
    task = a2rl_bench.benchmarks.get_task(task_id)
    assert isinstance(task, contracts.BenchmarkTask)
    assert isinstance(task.decoding, contracts.DecodingSettings)
    assert signature_mismatches(task, contracts.BenchmarkTask) == []
    # The library's own uses: a spec carries it, and the evaluation process rebuilds it from its class.
    assert EvalSpec.of(task, "offline", "validation").task_object() is task
    assert task_from_ref(task_class_ref(task), task_id) == task


@pytest.mark.parametrize("agent_id", a2rl_bench.agents.list_agents())
def test_every_agent_is_an_agent_as_the_harness_starts_it(agent_id):
    agent = a2rl_bench.agents.get_agent(agent_id)  # an LLM agent without a driver can be installed, not started
    assert isinstance(agent, contracts.Agent)
    assert signature_mismatches(agent, contracts.Agent) == []


def test_the_driver_is_an_llm_driver():
    driver = LLMDriver(model="m", input_usd_per_mtok=3.0)
    assert isinstance(driver, contracts.LLMDriver)
    assert signature_mismatches(driver, contracts.LLMDriver) == []


def test_the_check_finds_what_does_not_conform():
    class Lacking:
        id = "x"

        def evaluator_id(self, suffix):  # an extra required parameter
            return suffix

        def load_split(self, variant, part, limit=None):  # renamed parameter
            return []

    assert not isinstance(Lacking(), contracts.BenchmarkTask)  # build_prompt and the rest are missing
    found = signature_mismatches(Lacking(), contracts.BenchmarkTask)
    assert "evaluator_id: extra parameter suffix without a default" in found
    assert "load_split: parameters ['variant', 'part', 'limit'], not ['variant', 'split', 'limit']" in found
    assert "build_prompt: missing" in found


def test_the_library_calls_nothing_on_a_task_beyond_the_contract():
    """Every `task.<member>` the library reads is declared by the protocol, so a plug-in that satisfies it works."""
    declared = {n for n in vars(contracts.BenchmarkTask) if not n.startswith("_")}
    used: dict[str, str] = {}
    for path in sorted((Path(contracts.__file__).parent).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "task":
                used.setdefault(node.attr, path.name)
    assert {"load_split", "score_items", "run_episodes", "id"} <= set(used)  # the scan sees the evaluator
    assert {m: f for m, f in used.items() if m not in declared} == {}
