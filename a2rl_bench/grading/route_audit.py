"""The route audit: which post-training method a code snapshot uses (static analysis), and the mode check.

Labels: `SFT`, `GRPO`, `PPO`, `RLOO`, `RL` (a policy-gradient loss the analysis cannot name, or several RL
methods), `DPO` (preference optimisation: DPO and its relatives KTO, ORPO, CPO, online DPO), `SFT+RL`,
`SFT+DPO`, `copy` (no training, but the base model is copied or re-saved) and `none`.

What counts as evidence, per file of the snapshot:
- Python: TRL trainers and configs referenced in code (imported names, `trl.X` attributes) — not names that
  only appear in strings, comments or docstrings; hand-written training loops (`.backward()`) classified by
  their loss (policy gradient: advantages or rewards with log-probabilities; DPO: chosen/rejected
  log-sigmoid; anything else supervised); trainer command lines (`trl grpo`, `python -m trl.scripts.sft`,
  verl, OpenRLHF) in string constants.
- Shell scripts and notebooks: the same command lines; notebooks' code cells as Python.
- Prose (`*.md`, `*.txt`) is never evidence: notes that talk about GRPO do not make a run RL.
Static analysis sees what the code could run, not what ran: a script that picks `SFTTrainer` or
`GRPOTrainer` from a flag counts as both.

Modes (README, "Tasks, agents, modes"; the paper only prompted for them): `sft-only` accepts SFT, and
copy/none (no method used); `rl-only` accepts GRPO, PPO, RLOO, RL and SFT+RL (an SFT warm-up before RL is
allowed, as in the paper's ALFWorld RL-only run). DPO is offline preference optimisation without rollouts or
a reward signal, so by default it does **not** satisfy `rl-only` (pass `dpo_counts_as_rl=True` to accept it)
and it never satisfies `sft-only`.
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import errno
import io
import json
import os
import stat
import re
import time
import tokenize
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from pydantic import BaseModel, Field

from a2rl_bench.isolation import safefs

RL_METHODS = frozenset({"GRPO", "PPO", "RLOO", "RL"})
RL_LABELS = frozenset(RL_METHODS | {"SFT+RL"})
LABELS = ("SFT", "GRPO", "PPO", "RLOO", "RL", "DPO", "SFT+RL", "SFT+DPO", "copy", "none")
MAX_FILE_BYTES = 64 * 1024**2
"""A script larger than this is not read: the scan is then incomplete (never "no method found")."""
MAX_NOTEBOOK_BYTES = 16 * 1024**2
"""A notebook is parsed whole (JSON): its own, smaller cap."""
SCRIPT_SUFFIXES = (".py", ".ipynb", ".sh", ".bash")
SKIP_DIRS = {"__pycache__", ".git", ".ipynb_checkpoints", "node_modules", ".venv", "venv", "wandb"}

TRAINER_METHODS = {
    "SFTTrainer": "SFT", "SFTConfig": "SFT", "GKDTrainer": "SFT", "GKDConfig": "SFT",
    "DistillationTrainer": "SFT", "IterativeSFTTrainer": "SFT",
    "GRPOTrainer": "GRPO", "GRPOConfig": "GRPO",
    "PPOTrainer": "PPO", "PPOConfig": "PPO",
    "RLOOTrainer": "RLOO", "RLOOConfig": "RLOO",
    "DPOTrainer": "DPO", "DPOConfig": "DPO", "OnlineDPOTrainer": "DPO", "OnlineDPOConfig": "DPO",
    "KTOTrainer": "DPO", "KTOConfig": "DPO", "ORPOTrainer": "DPO", "ORPOConfig": "DPO",
    "CPOTrainer": "DPO", "CPOConfig": "DPO", "XPOTrainer": "DPO", "NashMDTrainer": "DPO",
}  # fmt: skip
# transformers' generic trainers: supervised unless the file also has a policy-gradient loss.
GENERIC_TRAINERS = {"Trainer", "Seq2SeqTrainer"}

# Command lines that start a trainer, in shell scripts or Python strings.
_COMMAND_PATTERNS = [
    (re.compile(r"\btrl\s+(sft|grpo|dpo|rloo|ppo|kto|orpo|online_dpo)\b"), None),
    (re.compile(r"\btrl[./]scripts[./](sft|grpo|dpo|rloo|ppo|kto|orpo|online_dpo)\b"), None),
    (re.compile(r"\bverl\.trainer\.main_ppo\b.*?adv_estimator=(grpo|rloo)"), None),
    (re.compile(r"\bverl\.trainer\.main_ppo\b"), "PPO"),
    (re.compile(r"\bverl\.trainer\.fsdp_sft_trainer\b"), "SFT"),
    (re.compile(r"\bopenrlhf\.cli\.train_(sft|dpo|ppo|kto)\w*"), None),
]
_CLI_METHODS = {"sft": "SFT", "grpo": "GRPO", "dpo": "DPO", "rloo": "RLOO", "ppo": "PPO", "kto": "DPO",
                "orpo": "DPO", "online_dpo": "DPO"}  # fmt: skip
_SHELL_COPY = re.compile(r"\b(cp|rsync|ln)\b[^\n;|&]*(models/base|\$\{?MODEL_PATH\b)")
_LOGPROB = re.compile(r"log_?probs?|logps?$|log_softmax|logsoftmax")


class Evidence(NamedTuple):
    """Why a method was found: where, and which pattern."""

    method: str
    file: str
    line: int
    what: str


class RouteAnalysis(BaseModel):
    """The route label of a code snapshot with the evidence behind it."""

    label: str
    methods: list[str] = Field(default_factory=list)
    """Every method found, sorted."""
    copies_base_model: bool = False
    evidence: list[dict] = Field(default_factory=list)
    """`{method, file, line, what}` per finding (first 50)."""
    files_scanned: int = 0
    complete: bool = True
    """Every script was analysed; False when a bound (`ScanLimits`) stopped the scan first: the label is what the
    scripts read so far show (a later scan of the same directory continues)."""
    left: int = 0
    """Scripts (or names) not analysed because of the bounds."""
    unreadable: int = 0
    """Scripts of this round that could not be read: no permission, held under a lease, swapped while listed, or
    over their size cap. Any one makes the scan incomplete until a later round reads it."""


class ScanLimits(NamedTuple):
    """Bounds of one scan of a directory the agent may fill at will (50,000 scripts made each /submit take 46 s)."""

    max_entries: int = 200_000
    """Names walked."""
    max_new_bytes: int = 64 * 1024**2
    """Bytes of new or changed scripts read."""
    seconds: float = 15.0


GRADER_LIMITS = ScanLimits()


class ModeCheck(NamedTuple):
    ok: bool
    message: str


def route_label(code_dir: Path) -> str:
    """The route label of `code_dir` (see the module docstring for the labels)."""
    return analyze_routes(code_dir).label


def analyze_routes(code_dir: Path, limits: ScanLimits | None = None) -> RouteAnalysis:
    """Scan every Python file, shell script and notebook under `code_dir` for training methods (within `limits`,
    if given)."""
    return RouteScanner(limits).scan(code_dir)


class RouteScanner:
    """Route analysis of one directory, again and again (one scan per submission, the agent still running).

    A script is analysed once: its evidence is kept, keyed by its path, inode, size and change times, so a later
    scan reads only new or changed scripts (a file found not to be a script is remembered as such). Names are
    visited code files first (`CodeFirstWalk`). Each scan stops at its `limits` (names visited, bytes read,
    seconds): its analysis then says `complete=False`, and the next scan starts where it stopped (a cursor), so a
    directory of 200,000 empty files can delay the label by a few scans, never hide a script for good. Memory: the evidence of
    each script (a few tuples), never its text past the one being read."""

    def __init__(self, limits: ScanLimits | None = None):
        self.limits = limits
        self._cache: dict[str, tuple[tuple, list[Evidence] | None]] = {}
        self._cursor: tuple[str, tuple[int, str]] | None = None
        """Where the last scan that stopped early stopped (directory, name key): the next one starts there."""
        self._unread: set[str] = set()
        """Scripts found unreadable in the current round (from the top to the end of the walk)."""

    def scan(self, code_dir: Path) -> RouteAnalysis:
        lim = self.limits
        deadline = time.monotonic() + lim.seconds if lim else None
        found: list[Evidence] = []
        scanned = left = new_bytes = 0
        complete = True
        cache: dict[str, tuple[tuple, list[Evidence] | None]] = {}
        unread = self._unread if self._cursor is not None else set()  # a new round forgets the last one's
        walk = CodeFirstWalk(Path(code_dir), self._cursor, deadline)
        with contextlib.closing(iter(walk)) as entries:
            for n, entry in enumerate(entries):
                if lim and (n >= lim.max_entries or time.monotonic() > deadline):
                    complete, left = False, left + 1
                    break
                key = (entry.st.st_ino, entry.st.st_size, entry.st.st_mtime_ns, entry.st.st_ctime_ns)
                cached = self._cache.get(entry.rel)
                if cached is not None and cached[0] == key:
                    evidence = cached[1]
                elif _too_short_for_a_shebang(entry):
                    walk.handled(entry)
                    continue
                elif lim and new_bytes and new_bytes + entry.st.st_size > lim.max_new_bytes:  # one file at least
                    complete, left = False, left + 1
                    if walk.resumable:
                        break  # the cursor must not pass a file left unread
                    continue
                else:
                    evidence = _analyze_entry(entry, deadline)
                    new_bytes += entry.st.st_size
                    if evidence is GONE:
                        continue
                    if evidence is UNREADABLE:  # never cached: every later scan tries it again
                        unread.add(entry.rel)
                        continue
                unread.discard(entry.rel)
                walk.handled(entry)
                cache[entry.rel] = (key, evidence)  # not a script (None) is remembered too: never read again
                if evidence is not None:
                    scanned += 1
                    found += evidence
        # A scan stopped early resumes after the last name it handled: a bulk directory cannot hold it at the top.
        complete = complete and walk.finished and not unread
        # A finished walk ends the round: the next scan starts at the top (and tries the unreadable scripts again).
        self._cursor = None if walk.finished else walk.cursor
        self._unread = unread
        if not complete:  # what earlier scans found where this one did not reach still stands
            for rel, kept in self._cache.items():
                if rel not in cache:
                    cache[rel] = kept
                    found += kept[1] or []
        self._cache = cache
        methods = {e.method for e in found if e.method != "copy"}
        copies = any(e.method == "copy" for e in found)
        return RouteAnalysis(label=combine_methods(methods, copies), methods=sorted(methods),
                             copies_base_model=copies, evidence=[e._asdict() for e in found[:50]],
                             files_scanned=scanned, complete=complete, left=left,
                             unreadable=len(unread))  # fmt: skip


def combine_methods(methods: set[str], copies_base_model: bool = False) -> str:
    """One label for a set of methods: RL wins over DPO, an SFT stage is kept as a prefix."""
    rl = methods & RL_METHODS
    if rl:
        if "SFT" in methods:
            return "SFT+RL"
        return next(iter(rl)) if len(rl) == 1 else "RL"
    if "DPO" in methods:
        return "SFT+DPO" if "SFT" in methods else "DPO"
    if "SFT" in methods:
        return "SFT"
    return "copy" if copies_base_model else "none"


def check_mode(mode: str, label: str, dpo_counts_as_rl: bool = False) -> ModeCheck:
    """Whether a submission whose code has route `label` respects the run's `mode`.

    Returns:
        `(ok, message)`; the message says what was found and what the mode allows, for the ledger and
        for the agent when a strict grader refuses the submission.
    """
    if mode in ("free", "multi"):
        return ModeCheck(True, f"mode {mode}: any method allowed (route {label})")
    if mode == "sft-only":
        if label in ("SFT", "copy", "none"):
            return ModeCheck(True, f"mode sft-only: route {label} is allowed")
        return ModeCheck(False, f"mode sft-only allows supervised fine-tuning only, but code/ uses {label}"
                                " (RL and preference optimisation such as DPO are not allowed)")  # fmt: skip
    if mode == "rl-only":
        accepted = RL_LABELS | ({"DPO", "SFT+DPO"} if dpo_counts_as_rl else set())
        if label in accepted:
            return ModeCheck(True, f"mode rl-only: route {label} is allowed")
        if label in ("DPO", "SFT+DPO"):
            why = "DPO is offline preference optimisation, not RL with rollouts and rewards"
        elif label in ("copy", "none"):
            why = "no training method was found in code/"
        else:
            why = f"code/ uses {label} without any RL method"
        return ModeCheck(False, f"mode rl-only needs reinforcement learning (GRPO, PPO, RLOO or a policy-gradient"
                                f" loss; an SFT warm-up is allowed), but code/ has route {label}: {why}")  # fmt: skip
    raise ValueError(f"unknown mode {mode!r}; expected free, sft-only, rl-only or multi")


def check_snapshot(code_dir: Path, mode: str, dpo_counts_as_rl: bool = False,
                   scanner: RouteScanner | None = None) -> tuple[RouteAnalysis, ModeCheck]:  # fmt: skip
    """`analyze_routes` + `check_mode` for one code snapshot (what the grading service calls per submission, with
    its own bounded, incremental `scanner`). A scan cut short by its bounds says so in the message, and in a mode
    that forbids a method it fails the check unless no unread script could change the verdict: scripts only add
    methods, so an RL label found in `rl-only` stays allowed, while `sft-only` can be broken by any script."""
    analysis = (scanner or RouteScanner()).scan(code_dir)
    verdict = check_mode(mode, analysis.label, dpo_counts_as_rl)
    if not analysis.complete:
        unread = (f"from {analysis.files_scanned} scripts; {analysis.left} more were not yet analysed: code/ is "
                  "too large to scan at once, the next submission's scan goes on where this one stopped")  # fmt: skip
        if analysis.unreadable:  # a fixed category: never a path or an OS error text
            unread = (f"{analysis.unreadable} scripts in code/ could not be read (no permission, held under a "
                      f"lease, changing while read, or over the {MAX_FILE_BYTES // 1024**2} MiB cap); {unread}")
        if mode == "sft-only" and verdict.ok:
            verdict = ModeCheck(False, f"mode sft-only could not be confirmed: the route scan is incomplete ({unread})")
        else:
            verdict = verdict._replace(message=f"{verdict.message} ({unread})")
    return analysis, verdict


# -- files -------------------------------------------------------------------------------------------------


AST_MAX_BYTES = 512 * 1024
"""Larger scripts are scanned by their tokens (bounded memory) instead of a syntax tree (~100x their size)."""


BULK_DIR_NAMES = 1_000
"""A directory of more names than this is bulk: its files are visited after every code file elsewhere."""
UNREADABLE: list[Evidence] = []
"""`_analyze_entry`'s answer for a script that could not be read (no permission, a lease, swapped, too large):
not cached, and the scan is incomplete."""
GONE: list[Evidence] = []
"""`_analyze_entry`'s answer for a file deleted since it was listed: nothing to analyse."""
STREAM_CHUNK = 1024**2


