"""Progress of a run as files: the flow writes `harness/progress.json` (phase, the step it waits on, baseline
splits); an evaluation process writes `harness/eval_progress.json` (items counted as they finish); a watcher
reads them with the files the run writes anyway (clock.json, ledger.jsonl, tool_calls.jsonl, llm_calls.jsonl,
agent.log).

Nothing here depends on Prefect: the CLI's display works the same for a run in this process or another.
A launcher that wants to know where a run it starts will live sets `A2RL_RUN_ANNOUNCE` to a file path; the
flow writes the run's id and directories there as soon as it has them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from a2rl_bench.isolation import procs
from a2rl_bench.protocol.breaches import breaks_mode

ANNOUNCE_ENV = "A2RL_RUN_ANNOUNCE"
PROGRESS_FILE = "progress.json"
RUN_LOG = "run.log"
"""The run's own log: Prefect's log lines and, when it fails, the traceback."""
EVAL_PROGRESS_FILE = "eval_progress.json"
EVAL_PROGRESS_ENV = "A2RL_EVAL_PROGRESS"
"""Set for an evaluation process: the file it counts its finished items in."""
GRADING_PROGRESS_FILE = "grading_progress.json"
"""Where the grader's evaluation of a submission counts its items (the agent session's own file)."""

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
    baseline_item_s: float | None = None
    """Seconds per item of the baseline's last finished split (loading included): the next split's ETA until
    its own rate is measured."""
    budget_s: float = 0.0
    step: str | None = None
    """What the phase waits on now, in words ("converting the base model ..."); None: nothing to add."""
    error: str | None = None
    pid: int = 0
    """The process running the flow, and its host: a `running` row with no such process died without a trace."""
    host: str = ""

    def process_alive(self) -> bool | None:
        """Whether the run's process is alive (a zombie is not, see procs.pid_alive); None when it ran on another
        host (cannot tell from here)."""
        if self.host != socket.gethostname():
            return None
        return procs.pid_alive(self.pid)

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
                write_atomic(Path(announce), self.state.model_dump_json())
            except OSError:  # the launcher's display is a convenience, never the reason a run fails
                pass

    def update(self, **fields) -> None:
        if "phase" in fields and fields["phase"] != self.state.phase:
            fields.setdefault("phase_started_at", time.time())
            fields.setdefault("step", None)  # a step belongs to its phase
        self.state = self.state.model_copy(update=fields)
        self._write()

    def _write(self) -> None:
        try:
            write_atomic(self.path, self.state.model_dump_json())
        except OSError:  # progress is a convenience: never the reason a run fails
            pass


def note_phase(harness_dir: Path, phase: str) -> None:
    """Set the phase in a run's progress file from another part of the flow (e.g. waiting for a GPU slot)."""
    path = Path(harness_dir) / PROGRESS_FILE
    if (progress := read_announced(path)) is None or progress.phase == phase:
        return
    _rewrite(path, progress, {"phase": phase, "phase_started_at": time.time(), "step": None})


def note_step(harness_dir: Path, step: str | None) -> None:
    """Say what the current phase waits on (a conversion, a download), from any part of the flow."""
    path = Path(harness_dir) / PROGRESS_FILE
    if (progress := read_announced(path)) is not None and progress.step != step:
        _rewrite(path, progress, {"step": step})


def _rewrite(path: Path, progress: RunProgress, update: dict) -> None:
    try:
        write_atomic(path, progress.model_copy(update=update).model_dump_json())
    except OSError:  # progress is a convenience: never the reason a run fails
        pass


