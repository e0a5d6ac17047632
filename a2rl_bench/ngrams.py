"""Word tokens and n-grams: the one text matching that the contamination guard (`a2rl_bench.benchmarks.contamination`,
held-out items in a task's visible data) and the post-run leak audit (`a2rl_bench.summary.leak_audit`, hidden items in
what the agent wrote) share. Tokens are lower-cased `\\w+` runs, so whitespace, punctuation and case do not matter.
"""

from __future__ import annotations

import copy
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


_WORD_ASCII = re.compile(rb"[0-9a-z_]+")
_TRAILING_WORD = re.compile(r"\w*\Z")
_TRAILING_WORD_ASCII = re.compile(rb"[0-9A-Za-z_]*\Z")
_HASH_BASE = 0x9E3779B97F4A7C15


class StreamMatcher:
    """Finds hidden texts in a stream of any length, fed in chunks of bytes or text (`feed`), holding only a few
    tokens between chunks: the agent's whole output can be searched while it is written, without keeping it.

    A text counts as found when `n` of its tokens appear in a row (an **n-gram**), or, for a text shorter than
    `n` tokens but at least `min_short_tokens` long, when all its tokens appear in a row (**exact**): the leak
    audit's matching. Vectorised: each chunk's tokens become ids (0 = in no hidden text), every window's
    polynomial hash (mod 2^64) is looked up among the hidden windows' hashes in one step, and only the rare
    candidates are compared token by token. Where every hidden token is ASCII, bytes are tokenised as ASCII
    words (`[0-9a-z_]+` after lower-casing): the same tokens as `tokens()` on ASCII text, and never fewer matches.
    """

    def __init__(self, texts: list[str], n: int = DEFAULT_NGRAM, min_short_tokens: int = 4):
        import numpy as np

        self.n = n
        windows: dict[tuple[str, ...], tuple[int, str]] = {}
        for i, text in enumerate(texts):
            words = tuple(tokens(text))
            if len(words) < min_short_tokens:
                continue
            if len(words) < n:
                windows.setdefault(words, (i, "exact"))
            for j in range(len(words) - n + 1):
                windows.setdefault(words[j : j + n], (i, "ngram"))
        vocab = sorted({w for window in windows for w in window})
        self.ascii = all(w.isascii() for w in vocab)
        self._ids: dict = {(w.encode() if self.ascii else w): k + 1 for k, w in enumerate(vocab)}
        self._words = [""] + vocab
        self._windows: dict[int, dict[tuple[int, ...], tuple[int, str]]] = {}
        for window, hit in windows.items():
            self._windows.setdefault(len(window), {})[tuple(self._ids[w.encode() if self.ascii else w]
                                                            for w in window)] = hit  # fmt: skip
        self._hashes = {k: np.unique(np.array([self._hash(ids) for ids in by], dtype=np.uint64))
                        for k, by in self._windows.items()}  # fmt: skip
        self._keep = max(self._windows, default=1) - 1
        self._carry = np.zeros(0, dtype=np.uint64)  # ids of the last tokens, for windows across chunks
        self._partial: bytes | str = b"" if self.ascii else ""
        self.found: dict[int, tuple[str, str]] = {}
        """item index -> (kind, evidence) of its first occurrence."""
        self.bytes_fed = 0

    def fresh(self) -> StreamMatcher:
        """A matcher for another stream, sharing this one's index of the hidden texts (built once)."""
        other = copy.copy(self)
        other._carry, other._partial = self._carry[:0], self._partial[:0]
        other.found, other.bytes_fed = {}, 0
        return other

    @staticmethod
    def _hash(ids: tuple[int, ...]) -> int:
        h = 0
        for x in ids:
            h = (h * _HASH_BASE + x) & 0xFFFFFFFFFFFFFFFF
        return h

    def feed(self, data: bytes | str) -> list[int]:
        """Search the next chunk (bytes are decoded as UTF-8, bad bytes replaced); returns the items found for the
        first time in it. A word cut by the chunk's end waits for the next chunk."""
        if isinstance(data, str):
            self.bytes_fed += len(data)
            data = data.encode("utf-8", "surrogatepass") if self.ascii else data
        else:
            self.bytes_fed += len(data)
            data = data if self.ascii else data.decode("utf-8", "replace")
        text = self._partial + data
        tail = text[-257:]  # one word longer than this is cut in two: no hidden word is that long
        cut = len(text) - len(tail) + (_TRAILING_WORD_ASCII if self.ascii else _TRAILING_WORD).search(tail).start()
        self._partial = text[cut:]
        return self._scan(text[:cut])

    def close(self) -> list[int]:
        """The end of the stream: the last word counts too."""
        last, self._partial = self._partial, self._partial[:0]
        return self._scan(last)

    def _scan(self, text: bytes | str) -> list[int]:
        import numpy as np

        if not self._windows:
            return []
        words = _WORD_ASCII.findall(text.lower()) if self.ascii else _WORD.findall(text.lower())
        get = self._ids.get
        ids = np.concatenate([self._carry, np.array([get(w, 0) for w in words], dtype=np.uint64)])
        self._carry = ids[len(ids) - min(self._keep, len(ids)) :]
        new: list[int] = []
        h = ids
        for k in range(1, min(self._keep + 1, len(ids)) + 1):  # h[i]: the hash of the k tokens from i
            if k > 1:
                h = h[:-1] * np.uint64(_HASH_BASE) + ids[k - 1 :]
            if (hashes := self._hashes.get(k)) is None:
                continue
            at = np.searchsorted(hashes, h)
            at[at == len(hashes)] = 0
            for start in np.flatnonzero(hashes[at] == h):
                window = tuple(int(x) for x in ids[start : start + k])
                hit = self._windows[k].get(window)
                if hit is not None and hit[0] not in self.found:
                    self.found[hit[0]] = (hit[1], " ".join(self._words[x] for x in window))
                    new.append(hit[0])
        return new
