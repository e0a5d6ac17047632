"""The base model's evaluation, started while `a2rl run` waits on Prefect (issue 48).

Before the run's first step, `a2rl run` waits ~15 s with a core idle: Prefect's imports, the local server's start (a
process of its own, migrating a fresh database), the run's opening. The baseline needs none of that: only the base
model, the task data and the run's config. `start` begins it in a thread of the CLI's process; the run's baseline
step takes its results (`Ahead.wait`) and records them as its own: the same evaluation process, the same cache
entries, the same rows. It is the run's first evaluation, before any agent starts: no agent's session shares the CPU
with it. Anything unexpected (another config, a failure) leaves the baseline step to evaluate as it always did.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2rl_bench.base_models.hashing import weights_hash
from a2rl_bench.base_models.registry import REGISTRY, resolve_base_model
from a2rl_bench.benchmarks import get_task
from a2rl_bench.inference.evaluation import EvalSpec, _uses_gpu, evaluate_cached_splits, shares_one_process
from a2rl_bench.ops.progress import EVAL_PROGRESS_FILE, ItemProgress, write_atomic
from a2rl_bench.records import EvalResult, RunConfig

log = logging.getLogger(__name__)


@dataclass
class Ahead:
    """One baseline evaluation begun before its run opened."""

    config: RunConfig
    progress_file: Path
    """Where its evaluation process counts its items (the run's own file does not exist yet)."""
    done: Future = field(default_factory=Future)
    """(base model dir, weights hash, specs, results), or None where the baseline step is better left to itself."""
    started: list[Any] = field(default_factory=list)
    """Its evaluation process (`procs.Started`), for the run's record of its processes."""
    cancelled: threading.Event = field(default_factory=threading.Event)

    def wait(self, model_dir: Path, base_hash: str, specs: list[EvalSpec], mirror: Path,
             poll_s: float = 0.5) -> list[EvalResult] | None:  # fmt: skip
        """Its results, where it evaluated `specs` of `base_hash` in `model_dir`; its counted items are copied to
        `mirror` (the run's progress file, which the display reads) while it runs. None otherwise, and where it
        failed (the baseline step then evaluates itself, and reports its own error)."""
        from a2rl_bench.isolation import procs

        since, recorded = time.time(), 0
        while True:
            for started in self.started[recorded:]:  # a retry of this run ends it should the harness die first
                procs.record_started(started)
                recorded += 1
            try:
                out = self.done.result(timeout=poll_s)
                break
            except TimeoutError:
                _mirror(self.progress_file, mirror, since)
            except Exception as e:  # noqa: BLE001 - the step evaluates again and fails, if it does, as before
                log.warning("the baseline evaluated ahead of the run failed (%s); evaluating it again", e)
                return None
        _mirror(self.progress_file, mirror, since)
        if out is None or (out[0], out[1], out[2]) != (Path(model_dir), base_hash, specs):
            return None
        return out[3]

    def cancel(self) -> None:
        """End its evaluation process, where no step will take its results: left running, it would share the CPU
        with the agent's budgeted session."""
        self.cancelled.set()
        for started in list(self.started):
            _end(started)

    def on_start(self, started: Any) -> None:
        """Its evaluation process began: recorded, or ended at once where it was cancelled meanwhile."""
        self.started.append(started)
        if self.cancelled.is_set():
            _end(started)


_ahead: Ahead | None = None


def start(config: RunConfig, scratch: Path) -> Ahead | None:
    """Begin `config`'s baseline in a daemon thread (its progress file in `scratch`, a folder the caller removes),
    where its base model is a registry model or a local checkpoint, evaluated on the CPU (the default run); None where
    not (a GPU's evaluations wait on slots and memory the run holds; a hub id is downloaded by the run's own step)."""
    global _ahead
    if not (config.base_model in REGISTRY or Path(config.base_model).is_dir()) or _uses_gpu(None):
        return None
    ahead = Ahead(config, Path(scratch) / EVAL_PROGRESS_FILE)

    def run() -> None:
        try:
            ahead.done.set_result(_evaluate(ahead))
        except BaseException as e:  # noqa: BLE001 - handed to the baseline step, which evaluates again
            ahead.done.set_exception(e)

    # A daemon: a run stopped meanwhile exits at once; its evaluation process dies with it (procs' supervisor).
    threading.Thread(target=run, name="a2rl-baseline-ahead", daemon=True).start()
    _ahead = ahead
    return ahead


def take(config: RunConfig) -> Ahead | None:
    """The baseline begun ahead for `config` (once: a second call gets None). One begun for another config is
    ended: nothing will take it."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is not None and ahead.config != config:
        ahead.cancel()
        return None
    return ahead


def _evaluate(ahead: Ahead) -> tuple[Path, str, list[EvalSpec], list[EvalResult]] | None:
    """What the baseline step does (run_steps.evaluate_baseline) where both splits share one process."""
    config = ahead.config
    bench = get_task(config.task)
    bench.prepare(config.variant)  # the provision step's task data (a lock per variant: it waits on this one)
    model_dir = resolve_base_model(config.base_model)  # waits on a conversion under way (`convert_ahead`)
    base_hash = weights_hash(model_dir)
    specs = [EvalSpec.for_run(config, split, bench) for split in ("validation", "test")]
    if ahead.cancelled.is_set() or not shares_one_process(base_hash, specs,
                                                         interactive=getattr(bench, "plays_episodes", True)):
        return None  # not wanted, cached already, or split by split: the step's own path
    results = evaluate_cached_splits(model_dir, base_hash, specs, progress_file=ahead.progress_file,
                                     on_start=ahead.on_start)  # fmt: skip
    return model_dir, base_hash, specs, results


def _end(started: Any) -> None:
    from a2rl_bench.isolation import procs

    if procs.alive(started.pid, started.start_ticks):
        procs.kill_tree(started.pid)


def _mirror(source: Path, target: Path, since: float) -> None:
    """Copy the evaluation's count to the run's progress file. Its start is moved to the baseline step's (`since`):
    the display drops a count that began before its phase (an earlier phase's file), and this one did."""
    try:
        items = ItemProgress.model_validate_json(source.read_text())
    except (OSError, ValueError):
        return
    items.started_at = max(items.started_at, since)
    items.at = max(items.at, items.started_at)
    try:
        write_atomic(target, items.model_dump_json())
    except OSError:  # progress is a convenience: never the reason a baseline fails
        pass
