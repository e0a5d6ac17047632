"""The evaluator's greedy decoding on a GPU: plain transformers `generate` vs a2rl's decode engine (static KV
cache + CUDA-graph decode step), per model shape and batch, against the memory floor; plus a token-identity
check of the engine against greedy `generate`.

No weights are downloaded: Llama-architecture models of the 135M / 0.5B / 7B shapes are built from a config
with random bf16 weights directly on the GPU; the tokenizer is the locally trained tiny BPE padded with extra
tokens to the model's vocabulary. Prompts are ~--prompt-tokens tokens of different lengths (left padding).

ms/step is a decode step of the real evaluator path (`a2rl_bench.inference.generation.generate` with engine=`generate`
or `graph`): (time for N new tokens - time for 1 new token) / (N - 1), so prefill is excluded. The memory floor
of a step is (weight bytes + KV bytes of the real context) / (copy bandwidth measured here, read + write).
Identity: the 135M shape in fp32, 16 prompts of different lengths, the engine's tokens vs `generate`'s up to
each row's EOS (every row must agree). A whole run is bounded by --budget-s: configurations left when it is
spent are reported as skipped, never as numbers.

    python bench/bench_gpu_generation.py                     # the default table (~2 min on one H100)
    python bench/bench_gpu_generation.py --shapes tiny --batches 1,4 --new-tokens 16 --plain-new-tokens 8  # CPU
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

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
}  # fmt: skip


def copy_bandwidth(torch, device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted); NaN off CUDA."""
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
    bw = 2 * x.numel() * n / (time.perf_counter() - t)
    del x, y
    return bw


def build(shape: str, device, dtype):
    """(model, tokenizer): random weights of the shape, built in `dtype` on `device` (no fp32 detour)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from a2rl_bench.inference.generation import LoadedModel, _prepare_tokenizer
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.tiny_model
    from tests.tiny_model import build_tiny_tokenizer

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=False)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(before)
    tok = build_tiny_tokenizer()
    missing = cfg.vocab_size - len(tok)
    if missing > 0:
        tok.add_tokens([f"<x{i}>" for i in range(missing)])
    return LoadedModel(model, _prepare_tokenizer(tok))


def conversations(n: int, prompt_tokens: int) -> list[list[dict[str, str]]]:
    """n prompts of about prompt_tokens tokens, lengths differing by up to ~10% (left padding in a batch)."""
    words = "seven apples and three pears cost".split()
    out = []
    for i in range(n):
        k = int(prompt_tokens * (0.9 + 0.1 * ((i * 7) % 11) / 10))
        out.append([{"role": "user", "content": f"{i} " + " ".join(words[j % len(words)] for j in range(k))}])
    return out


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_generate(torch, device, loaded, convs, new_tokens: int, engine: str) -> float:
    from a2rl_bench.inference.generation import generate

    sync(torch, device)
    t = time.perf_counter()
    generate(loaded, convs, max_new_tokens=new_tokens, batch_size=len(convs), engine=engine)
    sync(torch, device)
    return time.perf_counter() - t


def ms_per_step(torch, device, loaded, convs, new_tokens: int, engine: str) -> tuple[float, float]:
    """(ms per decode step, prefill seconds) of the evaluator's generate for this batch."""
    prefill = timed_generate(torch, device, loaded, convs, 1, engine)
    total = timed_generate(torch, device, loaded, convs, new_tokens, engine)
    return 1000 * max(total - prefill, 0.0) / (new_tokens - 1), prefill


def kv_bytes(shape: str, batch: int, context: int, dtype_bytes: int) -> int:
    s = SHAPES[shape]
    head_dim = s["hidden_size"] // s["num_attention_heads"]
    return 2 * s["num_hidden_layers"] * batch * s["num_key_value_heads"] * context * head_dim * dtype_bytes


def decoder_of(loaded):
    """The engine `generate` used for this model (graph key on CUDA), or None if it fell back."""
    return loaded.model.__dict__.get("_a2rl_decoders", {}).get(loaded.model.device.type == "cuda")


def engine_state(loaded) -> str:
    """`graph` when the engine ran with a captured graph; otherwise what happened instead."""
    decoder = decoder_of(loaded)
    if decoder is None:
        return "FELL BACK to generate (see the warning above)"
    return "graph" if decoder.graphs_captured else "engine, no graph"


