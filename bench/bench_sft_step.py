"""One SFT step of the reference agent alone: peak memory and seconds per step of `sft_torch.SFTRounds.train` (the
agent's own code) on its own SFT data, plain against checkpointed decoder layers (`A2RL_SFT_CHECKPOINT_LAYERS`) and
micro-batches of at most N padded tokens (`micro_tokens=N`, `A2RL_SFT_MICRO_TOKENS`).

    python bench/bench_sft_step.py MODEL_DIR [--random-init] --data PUBLIC [--steps 6] [--batch-size 32]
    python bench/bench_sft_step.py TINY_MODEL_DIR --data PUBLIC --smoke     # CPU check with the tests' tiny model

The examples are the agent's (`sft_grpo_session.sft_examples`: the task's worked examples plus the searching
demonstrations it builds from the training games, at most 1,024 tokens each), drawn in the agent's batch order
(`SFTRounds`, seed 0): every setting runs the same batches from the same weights. Per step: seconds (CUDA
synchronised), `torch.cuda.max_memory_allocated` (reset before each step), memory reserved by the allocator after
it (what `nvidia-smi` shows of the process, less the CUDA context), tokens. The first step of each setting is
untimed. PUBLIC is the offline alfworld public folder (`sft.jsonl`, `train.jsonl`, `envlib.zip`). With
`--random-init` the weights are a seeded random init of the model's config (memory and time of a fixed batch do
not depend on them; labelled so). Imports neither prefect, duckdb nor pydantic (runs on a bare torch image).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rl_update import load_model, workspace_modules  # noqa: E402 - the bench folder is not a package

SETTINGS = ("plain", "checkpointed")
"""Named settings; a setting is also `micro_tokens=N` (`A2RL_SFT_MICRO_TOKENS`), alone or after `checkpointed,`."""


def parse_setting(text: str) -> dict:
    """`plain`, `checkpointed`, `micro_tokens=N` or `checkpointed,micro_tokens=N` as SFTRounds' keywords.

    >>> parse_setting("checkpointed,micro_tokens=12288")
    {'checkpoint_layers': True, 'micro_tokens': 12288}
    """
    out = {"checkpoint_layers": False, "micro_tokens": None}
    for part in text.split(","):
        if part in SETTINGS:
            out["checkpoint_layers"] = part == "checkpointed"
        elif part.startswith("micro_tokens=") and part.split("=", 1)[1].isdigit() and int(part.split("=", 1)[1]) > 0:
            out["micro_tokens"] = int(part.split("=", 1)[1])
        else:
            raise argparse.ArgumentTypeError(f"unknown setting {part!r} (plain, checkpointed, micro_tokens=N)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--data", type=Path, required=True, help="the offline alfworld public folder")
    p.add_argument("--random-init", action="store_true")
    p.add_argument("--steps", type=int, default=6, help="timed steps per setting (after one untimed)")
    p.add_argument("--batch-size", type=int, default=32, help="the agent's default: 32")
    p.add_argument("--max-length", type=int, default=1024, help="the agent's default: 1,024 tokens")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS),
                   help="plain, checkpointed, micro_tokens=N or checkpointed,micro_tokens=N")
    p.add_argument("--allocator", choices=["agent", "default"], default="agent",
                   help="agent: expandable segments as the agent sets them (default); default: torch's own")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a CPU check of the whole path")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_size, args.max_length = 1, 4, 100_000
    try:
        settings = {name: parse_setting(name) for name in args.settings}
    except argparse.ArgumentTypeError as error:
        p.error(str(error))
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    with workspace_modules() as (_, sft_grpo_session):
        sft_torch = sys.modules["sft_torch"]
        if device == "cuda" and args.allocator == "agent":
            sft_grpo_session.grow_gpu_memory_in_place()
        for name in args.settings:
            model, tokenizer = load_model(args.model, args.random_init, device)
            examples, n = sft_grpo_session.sft_examples(args.data, args.data / "sft.jsonl", "alfworld", tokenizer,
                                                        args.max_length, search=not args.smoke)  # fmt: skip
            sft = sft_torch.SFTRounds(model, tokenizer, examples, lr=1e-4, batch_size=args.batch_size, seed=0,
                                      **settings[name])  # fmt: skip
            for step in range(args.steps + 1):
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                sync()
                t0 = time.perf_counter()
                stats = sft.train(seconds=1e9, max_steps=1)
                sync()
                row = {"setting": name, "step": step, "timed": step > 0, "seconds": round(time.perf_counter() - t0, 3),
                       "tokens": stats.tokens, "examples": len(examples), "loss": round(stats.loss, 5),
                       "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
                       "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2) if device == "cuda" else None,
                       "weights": "random init" if args.random_init else "loaded",
                       "allocator": args.allocator}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            del model, sft
            if device == "cuda":
                torch.cuda.empty_cache()
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    """Per setting: mean s / step over the timed steps, the largest peak and reserved memory, ratios to the first."""
    out = ["| setting | timed steps | tokens / step (mean) | s / step (mean) | x speed | peak GiB (max) "
           "| reserved GiB |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    base = None
    for name in dict.fromkeys(r["setting"] for r in rows):
        timed = [r for r in rows if r["setting"] == name and r["timed"]]
        if not timed:
            continue
        s = sum(r["seconds"] for r in timed) / len(timed)
        base = base or s
        peak = max((r["peak_gib"] or 0) for r in rows if r["setting"] == name)
        reserved = max((r["reserved_gib"] or 0) for r in rows if r["setting"] == name)
        tokens = sum(r["tokens"] for r in timed) / len(timed)
        out.append(f"| {name} | {len(timed)} | {tokens:,.0f} | {s:.3f} | {base / s:.2f} | {peak or '-'} | "
                   f"{reserved or '-'} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
