"""Post-run leak audit: does any hidden item's text appear in what the agent wrote or said?

After a session, everything the agent wrote (the workspace, its file names included) and what it said (its
output, transcripts and tool calls) is searched for the hidden test (and validation) items, with the
contamination guard's matching (`a2rl_bench.ngrams`): an **exact** match of a whole item's normalised text, or a shared
run of `n` word tokens (**n-gram**, 13 by default). A hit means the agent held a hidden item, whatever the route: a
leak through the sandbox, the driver LLM reciting a public benchmark, or a task whose training data overlaps its
test set.

The verdict is three-valued, and "not found" means everything was read:
- **found**: at least one hidden item, with where;
- **not found**: every byte was read (each file streamed whole through a `StreamMatcher`, whatever its size or
  kind; the agent's dropped output through the matcher while it was written, `a2rl_bench.capture.agent_log`);
- **incomplete**: something was not read (the time budget ran out, a file could not be opened, output was
  dropped unsearched): `unread` says what, and no "clean" is claimed.
What is read as text is the bytes as written (UTF-8): the tensor data of well-formed safetensors files is not text
and is counted apart (`tensor_bytes`). Besides, each file's first 16 MiB, the file names and the agent's output are
normalised and decoded (`a2rl_bench.isolation.leak_decode`: look-alike letters, invisible characters, joiners, reversed
text and word order, rot13 and Caesar shifts, one-byte XOR, URL, UTF-16/32, character codes as numbers or
integers, compressed streams anywhere in the bytes, zip members, PNG text chunks, Python bytes literals, base64,
base32, base85, hex) and searched in that form too, every file's normal form also concatenated with the others and
interleaved word by word with the one before it (an item split over two files); `decoded` counts what was
decoded. The integer tensors of safetensors files are viewed as character codes; float tensors are not decoded.
"""

from __future__ import annotations

import hashlib
import os
from itertools import zip_longest
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, Field

from a2rl_bench.isolation import safefs
from a2rl_bench.isolation.leak_decode import MAX_VIEW_BYTES, Views, normalize
from a2rl_bench.ngrams import DEFAULT_NGRAM, StreamMatcher, tokens
from a2rl_bench.capture.agent_log import read_agent_log_records
from a2rl_bench.workspace import RunPaths

MAX_EXAMPLES = 20
INTERLEAVE_WORDS = 20_000
"""Words of each file interleaved with the next file's (an item written one word per file, alternately)."""
MAX_UNREAD_LISTED = 50
CHUNK = 1 << 20

Verdict = Literal["found", "not found", "incomplete"]


class LeakHit(BaseModel):
    """One hidden item found in one file."""

    item: int
    """Index of the item in `hidden_items`."""
    path: str
    kind: Literal["exact", "ngram"]
    evidence: str
    """The shared n-gram, or the item's normalised text."""


