"""Okapi BM25 over a small corpus with numpy (a few thousand documents: an inverted index is enough)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np

_TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "he",
        "her",
        "his",
        "i",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "she",
        "that",
        "the",
        "their",
        "this",
        "to",
        "was",
        "were",
        "which",
        "who",
        "with",
        "what",
        "when",
        "where",
        "how",
        "did",
        "does",
        "do",
        "you",
        "your",
        "me",
        "my",
        "we",
        "our",
        "they",
        "them",
    ]
)


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


class BM25:
    """`BM25(docs).top_k(query, k)` -> document indices, best first (ties by index, so deterministic)."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75):
        self.n = len(docs)
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lengths = np.zeros(self.n, dtype=np.float64)
        for i, doc in enumerate(docs):
            counts = Counter(tokenize(doc))
            lengths[i] = sum(counts.values())
            for term, tf in counts.items():
                postings[term].append((i, tf))
        norm = k1 * (1 - b + b * lengths / max(1.0, lengths.mean()))
        self._index: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for term, rows in postings.items():
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            tf = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
            idf = np.log(1 + (self.n - len(rows) + 0.5) / (len(rows) + 0.5))
            self._index[term] = (ids, idf * tf * (k1 + 1) / (tf + norm[ids]))

    def scores(self, query: str) -> np.ndarray:
        scores = np.zeros(self.n, dtype=np.float64)
        for term in set(tokenize(query)):
            if term in self._index:
                ids, weights = self._index[term]
                scores[ids] += weights
        return scores

    def top_k(self, query: str, k: int) -> list[int]:
        scores = self.scores(query)
        order = np.lexsort((np.arange(self.n), -scores))[:k]
        return [int(i) for i in order if scores[i] > 0]
