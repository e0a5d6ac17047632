"""Progress of a run as files: the flow writes `harness/progress.json` (phase, baseline items); a watcher reads
it with the files the run writes anyway (clock.json, ledger.jsonl, tool_calls.jsonl, agent.log).

Nothing here depends on Prefect: the CLI's display works the same for a run in this process or another.
A launcher that wants to know where a run it starts will live sets `A2RL_RUN_ANNOUNCE` to a file path; the
flow writes the run's id and directories there as soon as it has them.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

ANNOUNCE_ENV = "A2RL_RUN_ANNOUNCE"
PROGRESS_FILE = "progress.json"
RUN_LOG = "run.log"
"""The run's own log: Prefect's log lines and, when it fails, the traceback."""

PHASE_LABELS = {
    "open": "opening the run",
    "preflight": "checking the configuration",
    "provision": "preparing data, base model and workspace",
    "baseline": "evaluating the base model",
    "waiting_gpu": "waiting for a GPU slot",
    "agent_session": "agent session",
    "final_grading": "final evaluation on the hidden test set",
    "summary": "writing the report",
    "done": "done",
}


class RunProgress(BaseModel):
    """The content of `progress.json` (also what is written to the announce file)."""

    run_id: str
    harness_dir: Path
    phase: str = "open"
    phase_started_at: float = 0.0
    baseline_done: int = 0
    baseline_total: int = 0
    baseline_split: str | None = None
    budget_s: float = 0.0
    error: str | None = None
    pid: int = 0
    """The process running the flow, and its host: a `running` row with no such process died without a trace."""
    host: str = ""

    def process_alive(self) -> bool | None:
        """Whether the run's process is alive; None when it ran on another host (cannot tell from here)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def report(self) -> Path:
        return self.harness_dir / "report.md"

    @property
    def log(self) -> Path:
        return self.harness_dir / RUN_LOG


class ProgressWriter:
    """Flow side: one small JSON file, replaced atomically at each change."""

    def __init__(self, run_id: str, harness_dir: Path, budget_s: float):
        self.state = RunProgress(run_id=run_id, harness_dir=harness_dir, budget_s=budget_s, phase_started_at=time.time(),
                                 pid=os.getpid(), host=socket.gethostname())  # fmt: skip
        self.path = Path(harness_dir) / PROGRESS_FILE
        self._write()
        if announce := os.environ.get(ANNOUNCE_ENV):
            try:
                _write_atomic(Path(announce), self.state.model_dump_json())
            except OSError:  # the launcher's display is a convenience, never the reason a run fails
                pass

    def update(self, **fields) -> None:
        if "phase" in fields and fields["phase"] != self.state.phase:
            fields.setdefault("phase_started_at", time.time())
        self.state = self.state.model_copy(update=fields)
        self._write()

    def _write(self) -> None:
        try:
            _write_atomic(self.path, self.state.model_dump_json())
        except OSError:  # progress is a convenience: never the reason a run fails
            pass