class CodeFirstWalk:
    """The names a scan visits, code files first, resumable at a cursor.

    Pass 1 walks every directory (listing names only, no stat) and visits the files with a script suffix of the
    directories that are not bulk, on every scan. Pass 2 visits what remains: files without a suffix (a shebang
    may make them scripts), then bulk directories, each by name (suffixed files first). Pass 2 starts after
    `cursor` (the last name an earlier, unfinished scan handled there), so successive scans walk it to its end
    however large one directory is; reaching the end completes the round and the next one starts at the top.
    Directories are opened one component at a time without following links (`safefs`): the agent may swap them.
    A file without a suffix written behind the cursor during a round is seen in the next round."""

    def __init__(self, root: Path, cursor: tuple[str, tuple[int, str]] | None = None,
                 deadline: float | None = None):  # fmt: skip
        self.root, self.start, self.deadline = root, cursor, deadline
        self.cursor = cursor
        self.finished = False
        self._pass = 1

    @property
    def resumable(self) -> bool:
        """In pass 2, where the next scan starts after the last name handled."""
        return self._pass == 2

    def handled(self, entry: safefs.Entry) -> None:
        if self._pass == 2:
            self.cursor = (entry.rel.rpartition("/")[0], _name_key(entry.name))

    def __iter__(self) -> Iterator[safefs.Entry]:
        if not self.root.is_dir() or self.root.is_symlink():
            self.finished = True
            return
        later: list[tuple[bool, str]] = []  # (bulk, directory) for pass 2, in a stable order
        fd = safefs.open_dir(self.root)
        try:
            yield from self._pass_one(fd, "", 0, later)
        finally:
            os.close(fd)
        if self.deadline is not None and time.monotonic() > self.deadline:
            return
        self._pass = 2
        order = [d for _, d in sorted(later)]
        bulk = {d for b, d in later if b}
        at = order.index(self.start[0]) if self.start and self.start[0] in order else None
        segments = [(d, None) for d in order] if at is None else [(order[at], self.start[1])] + [
            (d, None) for d in order[at + 1:]]  # fmt: skip
        for d, after in segments:
            yield from self._pass_two(d, d in bulk, after)
        self.finished = True

    def _pass_one(self, fd: int, prefix: str, depth: int, later: list) -> Iterator[safefs.Entry]:
        if self.deadline is not None and time.monotonic() > self.deadline:
            return  # listing alone ran out of time (a tree of empty directories): not finished
        try:
            with os.scandir(fd) as it:
                listed = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        except OSError:
            return
        bulk = len(listed) > BULK_DIR_NAMES
        if bulk or any(not is_dir and not PurePosixPath(name).suffix for name, is_dir in listed):
            later.append((bulk, prefix.rstrip("/")))
        for name, is_dir in listed:
            if is_dir:
                if name in SKIP_DIRS or depth + 1 >= safefs.MAX_DEPTH:
                    continue
                try:
                    child = safefs.open_dir(name, dir_fd=fd)
                except OSError:  # swapped for a link or a file: not ours to enter
                    continue
                try:
                    yield from self._pass_one(child, f"{prefix}{name}/", depth + 1, later)
                finally:
                    os.close(child)
            elif not bulk and PurePosixPath(name).suffix in SCRIPT_SUFFIXES:
                if (entry := _entry(fd, name, prefix)) is not None:
                    yield entry

    def _pass_two(self, rel: str, bulk: bool, after: tuple[int, str] | None) -> Iterator[safefs.Entry]:
        try:
            fd = _open_rel(self.root, rel)
        except OSError:
            return
        try:
            groups: tuple[list[str], list[str]] = ([], [])  # names only (a bulk directory may hold millions)
            with os.scandir(fd) as it:
                for e in it:
                    suffix = PurePosixPath(e.name).suffix
                    if e.is_dir(follow_symlinks=False) or (suffix and (not bulk or suffix not in SCRIPT_SUFFIXES)):
                        continue
                    groups[bool(not suffix)].append(e.name)
            for rank, names in enumerate(groups):
                names.sort()
                for name in names:
                    if after is not None and (rank, name) <= after:
                        continue
                    if (entry := _entry(fd, name, f"{rel}/" if rel else "")) is not None:
                        yield entry
        finally:
            os.close(fd)