class ItemProgress(BaseModel):
    """The content of `eval_progress.json`: one evaluation's items, counted as each one finishes."""

    what: str = ""
    id: str = ""
    """One evaluation's own mark: a new one in the same phase continues the count (ItemCounter)."""
    done: int = 0
    total: int = 0
    started_at: float = 0.0
    """When the first item started (after the model was loaded)."""
    loaded: bool = False
    """False while the evaluation process still loads the model (before any item can start)."""
    at: float = 0.0
    """When `done` last changed."""

    def left(self) -> str:
        """What remains, in words: loading the model, measuring the rate, or about how long."""
        return "loading the model" if not self.loaded else eta_text(self.eta_s(), 0 < self.total <= self.done)

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds left at the rate measured since the model was loaded (items of a batch finish together, so
        it moves in steps); None before the first item has finished."""
        if self.done <= 0 or self.total <= self.done:
            return None
        now = now or time.time()
        per_item = (self.at - self.started_at) / self.done
        at_rate = per_item * (self.total - self.done) - (now - self.at)
        # While the next item takes longer than the rate says, the items after it are due no sooner than at the
        # rate measured up to now (the ETA stays up instead of sitting at 0 s).
        stalled = (now - self.started_at) / (self.done + 1) * (self.total - self.done - 1)
        return max(0.0, at_rate, stalled)


class ItemProgressWriter:
    """Evaluation side: `add(n)` as items finish; the file is rewritten at most every `every_s` (and at the end)."""

    def __init__(self, path: Path | str | None, total: int, what: str, every_s: float = 0.5):
        self.path = Path(path) if path else None
        self.state = ItemProgress(what=what, id=f"{os.getpid()}-{time.time_ns()}", total=total, started_at=time.time(),
                                  at=time.time())  # fmt: skip
        self.every_s = every_s
        self._written = 0.0
        self._write(force=True)

    @classmethod
    def from_env(cls, total: int, what: str) -> ItemProgressWriter:
        return cls(os.environ.get(EVAL_PROGRESS_ENV), total, what)

    def begin(self) -> None:
        """The items start now (the model is loaded): the rate, and so the ETA, counts from here."""
        self.state.started_at = self.state.at = time.time()
        self.state.loaded = True
        self._write(force=True)

    def add(self, n: int = 1) -> None:
        if n > 0:
            self.state.done = min(self.state.total, self.state.done + n)
            self.state.at = time.time()
            self._write(force=self.state.done == self.state.total)

    def _write(self, force: bool = False) -> None:
        if self.path is None or (not force and time.monotonic() - self._written < self.every_s):
            return
        try:
            write_atomic(self.path, self.state.model_dump_json())
            self._written = time.monotonic()
        except OSError:  # progress is a convenience: never the reason an evaluation fails
            self.path = None


def write_atomic(path: Path, text: str) -> None:
    """A progress file replaced whole (a temporary of this process, renamed): its readers never see half of it."""
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
class LLMTally:
    """An LLM agent's calls so far (from `llm_calls.jsonl`): tokens and the driver's cost."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    offset: int = 0
    """Bytes of the file already counted: each read adds only the calls appended since."""

    def read(self, path: Path) -> LLMTally:
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self
        whole = data[: data.rfind(b"\n") + 1]  # a line being written is counted next time
        for line in whole.splitlines():
            try:
                call = json.loads(line)
            except ValueError:
                continue
            self.calls += 1
            self.input_tokens += int(call.get("input_tokens") or 0) + int(call.get("cache_read_tokens") or 0)
            self.output_tokens += int(call.get("output_tokens") or 0)
            self.cost_usd += float(call.get("cost_usd") or 0.0)
        self.offset += len(whole)
        return self

    def text(self) -> str:
        return (f"{self.calls} LLM calls, {_tokens(self.input_tokens)} in / {_tokens(self.output_tokens)} out tokens, "
                f"${self.cost_usd:.2f}")  # fmt: skip


_LLM_TALLIES: dict[Path, LLMTally] = {}


