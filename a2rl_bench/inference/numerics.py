"""The numeric path an evaluation runs on, named so that results of different paths are never mixed.

On CUDA evaluation is bf16 (`cuda-bf16`), through vLLM `vllm`. On CPU it is fp32 (`cpu-fp32`) on every machine:
greedy fp32 answers are the same at any batch size and in any company (the shared-prefix batcher's rows are
computed independently), so a checkpoint gets one answer set wherever it is graded. bf16 is an explicit opt-in,
`A2RL_CPU_EVAL_DTYPE=bf16` (or `auto`: bf16 where a measured probe shows its matrix products clearly faster on
this CPU, e.g. AVX-512 bf16 or AMX). bf16 answers differ from fp32's (about half of GSM8K's extracted answers) and
depend on the batch (batch 4 against 16 agreed on 6 of 16 completions), so its path names the batch size and
the decoding engine: `cpu-bf16-b16-auto`. The path is part of the evaluator id (`<task evaluator id>@<path>`) and
so of the evaluation cache key and of a setting; the report and `a2rl results` warn when runs of different
paths are shown together. Because fp32 answers do not depend on the batch, the default CPU fp32 grading decodes a
split's prompts together, up to `CPU_FP32_MAX_BATCH` at once (`eval_batch`); the other paths keep 16. The probe's
verdict is kept per machine (CPU model, torch version) beside the evaluation cache, so a grader and its evaluation
process agree on it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from a2rl_bench.records import EVAL_BATCH_DEFAULT

CPU_DTYPE_ENV = "A2RL_CPU_EVAL_DTYPE"
CPU_PATHS = {"fp32": "cpu-fp32", "bf16": "cpu-bf16"}

MIN_BF16_SPEEDUP = 1.4
"""bf16 is used only when its matrix products take at most 1/1.4 of fp32's CPU time (a CPU that emulates bf16
is several times slower, one with native bf16 about 2-3x faster; between, fp32's exactness wins)."""


CPU_FP32_MAX_BATCH = 48
"""Most prompts the default CPU fp32 grading decodes together. Decoding reads every weight at every step whatever
the number of rows, so more rows per step cost fewer CPU seconds per item: the default grading's 32 hidden-test
items as one batch took 0.79x the CPU seconds of two of 16 to decode, 0.87x as a whole evaluation, with identical
completions, and the baseline's 48 prompts decoded as one batch gave identical completions too (BENCHMARKS.md, "The
default run", fourth and fifth passes). 48 keeps the KV cache of a small model's rows well inside an evaluation's
memory headroom."""


def numeric_path(backend: str, on_gpu: bool, batch_size: int | None = None, engine: str | None = None) -> str:
    """The numeric path of an evaluation with this backend, on a GPU or not; `batch_size` (None: the default,
    `EVAL_BATCH_DEFAULT` on such a path) and `engine` (default: A2RL_DECODE_ENGINE, else `auto`) are named by a path
    whose answers depend on them (CPU bf16)."""
    if backend == "vllm":
        return "vllm"
    if on_gpu:
        return "cuda-bf16"
    return cpu_path(batch_size, engine)


def eval_batch(requested: int | None, path: str, n_prompts: int, interactive: bool = False) -> int:
    """Prompts an evaluation on numeric path `path` decodes together (interactive: episodes stepped together).

    An explicit `requested` batch is kept on every path. The default (None) is `EVAL_BATCH_DEFAULT` wherever answers
    may depend on the batch (`cuda-bf16`, `vllm`, CPU bf16): what ran there before. On `cpu-fp32`, whose answers do
    not, a single-turn split is decoded in as few batches as pay, all of it up to `CPU_FP32_MAX_BATCH`.
    Interactive episodes keep the default: their contexts grow every step, and their memory with the batch."""
    if requested is not None:
        return requested
    if decodes_in_any_company(requested, path, interactive):
        return max(1, min(n_prompts, CPU_FP32_MAX_BATCH))
    return EVAL_BATCH_DEFAULT


