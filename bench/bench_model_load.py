"""Where an evaluation process's model load goes, in CPU seconds (a shared machine's load stretches wall time, not
these) with wall seconds and peak memory: transformers' path (imports of torch, transformers and the model class,
then `load_transformers`) against the own Llama forward the CPU fp32 evaluation uses (`load_model(...,
own_forward=True)`, `a2rl_bench.inference.llama_forward`: no transformers import).

Each repeat is a fresh Python process, as each evaluation is (`a2rl_bench.inference.evaluation.evaluate_in_subprocess`);
the paths alternate. Phases: imports; the config's parameter count against the weights' headers (the evaluation
process checks it before loading, `config_check`); the load; one forward of one token (every weight read once, so
the peak RSS after it counts the weights in memory); a second load in the same process (the weights alone).

    python bench/bench_model_load.py --model smollm2-135m-instruct --repeats 3
    python bench/bench_model_load.py --same-completions 16   # the default grading's items through both models
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path

def mark():
    return time.perf_counter(), time.process_time()

def rss():
    # VmHWM: this process image's peak. ru_maxrss keeps the forking parent's peak across exec on Linux (every phase
    # read 1,146 MiB, imports included, under a parent that had loaded the model registry's imports).
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

path, model_dir = sys.argv[1], Path(sys.argv[2])
phases, peaks, (w, c) = {}, {}, mark()

def phase(name):
    global w, c
    (w2, c2) = mark(); phases[name] = (w2 - w, c2 - c); (w, c) = mark(); peaks[name] = rss()

import torch
if path == "transformers":
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama import modeling_llama
from a2rl_bench.inference.config_check import check_config_matches_weights
from a2rl_bench.inference.generation import load_model, load_transformers
phase("imports")
check_config_matches_weights(model_dir)
phase("config check")
load = (lambda: load_transformers(model_dir, "cpu")) if path == "transformers" else (
    lambda: load_model(model_dir, "cpu", own_forward=True))
loaded = load()
phase("load")
with torch.inference_mode():
    x = torch.tensor([[1]])
    if path == "transformers":
        loaded.model(x)
    else:
        assert getattr(loaded.model, "own_forward", False), "the own forward did not load this checkpoint"
        loaded.model.logits(x)
phase("one forward")
del loaded
load()
phase("second load")
imported = sorted({m.split(".")[0] for m in sys.modules} & {"transformers", "sympy"})
print(json.dumps({"phases": phases, "peaks": peaks, "load": os.getloadavg()[0], "imported": imported}))
"""

PATHS = ("transformers", "own")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base-model key or checkpoint dir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--same-completions", type=int, default=0, metavar="N",
                        help="also grade N gsm8k validation items (offline) with both models: completions identical?")
    args = parser.parse_args()

    from a2rl_bench.base_models.registry import resolve_base_model

    model_dir = resolve_base_model(args.model)
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    runs: dict[str, list[dict]] = {p: [] for p in PATHS}
    for _ in range(args.repeats):
        for path in PATHS:
            out = subprocess.run([sys.executable, "-c", CHILD, path, str(model_dir)], env=env, capture_output=True,
                                 text=True, check=True)  # fmt: skip
            runs[path].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(path, json.dumps(runs[path][-1]), flush=True)
    if runs["own"]:
        table(runs, weights)
    if args.same_completions:
        same_completions(model_dir, args.same_completions)


def table(runs: dict[str, list[dict]], weights: int) -> None:
    loads = [r["load"] for rs in runs.values() for r in rs]
    print(f"\nweights {weights / 2**20:.0f} MiB; n = {len(runs['own'])} fresh processes per path; machine load "
          f"{min(loads):.1f}-{max(loads):.1f}\n")
    print("| path | phase | CPU s (each run) | CPU s median | wall s median | peak RSS after it, median |")
    print("|---|---|---|---|---|---|")
    for path in PATHS:
        for name in runs[path][0]["phases"]:
            cpu = [r["phases"][name][1] for r in runs[path]]
            wall = [r["phases"][name][0] for r in runs[path]]
            peak = statistics.median(r["peaks"][name] for r in runs[path])
            print(f"| {path} | {name} | {', '.join(f'{s:.2f}' for s in cpu)} | {statistics.median(cpu):.2f} "
                  f"| {statistics.median(wall):.2f} | {peak / 2**20:.0f} MiB = {peak / weights:.2f} x weights |")
        total = [sum(r["phases"][n][1] for n in ("imports", "config check", "load")) for r in runs[path]]
        wall = [sum(r["phases"][n][0] for n in ("imports", "config check", "load")) for r in runs[path]]
        print(f"| {path} | **imports + check + load** | {', '.join(f'{s:.2f}' for s in total)} "
              f"| **{statistics.median(total):.2f}** | {statistics.median(wall):.2f} | |")
    for path in PATHS:
        print(f"{path}: modules imported {sorted({m for r in runs[path] for m in r['imported']})}")


def same_completions(model_dir, n: int) -> None:
    """The default grading's generation (16 slots, greedy, the task's stop strings, one thread) of `n` gsm8k
    validation items through transformers' model and through the own forward, compared completion by completion."""
    import torch

    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference.generation import generate, load_model, load_transformers

    torch.set_num_threads(1)
    task = get_task("gsm8k")
    conversations = [task.build_prompt(item) for item in task.load_split("offline", "validation", n)]
    d = task.decoding
    outputs = {}
    for path, loaded in (("transformers", load_transformers(model_dir, "cpu")),
                         ("own", load_model(model_dir, "cpu", own_forward=True))):  # fmt: skip
        started = time.process_time()
        outputs[path] = generate(loaded, conversations, max_new_tokens=d.max_new_tokens, temperature=d.temperature,
                                 stop=d.stop, batch_size=16)  # fmt: skip
        print(f"{path}: {outputs[path].generated_tokens} tokens in {time.process_time() - started:.1f} CPU s")
    same = sum(a == b for a, b in zip(outputs["transformers"].completions, outputs["own"].completions))
    tokens = outputs["transformers"].completion_tokens == outputs["own"].completion_tokens
    print(f"same completions: {same}/{n} (token counts identical: {tokens})")


if __name__ == "__main__":
    main()