def _tokens(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


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
    items: ItemProgress | None = None
    """The evaluation running now (baseline, final, a submission's grading), counted per finished item."""
    llm: LLMTally | None = None
    grading_id: int | None = None
    """The submission the grader works on (the oldest queued one)."""
    baseline_val: float | None = None
    """The base model's validation score, once recorded: the bar the agent's submissions are graded against (the
    agent hears it too). Its test score is not read here: the display has no use for it before the report."""


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
    counted = {"baseline": EVAL_PROGRESS_FILE, "final_grading": EVAL_PROGRESS_FILE}
    if snap.queued:
        counted["agent_session"] = GRADING_PROGRESS_FILE
    if name := counted.get(progress.phase):
        try:
            snap.items = ItemProgress.model_validate_json((h / name).read_text())
        except (OSError, ValueError):
            snap.items = None
        if snap.items is not None and name == EVAL_PROGRESS_FILE and snap.items.started_at < progress.phase_started_at:
            # An earlier phase's evaluation (the baseline's, until the final one replaces its file): the final phase
            # counted its items as its own ("final test items 78/80" for 32 items, 2026-11-29).
            snap.items = None
    if (h / "llm_calls.jsonl").exists():
        snap.llm = _LLM_TALLIES.setdefault(h / "llm_calls.jsonl", LLMTally()).read(h / "llm_calls.jsonl")
    return snap


def baseline_items(snap: Snapshot, now: float | None = None) -> tuple[int, float | None]:
    """Baseline items done (finished splits plus the running evaluation's finished items) and the seconds left
    at the rate measured so far (None: not measured yet)."""
    p, items = snap.progress, snap.items
    earlier = (p.baseline_total - p.baseline_done) * p.baseline_item_s if p.baseline_item_s else None
    if items is None or items.what != p.baseline_split:
        return p.baseline_done, earlier
    done = min(p.baseline_total, p.baseline_done + items.done)
    eta = items.eta_s(now)
    if eta is not None and items.done:  # the splits still to come, at the same rate
        eta += (p.baseline_total - p.baseline_done - items.total) * (items.at - items.started_at) / items.done
    return done, eta if eta is not None else earlier


def _read_submissions(ledger: Path, snap: Snapshot) -> None:
    latest: dict[int, dict] = {}
    breaches: set[int] = set()
    for line in _lines(ledger):
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line being written
        if entry.get("kind") == "baseline" and entry.get("split") == "validation":
            score = entry.get("score")
            snap.baseline_val = float(score) if isinstance(score, (int, float)) else snap.baseline_val
        if entry.get("kind") == "submission" and entry.get("submission_id") is not None:
            latest[entry["submission_id"]] = entry
            if breaks_mode(entry.get("detail")):
                breaches.add(entry["submission_id"])
    snap.mode_breaches = len(breaches)
    for sid, e in sorted(latest.items()):
        if e.get("status") in ("queued", "running"):
            snap.queued += 1
            snap.grading_id = sid if snap.grading_id is None else snap.grading_id
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
    log_lines = agent_lines(_lines(h / "agent.log", tail_bytes=8192))
    if log_lines:
        candidates.append((_mtime(h / "agent.log"), "log: " + " ".join(log_lines[-1].split())))
    return max(candidates)[1] if candidates else ""


_WARNING = re.compile(r"\b\w*(Warning|Deprecation)\b[:(]|^\s*warnings\.warn\(|^\s*(warn|warnings)\(|^WARNING\b|\bUserWarning\b")


_ASYNCIO_NOISE = re.compile(r"^\s*(Task was destroyed but it is pending!|Task exception was never retrieved|"
                            r"Future exception was never retrieved|task: <Task (pending|finished)|"
                            r"future: <(Task|Future) (pending|finished))")
"""What asyncio prints as an LLM agent's runner (the harness's side of the session) exits: never the agent's work."""


def agent_lines(lines: list[str]) -> list[str]:
    """The agent's own lines: blank lines, library warnings and the source line Python prints under a warning
    (`  x = f(...)`), and asyncio's lines about the runner's pending tasks left out, so that the latest line shown
    is what the agent did."""
    kept: list[str] = []
    after_warning = False
    for line in lines:
        raw = line.split("| ", 1)[1] if line.lstrip().startswith("| ") else line  # the reference agent's echo
        if not raw.strip() or _ASYNCIO_NOISE.search(raw):
            continue
        if _WARNING.search(raw):
            after_warning = True
            continue
        if after_warning and raw[:1] in (" ", "\t"):
            continue
        after_warning = False
        kept.append(line)
    return kept


def _lines(path: Path, tail_bytes: int | None = None) -> list[str]:
    start = 0
    try:
        with open(path, "rb") as f:
            if tail_bytes:
                start = max(0, os.fstat(f.fileno()).st_size - tail_bytes)
                f.seek(start)
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if start > 0 and len(lines) > 1 else lines  # a tail starts inside a line


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


def status_line(snap: Snapshot, with_time: bool = True, view: CountView | None = None) -> str:
    """One line for a log or a pipe: phase and the counters that matter in it (`with_time=False`: without the
    agent's clock and the item counts, i.e. what changes only when something happens). `view`: the display's
    own, whose counters never go back and whose ETA is smoothed."""
    p = snap.progress
    parts = [f"[{p.phase}] {PHASE_LABELS.get(p.phase, p.phase)}" + (f": {p.step}" if p.step else "")]
    if with_time:  # counts move often: not a change to print
        parts += [f"{c.label} items {c.done}/{c.total}, {c.left}" for c in (view or CountView()).counts(snap)]
    if p.phase in ("agent_session", "final_grading", "summary"):
        if with_time:
            parts.append(f"agent time {snap.agent_s:.0f}/{p.budget_s:.0f} s" + (" (paused: grading)" if snap.grading else ""))
        parts.append(f"submissions {snap.queued} queued, {snap.graded} graded" +
                     (f" [{', '.join(snap.scores[-5:])}]" if snap.scores else ""))
        if snap.mode_breaches:
            parts.append(f"MODE BREACHES {snap.mode_breaches}")
        if snap.llm and with_time:
            parts.append(snap.llm.text())
    return "; ".join(parts)


class EtaSmoother:
    """An ETA as shown, honest about what it knows: it counts down between estimates and moves toward each new one
    gradually (a time constant of `tau_s`), by at most a factor of 2 in any `tau_s`, so a rate that wobbles between
    batches, splits or a slow first item never makes it jump (13 -> 84 -> 53 -> 23 min, issue #36; 9 -> 17 -> 33
    -> 53 min in under a minute, issue #45). Once it has counted down to 0 s with items still to do, it does not
    creep back up by seconds ("about 2 s left" held for 150 s): the count is overdue, and says by how long
    (`overdue_s`), until an item finishes (`done` moves) and the observed rate gives a new estimate."""

    def __init__(self, tau_s: float = 30.0):
        self.tau_s = tau_s
        self.shown: float | None = None
        self.at = 0.0
        self.done: int | None = None
        self.overdue_since: float | None = None

    def __call__(self, estimate: float | None, now: float | None = None, done: int | None = None) -> float | None:
        now = time.time() if now is None else now
        if done is not None and done != self.done:
            if self.overdue_since is not None:  # an item finished after the estimate ran out: estimate anew
                self.shown, self.overdue_since = None, None
            self.done = done
        if self.shown is None:
            if estimate is not None:
                self.shown, self.at = max(0.0, estimate), now
            return self.shown
        if self.overdue_since is not None:
            return 0.0
        dt = max(0.0, now - self.at)
        current = max(0.0, self.shown - dt)
        if current <= 0.0:
            self.overdue_since = self.at + self.shown  # when the shown count reached 0
            self.shown, self.at = 0.0, now
            return 0.0
        if estimate is not None:
            step = min(1.0, dt / self.tau_s)
            target = current + step * (estimate - current)
            most = 2.0**step  # 2x per tau_s at most, compounded over the updates within it
            current = min(max(target, current / most), current * most)
        self.shown, self.at = current, now
        return current

    def overdue_s(self, now: float | None = None) -> float | None:
        """Seconds since the shown ETA ran out with items still to do; None while it has not."""
        if self.overdue_since is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.overdue_since)


