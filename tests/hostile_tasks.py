"""Tasks whose evaluation misbehaves, for tests of the evaluation process's supervision and memory limit (and one
that only reports how its process was set up).

The evaluation process rebuilds a task from its class (`module:Class`), so these live in an importable module.
Their episodes never load the model: they sleep (and start a child that sleeps), or allocate memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from a2rl_bench.records import ItemResult
from a2rl_bench.benchmarks.base import BenchmarkTask, Decoding, TaskData

ITEMS = [{"id": str(i), "question": f"q{i}", "answer": "1"} for i in range(2)]


@dataclass
class _Misbehaving(BenchmarkTask):
    id: str = "misbehaving"
    level: str = "test"
    metric: str = "accuracy"
    title: str = "a task whose evaluation misbehaves"
    prompt_version: str = "1"
    decoding: Decoding = field(default_factory=Decoding)
    default_base_model: str = "tiny"

    def load(self, variant: str) -> TaskData:
        return TaskData(ITEMS, ITEMS, ITEMS, "tests.hostile_tasks")

    def build_prompt(self, item):
        return [{"role": "user", "content": item["question"]}]

    def score_item(self, item, completion: str) -> ItemResult:
        return ItemResult(item_id=item["id"], completion=completion, prediction=None, target="1", correct=False)


@dataclass
class SleepingTask(_Misbehaving):
    """Writes its pid and a child's to `$A2RL_TEST_PID_FILE`, then sleeps: an evaluation that runs for ever."""

    id: str = "sleeping"

    def run_episodes(self, model_dir: Path, items, batch_size: int, on_done=None):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(os.environ["A2RL_TEST_PID_FILE"]).write_text(f"{os.getpid()} {child.pid}")
        time.sleep(600)


@dataclass
class HoggingTask(_Misbehaving):
    """Allocates (and touches) memory 64 MiB at a time, up to 4 GiB, then scores: weights that make the evaluation
    take every byte it can."""

    id: str = "hogging"

    def run_episodes(self, model_dir: Path, items, batch_size: int, on_done=None):
        held = [bytearray(64 << 20) for _ in range(64)]
        return [self.score_item(item, str(len(held))) for item in items]


@dataclass
class ThreadsTask(_Misbehaving):
    """Scores nothing; each item's completion is the evaluation process's torch thread count."""

    id: str = "threads"

    def run_episodes(self, model_dir: Path, items, batch_size: int, on_done=None):
        import torch

        return [self.score_item(item, str(torch.get_num_threads())) for item in items]