def _name_key(name: str) -> tuple[int, str]:
    """Order in a directory: files with a script suffix first, then the rest, each by name."""
    return (0 if PurePosixPath(name).suffix in SCRIPT_SUFFIXES else 1, name)


def _entry(fd: int, name: str, prefix: str) -> safefs.Entry | None:
    """The entry of a regular file that may be a script (script suffix, or none), else None."""
    suffix = PurePosixPath(name).suffix
    if suffix and suffix not in SCRIPT_SUFFIXES:
        return None
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    entry = safefs.Entry(fd, name, prefix + name, st)
    return entry if entry.is_file else None  # too large to read: `_analyze_entry` says unreadable


def _open_rel(root: Path, rel: str) -> int:
    """A directory under `root` opened one component at a time, never through a link."""
    fd = safefs.open_dir(root)
    for part in [p for p in rel.split("/") if p]:
        try:
            child = safefs.open_dir(part, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


def _too_short_for_a_shebang(entry: safefs.Entry) -> bool:
    return not PurePosixPath(entry.rel).suffix and entry.st.st_size < 4  # "#!sh" at least


def _analyze_entry(entry: safefs.Entry, deadline: float | None = None) -> list[Evidence] | None:
    """The evidence in one script, read relative to its held directory; None when it is not a script after all,
    `UNREADABLE` when it could not be read whole (a FIFO or a link swapped in meanwhile, no permission, a lease
    held on it, over its cap, past the deadline), `GONE` when it was deleted. Never blocks: a file under a write
    lease answers EWOULDBLOCK to the non-blocking open instead of waiting for the lease holder. Scripts larger than
    `AST_MAX_BYTES` are streamed (tokens and command lines), never held whole."""
    suffix = PurePosixPath(entry.rel).suffix
    try:
        fd = os.open(entry.name, safefs.FILE_FLAGS, dir_fd=entry.dir_fd)
    except OSError as e:
        return GONE if e.errno == errno.ENOENT else UNREADABLE
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (entry.st.st_dev, entry.st.st_ino):
            return UNREADABLE  # swapped since it was listed
        cap = MAX_NOTEBOOK_BYTES if suffix == ".ipynb" else MAX_FILE_BYTES
        if st.st_size > cap:
            return UNREADABLE
        try:
            head = f.read(64)
            if not (suffix or _has_shell_shebang(head)):
                return None
            if suffix == ".ipynb" or (suffix == ".py" and st.st_size <= AST_MAX_BYTES):
                data = head + f.read(cap + 1 - len(head))  # the file may grow meanwhile
                if len(data) > cap:
                    return UNREADABLE
                text = data.decode("utf-8", errors="replace")
                return analyze_python(text, entry.rel) if suffix == ".py" else _analyze_notebook(text, entry.rel)
            lines = _Lines(f, head, cap, deadline)
            found = _stream_python(lines, entry.rel) if suffix == ".py" else analyze_shell_lines(lines, entry.rel)
            return UNREADABLE if lines.cut else found
        except OSError:
            return UNREADABLE


class _Lines:
    """The lines of an open file, read in chunks (a script of 64 MiB is never held whole); `cut` when the file
    grew past `cap` or the deadline passed before its end (then what was found is not the file's whole story)."""

    def __init__(self, f: io.BufferedReader, head: bytes, cap: int, deadline: float | None):
        self.f, self.head, self.cap, self.deadline = f, head, cap, deadline
        self.cut = False

    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        read, pending, chunk = 0, "", self.head
        while chunk:
            read += len(chunk)
            if read > self.cap or (self.deadline is not None and time.monotonic() > self.deadline):
                self.cut = True
                return
            pending += decoder.decode(chunk)
            *done, pending = pending.split("\n")
            for line in done:
                yield line + "\n"
            chunk = self.f.read(STREAM_CHUNK)
        pending += decoder.decode(b"", final=True)
        if pending:
            yield pending


def _has_shell_shebang(data: bytes) -> bool:
    head = data[:64]
    return head.startswith(b"#!") and (b"sh" in head.split(b"\n")[0])


# -- Python ------------------------------------------------------------------------------------------------


def analyze_python(source: str, name: str = "<string>") -> list[Evidence]:
    """Methods a Python source uses; a file that does not parse is scanned without its strings and comments."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return _analyze_unparsable(source, name)
    return _PythonScan(name).run(tree)


class _PythonScan:
    def __init__(self, name: str):
        self.name = name
        self.found: list[Evidence] = []
        self.aliases: dict[str, str] = {}
        """local name -> TRL class name"""
        self.generic: set[str] = set()
        """local names of transformers' Trainer classes"""

    def add(self, method: str, node: ast.AST, what: str) -> None:
        self.found.append(Evidence(method, self.name, getattr(node, "lineno", 0), what))

    def run(self, tree: ast.AST) -> list[Evidence]:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name in TRAINER_METHODS:
                        self.aliases[a.asname or a.name] = a.name
                    elif a.name in GENERIC_TRAINERS and (node.module or "").startswith("transformers"):
                        self.generic.add(a.asname or a.name)
        # Bare string statements (docstrings) are prose, not commands.
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        tokens: set[str] = set()
        trains = generic_used = copies = loads_and_saves = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                tokens.add(node.id.lower())
                if isinstance(node.ctx, ast.Load):
                    cls = self.aliases.get(node.id) or (node.id if node.id in TRAINER_METHODS else None)
                    if cls:
                        self.add(TRAINER_METHODS[cls], node, f"uses {cls}")
                    generic_used |= node.id in self.generic
            elif isinstance(node, ast.Attribute):
                tokens.add(node.attr.lower())
                if node.attr in TRAINER_METHODS:
                    self.add(TRAINER_METHODS[node.attr], node, f"uses {ast.unparse(node)}")
                elif node.attr in GENERIC_TRAINERS and "transformers" in ast.unparse(node.value):
                    generic_used = True
            elif isinstance(node, ast.arg):
                tokens.add(node.arg.lower())
            elif isinstance(node, ast.keyword) and node.arg:
                tokens.add(node.arg.lower())
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                tokens.add(node.name.lower())
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                self.found += [e._replace(line=node.lineno) for e in _command_evidence(node.value, self.name)]
            elif isinstance(node, ast.List | ast.Tuple) and _is_trl_argv(node):
                method = _CLI_METHODS[node.elts[1].value]
                self.add(method, node, f"runs trl {node.elts[1].value}")
            if isinstance(node, ast.Call):
                func = node.func
                fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                trains |= fname == "backward"
                loads_and_saves |= fname == "save_pretrained"
                if fname in ("copytree", "copy", "copy2", "copyfile", "symlink", "link") and node.args:
                    src = ast.unparse(node.args[0])
                    if "base" in src.lower() or "model_path" in src.lower():
                        copies = True
                        self.add("copy", node, f"copies the base model: {ast.unparse(node)[:80]}")
        if trains:
            self._classify_loop(tree, tokens)
        if generic_used and not any(e.method in RL_METHODS for e in self.found):
            self.add("SFT", tree, "transformers Trainer without a policy-gradient loss")
        if loads_and_saves and not copies and not self.found and "from_pretrained" in tokens:
            self.add("copy", tree, "loads and saves a model without training it")
        return self.found

    def _classify_loop(self, tree: ast.AST, tokens: set[str]) -> None:
        """A hand-written training loop: which loss it optimises."""
        has_logprob = any(_LOGPROB.search(t) for t in tokens)
        if any("advantage" in t for t in tokens) or (any("reward" in t for t in tokens) and has_logprob):
            # Whole name parts: "generation" holds "ratio", and clip_grad_norm_ clips gradients, not ratios.
            parts = {p for t in tokens if not t.startswith("clip_grad") for p in t.lower().split("_")}
            if parts & {"ratio", "ratios"} and parts & {"clamp", "clip", "clipped", "cliprange"}:
                method, what = "PPO", "hand-written clipped policy-ratio loss"
            elif any("group" in t for t in tokens) and ("std" in tokens or any(t.endswith("_std") for t in tokens)):
                method, what = "GRPO", "hand-written group-normalised policy-gradient loss"
            else:
                method, what = "RL", "hand-written policy-gradient loss (rewards x log-probabilities)"
        elif {"chosen", "rejected"} <= {p for t in tokens for p in re.split(r"_", t)} and (
            {"logsigmoid", "log_sigmoid"} & tokens
        ):
            method, what = "DPO", "hand-written chosen/rejected log-sigmoid loss"
        else:
            method, what = "SFT", "hand-written training loop with a supervised loss"
        self.add(method, tree, what)


def _is_trl_argv(node: ast.List | ast.Tuple) -> bool:
    elts = node.elts
    return (
        len(elts) >= 2
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts[:2])
        and elts[0].value.rsplit("/", 1)[-1] == "trl"
        and elts[1].value in _CLI_METHODS
    )


