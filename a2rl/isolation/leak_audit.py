"""Post-run leak audit: does any hidden item's text appear in what the agent wrote or said?

After a session, the workspace (everything the agent could write) and its transcripts are searched for the
hidden test (and validation) items, with the contamination guard's matching (`a2rl.ngrams`, which
`benchmarks.contamination` shares): an **exact** match of a whole item's normalised text, or a shared run of
`n` word tokens (**n-gram**, 13 by default). A hit means the agent held a hidden item, whatever the route: a leak through the sandbox, the
driver LLM reciting a public benchmark, or a task whose training data overlaps its test set.

Time is bounded on large workspaces: binary files (a NUL byte near the start, or a weights suffix), files over
`max_file_bytes`, and anything past `max_total_bytes` or `max_seconds` are skipped and counted, never read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, Field

from a2rl.isolation import safefs
from a2rl.ngrams import DEFAULT_NGRAM, tokens
from a2rl.workspace import RunPaths

BINARY_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npy", ".npz", ".pyc", ".so",
                   ".arrow", ".parquet", ".zip", ".gz", ".tar", ".png", ".jpg", ".pdf")  # fmt: skip
MAX_EXAMPLES = 20


class LeakHit(BaseModel):
    """One hidden item found in one file."""

    item: int
    """Index of the item in `hidden_items`."""
    path: str
    kind: Literal["exact", "ngram"]
    evidence: str
    """The shared n-gram, or the start of the item's normalised text."""


class LeakReport(BaseModel):
    """What the audit read, what it skipped, and which hidden items it found where."""

    n_hidden_items: int
    leaked_items: int = 0
    """Distinct hidden items found at least once."""
    files_scanned: int = 0
    bytes_scanned: int = 0
    files_skipped: int = 0
    """Binary, too large, unreadable, or past the byte or time budget."""
    truncated: bool = False
    """The byte or time budget ran out before every file was read."""
    seconds: float = 0.0
    hits_by_path: dict[str, int] = Field(default_factory=dict)
    """Path -> distinct hidden items found in it."""
    examples: list[LeakHit] = Field(default_factory=list)
    """Up to MAX_EXAMPLES hits, one per item first."""

    @property
    def clean(self) -> bool:
        return self.leaked_items == 0


class _Index:
    """Hidden items by n-gram; items shorter than n tokens by their whole token sequence."""

    def __init__(self, items: list[str], n: int):
        self.n = n
        self.grams: dict[tuple[str, ...], int] = {}
        self.short: dict[tuple[str, ...], int] = {}
        for i, text in enumerate(items):
            words = tuple(tokens(text))
            if not words:
                continue
            if len(words) < n:
                self.short.setdefault(words, i)
            for j in range(len(words) - n + 1):
                self.grams.setdefault(words[j : j + n], i)
        self.short_lengths = sorted({len(w) for w in self.short})

    def find(self, text: str) -> Iterator[tuple[int, Literal["exact", "ngram"], str]]:
        words = tokens(text)
        for j in range(len(words) - self.n + 1):
            gram = tuple(words[j : j + self.n])
            if gram in self.grams:
                yield self.grams[gram], "ngram", " ".join(gram)
        for k in self.short_lengths:  # a short item counts only as a whole (k tokens in a row)
            for j in range(len(words) - k + 1):
                window = tuple(words[j : j + k])
                if window in self.short:
                    yield self.short[window], "exact", " ".join(window)