def decodes_in_any_company(requested: int | None, path: str, interactive: bool = False) -> bool:
    """Whether an evaluation's answers stay the same whatever prompts it decodes beside them: only the default
    batch (`requested` None) on `cpu-fp32`, single-turn. There a split is decoded in as few batches as pay
    (`eval_batch`), and several splits of one checkpoint may share one evaluation process and its batches (the
    baseline's validation and test: `a2rl_bench.inference.evaluation.evaluate_cached_splits`); on every other
    path the company of a prompt may change its answer under the same cache key."""
    return requested is None and path == CPU_PATHS["fp32"] and not interactive


def cpu_path(batch_size: int | None = None, engine: str | None = None) -> str:
    """`cpu-fp32` unless A2RL_CPU_EVAL_DTYPE opts into bf16 (`bf16`, or `auto` where the probe says bf16 pays)."""
    batch_size = batch_size or EVAL_BATCH_DEFAULT  # bf16 keeps the default batch (`eval_batch`)
    forced = os.environ.get(CPU_DTYPE_ENV, "").strip().lower()
    if forced not in ("", "fp32", "bf16", "auto"):
        raise ValueError(f"{CPU_DTYPE_ENV} must be fp32, bf16 or auto (got {forced!r})")
    if forced == "bf16" or (forced == "auto" and probe_verdict()["bf16_speedup"] >= MIN_BF16_SPEEDUP):
        engine = engine or os.environ.get("A2RL_DECODE_ENGINE") or "auto"
        return f"{CPU_PATHS['bf16']}-b{batch_size}-{engine}"
    return CPU_PATHS["fp32"]


def torch_dtype(path: str):
    """The CPU weights' dtype of a `cpu-*` path."""
    import torch

    return torch.bfloat16 if path.startswith(CPU_PATHS["bf16"]) else torch.float32


def mixed_paths(evaluator_ids) -> list[str]:
    """The numeric paths named by these evaluator ids when there are more than one (their scores are not
    comparable: another path gives other answers), else []."""
    paths = sorted({e.rsplit("@", 1)[1] for e in evaluator_ids if e and "@" in e})
    return paths if len(paths) > 1 else []


def _verdict_file() -> Path:
    from a2rl_bench.paths import eval_cache_dir

    return eval_cache_dir() / "cpu-numerics.json"


def _machine() -> str:
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} | torch {torch.__version__}"


def probe_verdict() -> dict:
    """{machine, fp32_s, bf16_s, bf16_speedup}: kept from an earlier probe on this machine, else measured now."""
    path, machine = _verdict_file(), _machine()
    try:
        kept = json.loads(path.read_text())
        if kept.get("machine") == machine:
            return kept
    except (OSError, ValueError):
        pass
    verdict = {"machine": machine, **probe()}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(verdict))
    tmp.replace(path)
    return verdict


def probe(reps: int = 30) -> dict:
    """CPU seconds of a decode step's matrix product (16 rows x a 576 x 1536 weight, SmolLM2's MLP) in fp32 and
    bf16 on one thread, best of three rounds: CPU time, not wall time, so other load on the cores counts less."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = {}
        for dtype in (torch.float32, torch.bfloat16):
            x, w = torch.randn(16, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
            with torch.inference_mode():
                torch.nn.functional.linear(x, w)  # warm-up (kernel selection)
                best = float("inf")
                for _ in range(3):
                    start = time.process_time()
                    for _ in range(reps):
                        torch.nn.functional.linear(x, w)
                    best = min(best, time.process_time() - start)
            seconds[str(dtype).removeprefix("torch.")] = best
    finally:
        torch.set_num_threads(threads)
    fp32, bf16 = seconds["float32"], seconds["bfloat16"]
    return {"fp32_s": fp32, "bf16_s": bf16, "bf16_speedup": round(fp32 / max(bf16, 1e-9), 2)}
