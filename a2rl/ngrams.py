"""Word tokens and n-grams: the one text matching that the contamination guard (`benchmarks.contamination`,
held-out items in a task's visible data) and the post-run leak audit (`a2rl.isolation.leak_audit`, hidden items in what
the agent wrote) share. Tokens are lower-cased `\\w+` runs, so whitespace, punctuation and case do not matter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

DEFAULT_NGRAM = 13
"""The usual contamination window since GPT-3."""

_WORD = re.compile(r"\w+")


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens: the unit both checks compare."""
    return _WORD.findall(text.lower())


def normalize_text(text: str) -> str:
    """Text with case, punctuation and whitespace differences removed.

    >>> normalize_text("  Hello,   World!\\n") == normalize_text("hello world")
    True
    """
    return " ".join(tokens(text))


def ngrams(text: str, n: int = DEFAULT_NGRAM) -> Iterator[str]:
    """Every run of `n` consecutive tokens, joined by spaces (texts shorter than `n` give none)."""
    words = tokens(text)
    for i in range(len(words) - n + 1):
        yield " ".join(words[i : i + n])
