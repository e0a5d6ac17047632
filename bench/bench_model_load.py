"""Where an evaluation process's model load goes: imports (torch, transformers, the model class) against reading
the weights, in CPU seconds (a shared machine's load stretches wall time, not these), with peak memory.

Each repeat is a fresh Python process, as each evaluation is (`a2rl_bench.inference.evaluation.evaluate_in_subprocess`);
a second load in the same process shows what the weights alone cost once the imports are paid.

    python bench/bench_model_load.py --model smollm2-135m-instruct --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys, time

def mark():
    return time.perf_counter(), time.process_time()

phases, (w, c) = {}, mark()
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama import modeling_llama
(w2, c2) = mark(); phases["imports"] = (w2 - w, c2 - c); (w, c) = (w2, c2)
from a2rl_bench.inference.generation import load_model
loaded = load_model(sys.argv[1], "cpu")
(w2, c2) = mark(); phases["first load"] = (w2 - w, c2 - c); (w, c) = (w2, c2)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
del loaded
load_model(sys.argv[1], "cpu")
(w2, c2) = mark(); phases["second load"] = (w2 - w, c2 - c)
print(json.dumps({"phases": phases, "max_rss": rss, "load": os.getloadavg()[0]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base-model key or checkpoint dir")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from a2rl_bench.base_models.registry import resolve_base_model

    model_dir = resolve_base_model(args.model)
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    runs = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, "-c", CHILD, str(model_dir)], env=env, capture_output=True, text=True,
                             check=True)  # fmt: skip
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    print(f"\nweights {weights / 2**20:.0f} MiB; n = {len(runs)} fresh processes; machine load "
          f"{min(r['load'] for r in runs):.1f}-{max(r['load'] for r in runs):.1f}\n")
    print("| phase | CPU s (each run) | CPU s median | wall s median |")
    print("|---|---|---|---|")
    for phase in runs[0]["phases"]:
        cpu = [r["phases"][phase][1] for r in runs]
        wall = [r["phases"][phase][0] for r in runs]
        print(f"| {phase} | {', '.join(f'{s:.2f}' for s in cpu)} | {statistics.median(cpu):.2f} "
              f"| {statistics.median(wall):.2f} |")
    rss = statistics.median(r["max_rss"] for r in runs)
    print(f"| peak RSS after the first load | {rss / 2**20:.0f} MiB = {rss / weights:.2f} x the weights | | |")


if __name__ == "__main__":
    main()
