"""Evaluate one checkpoint on one split of a task: prompts → batched generation → per-item scores.

`evaluate_in_subprocess` runs the evaluation in its own process, under the harness's process supervisor and a
memory limit, so that a crash or an out-of-memory kill costs that evaluation only (its stderr goes to the harness log, never to the agent);
results are cached by content hash of the weights, the evaluator id and the split selection.

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

from a2rl_bench.contracts import BenchmarkTask
from a2rl_bench.inference.config_check import architecture_parameters
from a2rl_bench.inference.failures import FailureKind, classify_failure
from a2rl_bench.inference.numerics import eval_batch, numeric_path
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
    import torch

    from a2rl_bench.inference.generation import generate, load_model
    from a2rl_bench.inference.numerics import torch_dtype
    from a2rl_bench.ops.progress import ItemProgressWriter

    numerics = numerics or numeric_path(spec.backend, torch.cuda.is_available(), spec.batch_size)

    task = spec.task_object()
    task.preflight()  # what the task needs besides the model (a judge): checked before the model is loaded
    items = task.load_split(spec.variant, spec.split, spec.limit)
    progress = ItemProgressWriter.from_env(len(items), spec.split)  # items counted as each one finishes
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
        results = task.score_items(items, out.completions)
        for result, tokens in zip(results, out.completion_tokens):  # per item, for the store's item_results
            result.detail.setdefault("generated_tokens", tokens)
        generated_tokens = out.generated_tokens
    n_correct = sum(r.correct for r in results)
    return EvalResult(
        task=spec.task,
        split=spec.split,
        score=task.aggregate(results),
        detail=task.summarize(results),
        n=len(results),
        n_correct=n_correct,
        evaluator_id=evaluator_id(spec, numerics),
        generated_tokens=generated_tokens,
        batch_size=batch,
        duration_s=time.perf_counter() - start,
        items=results,
    )


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


def _uses_gpu(device: str | None) -> bool:
    """The evaluation will initialise CUDA: a GPU was granted, or one is visible to a default-device process."""
    if device is not None:
        return True
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return Path("/dev/nvidiactl").exists() and (visible is None or visible.strip() not in ("", "-1"))


def evaluate_in_subprocess(
    model_dir: Path, spec: EvalSpec, timeout_s: float = 3600, device: str | None = None,
    progress_file: Path | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> EvalResult:
    """One evaluation in its own process: a crash, a hang or an OOM kill costs this evaluation only.

    It runs under the harness's process supervisor (`a2rl_bench.isolation.procs`): it, and whatever it starts (vLLM's
    engine processes), dies with the harness and with a timeout; and under a memory limit (`eval_memory_bytes`,
    a cgroup or RLIMIT_AS: `procs.memory_limit_for`), so weights with an inflated config cannot take the host's
    memory. `device` ("0", "1", ...) pins the process to one GPU through CUDA_VISIBLE_DEVICES. `on_start` is told
    the supervisor's `procs.Started` (pid and start time), e.g. for a run's record of its processes."""
    from a2rl_bench.isolation import procs

    task_ref = task_class_ref(spec.task_object())
    out_file = eval_cache_dir() / f"run-{os.getpid()}-{time.time_ns()}.json"
    cmd = [
        sys.executable, "-m", "a2rl_bench.inference.evaluation",
        "--model", str(model_dir), "--task", spec.task, "--task-class", task_ref, "--variant", spec.variant,
        "--split", spec.split, "--backend", spec.backend,
        "--out", str(out_file), "--numerics", numeric_path(spec.backend, _uses_gpu(device), spec.batch_size),
    ]  # fmt: skip
    if spec.limit:
        cmd += ["--limit", str(spec.limit)]
    if spec.batch_size is not None:  # else the evaluation picks it by its numeric path
        cmd += ["--batch-size", str(spec.batch_size)]
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # it shares the CPU with the agent's training
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
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
        return EvalResult.model_validate_json(out_file.read_text())
    finally:
        out_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Evaluate one checkpoint on one split (used by the grader).")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--task", required=True)
    parser.add_argument("--task-class", required=True, help="module:Class of the task, built without arguments")
    parser.add_argument("--variant", default="offline")
    parser.add_argument("--split", required=True, choices=["validation", "test"])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="default: by numeric path (numerics.eval_batch)")
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--numerics", default=None, help="numeric path (a2rl_bench.inference.numerics); default: probe")
    args = parser.parse_args(argv)
    from a2rl_bench.inference.config_check import check_config_matches_weights

    check_config_matches_weights(args.model)  # before any weight is loaded: a config that builds more is refused
    task = task_from_ref(args.task_class, args.task)
    spec = EvalSpec(args.task, args.variant, args.split, args.limit, args.batch_size, args.backend, task)
    result = evaluate(args.model, spec, args.numerics)
    args.out.write_text(result.model_dump_json())
    print(json.dumps({"score": result.score, "n": result.n, "seconds": round(result.duration_s, 1)}))


if __name__ == "__main__":
    main()
