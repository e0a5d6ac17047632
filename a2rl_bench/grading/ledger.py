"""The grading ledger: append-only JSONL outside the workspace, fsynced, hash-chained, its end anchored.

Each line carries the sha256 of the previous line, so an edited, reordered or deleted entry is detected by
`verify()`. The chain alone cannot see its own end (edit the last line, or cut lines off): so every append
also hands the new head (entry count, hash of the last line) to an `anchor` the writer controls (the results
store's `ledger_heads` table), and the run report records the head it was built from; `check_head` compares.
Readers never rewrite the file: a torn last line (a crash mid-write) is reported ("torn tail: N bytes after
entry K"); only the next append moves it aside into `ledger.jsonl.torn-<K>` and records a `torn-tail` event.
The ledger is the source of truth for scores; DuckDB is a view of it.

A report also carries `head_mac`: an HMAC of its run id and head under a key that only this machine's harness
holds (`A2RL_HOME/ledger.key`, never in a sandbox). Ingesting a run directory into a new store, where no anchor
exists, checks it: a ledger and report edited to agree still fail without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2rl_bench.records import LedgerEntry


log = logging.getLogger("a2rl_bench.grading")


class LedgerCorrupted(RuntimeError):
    """The ledger file does not verify: a line was edited, removed or is not valid JSON."""


@dataclass(frozen=True)
class LedgerHead:
    """Where the ledger ended: how many entries, and the sha256 of the last line ("" when empty)."""

    entries: int
    hash: str


@dataclass(frozen=True)
class TornTail:
    """Bytes after the last complete line: a write a crash interrupted (never acknowledged to anyone)."""

    after_entries: int
    size: int

    def __str__(self) -> str:
        return f"torn tail: {self.size} bytes after entry {self.after_entries}"


Anchor = Callable[[LedgerEntry, str], None]
"""Called after every append with the entry and its line's hash (the new head)."""


