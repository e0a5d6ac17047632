"""Contamination guard: no validation or hidden-test item may appear in a task's agent-visible data.

Two checks, on word tokens (lower-cased `\\w+` runs, so whitespace, punctuation and case do not matter):
- **exact**: a held-out field equals the same field of a visible item after normalisation;
- **n-gram**: a held-out item shares a run of `n` consecutive tokens (default 13, the usual
  contamination window since GPT-3) with any checked field of a visible item.

`check_contamination(data)` raises `ContaminationError` naming the items; call it at the end of a task's
`load()`. `drop_contaminated(pool, held_out)` is for tasks whose training data is a pool that may be
filtered (the dropped rows are reported, not hidden).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Literal, NamedTuple

from a2rl_bench.ngrams import DEFAULT_NGRAM, ngrams, normalize_text
from a2rl_bench.benchmarks.base import Item, TaskData

DEFAULT_FIELDS = ("question", "answer")


class ContaminationHit(NamedTuple):
    """One held-out item found in the agent-visible data."""

    held_out_id: str
    held_out_split: str
    visible_id: str
    kind: Literal["exact", "ngram"]
    evidence: str
    """The shared n-gram, or the start of the identical normalised text."""

    def __str__(self) -> str:
        return f"{self.held_out_split} item {self.held_out_id} ~ visible {self.visible_id} ({self.kind}: {self.evidence!r})"


class ContaminationError(RuntimeError):
    """Held-out items appear in agent-visible data; the task's data must not be used as it is."""

    def __init__(self, task: str, hits: Sequence[ContaminationHit]):
        self.hits = list(hits)
        shown = "\n  ".join(str(h) for h in self.hits[:20])
        more = f"\n  ... and {len(self.hits) - 20} more" if len(self.hits) > 20 else ""
        held = sorted({(h.held_out_split, h.held_out_id) for h in self.hits})
        super().__init__(
            f"{task}: {len(held)} held-out item(s) appear in the agent-visible training data "
            f"({len(self.hits)} match(es)):\n  {shown}{more}"
        )


def _texts(item: Item, fields: Sequence[str]) -> Iterator[tuple[str, str]]:
    for name in fields:
        value = item.get(name)
        if isinstance(value, str) and value.strip():
            yield name, value


class _HeldOutIndex:
    """Normalised fields and n-grams of the held-out items, for lookups by visible items."""

    def __init__(self, held_out: Mapping[str, Iterable[Item]], fields: Sequence[str], n: int):
        self.fields, self.n = fields, n
        self.exact: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.grams: dict[str, list[tuple[str, str]]] = {}
        for split, items in held_out.items():
            for item in items:
                owner = (split, str(item["id"]))
                for name, text in _texts(item, fields):
                    self.exact.setdefault((name, normalize_text(text)), []).append(owner)
                    for gram in set(ngrams(text, n)):
                        self.grams.setdefault(gram, []).append(owner)

    def hits(self, item: Item) -> list[ContaminationHit]:
        found: dict[tuple[str, str], ContaminationHit] = {}
        visible_id = str(item.get("id", "?"))
        for name, text in _texts(item, self.fields):
            for split, held_id in self.exact.get((name, normalize_text(text)), []):
                found[(split, held_id)] = ContaminationHit(
                    held_id, split, visible_id, "exact", normalize_text(text)[:80]
                )
            for gram in ngrams(text, self.n):
                for split, held_id in self.grams.get(gram, []):
                    found.setdefault((split, held_id), ContaminationHit(held_id, split, visible_id, "ngram", gram))
        return list(found.values())


def find_contamination(
    visible: Iterable[Item],
    held_out: Mapping[str, Iterable[Item]],
    fields: Sequence[str] = DEFAULT_FIELDS,
    n: int = DEFAULT_NGRAM,
) -> list[ContaminationHit]:
    """Every (held-out item, visible item) pair that matches exactly or shares an n-gram.

    Args:
        visible: Agent-visible items (each with an `id`).
        held_out: Split name -> items the agent must never see (validation, test).
        fields: Item fields compared; n-grams are matched across fields (a hidden question quoted in a
            visible answer counts), exact matches only within the same field.
        n: N-gram length in word tokens.
    """
    index = _HeldOutIndex(held_out, fields, n)
    return [hit for item in visible for hit in index.hits(item)]


def check_contamination(
    data: TaskData,
    task: str = "task",
    fields: Sequence[str] = DEFAULT_FIELDS,
    n: int = DEFAULT_NGRAM,
    allow: Collection[tuple[str, str]] = (),
) -> TaskData:
    """Raise `ContaminationError` if a validation or test item appears in `data.train`; else return `data`.

    Validation items count as held out too: they are the agent's feedback signal, and training on them
    would turn validation scores into training scores.

    Args:
        allow: `(held_out_id, visible_id)` pairs a person has reviewed and found to be different items
            that merely share a phrase; keep the reason next to the list where it is defined.
    """
    hits = find_contamination(data.train, {"validation": data.validation, "test": data.test}, fields, n)
    hits = [h for h in hits if (h.held_out_id, h.visible_id) not in allow]
    if hits:
        raise ContaminationError(task, hits)
    return data


def drop_contaminated(
    pool: Iterable[Item],
    held_out: Mapping[str, Iterable[Item]],
    fields: Sequence[str] = DEFAULT_FIELDS,
    n: int = DEFAULT_NGRAM,
    limit: int | None = None,
) -> tuple[list[Item], list[ContaminationHit]]:
    """The pool's items that match no held-out item (the first `limit` of them, if given), and the
    matches of the items left out."""
    index = _HeldOutIndex(held_out, fields, n)
    kept: list[Item] = []
    dropped: list[ContaminationHit] = []
    for item in pool:
        if limit is not None and len(kept) >= limit:
            break
        hits = index.hits(item)
        if hits:
            dropped.extend(hits)
        else:
            kept.append(item)
    return kept, dropped
