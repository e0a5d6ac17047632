"""Resource samples of a run: `ResourceSampler` is a thread sampling CPU %, RSS and process count of the agent's
process tree, the workspace's disk use and, where `pynvml` imports, GPU utilisation and memory, into
`harness/resources.jsonl`."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from a2rl_bench.isolation import safefs
from a2rl_bench.jsonl import read_jsonl
from a2rl_bench.records import utcnow

log = logging.getLogger(__name__)


class GpuSample(BaseModel):
    index: int
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    procs: int | None = None
    """Compute processes on this GPU, whoever started them (None: the driver did not list them)."""
    agent_procs: int | None = None
    """Of them, processes of the agent's tree."""


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
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            gpus.append(
                GpuSample(
                    index=i, util_percent=float(util.gpu), mem_used_bytes=int(mem.used), mem_total_bytes=int(mem.total),
                    procs=len(procs), agent_procs=sum(p.pid in pids for p in procs),
                )
            )  # fmt: skip
            for proc in procs:
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
    shared = sorted(n for n in map(gpu_shared_procs, samples) if n is not None)
    return {
        "resource_samples": len(samples),
        "cpu_percent_mean": round(sum(s.cpu_percent for s in samples) / len(samples), 1),
        "cpu_percent_peak": max(s.cpu_percent for s in samples),
        "rss_peak_bytes": max(s.rss_bytes for s in samples),
        "procs_peak": max(s.n_procs for s in samples),
        "workspace_peak_bytes": max(disk) if disk else None,
        "gpu_util_percent_mean": round(sum(gpu_util) / len(gpu_util), 1) if gpu_util else None,
        "gpu_mem_peak_bytes": max(gpu_mem) if gpu_mem else None,
        "gpu_shared_procs_median": shared[len(shared) // 2] if shared else None,
        "gpu_shared_procs_peak": shared[-1] if shared else None,
    }


def gpu_shared_procs(sample: ResourceSample) -> int | None:
    """Compute processes outside the agent's tree on the GPUs the agent was using at this sample, while no grading
    of the run ran (its evaluations are the run's own): other runs, or anyone else, on the same card. None where the
    agent held no GPU or the driver did not list processes. A wall-clock budget on a card shared with seven other
    runs is not the budget of a card of its own (an RL update took 30-47 s against 8 s alone; BENCHMARKS.md "RL,
    eighth pass"): this is how a reader tells them apart."""
    if sample.extra.get("grading") is True:
        return None
    used = [g for g in sample.gpus if g.procs is not None and g.agent_procs]
    return sum(g.procs - g.agent_procs for g in used) if used else None


CROWDED_FULL = 0.95
"""A card at least this full (memory used / total) has no room left for an allocation of any size."""
CROWDED_BY_OTHERS = 0.5
"""...and processes outside the agent's tree held at least this share of it: they, not the agent, filled it."""
CROWDED_WINDOW_S = 30.0
"""Seconds before the session's end in which such a sample counts: an out-of-memory error ends a process at once."""


def gpu_crowded_at_end(samples: list[ResourceSample]) -> str | None:
    """Whether other processes had filled the agent's GPU just before its session ended (the clause of a reason), or
    None: a sample in the session's last `CROWDED_WINDOW_S` seconds where a card the agent was using was at least
    `CROWDED_FULL` full and processes outside its tree (other runs on a shared card, anyone) held at least
    `CROWDED_BY_OTHERS` of it. In the eleventh RL pass (BENCHMARKS.md) two agents died of CUDA out of memory this
    way, on a card at 99.5%, and their runs were counted as the agent's results.

    Only from what the harness measured (NVML), never from the agent's output, which would let an agent have its own
    run set aside. Needs the driver's per-process memory of the agent's tree (`gpu_mem_tree_bytes`): without it the
    agent's own share is unknown and nothing is concluded. The tree's memory is summed over its cards, so on several
    cards the others' share is underestimated (the rule errs towards the agent's own failure)."""
    if not samples:
        return None
    end = samples[-1].elapsed_s
    worst: tuple[float, GpuSample, int, float] | None = None
    for s in samples:
        if end - s.elapsed_s > CROWDED_WINDOW_S or not s.gpu_mem_tree_bytes:
            continue
        for g in s.gpus:
            used, total = g.mem_used_bytes, g.mem_total_bytes
            if not (g.agent_procs and g.procs and g.procs > g.agent_procs and used and total):
                continue
            others = used - s.gpu_mem_tree_bytes
            if used >= CROWDED_FULL * total and others >= CROWDED_BY_OTHERS * total:
                if worst is None or others > worst[0]:
                    worst = (others, g, s.gpu_mem_tree_bytes, end - s.elapsed_s)
    if worst is None:
        return None
    others, g, mine, before = worst
    gib = 2**30
    return (f"{before:.0f} s before it ended, other processes ({g.procs - g.agent_procs}) held {others / gib:.1f} of "
            f"GPU {g.index}'s {g.mem_total_bytes / gib:.1f} GiB ({g.mem_used_bytes / g.mem_total_bytes:.0%} full) and "
            f"the agent {mine / gib:.1f} GiB: the card was full of other processes' memory")


def resource_rows(samples: list[ResourceSample]) -> list[dict[str, Any]]:
    """Rows for the `resources` table of the results store."""
    return [
        {
            "seq": s.seq,
            "created_at": s.at,
            "elapsed_s": s.elapsed_s,
            "n_procs": s.n_procs,
            "cpu_percent": s.cpu_percent,
            "rss_bytes": s.rss_bytes,
            "workspace_bytes": s.workspace_bytes,
            "gpu_util_percent": (sum(g.util_percent or 0 for g in s.gpus) / len(s.gpus)) if s.gpus else None,
            "gpu_mem_bytes": sum(g.mem_used_bytes or 0 for g in s.gpus) if s.gpus else None,
        }  # fmt: skip
        for s in samples
    ]
