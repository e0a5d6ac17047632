"""Recording during a run: code snapshots of `code/`, resource samples, LLM-call events (docs/architecture.md).

Everything is written under the run's harness directory, outside the workspace, so the agent can neither
read nor rewrite its own record.

- `CodeSnapshots` keeps a git repository at `harness/code.git` whose work tree is `workspace/code`. Each
  snapshot builds a fresh index from the files on disk (the agent's `.gitignore` files and any `.git` of its
  own are not obeyed: the record must not depend on the agent), skips files over a size cap, and commits
  only when the tree differs from the last commit. `harness/code_snapshots.jsonl` maps labels to commits.
- `ResourceSampler` is a thread sampling CPU %, RSS and process count of the agent's process tree, the
  workspace's disk use and, where `pynvml` imports, GPU utilisation and memory, into `harness/resources.jsonl`.
- `read_llm_calls` / `read_tool_calls` turn the agents' `llm_calls.jsonl` / `tool_calls.jsonl` into store rows.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from a2rl import safefs
from a2rl.jsonl import read_jsonl
from a2rl.records import utcnow

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
                input=payload, capture_output=True, env=env,
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
        return env | GIT_IDENTITY | {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
        }


def _files_only(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """Extract regular files and directories only: a recorded symlink may point anywhere."""
    if not (member.isfile() or member.isdir()):
        return None
    return tarfile.data_filter(member, path)


# ---- resources --------------------------------------------------------------------------------------


class GpuSample(BaseModel):
    index: int
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None


class ResourceSample(BaseModel):
    """One line of `resources.jsonl`."""

    seq: int
    at: datetime = Field(default_factory=utcnow)
    elapsed_s: float
    """Seconds since the sampler started (wall clock, grading included)."""
    n_procs: int
    """Processes in the agent's tree."""
    cpu_percent: float
    """Sum over the tree; 100 = one core busy."""
    rss_bytes: int
    workspace_bytes: int | None = None
    """Disk use of the workspace (measured every `disk_interval_s`, else None)."""
    gpus: list[GpuSample] = Field(default_factory=list)
    gpu_mem_tree_bytes: int | None = None
    """GPU memory held by processes of the agent's tree, where the driver reports it."""
    extra: dict[str, Any] = Field(default_factory=dict)


def workspace_pids(workspace: Path | str) -> Callable[[], list[int]]:
    """A `pids_fn` that finds the agent without being told its pid: processes whose cwd is in the workspace."""
    import psutil

    root = os.path.realpath(workspace)
    me = os.getpid()

    def pids() -> list[int]:
        found = []
        for p in psutil.process_iter(["pid", "cwd"]):
            cwd = p.info.get("cwd")
            if p.info["pid"] != me and cwd and (cwd == root or cwd.startswith(root + os.sep)):
                found.append(p.info["pid"])
        return found

    return pids