class Ledger:
    def __init__(self, path: Path, anchor: Anchor | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.anchor = anchor
        self._lock = threading.Lock()
        self.torn_tail: TornTail | None = None
        self._hashes: list[str] = []  # sha256 of each entry's line
        self._entries: list[LedgerEntry] = self._load() if self.path.exists() else []
        self._last_hash = self._hashes[-1] if self._entries else ""

    def append(self, on_durable: Callable[[LedgerEntry], None] | None = None, **fields: Any) -> LedgerEntry:
        """Write one entry durably (fsync), anchor the new head, and return it. `on_durable` hears of the entry
        once its line is on disk, before the anchor and anything else is written (the grader's clock runs again
        there: the line's time is when it did, and a crash before it leaves the clock stopped, as the line says)."""
        with self._lock:
            if self.torn_tail is not None:
                self._set_torn_tail_aside()
            entry = self._write(LedgerEntry(seq=len(self._entries), prev_hash=self._last_hash, **fields))
        if on_durable is not None:
            on_durable(entry)
        if self.anchor is not None:
            try:
                self.anchor(entry, self._last_hash_of(entry))
            except Exception as e:  # noqa: BLE001 - the entry is durable; verification shows the unanchored tail
                log.warning("ledger %s: entry %s not anchored (%s: %s)", self.path, entry.seq, type(e).__name__, e)
        return entry

    def head(self) -> LedgerHead:
        with self._lock:
            return LedgerHead(len(self._entries), self._last_hash)

    def check_head(self, expected: LedgerHead, where: str, complete: bool = True) -> str | None:
        """None if the ledger still ends where `where` (the results store, a report) saw it end; with
        `complete=False` (a report written mid-run) later entries are allowed after that head."""
        here = self.head()
        if here == expected:
            return None
        if here.entries < expected.entries:
            return (f"ledger has {here.entries} entries but {where} recorded {expected.entries}: "
                    "entries were cut off its end")  # fmt: skip
        if here.entries == expected.entries:
            return f"ledger's last entry (seq {here.entries - 1}) differs from the one {where} recorded: it was edited"
        if expected.entries and self._hashes[expected.entries - 1] != expected.hash:
            return f"ledger entry seq {expected.entries - 1} differs from the one {where} recorded: it was edited"
        if not complete:
            return None
        return f"ledger has {here.entries - expected.entries} entries after the head {where} recorded"

    def _write(self, entry: LedgerEntry) -> LedgerEntry:
        line = entry.model_dump_json()
        with self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._entries.append(entry)
        self._last_hash = _line_hash(line)
        self._hashes.append(self._last_hash)
        return entry

    def _last_hash_of(self, entry: LedgerEntry) -> str:
        return self._hashes[entry.seq]

    def _set_torn_tail_aside(self) -> None:
        """The writer's repair before its next append: the torn bytes are kept beside the ledger, cut from
        it, and the cut is itself recorded in the chain."""
        torn = self.torn_tail
        raw = self.path.read_bytes()
        keep = len(raw) - torn.size
        aside = self.path.with_name(f"{self.path.name}.torn-{torn.after_entries}")
        aside.write_bytes(raw[keep:])
        with self.path.open("r+b") as f:
            f.truncate(keep)
            os.fsync(f.fileno())
        self.torn_tail = None
        self._write(LedgerEntry(seq=len(self._entries), prev_hash=self._last_hash, run_id=self._entries[-1].run_id
                                if self._entries else "", kind="event",
                                detail={"event": "torn-tail", "bytes": torn.size, "after_entries": torn.after_entries,
                                        "saved_to": aside.name}))  # fmt: skip

    def entries(self) -> list[LedgerEntry]:
        with self._lock:
            return list(self._entries)

    def verify(self) -> int:
        """Re-read the file and check the hash chain; return the number of entries."""
        return len(self._load())

    def _load(self) -> list[LedgerEntry]:
        entries: list[LedgerEntry] = []
        self._hashes: list[str] = []
        prev = ""
        with self.path.open() as f:
            raw_lines = f.read().split("\n")
        # A crash during a write can leave a torn last line (no trailing newline). Reported, never rewritten
        # here; the next append sets it aside.
        if raw_lines and raw_lines[-1]:
            complete = [x for x in raw_lines[:-1] if x.strip()]
            self.torn_tail = TornTail(len(complete), len(raw_lines[-1].encode()))
            raw_lines = raw_lines[:-1]
        for n, line in enumerate(x for x in raw_lines if x.strip()):
            try:
                entry = LedgerEntry.model_validate_json(line)
            except ValueError as e:
                raise LedgerCorrupted(f"{self.path}: line {n + 1} is not a ledger entry: {e}") from e
            if entry.prev_hash != prev or entry.seq != n:
                raise LedgerCorrupted(
                    f"{self.path}: hash chain broken at line {n + 1} (seq {entry.seq}): "
                    "an entry was edited, removed or reordered"
                )
            prev = _line_hash(line)
            self._hashes.append(prev)
            entries.append(entry)
        return entries


def own_key_path(create: bool = False) -> Path:
    """This machine's ledger key file (`A2RL_HOME/ledger.key`), made first where `create`."""
    from a2rl_bench.paths import a2rl_home

    if create:
        _ledger_key(create=True)
    return a2rl_home() / "ledger.key"


def _ledger_key(create: bool) -> bytes | None:
    from a2rl_bench.paths import a2rl_home

    path = a2rl_home() / "ledger.key"
    if not path.exists() and create:
        tmp = path.with_name(f".ledger.key.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # first writer wins; a concurrent one reads the winner's key
        except FileExistsError:
            pass
        tmp.unlink()
    try:
        return path.read_text().strip().encode()
    except OSError:
        return None


def head_mac(run_id: str, head: LedgerHead, create: bool = True) -> str | None:
    """HMAC-SHA256 of a run's ledger head under this machine's ledger key (made on first use), as
    `<key id>:<mac>`; None without a key. The key id (a hash of the key, not the key) lets another machine's
    store tell a MAC it cannot check from a forged one."""
    key = _ledger_key(create)
    if key is None:
        return None
    return f"{_key_id(key)}:{_mac(key, run_id, head)}"


def mac_matches(run_id: str, head: LedgerHead, mac: str) -> bool | None:
    """Whether `mac` authenticates this head under this machine's key or a host key it trusts (`trust_host_key`);
    None where it cannot tell (the MAC names a key it does not hold)."""
    key_id, _, digest = mac.rpartition(":")
    keys = trusted_keys()
    if key_id:
        key = keys.get(key_id)
    else:  # a MAC from before key ids: this machine's key only
        key = _ledger_key(create=False)
    if key is None:
        return None
    return hmac.compare_digest(_mac(key, run_id, head), digest)


TRUSTED_KEYS_DIR = "trusted-ledger-keys"
"""In A2RL_HOME: the ledger keys of the hosts whose runs this machine's stores accept (one file per key id)."""


def trusted_keys() -> dict[str, bytes]:
    """Key id -> key: this machine's own ledger key and every host key registered with `trust_host_key`."""
    from a2rl_bench.paths import a2rl_home

    keys = {}
    if (own := _ledger_key(create=False)) is not None:
        keys[_key_id(own)] = own
    folder = a2rl_home() / TRUSTED_KEYS_DIR
    for path in sorted(folder.glob("*.key")) if folder.is_dir() else []:
        try:
            key = path.read_text().strip().encode()
        except OSError:
            continue
        if key and _key_id(key) == path.stem:
            keys[path.stem] = key
    return keys


def trust_host_key(key_file: Path, host: str = "") -> str:
    """Register a host's ledger key (its `A2RL_HOME/ledger.key`, copied over a trusted channel) so that runs whose
    reports carry its MACs verify here; returns the key id. The key stays secret: a file readable by this user
    only, never in a results store."""
    from a2rl_bench.paths import a2rl_home

    key = Path(key_file).read_text().strip().encode()
    if len(key) < 32 or not all(c in b"0123456789abcdef" for c in key):
        raise ValueError(f"{key_file} is not an a2rl ledger key (64 hex digits, as A2RL_HOME/ledger.key holds)")
    key_id = _key_id(key)
    folder = a2rl_home() / TRUSTED_KEYS_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = folder / f"{key_id}.key"
    fd = os.open(target.with_name(f".{key_id}.{os.getpid()}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.decode() + "\n")
    os.replace(target.with_name(f".{key_id}.{os.getpid()}"), target)
    with (folder / "hosts.jsonl").open("a") as f:
        f.write(json.dumps({"key_id": key_id, "host": host, "at": time.time()}) + "\n")
    return key_id


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"a2rl ledger key id|" + key).hexdigest()[:16]


def _mac(key: bytes, run_id: str, head: LedgerHead) -> str:
    return hmac.new(key, f"{run_id}|{head.entries}|{head.hash}".encode(), hashlib.sha256).hexdigest()


def _line_hash(line: str) -> str:
    return hashlib.sha256(line.encode()).hexdigest()


def read_ledger(path: Path, expected: dict[str, LedgerHead | None] | None = None,
                report_head: LedgerHead | None = None) -> list[LedgerEntry]:  # fmt: skip
    """Verified entries of a ledger file. Raises LedgerCorrupted on a broken chain, or when the ledger does
    not end where a recorded head says it ended (`expected`: where -> head, e.g. the results store; the
    `report_head` may be followed by later entries)."""
    ledger = Ledger(path)
    checks = [(where, head, True) for where, head in (expected or {}).items()]
    checks.append(("the run report", report_head, False))
    problems = [p for where, head, complete in checks if head is not None
                and (p := ledger.check_head(head, where, complete))]  # fmt: skip
    if problems:
        raise LedgerCorrupted(f"{path}: " + "; ".join(problems))
    return ledger.entries()


def dump_entries(entries: list[LedgerEntry]) -> list[dict]:
    return [json.loads(e.model_dump_json()) for e in entries]