def _command_evidence(text: str, name: str) -> list[Evidence]:
    found = []
    for i, line in enumerate(text.splitlines() or [text], start=1):
        for pattern, fixed in _COMMAND_PATTERNS:
            m = pattern.search(line)
            if m:
                method = fixed or _CLI_METHODS.get(m.group(1).lower(), "RL")
                found.append(Evidence(method, name, i, f"runs {m.group(0)[:60]}"))
                break
    return found


def _stream_python(lines: Iterator[str] | _Lines, name: str) -> list[Evidence]:
    """A script too large for a syntax tree, line by line: trainer names among its tokens (outside strings and
    comments) and trainer command lines anywhere, in one pass over the file."""
    commands: list[Evidence] = []
    numbered = enumerate(lines, start=1)

    def readline() -> str:
        for i, line in numbered:
            commands.extend(e._replace(line=i) for e in _command_evidence(line, name))
            return line
        return ""

    found = _analyze_unparsable(readline, name)
    for _ in iter(readline, ""):  # a tokenizer error stops the tokens, never the command lines
        pass
    return found + commands


def _analyze_unparsable(source: str | Callable[[], str], name: str) -> list[Evidence]:
    """Names of trainers outside strings and comments (tokenize copes with most half-written files); `source` is
    a text or a `readline`."""
    code = []  # trainer names only: a large file's other tokens are not kept
    readline = io.StringIO(source).readline if isinstance(source, str) else source
    try:
        for tok in tokenize.generate_tokens(readline):
            if tok.type == tokenize.NAME and tok.string in TRAINER_METHODS:
                code.append((tok.string, tok.start[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    found = [Evidence(TRAINER_METHODS[s], name, line, f"uses {s} (file does not parse)")
             for s, line in code if s in TRAINER_METHODS]  # fmt: skip
    return found


# -- shell and notebooks -----------------------------------------------------------------------------------


def analyze_shell(text: str, name: str = "<shell>") -> list[Evidence]:
    """Trainer command lines and copies of the base model in a shell script (comments ignored)."""
    return analyze_shell_lines(text.splitlines(), name)


def analyze_shell_lines(lines: Iterable[str], name: str = "<shell>") -> list[Evidence]:
    """`analyze_shell` over lines (a large script is streamed)."""
    found = []
    for i, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0] if not raw.lstrip().startswith("#!") else ""
        found += [e._replace(line=i) for e in _command_evidence(line, name)]
        if _SHELL_COPY.search(line):
            found.append(Evidence("copy", name, i, f"copies the base model: {line.strip()[:80]}"))
    return found


def _analyze_notebook(text: str, name: str) -> list[Evidence]:
    try:
        cells = json.loads(text).get("cells", [])
    except (json.JSONDecodeError, AttributeError):
        return []
    python, shell = [], []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        for line in src if isinstance(src, list) else src.splitlines(keepends=True):
            stripped = line.lstrip()
            if stripped.startswith("!"):
                shell.append(stripped[1:])
                python.append("\n")
            else:
                python.append("\n" if stripped.startswith("%") else line if line.endswith("\n") else line + "\n")
    return analyze_python("".join(python), name) + analyze_shell("".join(shell), name)