class LeakReport(BaseModel):
    """What the audit read, what it did not, and which hidden items it found where."""

    n_hidden_items: int
    verdict: Verdict = "not found"
    leaked_items: int = 0
    """Distinct hidden items found at least once."""
    files_scanned: int = 0
    bytes_scanned: int = 0
    files_skipped: int = 0
    """Files not (fully) read: unreadable, or past the time or byte budget (then `truncated`)."""
    unread: list[str] = Field(default_factory=list)
    """What was not read and why (the first MAX_UNREAD_LISTED)."""
    truncated: bool = False
    """The time or byte budget ran out before everything was read."""
    tensor_bytes: int = 0
    """Tensor data of well-formed safetensors files: not text, not read (their headers are)."""
    output_bytes_searched_while_written: int = 0
    """Agent output dropped from the capped agent.log, but searched as it was written."""
    seconds: float = 0.0
    hits_by_path: dict[str, int] = Field(default_factory=dict)
    """Path -> distinct hidden items found in it."""
    examples: list[LeakHit] = Field(default_factory=list)
    """Up to MAX_EXAMPLES hits, one per item first."""
    decoded: dict[str, int] = Field(default_factory=dict)
    """What the audit decoded before matching, by kind (base64, hex, gzip, zlib, url, utf-16): blobs or files."""
    viewed_files: int = 0
    """Files (and streams) also searched normalised, reversed, rot13 and decoded."""
    viewed_in_part: int = 0
    """Of those, files larger than the viewed part (16 MiB): only their start was normalised and decoded."""

    @property
    def clean(self) -> bool:
        """Read everything and found nothing (an incomplete audit is never clean)."""
        return self.verdict == "not found"

    def summary_line(self) -> str:
        """The report's one line on the audit."""
        n = self.n_hidden_items
        if self.verdict == "found":
            more = " (and not everything was read)" if self.truncated or self.unread else ""
            return (f"Leak audit: FOUND {self.leaked_items} of {n} hidden validation/test texts (questions, reference "
                    f"answers, solutions) in what the agent wrote or said{more} (harness/leak_audit.json).")  # fmt: skip
        if self.verdict == "incomplete":
            return (f"Leak audit: INCOMPLETE, no verdict: 0 of {n} hidden items found in what was read, but "
                    f"{self.files_skipped} file(s) or streams were not read ({'; '.join(self.unread[:2])}; "
                    "harness/leak_audit.json).")  # fmt: skip
        tensors = f"; tensor data of safetensors files ({self.tensor_bytes / 1e9:.1f} GB) is not text and was not read" \
            if self.tensor_bytes else ""  # fmt: skip
        decoded = ", ".join(f"{k} {v}" for k, v in sorted(self.decoded.items())) or "nothing encoded found"
        return (f"Leak audit: not found: 0 of {n} hidden items in everything the agent wrote or said "
                f"({self.files_scanned} files, {self.bytes_scanned / 1e6:.1f} MB{tensors}; also normalised, reversed "
                f"and decoded: {decoded}; harness/leak_audit.json).")


class _Audit:
    """One audit's running state: the matcher per source, the report, the budget."""

    def __init__(self, items: list[str], n: int, min_short_tokens: int, max_total_bytes: int | None,
                 max_seconds: float):  # fmt: skip
        self.report = LeakReport(n_hidden_items=len(items))
        self.start = time.monotonic()
        self.max_total_bytes, self.max_seconds = max_total_bytes, max_seconds
        self.found: set[int] = set()
        self._matcher = StreamMatcher(items, n, min_short_tokens)  # the index, built once
        normal = [normalize(t) for t in items]  # for normalised views: the same index where tokens agree
        same = all(a == b or tokens(a) == tokens(b) for a, b in zip(items, normal))
        self._normal = self._matcher if same else StreamMatcher(normal, n, min_short_tokens)
        self.across = self._normal.fresh()  # every file's normal form, one after the other
        self._previous: list[str] = []  # the last file's words, to interleave with the next one's
        self.seen: dict[int, list[bytes]] = {}  # size -> sha256 of files of that size already read

    def over_budget(self) -> bool:
        over = time.monotonic() - self.start > self.max_seconds or (
            self.max_total_bytes is not None and self.report.bytes_scanned > self.max_total_bytes)
        self.report.truncated |= over
        return over

    def unread(self, what: str) -> None:
        self.report.files_skipped += 1
        if len(self.report.unread) < MAX_UNREAD_LISTED:
            self.report.unread.append(what)

    def matcher(self) -> StreamMatcher:
        return self._matcher.fresh()

    def normal_matcher(self) -> StreamMatcher:
        return self._normal.fresh()

    def record(self, path: str, found: dict[int, tuple[str, str]]) -> None:
        if not found:
            return
        self.report.hits_by_path[path] = self.report.hits_by_path.get(path, 0) + len(found)
        for item, (kind, evidence) in sorted(found.items()):
            if item not in self.found and len(self.report.examples) < MAX_EXAMPLES:
                self.report.examples.append(LeakHit(item=item, path=path, kind=kind, evidence=evidence[:200]))
            self.found.add(item)

    def views(self, path: str, data: bytes, size: int) -> None:
        """Search `data` (a file's start) normalised, reversed, rot13 and decoded; its normal form also joins
        the concatenation of all files and is interleaved word by word with the previous file's."""
        views = Views()
        for kind, text in views.of(data):
            if self.over_budget():
                self.unread(f"{path} (normalised and decoded views: the audit's budget ran out)")
                break
            m = self.normal_matcher()
            m.feed(text)
            m.close()
            self.record(f"{path} ({kind})", m.found)
            if kind == "normalised":
                self.across.feed(text + "\n")
                words = text.split()[:INTERLEAVE_WORDS]
                if self._previous and words:
                    m = self.normal_matcher()
                    m.feed(" ".join(w for pair in zip_longest(self._previous, words, fillvalue="") for w in pair))
                    m.close()
                    self.record(f"{path} (word by word with the file before it)", m.found)
                self._previous = words
        for kind, count in views.decoded.items():
            self.report.decoded[kind] = self.report.decoded.get(kind, 0) + count
        self.report.viewed_files += 1
        self.report.viewed_in_part += size > MAX_VIEW_BYTES

    def finish_views(self) -> None:
        self.across.close()
        self.record("(all files concatenated)", self.across.found)

    def stream(self, path: str, chunks: Iterator[bytes]) -> bool:
        """Search one file's chunks; False (and listed as unread) when the budget ran out before its end."""
        m = self.matcher()
        whole = True
        for data in chunks:
            if self.over_budget():
                whole = False
                break
            m.feed(data)
            self.report.bytes_scanned += len(data)
        m.close()
        self.record(path, m.found)
        if whole:
            self.report.files_scanned += 1
        else:
            self.unread(f"{path} (the audit's time or byte budget ran out)")
        return whole


