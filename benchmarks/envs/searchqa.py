"""A search-and-answer environment: `search[query]`, `open[title]`, `answer[text]` over a document corpus.

Graded by alias match: the normalised answer must equal one of the normalised answer aliases. An empty or
missing answer is never correct (the original harness counted one as correct when its judge failed).
Stdlib + numpy; copied into workspaces.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import StepResult, TextEnv, read_jsonl
from .bm25 import BM25
from .react import Messages, history_prompt

SEARCH_RESULTS = 3
SNIPPET_CHARS = 240
OPEN_CHARS = 1200
_ACTION = re.compile(r"^\s*(search|open|answer)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

SYSTEM_PROMPT = (
    "Answer the question using the search tool. Each turn, reply with exactly one action and nothing else:\n"
    "search[<query>] returns the top Wikipedia summaries; open[<title>] shows a whole summary; "
    "answer[<short answer>] ends the episode. Answer with a few words only."
)

Judge = Callable[[str, str, list[str]], "bool | None"]
"""(question, answer, aliases) -> verdict; None when the judge failed (alias matching decides then)."""


def normalize_answer(text: str) -> str:
    """SQuAD/TriviaQA normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def alias_match(answer: str | None, aliases: list[str]) -> bool:
    normalized = normalize_answer(answer or "")
    return bool(normalized) and normalized in {normalize_answer(a) for a in aliases}


def grade_answer(question: str, answer: str | None, aliases: list[str], judge: Judge | None = None) -> bool:
    """Alias match, or a judge's verdict when one is given and answers; empty answers are never correct."""
    if not normalize_answer(answer or ""):
        return False
    if judge is not None:
        verdict = judge(question, answer or "", aliases)
        if verdict is not None:
            return bool(verdict)
    return alias_match(answer, aliases)


def contains_alias(text: str, aliases: list[str]) -> bool:
    """Whether a normalised alias occurs as whole words in the normalised text (the retrievability filter)."""
    padded = f" {normalize_answer(text)} "
    return any(f" {a} " in padded for a in (normalize_answer(x) for x in aliases) if a)


class SearchQAEnv(TextEnv):
    """One question per episode; `docs` is a list of `{"title", "text"}` shared by all episodes."""

    def __init__(self, docs: list[dict[str, str]], index: BM25 | None = None, judge: Judge | None = None):
        self.docs = docs
        self.by_title = {d["title"].lower(): d for d in docs}
        self.index = index or BM25([f"{d['title']} {d['text']}" for d in docs])
        self.judge = judge
        self.goal: dict[str, Any] = {}
        self.done = False

    def reset(self, goal: dict[str, Any], seed: int = 0) -> tuple[str, dict[str, Any]]:
        self.goal, self.done = goal, False
        return f"Question: {goal['question']}", {}

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("the episode is over; call reset()")
        match = _ACTION.match(action or "")
        if not match:
            return StepResult(
                f"Invalid action '{action}': use search[...], open[...] or answer[...].", 0.0, False, {"invalid": True}
            )
        verb, arg = match.group(1).lower(), match.group(2).strip()
        if verb == "search":
            hits = [self.docs[i] for i in self.index.top_k(arg, SEARCH_RESULTS)]
            if not hits:
                return StepResult("No results.", 0.0, False, {})
            return StepResult("\n".join(f"[{d['title']}] {d['text'][:SNIPPET_CHARS]}" for d in hits), 0.0, False, {})
        if verb == "open":
            doc = self.by_title.get(arg.strip("[] ").lower())
            if doc is None:
                return StepResult(f"No page titled '{arg}'. Use a title from the search results.", 0.0, False, {})
            return StepResult(f"[{doc['title']}] {doc['text'][:OPEN_CHARS]}", 0.0, False, {})
        self.done = True
        won = grade_answer(self.goal["question"], arg, self.goal["aliases"], self.judge)
        return StepResult(f"Your answer: {arg}", float(won), True, {"won": won, "answer": arg})

    def admissible_actions(self) -> list[str]:
        return [] if self.done else ["search[...]", "open[...]", "answer[...]"]


def oracle_actions(goal: dict[str, Any]) -> list[str]:
    """Search with the question, then answer with the reference answer."""
    return [f"search[{goal['question']}]", f"answer[{goal['answer']}]"]


def searchqa_prompt(goal: dict[str, Any], observation: str, turns: list[dict[str, Any]], window: int = 4) -> Messages:
    return history_prompt(SYSTEM_PROMPT, observation, turns, window, action_prefix="")


def make_env(data_dir: Path) -> Callable[[], TextEnv]:
    """envlib's factory for DeepSearchQA: the corpus in `data_dir` and its search index, built once."""
    docs = read_jsonl(data_dir / "corpus.jsonl")
    index = BM25([f"{d['title']} {d['text']}" for d in docs])
    return lambda: SearchQAEnv(docs, index)