class ItemCounter:
    """The items of one phase's evaluations added up: the next evaluation of the phase (the final pick, then
    each submission for analysis) continues the count instead of starting it at 0, and a count read as lower
    than one already shown (a file rewritten) is not shown."""

    def __init__(self) -> None:
        self.finished_total = 0
        self.current_id: str | None = None
        self.current_total = 0
        self.high = 0

    def __call__(self, items: ItemProgress) -> tuple[int, int]:
        if self.current_id is not None and items.id != self.current_id:
            self.finished_total += self.current_total  # it ended (a new one started): all of its items counted
        self.current_id, self.current_total = items.id, items.total
        self.high = max(self.high, self.finished_total + items.done)
        return self.high, self.finished_total + items.total


@dataclass
class Count:
    """One counter of the display: what, items done of total, and what is left in words."""

    label: str
    done: int
    total: int
    left: str


@dataclass
class CountView:
    """The item counters the display shows for a snapshot, steady over time: per phase and evaluation kind an
    ItemCounter (never backwards) and an EtaSmoother (no jumps). One per display; a fresh one has no memory."""

    counters: dict[str, ItemCounter] = field(default_factory=dict)
    etas: dict[str, EtaSmoother] = field(default_factory=dict)
    high: dict[str, int] = field(default_factory=dict)

    def counts(self, snap: Snapshot, now: float | None = None) -> list[Count]:
        p, items = snap.progress, snap.items
        out = []
        if p.phase == "baseline" and p.baseline_total:
            done, eta = baseline_items(snap, now)
            done = self.high["baseline"] = max(self.high.get("baseline", 0), done)
            loading = items is not None and not items.loaded
            out.append(Count("baseline", done, p.baseline_total, "loading the model" if loading else
                             self._left("baseline", eta, now, done, done >= p.baseline_total)))  # fmt: skip
        elif p.phase in ("final_grading", "agent_session") and items is not None:
            # The final phase's evaluations add up; each submission's grading is a counter of its own.
            label = "final test" if p.phase == "final_grading" else f"grading #{snap.grading_id}"
            done, total = self.counters.setdefault(label, ItemCounter())(items)
            key = f"{label}:{items.id}"  # each evaluation measures its own rate
            left = ("loading the model" if not items.loaded else
                    self._left(key, items.eta_s(now), now, items.done, 0 < items.total <= items.done))  # fmt: skip
            out.append(Count(label, done, total, left))
        return out

    def _left(self, key: str, estimate: float | None, now: float | None, done: int, complete: bool) -> str:
        smoother = self.etas.setdefault(key, EtaSmoother())
        shown = smoother(estimate, now, done)
        return eta_text(shown, complete, None if complete else smoother.overdue_s(now))