def identity_check(torch, device, prompt_tokens: int, new_tokens: int) -> dict:
    """135M shape in fp32: the engine's (graph) tokens against greedy `generate`'s, row by row up to EOS."""
    from a2rl_bench.inference.decode_engine import Decoder
    from a2rl_bench.inference.generation import _eos_ids, _generate_batch

    loaded = build("135m" if device.type == "cuda" else "tiny", device, torch.float32)
    tok = loaded.tokenizer
    prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
               for c in conversations(16, prompt_tokens)]  # fmt: skip
    rows = tok(prompts, add_special_tokens=False)["input_ids"]
    options = {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": tok.pad_token_id}
    reference = _generate_batch(loaded.model, tok, prompts, options)
    decoder = Decoder(loaded.model, use_graph=True, chunk=32)
    ends = _eos_ids(loaded.model, tok)  # generate stops (and pads) at the generation config's EOS too
    ours = decoder.decode(rows, new_tokens, lambda t: any(x in ends for x in t), tok.pad_token_id)
    same = 0
    first_diff = None
    for i, (ref, got) in enumerate(zip(reference, ours)):
        n = next((j + 1 for j, x in enumerate(ref) if x in ends), len(ref))
        if got[:n] == ref[:n]:
            same += 1
        elif first_diff is None:
            first_diff = {"row": i, "step": next((j for j in range(n) if j >= len(got) or got[j] != ref[j]), n)}
    del loaded, decoder
    return {"shape": "135m" if device.type == "cuda" else "tiny", "dtype": "fp32", "rows": len(rows),
            "rows_identical": same, "new_tokens": new_tokens, "first_difference": first_diff}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="135m,0.5b,7b")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt-tokens", type=int, default=790)
    parser.add_argument("--new-tokens", type=int, default=128, help="new tokens per engine measurement")
    parser.add_argument("--plain-new-tokens", type=int, default=24, help="new tokens per plain-generate measurement")
    parser.add_argument("--identity-new-tokens", type=int, default=64)
    parser.add_argument("--budget-s", type=float, default=110.0, help="stop starting new measurements after this")
    parser.add_argument("--json", default=None, help="also write JSON here (default: $OUT/bench_gpu_generation.json)")
    args = parser.parse_args()
    started = time.perf_counter()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import torch
    import transformers

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bw = copy_bandwidth(torch, device)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    report = {"device": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
              "copy_bandwidth_Bps": bw, "prompt_tokens": args.prompt_tokens, "rows": [], "identity": None}  # fmt: skip
    out_path = args.json or (os.path.join(os.environ["OUT"], "bench_gpu_generation.json") if os.environ.get("OUT")
                             else None)  # fmt: skip

    def save() -> None:
        if out_path:
            Path(out_path).parent.mkdir(parents=True, exist_ok=True)
            Path(out_path).write_text(json.dumps(report, indent=1))

    try:
        report["identity"] = identity_check(torch, device, args.prompt_tokens, args.identity_new_tokens)
    except Exception as e:  # noqa: BLE001 - report it; the timings still run
        report["identity"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps({"identity": report["identity"]}), flush=True)
    save()
    for shape in args.shapes.split(","):
        if time.perf_counter() - started > args.budget_s:
            report["rows"].append({"shape": shape, "skipped": "time budget spent"})
            continue
        loaded = build(shape, device, dtype)
        weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
        for batch in (int(b) for b in args.batches.split(",")):
            row = {"shape": shape, "params_m": round(weight_bytes / dtype.itemsize / 1e6), "batch": batch}
            if time.perf_counter() - started > args.budget_s:
                report["rows"].append({**row, "skipped": "time budget spent"})
                continue
            convs = conversations(batch, args.prompt_tokens)
            try:
                timed_generate(torch, device, loaded, convs[:2], 2, "generate")  # warm-up (kernels, allocator)
                plain_ms, plain_prefill = ms_per_step(torch, device, loaded, convs, args.plain_new_tokens,
                                                      "generate")
                # Warm-up at the measured length: the cache of that (batch, length) is allocated and its step captured.
                timed_generate(torch, device, loaded, convs, args.new_tokens, "graph")
                engine_ms, engine_prefill = ms_per_step(torch, device, loaded, convs, args.new_tokens, "graph")
                context = args.prompt_tokens + args.new_tokens // 2
                floor_ms = 1000 * (weight_bytes + kv_bytes(shape, batch, context, dtype.itemsize)) / bw
                decoder = decoder_of(loaded)
                row.update({
                    "plain_ms_per_step": round(plain_ms, 2), "engine_ms_per_step": round(engine_ms, 2),
                    "plain_tok_s": round(1000 * batch / plain_ms, 1) if plain_ms else None,
                    "engine_tok_s": round(1000 * batch / engine_ms, 1) if engine_ms else None,
                    "floor_ms_per_step": round(floor_ms, 3) if bw == bw else None,
                    "engine_x_floor": round(engine_ms / floor_ms, 2) if bw == bw and floor_ms else None,
                    "plain_x_floor": round(plain_ms / floor_ms, 2) if bw == bw and floor_ms else None,
                    "speedup": round(plain_ms / engine_ms, 2) if engine_ms else None,
                    "prefill_s_plain": round(plain_prefill, 3), "prefill_s_engine": round(engine_prefill, 3),
                    "engine": engine_state(loaded),
                    "graph_capture_s": round(decoder.graph_seconds, 3) if decoder else None,
                })  # fmt: skip
            except Exception as e:  # noqa: BLE001 - one configuration's failure is a row, not the end
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()
        del loaded
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["seconds"] = round(time.perf_counter() - started, 1)
    save()
    print(f"\ndevice: {gpu}; torch {torch.__version__}, transformers {transformers.__version__}; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s; prompts ~{args.prompt_tokens} tokens; {report['seconds']} s")
    print(f"identity (engine vs greedy generate): {report['identity']}\n")
    print("| shape | batch | plain ms/step | engine ms/step | floor ms | engine × floor | plain × floor | "
          "engine tok/s | speed-up | engine |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in report["rows"]:
        if "plain_ms_per_step" not in r:
            print(f"| {r['shape']} | {r.get('batch', '')} | {r.get('error') or r.get('skipped')} | | | | | | | |")
            continue
        print(f"| {r['shape']} | {r['batch']} | {r['plain_ms_per_step']} | {r['engine_ms_per_step']} | "
              f"{r['floor_ms_per_step']} | {r['engine_x_floor']} | {r['plain_x_floor']} | {r['engine_tok_s']} | "
              f"{r['speedup']} | {r['engine']} |")


if __name__ == "__main__":
    main()