def audit_leaks(
    workspace: Path,
    transcripts: list[Path],
    hidden_items: list[str],
    n: int = DEFAULT_NGRAM,
    max_file_bytes: int = 32 * 1024**2,
    max_total_bytes: int = 1024**3,
    max_seconds: float = 120.0,
    min_short_tokens: int = 4,
    exclude: tuple[str, ...] = (),
) -> LeakReport:
    """Search the workspace's text files and the transcripts for hidden items.

    Args:
        workspace: The run's workspace; every file under it is a candidate (symlinks are not followed).
        transcripts: Extra files to search (agent log, LLM transcript, tool calls), read first.
        hidden_items: Texts the agent must never have held (hidden test and validation questions).
        n: N-gram length in word tokens.
        min_short_tokens: Items shorter than `n` tokens are matched whole, but only from this length up: a
            two-word item would match everywhere.
        exclude: Workspace sub-paths not searched: what the harness itself put there (training data, base
            model), which the contamination guard checked when the task's data was built.
    """
    start = time.monotonic()
    index = _Index([t if len(tokens(t)) >= min_short_tokens else "" for t in hidden_items], n)
    report = LeakReport(n_hidden_items=len(hidden_items))
    found: set[int] = set()
    seen_content: set[str] = set()
    sources = [(Path(t), _read_chunks(Path(t), max_file_bytes)) for t in transcripts]
    skip = {str(PurePosixPath(e)) for e in exclude}
    sources += [(Path(workspace, entry.rel), _read_whole(entry, max_file_bytes))
                for entry in _files(Path(workspace), skip)]
    for path, chunks in sources:
        if report.bytes_scanned > max_total_bytes or time.monotonic() - start > max_seconds:
            report.truncated = True
            report.files_skipped += 1
            continue
        in_file: set[int] = set()
        read_any = False
        for text in chunks:
            if report.bytes_scanned > max_total_bytes or time.monotonic() - start > max_seconds:
                report.truncated = True
                break
            digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
            if digest in seen_content:  # a file copied into every checkpoint is read once
                continue
            seen_content.add(digest)
            read_any = True
            report.bytes_scanned += len(text)
            for item, kind, evidence in index.find(text):
                if item in in_file:
                    continue
                in_file.add(item)
                if item not in found and len(report.examples) < MAX_EXAMPLES:
                    report.examples.append(LeakHit(item=item, path=str(path), kind=kind, evidence=evidence[:200]))
                found.add(item)
        if chunks is _UNREADABLE:
            report.files_skipped += 1
        elif read_any:
            report.files_scanned += 1
        if in_file:
            report.hits_by_path[str(path)] = len(in_file)
    report.leaked_items = len(found)
    report.seconds = round(time.monotonic() - start, 3)
    return report


def hidden_texts(items: Iterable[dict], fields: tuple[str, ...] = ("question",)) -> list[str]:
    """The texts of task items to audit for (by default the question: answers are often a bare number)."""
    return [str(item[f]) for item in items for f in fields if isinstance(item.get(f), str) and item[f].strip()]


def audit_run(paths: RunPaths, hidden_items: Iterable[dict]) -> LeakReport:
    """A finished run's audit: its workspace (less the data and models the harness put there) and the agent's
    log and transcripts, for `hidden_items` (the task's validation and test items); writes leak_audit.json."""
    h = paths.harness_dir
    report = audit_leaks(paths.workspace, [h / "agent.log", h / "transcript.jsonl", h / "tool_calls.jsonl"],
                         hidden_texts(hidden_items), exclude=("data", "models"))  # fmt: skip
    (h / "leak_audit.json").write_text(report.model_dump_json(indent=1))
    return report


_UNREADABLE: list[str] = []


def _files(root: Path, skip: set[str]) -> Iterator[safefs.Entry]:
    """Regular files under `root` but not under `skip`, walked without following links (even swapped-in ones)."""
    if not root.is_dir() or root.is_symlink():
        return
    for entry in safefs.walk(root, prune=lambda e: e.rel in skip):
        if entry.is_file and entry.rel not in skip:
            yield entry


def _read_whole(entry: safefs.Entry, max_bytes: int) -> list[str]:
    """The file's text as one chunk; _UNREADABLE for binary, oversized, unreadable or non-regular files."""
    if PurePosixPath(entry.name).suffix.lower() in BINARY_SUFFIXES:
        return _UNREADABLE
    data = safefs.read_file(entry, max_bytes)
    if data is None:
        return _UNREADABLE
    return _UNREADABLE if b"\x00" in data[:8192] else [data.decode("utf-8", errors="replace")]


def _read_chunks(path: Path, chunk_bytes: int) -> Iterator[str]:
    """A transcript of any size, in chunks that overlap by a few KB so that no item is cut in two."""
    overlap = 16 * 1024
    try:
        with path.open("rb") as f:
            tail = b""
            while data := f.read(chunk_bytes):
                yield (tail + data).decode("utf-8", errors="replace")
                tail = data[-overlap:]
    except OSError:
        return


__all__ = ["LeakHit", "LeakReport", "audit_leaks", "audit_run", "hidden_texts"]
