"""Lockstep RL rollouts on alfworld: `generate` (the sampler before #23) against the decode engine, same model,
same card, same goals; then one whole GRPO / GiGPO step (rollouts + update) on the engine.

    python bench/bench_rollouts.py MODEL_DIR [--episodes 32 128 512] [--max-steps 30] [--out rollouts.json]

MODEL_DIR is a Hugging Face checkpoint (e.g. the converted SmolLM2-135M; on the CPU the tests' tiny model with
`--episodes 4 --max-steps 3`). Every episode plays up to `--max-steps` steps of the offline alfworld training
games under the evaluator's prompts; an untrained model rarely wins, so episodes mostly run to the step limit
(the slow case). Reports episodes/s and generated tokens/s per sampler and batch, and the speed-up of the engine
over `generate` at the batch `generate` used (32 episodes: 8 goals x 4).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def load(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    return model, tokenizer, device


def one(grpo_env_torch, envlib, data: Path, model, tokenizer, engine: str, episodes: int, max_steps: int,
        seed: int = 0) -> dict:  # fmt: skip
    import torch

    sample = grpo_env_torch.make_sampler(model, tokenizer, max_new_tokens=32, temperature=1.0, stop=envlib.STOP,
                                         seed=seed, engine=engine)  # fmt: skip
    goals = envlib.load_goals(data)
    group = 4 if episodes >= 4 else 1
    grouped = [g for g in goals[: max(1, episodes // group)] for _ in range(group)][:episodes]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    rollouts = grpo_env_torch.play(envlib, "alfworld", data, grouped, sample, max_steps, seed)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens = sum(len(a) for r in rollouts for _, a in r.steps)
    steps = sum(len(r.steps) for r in rollouts)
    return {"sampler": "engine" if isinstance(sample, grpo_env_torch.EngineSampler) else "generate",
            "episodes": len(rollouts),
            "seconds": round(seconds, 2), "episodes_per_s": round(len(rollouts) / seconds, 3),
            "env_steps": steps, "generated_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "won": sum(r.won for r in rollouts)}  # fmt: skip


def grpo_steps(grpo_env_torch, envlib, data: Path, model, tokenizer, algorithm: str, goals: int, group: int,
               max_steps: int, n: int) -> list[dict]:  # fmt: skip
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "alfworld", data, lr=1e-6, goals_per_step=goals,
                                  group_size=group, max_episode_steps=max_steps, temperature=1.0, loop_penalty=0.5,
                                  seed=0, algorithm=algorithm)  # fmt: skip
    out = []
    for _ in range(n):
        stats = grpo.grpo_step()
        out.append({"algorithm": algorithm, "episodes": stats.episodes, "rollout_s": stats.rollout_s,
                    "update_s": stats.update_s, "samples": stats.samples, "generated_tokens": stats.generated_tokens,
                    "mean_steps": stats.mean_steps})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--episodes", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--generate-episodes", type=int, default=32, help="the batch the old sampler is timed at")
    p.add_argument("--grpo-steps", type=int, default=2, help="whole GRPO steps timed per algorithm (0: none)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    from a2rl_bench.agents.reference_sft_grpo import grpo_env_torch
    from a2rl_bench.benchmarks import get_task

    public = get_task("alfworld").prepare("offline").public_dir
    envlib = grpo_env_torch.import_envlib(public)
    model, tokenizer, device = load(args.model)
    facts = {"device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
             "torch": torch.__version__, "model": str(args.model),
             "params": sum(p.numel() for p in model.parameters()), "max_steps": args.max_steps}  # fmt: skip
    print(json.dumps(facts), flush=True)
    rows = []
    warm = one(grpo_env_torch, envlib, public, model, tokenizer, "engine", min(args.episodes), 2)  # graphs, caches
    print("warm-up", json.dumps(warm), flush=True)
    rows.append(one(grpo_env_torch, envlib, public, model, tokenizer, "generate", args.generate_episodes, args.max_steps))
    print(json.dumps(rows[-1]), flush=True)
    for n in args.episodes:
        rows.append(one(grpo_env_torch, envlib, public, model, tokenizer, "engine", n, args.max_steps))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["episodes_per_s"]
    same = next((r for r in rows[1:] if r["episodes"] == rows[0]["episodes"]), None)
    best = max(rows[1:], key=lambda r: r["episodes_per_s"])
    summary = {"generate_episodes_per_s": base,
               "engine_same_batch_x": same and round(same["episodes_per_s"] / base, 1),
               "engine_best_x": round(best["episodes_per_s"] / base, 1), "engine_best_batch": best["episodes"]}  # fmt: skip
    steps = []
    if args.grpo_steps:
        for algorithm in ("grpo", "gigpo"):
            steps += grpo_steps(grpo_env_torch, envlib, public, model, tokenizer, algorithm, 16, 8, args.max_steps,
                                args.grpo_steps)  # fmt: skip
            print(json.dumps(steps[-1]), flush=True)
    if device == "cuda":
        summary["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print("summary", json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"facts": facts, "rows": rows, "grpo_steps": steps, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