FINISHING_S = 5.0
"""With every item counted, or below this many seconds left of an estimate not yet run out, the display says
"finishing"; past the estimate it says by how long ("overdue by ..."), counting up: an ETA of a few seconds held
while a last slow item took minutes read as a hang (issue #45)."""


def eta_text(eta_s: float | None, complete: bool = False, overdue_s: float | None = None) -> str:
    if complete:
        return "finishing"
    if overdue_s is not None:
        return f"overdue by {_duration(overdue_s)}"
    if eta_s is not None and eta_s < FINISHING_S:
        return "finishing"
    return "measuring the rate" if eta_s is None else f"about {_duration(eta_s)} left"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def running_label(harness_dir: str | Path | None) -> str:
    """What a `running` row means: a process is still on it, or it died without a trace, or (another host) unknown."""
    if not harness_dir:
        return "running"
    progress = read_announced(Path(harness_dir) / PROGRESS_FILE)
    alive = progress.process_alive() if progress else None
    if alive is None:
        return "running" if progress else "running (no progress file)"
    return f"running (pid {progress.pid}, {progress.phase})" if alive else f"running? process {progress.pid} is gone"


_SIGN_OFF = re.compile(r"stopped by SIG\w+$|done after \d+ rounds|while submitting: finishing")


def why_no_submission(harness_dir: Path, budget_s: float) -> str:
    """One line: why a run ended with no submission, from how its session ended (the ledger's `session-end`)
    and the agent's own last line in `agent.log`."""
    h = Path(harness_dir)
    end: dict = {}
    for line in _lines(h / "ledger.jsonl"):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("kind") == "event" and (entry.get("detail") or {}).get("event") == "session-end":
            end = entry["detail"]
    # The agent's last line about its work (a reference agent's sign-off says only that it stopped).
    last = [line for line in agent_lines(_lines(h / "agent.log", tail_bytes=16384)) if not _SIGN_OFF.search(line)]
    said = f"; its last line: {' '.join(last[-1].split())[:200]}" if last else "; it wrote nothing to its log"
    ended_by, used = end.get("ended_by"), float(end.get("agent_seconds") or 0.0)
    if ended_by == "budget":
        why = f"its {budget_s:.0f} s budget ended before the agent submitted"
    elif ended_by == "exited":
        why = f"the agent exited (code {end.get('exit_code')}) after {used:.0f} s without submitting"
    elif ended_by == "launch-error":
        return f"the agent could not be launched: {end.get('error')}"
    elif ended_by == "interrupted":
        return f"the session was interrupted: {end.get('error')}"
    else:
        return "the run ended before its agent session did (see the report)"
    return f"{why}{said} (all of it: {h / 'agent.log'})"
