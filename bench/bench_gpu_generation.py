"""Grading throughput on a GPU: a2rl's batched `generate` against one-by-one, for model shapes up to 7B.

No weights are downloaded: models are built from a config with random weights (bf16) directly on the GPU,
and the tokenizer is the locally trained tiny BPE padded with extra tokens to the model's vocabulary, so
every generated id decodes. The memory-bandwidth floor of one decode step is (bytes of weights) / (HBM
bandwidth), with the bandwidth measured here by a device-to-device copy.

    python bench/bench_gpu_generation.py --shapes 135m,7b --batch 64 --prompt-tokens 512 --new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import time

SHAPES = {
    # Llama/Qwen-like decoder shapes (hidden, layers, heads, kv heads, ffn, vocab).
    "135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                 intermediate_size=1536, vocab_size=49152),
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=2048),
}


def copy_bandwidth(torch, device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    if device.type != "cuda":
        return float("nan")
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    n = 10
    for _ in range(n):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * n / (time.perf_counter() - t)


def build(shape: str, device, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from a2rl.models import build_tiny_tokenizer

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=False)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    tok = build_tiny_tokenizer()
    missing = cfg.vocab_size - len(tok)
    if missing > 0:
        tok.add_tokens([f"<x{i}>" for i in range(missing)])
    return model, tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="135m,7b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--n", type=int, default=64, help="prompts per measurement")
    parser.add_argument("--one-by-one-n", type=int, default=4, help="prompts for the unbatched baseline")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from a2rl.generation import generate

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bw = copy_bandwidth(torch, device)
    rows = []
    for shape in args.shapes.split(","):
        model, tok = build(shape, device, dtype)
        n_params = sum(p.numel() for p in model.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # Prompts of about --prompt-tokens tokens: repeated words the tiny BPE knows.
        text = " ".join(["seven apples and three pears cost"] * (args.prompt_tokens // 6))
        convs = [[{"role": "user", "content": f"{i} {text}"}] for i in range(args.n)]
        generate((model, tok), convs[:2], max_new_tokens=8, batch_size=2)  # warm-up (kernels, allocator)
        for label, batch, n in (("batched", args.batch, args.n), ("one-by-one", 1, args.one_by_one_n)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            out = generate((model, tok), convs[:n], max_new_tokens=args.new_tokens, batch_size=batch)
            steps = -(-n // batch) * args.new_tokens
            rows.append({
                "shape": shape, "params_m": round(n_params / 1e6), "mode": label, "batch": batch, "prompts": n,
                "seconds": round(out.seconds, 2), "examples_per_s": round(n / out.seconds, 3),
                "tokens_per_s": round(out.generated_tokens / out.seconds, 1),
                "ms_per_decode_step": round(1000 * out.seconds / steps, 2),
                "floor_ms_per_step": round(1000 * weight_bytes / bw, 3) if bw == bw else None,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"\ndevice: {gpu}; copy bandwidth {bw / 1e12:.2f} TB/s\n")
    print("| shape | mode | batch | examples/s | generated tok/s | ms/decode step | floor ms/step |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['mode']} | {r['batch']} | {r['examples_per_s']} | {r['tokens_per_s']} | "
              f"{r['ms_per_decode_step']} | {r['floor_ms_per_step']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gpu, "copy_bandwidth": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