def note_phase(harness_dir: Path, phase: str) -> None:
    """Set the phase in a run's progress file from another part of the flow (e.g. waiting for a GPU slot)."""
    path = Path(harness_dir) / PROGRESS_FILE
    if (progress := read_announced(path)) is None or progress.phase == phase:
        return
    try:
        updated = progress.model_copy(update={"phase": phase, "phase_started_at": time.time()})
        _write_atomic(path, updated.model_dump_json())
    except OSError:  # progress is a convenience: never the reason a run fails
        pass


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_announced(path: Path) -> RunProgress | None:
    try:
        return RunProgress.model_validate_json(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ---- watcher side ------------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What the display shows, read from the run's files."""

    progress: RunProgress
    agent_s: float = 0.0
    grading: bool = False
    queued: int = 0
    graded: int = 0
    scores: list[str] = field(default_factory=list)
    mode_breaches: int = 0
    last_activity: str = ""


def read_snapshot(progress_path: Path) -> Snapshot | None:
    """The run's state now; None before its progress file exists."""
    try:
        progress = RunProgress.model_validate_json(Path(progress_path).read_text())
    except (OSError, ValueError):
        return None
    h = progress.harness_dir
    snap = Snapshot(progress=progress)
    _read_submissions(h / "ledger.jsonl", snap)
    clock = _read_json(h / "clock.json")
    if clock:
        snap.agent_s = float(clock.get("elapsed_s", 0.0))
        if progress.phase == "agent_session" and not snap.grading:  # the file is saved every few seconds
            snap.agent_s += max(0.0, time.time() - float(clock.get("at", time.time())))
    snap.agent_s = min(snap.agent_s, progress.budget_s or snap.agent_s)
    snap.last_activity = _last_activity(h)
    return snap


def _read_submissions(ledger: Path, snap: Snapshot) -> None:
    latest: dict[int, dict] = {}
    breaches: set[int] = set()
    for line in _lines(ledger):
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line being written
        if entry.get("kind") == "submission" and entry.get("submission_id") is not None:
            latest[entry["submission_id"]] = entry
            if (entry.get("detail") or {}).get("mode_ok") is False:
                breaches.add(entry["submission_id"])
    snap.mode_breaches = len(breaches)
    for sid, e in sorted(latest.items()):
        if e.get("status") in ("queued", "running"):
            snap.queued += 1
            snap.grading = True  # the agent's clock stops while the grader works on its submissions
        else:
            snap.graded += 1
            score = e.get("score")
            snap.scores.append(f"#{sid} {score:.1f}" if isinstance(score, (int, float)) else f"#{sid} error")


def _last_activity(h: Path) -> str:
    """The agent's latest tool call (LLM agents) or its latest log line (any agent)."""
    candidates = []
    tool_lines = _lines(h / "tool_calls.jsonl", tail_bytes=8192)
    if tool_lines:
        try:
            call = json.loads(tool_lines[-1])
            args = " ".join(str(v) for v in (call.get("input") or {}).values())
            candidates.append((_mtime(h / "tool_calls.jsonl"), f"tool {call.get('tool')}: {' '.join(args.split())}"))
        except ValueError:
            pass
    log_lines = [line for line in _lines(h / "agent.log", tail_bytes=8192) if line.strip()]
    if log_lines:
        candidates.append((_mtime(h / "agent.log"), "log: " + " ".join(log_lines[-1].split())))
    return max(candidates)[1] if candidates else ""


def _lines(path: Path, tail_bytes: int | None = None) -> list[str]:
    try:
        with open(path, "rb") as f:
            if tail_bytes:
                f.seek(max(0, os.fstat(f.fileno()).st_size - tail_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if tail_bytes and len(lines) > 1 else lines


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def status_line(snap: Snapshot, with_time: bool = True) -> str:
    """One line for a log or a pipe: phase and the counters that matter in it (`with_time=False`: without the
    agent's clock, i.e. what changes only when something happens)."""
    p = snap.progress
    parts = [f"[{p.phase}] {PHASE_LABELS.get(p.phase, p.phase)}"]
    if p.phase == "baseline" and p.baseline_total:
        parts.append(f"baseline items {p.baseline_done}/{p.baseline_total}")
    if p.phase in ("agent_session", "final_grading", "summary"):
        if with_time:
            parts.append(f"agent time {snap.agent_s:.0f}/{p.budget_s:.0f} s" + (" (paused: grading)" if snap.grading else ""))
        parts.append(f"submissions {snap.queued} queued, {snap.graded} graded" +
                     (f" [{', '.join(snap.scores[-5:])}]" if snap.scores else ""))
        if snap.mode_breaches:
            parts.append(f"MODE BREACHES {snap.mode_breaches}")
    return "; ".join(parts)


def running_label(harness_dir: str | Path | None) -> str:
    """What a `running` row means: a process is still on it, or it died without a trace, or (another host) unknown."""
    if not harness_dir:
        return "running"
    progress = read_announced(Path(harness_dir) / PROGRESS_FILE)
    alive = progress.process_alive() if progress else None
    if alive is None:
        return "running" if progress else "running (no progress file)"
    return f"running (pid {progress.pid}, {progress.phase})" if alive else f"running? process {progress.pid} is gone"