def audit_leaks(
    workspace: Path,
    transcripts: list[Path],
    hidden_items: list[str],
    n: int = DEFAULT_NGRAM,
    max_total_bytes: int | None = None,
    max_seconds: float = 3600.0,
    min_short_tokens: int = 4,
    exclude: tuple[str, ...] = (),
    agent_log: Path | None = None,
) -> LeakReport:
    """Search the workspace (every file, and every file's name) and the transcripts for hidden items.

    Args:
        workspace: The run's workspace; every file under it is read (symlinks are not followed).
        transcripts: Harness-side files to search whole (LLM transcript, tool calls), read first.
        hidden_items: Texts the agent must never have held (hidden test and validation questions).
        n: N-gram length in word tokens.
        max_total_bytes, max_seconds: The budget; past it the verdict is "incomplete" (never "not found").
        min_short_tokens: Items shorter than `n` tokens are matched whole, but only from this length up: a
            two-word item would match everywhere.
        exclude: Workspace sub-paths not searched: what the harness itself put there (training data, base
            model), which the contamination guard checked when the task's data was built.
        agent_log: The capped agent log: the file is read like a transcript, and what was dropped from it counts
            as read only where its capture searched every byte (`harness/agent-log.json`).
    """
    audit = _Audit(hidden_items, n, min_short_tokens, max_total_bytes, max_seconds)
    if agent_log is not None:
        _agent_output(audit, agent_log)
    for path in transcripts:
        if not path.exists():
            continue
        _stream_file(audit, path)
    skip = {str(PurePosixPath(e)) for e in exclude}
    names, pending = audit.matcher(), []  # file names and link targets are what the agent wrote too
    normal_names = audit.normal_matcher()
    listed_past_budget = 0
    for entry in _entries(audit, Path(workspace), skip):
        if audit.over_budget():  # files past the budget are listed as unread, up to a point
            listed_past_budget += 1
            if listed_past_budget > 100_000:
                audit.unread(f"{workspace}/{entry.rel} and every name after it (the audit's budget ran out)")
                break
        pending.append(entry.rel.replace("/", " "))
        if entry.is_link:
            pending.append(safefs.read_link(entry) or "")
        elif entry.is_file:
            _workspace_file(audit, Path(workspace), entry)
        if len(pending) > 10_000:  # fed in batches: a feed has a fixed cost, millions of names are cheap
            names.feed("\n".join(pending) + "\n")
            normal_names.feed(normalize("\n".join(pending)) + "\n")
            pending.clear()
    names.feed("\n".join(pending))
    names.close()
    normal_names.feed(normalize("\n".join(pending)))
    normal_names.close()
    audit.record(f"{workspace} (file names)", names.found)
    audit.record(f"{workspace} (file names, normalised)", normal_names.found)
    audit.finish_views()
    report = audit.report
    report.leaked_items = len(audit.found)
    report.verdict = "found" if audit.found else "incomplete" if report.files_skipped else "not found"
    report.seconds = round(time.monotonic() - audit.start, 3)
    return report


