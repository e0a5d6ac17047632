"""DeepSearchQA (L3): offline, TriviaQA over offline Wikipedia summaries with BM25; `full`, google/deepsearchqa
with a web search backend. Regenerate the committed offline split (about a minute: one BM25 query per question)
with `python -c "from a2rl_bench.benchmarks.deepsearchqa.task import write_offline_manifest; write_offline_manifest()"`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2rl_bench.benchmarks.base import Item, Messages, TaskData
from a2rl_bench.benchmarks.deepsearchqa.corpus import (
    TRIVIAQA,
    WIKI,
    DeepSearchQADataError,
    package_file,
    read_corpus,
    read_triviaqa,
    sha256_of,
)
from a2rl_bench.benchmarks.deepsearchqa.web import (
    FULL_SEED,
    FULL_SIZES,
    HF_DATASET,
    SerpApiSearch,
    WebSearchQAEnv,
    items_from_rows,
)
from a2rl_bench.benchmarks.envs.base import TextEnv
from a2rl_bench.benchmarks.envs.bm25 import BM25
from a2rl_bench.benchmarks.envs import searchqa
from a2rl_bench.benchmarks.envs.searchqa import Judge, SearchQAEnv, contains_alias, searchqa_prompt
from a2rl_bench.benchmarks.envs.splits import read_manifest, split_ids, write_manifest
from a2rl_bench.benchmarks.envs.task import AgentEnvironment, InteractiveTask
from a2rl_bench.paths import data_file

SPLIT_SEED = 20262
SIZES = {"validation": 200, "test": 400, "train": -1}
RETRIEVAL_K = 5
MANIFEST = data_file("deepsearchqa", "split-offline.json")
REGENERATE = "a2rl_bench.benchmarks.deepsearchqa.task.write_offline_manifest()"


@functools.lru_cache(maxsize=1)
def offline_corpus() -> tuple[list[dict[str, str]], BM25]:
    docs = read_corpus()
    return docs, BM25([f"{d['title']} {d['text']}" for d in docs])


def retrievable(question: dict[str, Any], k: int = RETRIEVAL_K) -> bool:
    """Whether an answer alias occurs in the top-k summaries BM25 returns for the question itself."""
    docs, index = offline_corpus()
    return any(
        contains_alias(f"{docs[i]['title']} {docs[i]['text']}", question["aliases"])
        for i in index.top_k(question["question"], k)
    )


def _sources() -> dict[str, Any]:
    return {
        "corpus": {"package": WIKI[0], "version": WIKI[1], "file": WIKI[2], "sha256": sha256_of(package_file(*WIKI))},
        "questions": {"package": TRIVIAQA[0], "version": TRIVIAQA[1], "file": TRIVIAQA[2], "sha256": sha256_of(package_file(*TRIVIAQA))},
    }  # fmt: skip


def build_offline_manifest() -> dict[str, Any]:
    questions = read_triviaqa()
    kept = [q["id"] for q in questions if retrievable(q)]
    return {
        "task": "deepsearchqa",
        "variant": "offline",
        "seed": SPLIT_SEED,
        "source": _sources(),
        "filter": {
            "retriever": "BM25 (k1 1.5, b 0.75) over title + summary",
            "top_k": RETRIEVAL_K,
            "questions": len(questions),
            "kept": len(kept),
        },
        "ids": split_ids(kept, SIZES, SPLIT_SEED),
    }


def write_offline_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    manifest = build_offline_manifest()
    write_manifest(path, manifest)
    return manifest


def load_offline(path: Path = MANIFEST) -> TaskData:
    """The committed split; the sources must be the ones it was made from (the filter is not re-run here)."""
    committed = read_manifest(path, DeepSearchQADataError, REGENERATE)
    if (current := _sources()) != committed["source"]:
        raise DeepSearchQADataError(
            f"the offline sources differ from the committed split ({current} vs {committed['source']}); install "
            f"{WIKI[0]}=={WIKI[1]} and {TRIVIAQA[0]}=={TRIVIAQA[1]} or regenerate with {REGENERATE}"
        )
    by_id = {q["id"]: {**q, "target": q["answer"], "variant": "offline"} for q in read_triviaqa()}
    ids = committed["ids"]
    return TaskData(
        train=[by_id[i] for i in ids["train"]],
        validation=[by_id[i] for i in ids["validation"]],
        test=[by_id[i] for i in ids["test"]],
        source=f"TriviaQA validation ({TRIVIAQA[0]}=={TRIVIAQA[1]}) filtered to questions answerable from the "
        f"top-{RETRIEVAL_K} BM25 hits over {WIKI[0]}=={WIKI[1]} Wikipedia summaries",
    )


def load_full() -> TaskData:
    """google/deepsearchqa `eval` (900), shuffled with seed 42: 100 train / 100 validation / 200 hidden test."""
    try:
        from datasets import load_dataset

        rows = list(load_dataset(HF_DATASET[0], split=HF_DATASET[1]))
    except Exception as e:  # offline, gated, rate-limited: all mean the same to the user
        raise DeepSearchQADataError(
            f"the `full` DeepSearchQA variant loads {HF_DATASET[0]} from the Hugging Face Hub and searches the web "
            "(SERPAPI_KEY); without internet use the `offline` variant"
        ) from e
    return full_task_data(rows)


def full_task_data(rows: list[dict[str, Any]]) -> TaskData:
    items = items_from_rows(rows)
    random.Random(FULL_SEED).shuffle(items)
    a, b = FULL_SIZES["train"], FULL_SIZES["train"] + FULL_SIZES["validation"]
    return TaskData(
        train=items[:a], validation=items[a:b], test=items[b : b + FULL_SIZES["test"]],
        source=f"Hugging Face {HF_DATASET[0]} ({HF_DATASET[1]}), shuffled with seed {FULL_SEED}",
    )  # fmt: skip


@dataclass
class DeepSearchQA(InteractiveTask):
    """Declarative fields (id, title, decoding, variant labels, ...): task.toml beside this file."""
    agent_environment = AgentEnvironment(
        ("a2rl_bench.benchmarks.envs.searchqa",), "searchqa:make_env", "searchqa:searchqa_prompt"
    )

    judge: Judge | None = None
    """Off by default: grading is alias match. A judge must be pinned (model + prompt) and its failures
    fall back to alias matching, never to 'correct'."""

    def loaders(self) -> dict[str, Callable[[], TaskData]]:
        return {"offline": load_offline, "full": load_full}

    def make_env(self, variant: str) -> Callable[[], TextEnv]:
        if variant == "full":
            backend = SerpApiSearch()
            return lambda: WebSearchQAEnv(backend, self.judge)
        docs, index = offline_corpus()
        return lambda: SearchQAEnv(docs, index, self.judge)

    def oracle_actions(self, variant: str, goal: Item) -> list[str] | None:
        return searchqa.oracle_actions(goal) if variant == "offline" else None

    def prompt(self, goal: Item, observation: str, turns: list[dict[str, Any]]) -> Messages:
        return searchqa_prompt(goal, observation, turns)

    def public_files(self, variant: str) -> dict[str, list[dict]]:
        return {"corpus.jsonl": offline_corpus()[0]} if variant == "offline" else {}
