"""Code snapshots of the agent's `code/` in a harness-owned git repository (`CodeSnapshots`).

Each snapshot builds a fresh index from the files on disk (the agent's `.gitignore` files and any `.git` of its
own are not obeyed: the record must not depend on the agent), skips files over a size cap, and commits only
when the tree differs from the last commit. `harness/code_snapshots.jsonl` maps labels to commits. Written
under the run's harness directory, outside the workspace, so the agent can neither read nor rewrite it.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field

from a2rl_bench.isolation import safefs
from a2rl_bench.jsonl import read_jsonl
from a2rl_bench.records import utcnow

log = logging.getLogger(__name__)

SKIP_DIRS = frozenset({".git", "__pycache__", ".ipynb_checkpoints"})
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "a2rl",
    "GIT_AUTHOR_EMAIL": "a2rl@localhost",
    "GIT_COMMITTER_NAME": "a2rl",
    "GIT_COMMITTER_EMAIL": "a2rl@localhost",
}


class SnapshotError(RuntimeError):
    """git failed while taking or reading a code snapshot."""


class SnapshotRecord(BaseModel):
    """One line of `code_snapshots.jsonl`: a snapshot request and the commit that holds it."""

    label: str
    sha: str
    changed: bool
    """False when the code was identical to the previous snapshot (no new commit was made)."""
    at: datetime = Field(default_factory=utcnow)
    n_files: int = 0
    skipped: list[str] = Field(default_factory=list)
    """Files left out: over the size cap, over the file-count cap, or not regular files."""


class CodeSnapshots:
    """Snapshots of the agent's `code/` directory in a harness-owned git repository.

    Args:
        harness_dir: the run's harness directory; the repository is `harness_dir / "code.git"`.
        code_dir: the directory to snapshot; default `<run dir>/workspace/code` (the layout of `RunPaths`).
        max_file_bytes: larger files are left out of the snapshot (and listed in its record).
        max_files: at most this many files per snapshot, in sorted path order.
    """

    def __init__(
        self,
        harness_dir: Path | str,
        code_dir: Path | str | None = None,
        max_file_bytes: int = 2 * 1024**2,
        max_files: int = 20_000,
    ) -> None:
        self.harness_dir = Path(harness_dir)
        self.code_dir = Path(code_dir) if code_dir else self.harness_dir.parent / "workspace" / "code"
        self.git_dir = self.harness_dir / "code.git"
        self.log_path = self.harness_dir / "code_snapshots.jsonl"
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        # Submissions (grading threads) and the periodic thread may snapshot at the same moment; git's
        # index and ref updates are not safe to interleave, so one snapshot runs at a time.
        self._lock = threading.Lock()

    # -- taking snapshots ------------------------------------------------------------------------
    def snapshot(self, label: str) -> str:
        """Commit the current state of `code_dir` and return the commit sha.

        When nothing changed since the last snapshot no commit is made and the last sha is returned.
        """
        with self._lock:
            self._init()
            staging = Path(tempfile.mkdtemp(prefix="snapshot-", dir=self.harness_dir))
            try:
                files, skipped = self._collect(staging)
                tree = self._write_tree(files, staging)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            head = self._head()
            changed = head is None or self._git("rev-parse", f"{head}^{{tree}}").strip() != tree
            sha = self._commit(tree, head, label, skipped) if changed else head
            record = SnapshotRecord(label=label, sha=sha, changed=changed, n_files=len(files), skipped=skipped)
            with self.log_path.open("a") as f:
                f.write(record.model_dump_json() + "\n")
            return sha

    @contextmanager
    def periodic(self, interval_s: float, label: str = "periodic") -> Iterator[None]:
        """Snapshot every `interval_s` seconds while the block runs, and once more when it exits."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval_s):
                self._snapshot_logged(label)

        thread = threading.Thread(target=loop, name="code-snapshots", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self._snapshot_logged(f"{label}-end")

    # -- reading them back -----------------------------------------------------------------------
    def records(self) -> list[SnapshotRecord]:
        if not self.log_path.exists():
            return []
        return [SnapshotRecord.model_validate(row) for row in read_jsonl(self.log_path)]

    def sha_for(self, label: str) -> str | None:
        """The commit of the latest snapshot taken with this label."""
        return next((r.sha for r in reversed(self.records()) if r.label == label), None)

    def diff(self, a: str, b: str, stat: bool = False) -> str:
        """Unified diff (or `--stat`) from commit `a` to commit `b`."""
        args = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "-M", a, b]
        return self._git(*(args[:1] + ["--stat"] + args[1:] if stat else args))

    def files(self, sha: str) -> list[str]:
        out = self._git("ls-tree", "-r", "-z", "--name-only", sha)
        return sorted(p for p in out.split("\0") if p)

    def export(self, sha: str, dest: Path | str) -> Path:
        """Write the files of commit `sha` into `dest` (e.g. for static route labelling)."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        if not self.files(sha):
            # git archive of an empty tree is a header-only tar that tarfile refuses to open ("end of file
            # header"); an agent that emptied or was mid-rename of its code/ at snapshot time makes one.
            return dest
        proc = subprocess.run(self._cmd("archive", "--format=tar", sha), capture_output=True, env=self._env())
        if proc.returncode != 0:
            raise SnapshotError(f"git archive {sha}: {proc.stderr.decode(errors='replace').strip()}")
        with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
            tar.extractall(dest, filter=_files_only)
        return dest

    # -- internals --------------------------------------------------------------------------------
    def _snapshot_logged(self, label: str) -> None:
        try:
            self.snapshot(label)
        except (OSError, SnapshotError) as e:  # a failed periodic snapshot must not stop the run
            log.warning("code snapshot %r failed: %s", label, e)

    def _init(self) -> None:
        if (self.git_dir / "HEAD").exists():
            return
        self.harness_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "init", "--quiet", "--bare", "--initial-branch=snapshots", str(self.git_dir)],
            check=True, capture_output=True, env=self._env(),
        )  # fmt: skip

    def _collect(self, staging: Path) -> tuple[list[str], list[str]]:
        """Copy what to snapshot (regular files and links under the caps) into `staging`, a harness-owned
        directory git then reads: git never resolves a path in the agent's directory, where a directory swapped
        for a link would make it read host files. Returns the relative paths kept and the ones left out."""
        keep: list[str] = []
        skipped: list[str] = []
        if not self.code_dir.is_dir() or self.code_dir.is_symlink():
            return keep, skipped
        for entry in safefs.walk(self.code_dir, prune=lambda e: e.name in SKIP_DIRS):
            if entry.is_dir:
                continue
            if not (entry.is_file or entry.is_link):
                skipped.append(f"{entry.rel} (not a regular file)")
            elif entry.st.st_size > self.max_file_bytes:
                skipped.append(f"{entry.rel} ({entry.st.st_size} bytes > {self.max_file_bytes})")
            elif len(keep) >= self.max_files:
                skipped.append(f"{entry.rel} (over {self.max_files} files)")
            elif self._stage(entry, staging / entry.rel):  # a link is recorded as a link, never followed
                keep.append(entry.rel)
        return sorted(keep), skipped

    def _stage(self, entry: safefs.Entry, dest: Path) -> bool:
        """False when the entry changed kind since it was listed (deleted or swapped while we walk)."""
        content = safefs.read_link(entry) if entry.is_link else safefs.read_file(entry, self.max_file_bytes)
        if content is None:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        if entry.is_link:
            os.symlink(content, dest)
        else:
            dest.write_bytes(content)
            if entry.st.st_mode & 0o100:
                dest.chmod(0o755)
        return True

    def _write_tree(self, files: list[str], staging: Path) -> str:
        index = self.git_dir / "snapshot.index"
        index.unlink(missing_ok=True)
        env = self._env() | {"GIT_INDEX_FILE": str(index)}
        if files:
            payload = "\0".join(files).encode() + b"\0"
            proc = subprocess.run(
                self._cmd("update-index", "--add", "-z", "--stdin", work_tree=staging),
                input=payload,
                capture_output=True,
                env=env,
            )
            if proc.returncode != 0:
                raise SnapshotError(f"git update-index: {proc.stderr.decode(errors='replace').strip()}")
        return self._git("write-tree", env=env).strip()

    def _commit(self, tree: str, parent: str | None, label: str, skipped: list[str]) -> str:
        message = label if not skipped else label + "\n\nleft out:\n" + "\n".join(skipped[:200])
        args = ["commit-tree", tree, "-F", "-"] + (["-p", parent] if parent else [])
        sha = self._git(*args, input=message).strip()
        self._git("update-ref", "refs/heads/snapshots", sha)
        return sha

    def _head(self) -> str | None:
        proc = subprocess.run(
            self._cmd("rev-parse", "--verify", "--quiet", "refs/heads/snapshots"), capture_output=True, text=True,
            env=self._env(),
        )  # fmt: skip
        return proc.stdout.strip() or None

    def _cmd(self, *args: str, work_tree: Path | None = None) -> list[str]:
        # Only reading files into the index needs a work tree: the harness-owned staging copy.
        tree = [f"--work-tree={work_tree}"] if work_tree else []
        return ["git", f"--git-dir={self.git_dir}", *tree, *args]

    def _git(self, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run(self._cmd(*args), input=input, capture_output=True, text=True, env=env or self._env())
        if proc.returncode != 0:
            raise SnapshotError(f"git {args[0]}: {proc.stderr.strip()}")
        return proc.stdout

    def _env(self) -> dict[str, str]:
        # Only our settings: no user/system config, hooks or GIT_* variables of the harness process.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        return (
            env
            | GIT_IDENTITY
            | {
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": os.devnull,
                "GIT_TERMINAL_PROMPT": "0",
            }
        )


def _files_only(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """Extract regular files and directories only: a recorded symlink may point anywhere."""
    if not (member.isfile() or member.isdir()):
        return None
    return tarfile.data_filter(member, path)