def _agent_output(audit: _Audit, log: Path) -> None:
    """What the agent printed: the capped file, and what each capture dropped (searched as it was written)."""
    records = read_agent_log_records(log.parent) if log.exists() else []
    for i, rec in enumerate(records):
        audit.record(f"{log} (all {rec.total_bytes} bytes of session output {i + 1}, searched as written)",
                     {int(k): v for k, v in rec.found.items()} if rec.scanned else {})  # fmt: skip
        if rec.dropped_bytes and rec.scanned and rec.complete:
            audit.report.output_bytes_searched_while_written += rec.dropped_bytes
        elif rec.dropped_bytes or not rec.complete:
            why = "not searched" if not rec.scanned else "its capture was cut short by the harness's end"
            audit.unread(f"{log}: {rec.dropped_bytes or 'some'} bytes of session output {i + 1} dropped ({why})")
    if log.exists():
        _stream_file(audit, log)


def _stream_file(audit: _Audit, path: Path) -> None:
    """A harness file (transcript, log), read whole without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        audit.unread(f"{path} ({e.strerror})")
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            if audit.stream(str(path), _chunks(fd)):
                audit.views(str(path), os.pread(fd, MAX_VIEW_BYTES, 0), os.fstat(fd).st_size)
        else:
            audit.unread(f"{path} (not a regular file)")
    finally:
        os.close(fd)


def _workspace_file(audit: _Audit, root: Path, entry: safefs.Entry) -> None:
    path = str(root / entry.rel)
    if audit.over_budget():
        audit.unread(f"{path} (the audit's time or byte budget ran out)")
        return
    fd = safefs.open_file(entry)
    if fd is None:
        audit.unread(f"{path} (gone, swapped or unreadable when opened)")
        return
    try:
        size = os.fstat(fd).st_size
        if size in audit.seen and _sha256(_chunks(fd)) in audit.seen[size]:  # a copy of a file already read
            audit.report.files_scanned += 1
            return
        text_end = _safetensors_text_end(fd, size) if entry.name.endswith(".safetensors") else size
        audit.report.tensor_bytes += size - text_end
        digest = hashlib.sha256()
        whole = audit.stream(path, _hashed(_chunks(fd, text_end), digest))
        if whole and text_end == size:
            audit.seen.setdefault(size, []).append(digest.digest())
        if whole:
            audit.views(path, os.pread(fd, min(text_end, MAX_VIEW_BYTES), 0), text_end)
        if whole and text_end < size and (codes := _integer_tensors(fd, text_end)):
            audit.views(f"{path} (integer tensors)", codes, len(codes))
    finally:
        os.close(fd)


INTEGER_DTYPES = {"I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64"}


def _integer_tensors(fd: int, data_start: int) -> bytes:
    """The data of a safetensors file's integer tensors (up to MAX_VIEW_BYTES in all): weights are floats, a
    tensor of integers may be character codes. Each one's bytes as stored (little-endian), one after another."""
    import json

    try:
        header = json.loads(os.pread(fd, data_start - 8, 8))
    except ValueError:
        return b""
    out, left = [], MAX_VIEW_BYTES
    for name, info in header.items() if isinstance(header, dict) else ():
        if name == "__metadata__" or not isinstance(info, dict) or info.get("dtype") not in INTEGER_DTYPES:
            continue
        begin, end = info.get("data_offsets", (0, 0))
        n = min(int(end) - int(begin), left)
        if n > 0:
            out.append(os.pread(fd, n, data_start + int(begin)))
            left -= n
        if left <= 0:
            break
    return b"\n".join(out)


