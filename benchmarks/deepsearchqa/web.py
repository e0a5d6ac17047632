"""The `full` variant's pieces: google/deepsearchqa rows and a pluggable web-search backend.

`SerpApiSearch` needs a SerpAPI key (`SERPAPI_KEY`); the HTTP call is injectable so that it is tested with
fixtures offline. `WebSearchQAEnv` is the search-and-answer environment over such a backend.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from a2rl_bench.benchmarks.deepsearchqa.corpus import DeepSearchQADataError
from a2rl_bench.benchmarks.envs.base import StepResult
from a2rl_bench.benchmarks.envs.searchqa import SearchQAEnv

HF_DATASET = ("google/deepsearchqa", "eval")
FULL_SEED, FULL_SIZES = 42, {"train": 100, "validation": 100, "test": 200}
_QUESTION_KEYS = ("problem", "question", "prompt")
_ANSWER_KEYS = ("answer", "ground_truth", "answers")


class SearchBackend(Protocol):
    def search(self, query: str, k: int) -> list[dict[str, str]]:
        """Top-k results as `{"title", "text"}` (text = snippet)."""


Fetch = Callable[[str], bytes]


def _urlopen(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()


class SerpApiSearch:
    """Google results through SerpAPI: organic results' titles and snippets."""

    endpoint = "https://serpapi.com/search.json"

    def __init__(self, api_key: str | None = None, fetch: Fetch = _urlopen):
        self.api_key = api_key or os.environ.get("SERPAPI_KEY", "")
        if not self.api_key:
            raise DeepSearchQADataError(
                "the `full` DeepSearchQA variant needs a web search backend: set SERPAPI_KEY (or pass another "
                "SearchBackend); without network access use the `offline` variant"
            )
        self.fetch = fetch

    def search(self, query: str, k: int) -> list[dict[str, str]]:
        url = f"{self.endpoint}?{urllib.parse.urlencode({'q': query, 'api_key': self.api_key, 'num': k})}"
        try:
            payload = json.loads(self.fetch(url))
        except OSError as e:
            raise DeepSearchQADataError(f"web search failed ({e}); the `full` variant needs network access") from e
        rows = payload.get("organic_results", [])[:k]
        return [{"title": r.get("title", ""), "text": r.get("snippet", "")} for r in rows]


class WebSearchQAEnv(SearchQAEnv):
    """SearchQAEnv whose `search` asks a web backend; `open[title]` shows a result seen in this episode."""

    def __init__(self, backend: SearchBackend, judge=None):
        super().__init__(docs=[], index=_NoIndex(), judge=judge)
        self.backend = backend

    def step(self, action: str) -> StepResult:
        verb, _, rest = (action or "").strip().partition("[")
        if verb.strip().lower() == "search" and rest.endswith("]") and not self.done:
            hits = self.backend.search(rest[:-1].strip(), 3)
            for hit in hits:
                self.by_title[hit["title"].lower()] = hit
            return StepResult("\n".join(f"[{h['title']}] {h['text']}" for h in hits) or "No results.", 0.0, False, {})
        return super().step(action)


class _NoIndex:
    def top_k(self, query: str, k: int) -> list[int]:
        return []


def items_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Task items from google/deepsearchqa rows (question and answer columns found by name)."""
    items = []
    for i, row in enumerate(rows):
        question = next((row[k] for k in _QUESTION_KEYS if k in row), None)
        answer = next((row[k] for k in _ANSWER_KEYS if k in row), None)
        if question is None or answer is None:
            raise DeepSearchQADataError(f"{HF_DATASET[0]} row {i} has none of {_QUESTION_KEYS} / {_ANSWER_KEYS}")
        answers = answer if isinstance(answer, list) else [answer]
        items.append({"id": f"dsqa-{i:04d}", "question": question, "answer": str(answers[0]),
                      "aliases": [str(a) for a in answers], "variant": "full"})  # fmt: skip
    return items