class ResourceSampler:
    """Samples the agent's process tree every `interval_s` seconds into `harness_dir/resources.jsonl`.

    Use as a context manager around the agent session. `pids_fn` returns the root pids of the agent (their
    descendants are included); `extra_fn` may add fields to each sample (e.g. whether grading is running).
    """

    def __init__(
        self,
        harness_dir: Path | str,
        pids_fn: Callable[[], list[int]],
        interval_s: float = 5.0,
        workspace: Path | str | None = None,
        disk_interval_s: float = 60.0,
        extra_fn: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.path = Path(harness_dir) / "resources.jsonl"
        self.pids_fn = pids_fn
        self.interval_s = interval_s
        self.workspace = Path(workspace) if workspace else None
        self.disk_interval_s = disk_interval_s
        self.extra_fn = extra_fn
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[int, Any] = {}  # psutil.Process objects kept so cpu_percent() measures between samples
        self._seq = _count_lines(self.path)
        self._nvml: Any = None
        self._start = time.monotonic()
        self._last_disk = -float("inf")

    def __enter__(self) -> ResourceSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._nvml = _nvml()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="resource-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample_once()  # the end state, so a short session still has a sample

    def sample_once(self) -> ResourceSample:
        sample = self._sample()
        with self.path.open("a") as f:
            f.write(sample.model_dump_json() + "\n")
        return sample

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample_once()
            except Exception as e:  # sampling is best effort; never take the run down
                log.warning("resource sample failed: %s", e)

    def _sample(self) -> ResourceSample:
        import psutil

        procs = self._tree(psutil)
        cpu = rss = 0.0
        for p in procs:
            try:
                cpu += p.cpu_percent(None)
                rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        elapsed = time.monotonic() - self._start
        disk = None
        if self.workspace is not None and elapsed - self._last_disk >= self.disk_interval_s:
            disk, self._last_disk = _disk_usage(self.workspace), elapsed
        gpus, tree_mem = _gpu_sample(self._nvml, {p.pid for p in procs})
        sample = ResourceSample(
            seq=self._seq, elapsed_s=round(elapsed, 3), n_procs=len(procs), cpu_percent=round(cpu, 1),
            rss_bytes=int(rss), workspace_bytes=disk, gpus=gpus, gpu_mem_tree_bytes=tree_mem,
            extra=self.extra_fn() if self.extra_fn else {},
        )  # fmt: skip
        self._seq += 1
        return sample

    def _tree(self, psutil: Any) -> list[Any]:
        seen: dict[int, Any] = {}
        for pid in self.pids_fn():
            try:
                root = self._procs.get(pid) or psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    seen.setdefault(p.pid, self._procs.get(p.pid) or p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self._procs = seen
        return list(seen.values())


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open() as f:
        return sum(1 for line in f if line.strip())


def _disk_usage(root: Path) -> int:
    try:
        return safefs.disk_usage(root)
    except OSError:  # no workspace (yet), or it is a link
        return 0


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no pynvml or no driver: GPU fields stay empty
        return None


def _gpu_sample(nvml: Any, pids: set[int]) -> tuple[list[GpuSample], int | None]:
    if nvml is None:
        return [], None
    gpus: list[GpuSample] = []
    tree_mem = 0
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuSample(index=i, util_percent=float(util.gpu), mem_used_bytes=int(mem.used),
                                  mem_total_bytes=int(mem.total)))
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid in pids and proc.usedGpuMemory:
                    tree_mem += int(proc.usedGpuMemory)
    except Exception as e:  # a driver hiccup loses this sample's GPU fields, not the sample
        log.debug("NVML query failed: %s", e)
    return gpus, tree_mem if gpus else None


def read_resources(path: Path | str) -> list[ResourceSample]:
    path = Path(path)
    if not path.exists():
        return []
    return [ResourceSample.model_validate(row) for row in read_jsonl(path)]


def summarize_resources(samples: list[ResourceSample]) -> dict[str, float | None]:
    """Peaks and means for the run report (None where nothing was measured)."""
    if not samples:
        return {}
    disk = [s.workspace_bytes for s in samples if s.workspace_bytes is not None]
    gpu_util = [g.util_percent for s in samples for g in s.gpus if g.util_percent is not None]
    gpu_mem = [sum(g.mem_used_bytes or 0 for g in s.gpus) for s in samples if s.gpus]
    return {
        "resource_samples": len(samples),
        "cpu_percent_mean": round(sum(s.cpu_percent for s in samples) / len(samples), 1),
        "cpu_percent_peak": max(s.cpu_percent for s in samples),
        "rss_peak_bytes": max(s.rss_bytes for s in samples),
        "procs_peak": max(s.n_procs for s in samples),
        "workspace_peak_bytes": max(disk) if disk else None,
        "gpu_util_percent_mean": round(sum(gpu_util) / len(gpu_util), 1) if gpu_util else None,
        "gpu_mem_peak_bytes": max(gpu_mem) if gpu_mem else None,
    }


def resource_rows(samples: list[ResourceSample]) -> list[dict[str, Any]]:
    """Rows for the `resources` table of the results store."""
    return [
        {
            "seq": s.seq, "created_at": s.at, "elapsed_s": s.elapsed_s, "n_procs": s.n_procs,
            "cpu_percent": s.cpu_percent, "rss_bytes": s.rss_bytes, "workspace_bytes": s.workspace_bytes,
            "gpu_util_percent": (sum(g.util_percent or 0 for g in s.gpus) / len(s.gpus)) if s.gpus else None,
            "gpu_mem_bytes": sum(g.mem_used_bytes or 0 for g in s.gpus) if s.gpus else None,
        }  # fmt: skip
        for s in samples
    ]


# ---- LLM and tool calls -------------------------------------------------------------------------------
# Agents write `harness/llm_calls.jsonl` and `harness/tool_calls.jsonl` (records `LLMCallEvent` and
# `ToolCallEvent` in agents/base.py). They are read here as plain JSON, so this module does not import agents;
# `read_jsonl(tolerant=True)` skips the torn last line a crashed agent may leave.


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_llm_calls(path: Path | str) -> list[dict[str, Any]]:
    """Rows for the `llm_calls` table, one per line of `llm_calls.jsonl`; `seq` is the line number."""
    return [
        {
            "seq": seq, "created_at": r.get("at"), "agent_elapsed_s": r.get("agent_elapsed_s"),
            "model": r.get("model"), "input_tokens": _int(r.get("input_tokens")) or 0,
            "output_tokens": _int(r.get("output_tokens")) or 0,
            "cache_read_tokens": _int(r.get("cache_read_tokens")) or 0,
            "cache_write_tokens": _int(r.get("cache_write_tokens")) or 0, "cost_usd": r.get("cost_usd"),
            "latency_s": r.get("latency_s"), "error": r.get("error"), "call": _int(r.get("call")),
            "attempt": _int(r.get("attempt")), "status": _int(r.get("status")), "stop_reason": r.get("stop_reason"),
            "source": r.get("source"),
        }  # fmt: skip
        for seq, r in enumerate(read_jsonl(path, tolerant=True))
    ]


def read_tool_calls(path: Path | str) -> list[dict[str, Any]]:
    """Rows for the `tool_calls` table, one per line of `tool_calls.jsonl`; `seq` is the line number."""
    return [
        {
            "seq": seq, "created_at": r.get("at"), "call": _int(r.get("call")), "tool": r.get("tool"),
            "ok": r.get("ok"), "exit_code": _int(r.get("exit_code")), "duration_s": r.get("duration_s"),
            "output_chars": _int(r.get("output_chars")), "error": r.get("error"), "source": r.get("source"),
            "input_json": json.dumps(r.get("input") or {}, sort_keys=True, default=str),
        }  # fmt: skip
        for seq, r in enumerate(read_jsonl(path, tolerant=True))
    ]


def summarize_llm_calls(rows: list[dict[str, Any]]) -> dict[str, float | int | None]:
    """Totals for the run report (tokens as input + output + cache read + cache write)."""
    if not rows:
        return {}
    parts = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    tokens = sum(r[p] for r in rows for p in parts)
    costs = [r["cost_usd"] for r in rows if isinstance(r["cost_usd"], (int, float))]
    latencies = [r["latency_s"] for r in rows if isinstance(r["latency_s"], (int, float))]
    return {
        "llm_requests": len(rows),
        "llm_failed_requests": sum(bool(r["error"]) for r in rows),
        "llm_tokens_total": tokens,
        "llm_input_tokens": sum(r["input_tokens"] for r in rows),
        "llm_output_tokens": sum(r["output_tokens"] for r in rows),
        "llm_cache_read_tokens": sum(r["cache_read_tokens"] for r in rows),
        "llm_cost_usd": round(sum(costs), 6) if costs else None,
        "llm_latency_s_mean": round(sum(latencies) / len(latencies), 3) if latencies else None,
    }
