"""Evaluate one checkpoint on one split of a task: prompts → batched generation → per-item scores.

`evaluate_in_subprocess` runs the evaluation in its own process, under the harness's process supervisor and a
memory limit, so that a crash or an out-of-memory kill costs that evaluation only (its stderr goes to the harness log, never to the agent);
results are cached by content hash of the weights, the evaluator id and the split selection. Where a prompt's answer
does not depend on its company (`shares_one_process`), several splits of one checkpoint share one process and its
batches (`evaluate_cached_splits`), each result still cached under its own split's key.

The task is an object the caller resolves (`a2rl_bench.benchmarks.get_task(config.task)` in the flow's steps): the
library never looks a task up by id. The evaluation process rebuilds it from its class (`task_class_ref`), which is why
a task class must be constructible without arguments, as every class in `benchmarks` is.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from a2rl_bench.contracts import BenchmarkTask
from a2rl_bench.inference.config_check import architecture_parameters
from a2rl_bench.inference.failures import FailureKind, classify_failure
from a2rl_bench.inference.numerics import decodes_in_any_company, eval_batch, numeric_path
from a2rl_bench.paths import eval_cache_dir
from a2rl_bench.records import EvalResult, RunConfig, Split

log = logging.getLogger("a2rl_bench.grading")


@dataclass(frozen=True)
class EvalSpec:
    """What is evaluated, apart from the checkpoint."""

    task: str
    variant: str
    split: Split
    limit: int | None
    batch_size: int | None = None
    """Prompts decoded together; None: by numeric path (`a2rl_bench.inference.numerics.eval_batch`)."""
    backend: str = "transformers"
    evaluator: BenchmarkTask | None = field(default=None, compare=False, repr=False)
    """The task object named by `task` (an `a2rl_bench.contracts.BenchmarkTask`), resolved by the caller; None: a spec
    that only names the evaluation (a test's own evaluator), which `evaluate` and the cache refuse or miss."""

    @classmethod
    def for_run(cls, config: RunConfig, split: Split, task: BenchmarkTask | None = None) -> EvalSpec:
        """The evaluation a run's config asks for on one split (subset limits included), on `task`, the object
        that `config.task` names."""
        limit = config.val_limit if split == "validation" else config.test_limit
        return cls(config.task, config.variant, split, limit, config.eval_batch_size, config.eval_backend, task)

    @classmethod
    def of(cls, task: BenchmarkTask, variant: str, split: Split, limit: int | None = None, **options: Any) -> EvalSpec:
        """An evaluation of a task object (its id is taken from it)."""
        return cls(task.id, variant, split, limit, evaluator=task, **options)

    def task_object(self) -> BenchmarkTask:
        if self.evaluator is None:
            raise ValueError(f"no task object for {self.task!r}: the caller resolves the task id "
                             f"(e.g. EvalSpec.of(a2rl_bench.benchmarks.get_task({self.task!r}), ...))")  # fmt: skip
        if self.evaluator.id != self.task:
            raise ValueError(f"task object {self.evaluator.id!r} does not match the spec's task {self.task!r}")
        return self.evaluator

    def cache_key(self, weights_hash: str, evaluator_id: str) -> str:
        blob = f"{weights_hash}|{evaluator_id}|{self.task}|{self.variant}|{self.split}|{self.limit}|{self.backend}"
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


class EvaluationFailed(RuntimeError):
    """The evaluation process crashed, timed out or produced no result; never counted as a score.

    The message is the full text (stderr tail) for the harness log; `kind` is an
    `a2rl_bench.inference.failures.FailureKind` value, the only part the agent sees."""

    def __init__(self, message: str, kind: str = "crash"):
        super().__init__(message)
        self.kind = kind


def task_class_ref(task: BenchmarkTask) -> str:
    """`module:Class` of a task object: how the evaluation process rebuilds it."""
    cls = type(task)
    return f"{cls.__module__}:{cls.__qualname__}"


def task_from_ref(ref: str, task_id: str) -> BenchmarkTask:
    """The task object of `task_class_ref`, checked to be the task the spec names."""
    module, _, name = ref.partition(":")
    task = getattr(importlib.import_module(module), name)()
    if task.id != task_id:
        raise ValueError(f"{ref} builds task {task.id!r}, not {task_id!r}")
    return task


def evaluator_id(spec: EvalSpec, numerics: str) -> str:
    """The task's evaluator id and the numeric path (`a2rl_bench.inference.numerics`): results of different paths
    never share a cache entry or a setting."""
    return f"{spec.task_object().evaluator_id()}@{numerics}"


def evaluate(model_dir: Path, spec: EvalSpec, numerics: str | None = None) -> EvalResult:
    """Run the evaluation of `spec.evaluator` (the task object) in this process. Prompts are rendered with the
    tokenizer and chat template in `model_dir`: for a submission that is the grader's snapshot, whose tokenizer
    files are the base model's (a2rl_bench.grading.checkpoint.write_snapshot), never the agent's. `numerics`: the
    numeric path (`a2rl_bench.inference.numerics`); None picks this process's."""
    return evaluate_splits(model_dir, [spec], numerics)[0]


def evaluate_splits(model_dir: Path, specs: list[EvalSpec], numerics: str | None = None) -> list[EvalResult]:
    """`evaluate` of one or more splits of one task and options in this process: one model load, every split's
    items decoded together (in `eval_batch`'s batches of all of them). Only where answers do not depend on a
    prompt's company (`numerics.decodes_in_any_company`) does each split get what `evaluate` alone gives it;
    the caller checks that (`evaluate_cached_splits`). With several splits each result names the others
    (`shared_with`), its `batch_size` is the shared batch and its `duration_s` its share of the time by items."""
    import torch

    from a2rl_bench.inference.generation import generate, load_model
    from a2rl_bench.inference.numerics import torch_dtype
    from a2rl_bench.ops.progress import ItemProgressWriter

    spec = specs[0]
    if not _one_evaluation(specs):
        raise ValueError("splits evaluated together must be distinct splits of one task with the same options")
    numerics = numerics or numeric_path(spec.backend, torch.cuda.is_available(), spec.batch_size)

    task = spec.task_object()
    task.preflight()  # what the task needs besides the model (a judge): checked before the model is loaded
    parts = [task.load_split(s.variant, s.split, s.limit) for s in specs]
    items = [item for part in parts for item in part]
    progress = ItemProgressWriter.from_env(len(items), splits_label(specs))  # items counted as each one finishes
    d = task.decoding
    start = time.perf_counter()
    dtype = torch_dtype(numerics) if numerics.startswith("cpu-") else None
    # Loaded first: the ETA counts items. On the CPU in fp32 a Llama loads without transformers (seconds less).
    model = model_dir if spec.backend == "vllm" else load_model(model_dir, dtype=dtype, own_forward=True)
    progress.begin()
    batch: int | None = eval_batch(spec.batch_size, numerics, len(items), interactive=True)
    results = task.run_episodes(model, items, batch, on_done=progress.add)
    if results is not None:  # an interactive task: its episodes carry their own token counts
        generated_tokens = sum(r.detail.get("generated_tokens", 0) for r in results)
    else:
        conversations = [task.build_prompt(item) for item in items]
        if spec.backend == "vllm":
            from a2rl_bench.inference.vllm_backend import generate_vllm

            batch = None  # vLLM schedules its own batches
            out = generate_vllm(model_dir, conversations, max_new_tokens=d.max_new_tokens,
                                temperature=d.temperature, stop=d.stop)
        else:
            batch = eval_batch(spec.batch_size, numerics, len(conversations))
            out = generate(
                model,
                conversations,
                max_new_tokens=d.max_new_tokens,
                temperature=d.temperature,
                stop=d.stop,
                batch_size=batch,
                on_done=progress.add,
            )
        results = []
        for part, at in zip(parts, _offsets(parts)):  # scored per split, as each split alone would be
            results += task.score_items(part, out.completions[at : at + len(part)])
        for result, tokens in zip(results, out.completion_tokens):  # per item, for the store's item_results
            result.detail.setdefault("generated_tokens", tokens)
        generated_tokens = out.generated_tokens
    duration = time.perf_counter() - start
    made = []
    for s, part, at in zip(specs, parts, _offsets(parts)):
        mine = results[at : at + len(part)]
        alone = len(specs) == 1
        made.append(EvalResult(
            task=s.task,
            split=s.split,
            score=task.aggregate(mine),
            detail=task.summarize(mine),
            n=len(mine),
            n_correct=sum(r.correct for r in mine),
            evaluator_id=evaluator_id(s, numerics),
            generated_tokens=generated_tokens if alone else sum(r.detail.get("generated_tokens", 0) for r in mine),
            batch_size=batch,
            duration_s=duration if alone else duration * len(part) / max(1, len(items)),
            shared_with=[o.split for o in specs if o is not s],
            items=mine,
        ))  # fmt: skip
    return made


def _one_evaluation(specs: list[EvalSpec]) -> bool:
    """Distinct splits of one task with the same options: what one evaluation process can do together."""
    return len({s.split for s in specs}) == len(specs) and len({(s.task, s.variant, s.batch_size, s.backend)
                                                                 for s in specs}) == 1  # fmt: skip


def splits_label(specs: list[EvalSpec]) -> str:
    """What an evaluation of these splits counts its items as (`ItemProgress.what`): `test`, `validation+test`."""
    return "+".join(s.split for s in specs)


def _offsets(parts: list[list[Any]]) -> list[int]:
    """Where each part starts in the parts laid end to end."""
    starts, at = [], 0
    for part in parts:
        starts.append(at)
        at += len(part)
    return starts


class EvalCache:
    """Finished evaluations on disk, keyed by weights hash + evaluator id + split selection."""

    def __init__(self, root: Path | None = None):
        self.root = root or eval_cache_dir()

    def _file(self, weights_hash: str, spec: EvalSpec, device: str | None = None) -> Path:
        numerics = numeric_path(spec.backend, _uses_gpu(device), spec.batch_size)
        return self.root / f"{spec.cache_key(weights_hash, evaluator_id(spec, numerics))}.json"

    def lookup(self, weights_hash: str, spec: EvalSpec, device: str | None = None) -> EvalResult | None:
        """The cached result, or None; a spec without a task object (a test's own evaluator) never hits."""
        if spec.evaluator is None:
            return None
        path = self._file(weights_hash, spec, device)
        if not path.exists():
            return None
        try:
            result = EvalResult.model_validate_json(path.read_text())
        except ValueError:
            path.unlink(missing_ok=True)  # a torn cache file is just a miss
            return None
        return result.model_copy(update={"cached": True, "duration_s": 0.0})

    def store(self, weights_hash: str, spec: EvalSpec, result: EvalResult, device: str | None = None) -> None:
        path = self._file(weights_hash, spec, device)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(result.model_dump_json())
        tmp.replace(path)


def shares_one_process(weights_hash: str, specs: list[EvalSpec], interactive: bool, device: str | None = None) -> bool:
    """Whether these splits of one checkpoint are evaluated in one process, their prompts decoded together
    (`evaluate_cached_splits`): more than one split of one task with the same options, none of them cached, on a
    path whose answers do not depend on a prompt's company (`numerics.decodes_in_any_company`: the default batch
    on `cpu-fp32`, a single-turn task). Otherwise each split is evaluated alone (`evaluate_cached`)."""
    spec = specs[0] if specs else None
    return (
        spec is not None and len(specs) > 1 and _one_evaluation(specs)
        and decodes_in_any_company(spec.batch_size, numeric_path(spec.backend, _uses_gpu(device), spec.batch_size),
                                   interactive)
        and all(EvalCache().lookup(weights_hash, s, device) is None for s in specs)
    )  # fmt: skip


def evaluate_cached_splits(
    model_dir: Path, weights_hash: str, specs: list[EvalSpec], timeout_s: float = 3600, device: str | None = None,
    progress_file: Path | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> list[EvalResult]:
    """Splits that `shares_one_process` allows, evaluated in one subprocess, each result cached under its own key
    as `evaluate_cached` caches it (a later evaluation of one split hits it)."""
    results = evaluate_splits_in_subprocess(model_dir, specs, timeout_s, device, progress_file, on_start=on_start)
    cache = EvalCache()
    out = []
    for spec, result in zip(specs, results):
        result = result.model_copy(update={"weights_hash": weights_hash})
        cache.store(weights_hash, spec, result, device)
        out.append(result)
    return out


GPU_OOM_WAITS_S = (10.0, 30.0)
"""Waits before evaluating again after a GPU evaluation ran out of memory. Runs that share a card free it as their
trainers and evaluations end (one H200, four runs: 3 of 27 gradings lost to a full card, 2026-11-29); a grading's
agent clock stays paused meanwhile. A checkpoint too big for the card fails every try."""


def evaluate_cached(
    model_dir: Path, weights_hash: str, spec: EvalSpec, timeout_s: float = 3600, device: str | None = None,
    progress_file: Path | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> EvalResult:
    """Evaluate in a subprocess unless an identical evaluation is cached (`progress_file`: where it counts its
    finished items, an `a2rl_bench.ops.progress.ItemProgress`); on a GPU, again after an out-of-memory failure
    (`GPU_OOM_WAITS_S`): a card the harness shares between runs is the harness's failure, not the checkpoint's."""
    cache = EvalCache()
    if (hit := cache.lookup(weights_hash, spec, device)) is not None:
        return hit
    for wait_s in GPU_OOM_WAITS_S if _uses_gpu(device) else ():
        try:
            result = evaluate_in_subprocess(model_dir, spec, timeout_s, device, progress_file, on_start=on_start)
            break
        except EvaluationFailed as e:
            if e.kind != FailureKind.OOM:
                raise
            log.warning("%s evaluation of %s ran out of GPU memory; again in %.0f s", spec.split, model_dir, wait_s)
            time.sleep(wait_s)
    else:
        result = evaluate_in_subprocess(model_dir, spec, timeout_s, device, progress_file, on_start=on_start)
    result = result.model_copy(update={"weights_hash": weights_hash})
    cache.store(weights_hash, spec, result, device)
    return result


OUTPUT_TAIL_BYTES = 64 * 1024
"""What is kept of an evaluation process's output for the harness log (the rest is never held in memory)."""


BYTES_PER_PARAMETER = 8
"""Memory per parameter of the model an evaluation builds: fp32 on CPU (4), with as much again for loading."""
EVAL_HEADROOM_BYTES = 6 * 2**30
"""Activations, the KV cache and the runtime."""


def eval_memory_bytes(model_dir: Path) -> int:
    """The memory cap of one evaluation: `A2RL_EVAL_MEMORY_BYTES` if set, else 8 bytes per parameter of the
    model the config builds (`architecture_parameters`) + 6 GiB, at most 90% of RAM. Never more than 4 x the
    weights' bytes + 6 GiB (the old rule), so neither an inflated config nor unused tensors the agent ships (an
    extra 1 GiB tensor raised the cap by 4 GiB) buy memory; where the config names no size, the bytes rule."""
    if (given := os.environ.get("A2RL_EVAL_MEMORY_BYTES")) is not None:
        return int(given)
    weights = sum(f.stat().st_size for f in Path(model_dir).iterdir()
                  if f.is_file() and f.suffix in (".safetensors", ".bin"))  # fmt: skip
    by_bytes = 4 * weights
    params = architecture_parameters(model_dir)
    need = by_bytes if params is None else min(by_bytes, BYTES_PER_PARAMETER * params)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(need + EVAL_HEADROOM_BYTES, 0.9 * total))


ONE_THREAD_BELOW_PARAMS = 10_000_000
"""A CPU evaluation of a model with fewer parameters runs one OpenMP thread (unless OMP_NUM_THREADS is set): its
products are too small to split, and a second thread only adds a wake-up per op (a ~100k-parameter model's 3-item
evaluation: 1.74-1.83 s of process wall on one thread, 2.15-2.34 s on two with OMP_WAIT_POLICY=PASSIVE; BENCHMARKS
twenty-first pass). From SmolLM2-135M up, two threads are the faster (the default)."""


def _uses_gpu(device: str | None) -> bool:
    """The evaluation will initialise CUDA: a GPU was granted, or one is visible to a default-device process."""
    if device is not None:
        return True
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return Path("/dev/nvidiactl").exists() and (visible is None or visible.strip() not in ("", "-1"))


def eval_env(model_dir: Path, device: str | None = None) -> dict[str, str]:
    """The environment of an evaluation process: the harness's, with passive OpenMP waits (it may share the CPU
    with other runs), one thread for a small model on the CPU (`ONE_THREAD_BELOW_PARAMS`) and `device` pinned
    through CUDA_VISIBLE_DEVICES. What the operator set for OpenMP is kept."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    params = None if _uses_gpu(device) else architecture_parameters(model_dir)
    if params is not None and params < ONE_THREAD_BELOW_PARAMS:
        env.setdefault("OMP_NUM_THREADS", "1")
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


def evaluate_in_subprocess(
    model_dir: Path, spec: EvalSpec, timeout_s: float = 3600, device: str | None = None,
    progress_file: Path | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> EvalResult:
    """One evaluation in its own process: `evaluate_splits_in_subprocess` of one split."""
    return evaluate_splits_in_subprocess(model_dir, [spec], timeout_s, device, progress_file, on_start)[0]


def evaluate_splits_in_subprocess(
    model_dir: Path, specs: list[EvalSpec], timeout_s: float = 3600, device: str | None = None,
    progress_file: Path | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> list[EvalResult]:
    """One evaluation of one or more splits (`evaluate_splits`) in its own process: a crash, a hang or an OOM kill
    costs this evaluation only.

    It runs under the harness's process supervisor (`a2rl_bench.isolation.procs`): it, and whatever it starts (vLLM's
    engine processes), dies with the harness and with a timeout; and under a memory limit (`eval_memory_bytes`,
    a cgroup or RLIMIT_AS: `procs.memory_limit_for`), so weights with an inflated config cannot take the host's
    memory. `device` ("0", "1", ...) pins the process to one GPU through CUDA_VISIBLE_DEVICES. `on_start` is told
    the supervisor's `procs.Started` (pid and start time), e.g. for a run's record of its processes."""
    from a2rl_bench.isolation import procs

    spec = specs[0]
    task_ref = task_class_ref(spec.task_object())
    out_file = eval_cache_dir() / f"run-{os.getpid()}-{time.time_ns()}.json"
    cmd = [
        sys.executable, "-m", "a2rl_bench.inference.evaluation",
        "--model", str(model_dir), "--task", spec.task, "--task-class", task_ref, "--variant", spec.variant,
        "--backend", spec.backend,
        "--out", str(out_file), "--numerics", numeric_path(spec.backend, _uses_gpu(device), spec.batch_size),
    ]  # fmt: skip
    for s in specs:  # each split with its limit (0: all of it)
        cmd += ["--split", s.split] + (["--limit", str(s.limit or 0)] if len(specs) > 1 or s.limit else [])
    if spec.batch_size is not None:  # else the evaluation picks it by its numeric path
        cmd += ["--batch-size", str(spec.batch_size)]
    env = eval_env(model_dir, device)
    if progress_file is not None:
        from a2rl_bench.ops.progress import EVAL_PROGRESS_ENV

        env[EVAL_PROGRESS_ENV] = str(progress_file)
        # The last evaluation's count (e.g. the baseline's 32/32) is not this one's while its process starts.
        Path(progress_file).unlink(missing_ok=True)
    memory = procs.memory_limit_for(eval_memory_bytes(model_dir), gpu=_uses_gpu(device), label="eval")
    log.info("evaluation of %s: memory limit %s", model_dir,
             memory.describe() if memory else "none (a GPU evaluation and no writable cgroup v2 here)")
    with tempfile.TemporaryFile() as output:  # on disk, not in memory: only its tail is ever read back
        try:
            proc = procs.start(procs.supervised(cmd, sys.executable), group="session",
                               death_signal=procs.SUPERVISOR_DEATH_SIGNAL, memory=memory, on_start=on_start, env=env,
                               stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)  # fmt: skip
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired as e:
                raise EvaluationFailed(f"evaluation timed out after {timeout_s:.0f} s", FailureKind.TIMEOUT) from e
            finally:
                procs.end_session_of(proc)  # the supervisor's tree, its group and session: nothing outlives it
            oom = memory is not None and memory.oom_killed()
        finally:
            if memory is not None:
                memory.release()
        if returncode != 0 or not out_file.exists():
            out_file.unlink(missing_ok=True)
            output.seek(max(0, output.seek(0, os.SEEK_END) - OUTPUT_TAIL_BYTES))
            text = output.read().decode("utf-8", errors="replace").strip()
            tail = text.splitlines()[-40:]
            kind = FailureKind.OOM if oom else classify_failure(text, returncode)
            raise EvaluationFailed(f"evaluation process exited with {returncode}"
                                   f"{' (memory limit ' + memory.describe() + ')' if oom else ''}: " + "\n".join(tail),
                                   kind)  # fmt: skip
    try:
        text = out_file.read_text()
        if len(specs) == 1:
            return [EvalResult.model_validate_json(text)]
        results = TypeAdapter(list[EvalResult]).validate_json(text)
        if [r.split for r in results] != [s.split for s in specs]:
            raise EvaluationFailed(f"the evaluation process returned splits {[r.split for r in results]}, "
                                   f"not {[s.split for s in specs]}")  # fmt: skip
        return results
    finally:
        out_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Evaluate one checkpoint on one split (used by the grader).")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--task", required=True)
    parser.add_argument("--task-class", required=True, help="module:Class of the task, built without arguments")
    parser.add_argument("--variant", default="offline")
    parser.add_argument("--split", required=True, choices=["validation", "test"], action="append",
                        help="repeated: the splits evaluated together, their items decoded in shared batches")
    parser.add_argument("--limit", type=int, action="append", help="per --split, in order (0: all); optional for one")
    parser.add_argument("--batch-size", type=int, default=None, help="default: by numeric path (numerics.eval_batch)")
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--numerics", default=None, help="numeric path (a2rl_bench.inference.numerics); default: probe")
    args = parser.parse_args(argv)
    from a2rl_bench.inference.config_check import check_config_matches_weights

    check_config_matches_weights(args.model)  # before any weight is loaded: a config that builds more is refused
    limits = args.limit or [None] * len(args.split)
    if len(limits) != len(args.split):
        parser.error(f"{len(args.split)} --split but {len(limits)} --limit: give one --limit per --split")
    task = task_from_ref(args.task_class, args.task)
    specs = [EvalSpec(args.task, args.variant, split, limit or None, args.batch_size, args.backend, task)
             for split, limit in zip(args.split, limits)]  # fmt: skip
    results = evaluate_splits(args.model, specs, args.numerics)
    if len(results) == 1:  # one split: the result itself, as callers of one evaluation read it
        args.out.write_text(results[0].model_dump_json())
    else:
        args.out.write_bytes(TypeAdapter(list[EvalResult]).dump_json(results))
    for result in results:
        print(json.dumps({"split": result.split, "score": result.score, "n": result.n,
                          "seconds": round(result.duration_s, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
