"""Benchmark tasks: one package per task (data loader, prompt, evaluator, description.md)."""

from __future__ import annotations

from a2rl_bench.registry import PluginError, Registry
from a2rl_bench.benchmarks.base import BenchmarkTask, Decoding, PreparedData, TaskData

TASKS: Registry[type[BenchmarkTask]] = Registry("task", "a2rl.tasks", {
    "gsm8k": "a2rl_bench.benchmarks.gsm8k:GSM8K",
    "humaneval": "a2rl_bench.benchmarks.humaneval:HumanEval",
    "alpacaeval": "a2rl_bench.benchmarks.alpacaeval:AlpacaEval",
    "alfworld": "a2rl_bench.benchmarks.alfworld:ALFWorld",
    "webshop": "a2rl_bench.benchmarks.webshop:WebShop",
    "deepsearchqa": "a2rl_bench.benchmarks.deepsearchqa:DeepSearchQA",
})
"""Benchmark tasks by id: the six built in, plus any an installed package declares under the `a2rl.tasks` entry
point group (docs/architecture.md, "Adding a benchmark task"). Imported on first use."""


def get_task(task_id: str) -> BenchmarkTask:
    """A new instance of the task (tasks are small declarative objects; their data is cached on disk), by its short
    name or its namespaced one (`a2rl/gsm8k`, `my-dist/my-task`)."""
    task = TASKS.load(task_id)()
    if task.id != TASKS.ref(task_id).name:
        raise PluginError(f"task {task_id!r} ({TASKS.ref(task_id).target}) calls itself {task.id!r}")
    return task


def list_tasks() -> list[BenchmarkTask]:
    """Every usable task (a name two plug-ins declare is left out: `TASKS.clashes()` says why)."""
    clashes = TASKS.clashes()
    return [get_task(name) for name in TASKS.names() if name not in clashes]


__all__ = ["TASKS", "BenchmarkTask", "Decoding", "PreparedData", "TaskData", "get_task", "list_tasks"]