def _safetensors_text_end(fd: int, size: int) -> int:
    """Where the text of a safetensors file ends: after its header when the header is well formed (read in
    bounded memory, as the grader reads it), the rest being tensor data; else the whole file is text to read."""
    from a2rl_bench.grading.errors import SubmissionRejected
    from a2rl_bench.grading.weights import MAX_SAFETENSORS_HEADER, parse_safetensors_header

    raw = os.pread(fd, 8, 0)
    header_len = int.from_bytes(raw, "little") if len(raw) == 8 else 0
    if not 0 < header_len <= min(MAX_SAFETENSORS_HEADER, size - 8):
        return size
    try:
        parse_safetensors_header(os.pread(fd, header_len, 8), size - 8 - header_len, "")
    except SubmissionRejected:
        return size
    return 8 + header_len


def _sha256(chunks: Iterator[bytes]) -> bytes:
    h = hashlib.sha256()
    for block in chunks:
        h.update(block)
    return h.digest()


def _hashed(chunks: Iterator[bytes], digest) -> Iterator[bytes]:
    for block in chunks:
        digest.update(block)
        yield block


def _chunks(fd: int, end: int | None = None) -> Iterator[bytes]:
    """The file's bytes from 0 to `end` (or its end), a chunk at a time (the caller closes `fd`)."""
    offset = 0
    while end is None or offset < end:
        data = os.pread(fd, CHUNK if end is None else min(CHUNK, end - offset), offset)
        if not data:
            return
        offset += len(data)
        yield data


ANSWER_FIELDS = ("answer", "solution", "canonical_solution", "reference", "reference_answer", "output")
"""Reference answers and solutions: audited too, where they are long enough to be told from chance (n tokens)."""


def hidden_texts(items: Iterable[dict], fields: tuple[str, ...] = ("question",),
                 answers: tuple[str, ...] = ANSWER_FIELDS, n: int = DEFAULT_NGRAM) -> list[str]:  # fmt: skip
    """The texts of task items to audit for: the question, and each reference answer or solution of at least `n`
    word tokens (a bare number or a short answer would match by chance)."""
    out = []
    for item in items:
        out += [str(item[f]) for f in fields if isinstance(item.get(f), str) and item[f].strip()]
        out += [item[f] for f in answers if f not in fields and isinstance(item.get(f), str)
                and len(tokens(item[f])) >= n]  # fmt: skip
    return out


def leak_metrics(report: LeakReport) -> dict:
    """The audit in the results store: the verdict, and the count only where it is one (an incomplete audit's
    zero is no count)."""
    return {"leaked_items": None if report.verdict == "incomplete" else report.leaked_items,
            "leak_verdict": report.verdict}  # fmt: skip


def audit_run(paths: RunPaths, hidden_items: Iterable[dict]) -> LeakReport:
    """A finished run's audit: its workspace (less the data and models the harness put there), the agent's output
    (capped log and what its capture searched) and transcripts, for `hidden_items` (the task's validation and
    test items); writes leak_audit.json."""
    h = paths.harness_dir
    report = audit_leaks(paths.workspace, [h / "transcript.jsonl", h / "tool_calls.jsonl"], hidden_texts(hidden_items),
                         exclude=("data", "models"), agent_log=h / "agent.log")  # fmt: skip
    (h / "leak_audit.json").write_text(report.model_dump_json(indent=1))
    return report


def _entries(audit: _Audit, root: Path, skip: set[str]) -> Iterator[safefs.Entry]:
    """Every name under `root` but not under `skip`, walked without following links (even swapped-in ones); a
    directory too deep to enter is listed as unread."""
    if not root.is_dir() or root.is_symlink():
        return
    depth = 4 * safefs.MAX_DEPTH
    for entry in safefs.walk(root, prune=lambda e: e.rel in skip, max_depth=depth):
        if entry.rel in skip:
            continue
        if entry.is_dir and entry.rel.count("/") + 1 >= depth:
            audit.unread(f"{root / entry.rel} (nested deeper than {depth} directories: not entered)")
        yield entry


__all__ = ["LeakHit", "LeakReport", "audit_leaks", "audit_run", "hidden_texts", "leak_metrics"]
