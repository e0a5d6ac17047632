"""Benchmark tasks: one package per task (data loader, prompt, evaluator, description.md)."""

from __future__ import annotations

from benchmarks.base import BenchmarkTask, Decoding, PreparedData, TaskData


def _registry() -> dict[str, BenchmarkTask]:
    # Imported lazily so that `import benchmarks` stays cheap.
    from benchmarks.alfworld import ALFWorld
    from benchmarks.alpacaeval import AlpacaEval
    from benchmarks.deepsearchqa import DeepSearchQA
    from benchmarks.gsm8k import GSM8K
    from benchmarks.humaneval import HumanEval
    from benchmarks.webshop import WebShop

    tasks = [GSM8K(), HumanEval(), AlpacaEval(), ALFWorld(), WebShop(), DeepSearchQA()]
    return {t.id: t for t in tasks}


def get_task(task_id: str) -> BenchmarkTask:
    tasks = _registry()
    if task_id not in tasks:
        raise KeyError(f"unknown task {task_id!r}; known tasks: {', '.join(sorted(tasks))}")
    return tasks[task_id]


def list_tasks() -> list[BenchmarkTask]:
    return list(_registry().values())


__all__ = ["BenchmarkTask", "Decoding", "PreparedData", "TaskData", "get_task", "list_tasks"]
