"""CPU grading of the default run on several engines, side by side in one process, same items, same token ids.

* `fp32 static`: the decode engine over a static cache, the shared exemplars copied into every row, fixed
  batches (the CPU path before issue #37);
* `fp32 batcher`: `a2rl_bench.inference.prefix_batching` (the exemplars' KV once for all rows, continuous batching,
  prompts prefilled in groups of similar length): the default greedy CPU path, same numeric path;
* `fp32 batcher, drafting off` (`fp32-nodraft`): the same with `A2RL_CPU_DRAFT=0`, one token per row and forward
  (the batcher before issue 48's drafted tokens); listed first, it is the reference the others' completions are
  compared with;
* `bf16 batcher`: the same with bf16 weights (the opt-in `A2RL_CPU_EVAL_DTYPE=bf16`);
* with `--llama-cpp DIR` and/or `--llama-cpp-native DIR`: llama.cpp on the same GGUF file (the registry model's
  Q4_1 file the checkpoint was converted from) and the same token ids, greedy, the prefix decoded once and shared
  in its KV cache, rows decoded together (`llama.cpp ... batch`) and one at a time (`llama.cpp ... sequential`);
  `bench/llama_cpp_grading.py` says how. `--llama-cpp DIR`: the prebuilt llama-cpp-cffi 0.4.42 wheel (AVX2 only)
  in a `pip install --no-deps --target DIR` folder with a one-symbol libstdc++ shim; `--llama-cpp-native DIR`:
  llama.cpp built for this CPU by `bench/build_llama_cpp_native.sh DIR` (AVX-512 and AMX where the CPU has
  them; `--native-amx on|off|both`: with the library's AMX weight repacking, without it, or both, as
  `llama.cpp native` and `llama.cpp native-noamx`). Its answers come from the Q4_1 weights with 8-bit
  activations, not the fp32 dequantized ones, so agreement with fp32 is a measure, not expected to be total.

All on one thread. Runs alternate so machine load hits every engine alike; CPU seconds are the measure (wall is
printed too). The floor: the fp32 matrix products the grading needs at least (2 x the weight matrices'
parameters x the tokens fed, prefix once + suffixes + generated tokens; attention left out), at this CPU's
measured fp32 GEMM rate per CPU second. Completions are compared with a2rl fp32's (the first fp32 engine run).
`--engines` picks a subset (the fp32 batcher always runs: the floor counts its tokens).

    python bench/bench_cpu_grading.py --model smollm2-135m-instruct --limit 16 --repeats 2 --llama-cpp DIR
    python bench/bench_cpu_grading.py --limit 16 --repeats 3 --engines fp32,llama-batch --llama-cpp DIR \
        --llama-cpp-native DIR2

With `--phases`: where the default path's (fp32 batcher) time goes instead, per forward of the batcher grouped by
phase (the shared prefix's prefill, the prompts' own prefill, decode steps by how many rows they carry, drafted
or not), in CPU seconds, with each phase's matrix-product GFLOP and the weight bytes its forwards stream;
`A2RL_CPU_DRAFT=0` in the environment gives the same without drafting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the evaluation process runs
ENGINES = ("fp32-static", "fp32-nodraft", "fp32", "bf16", "llama-batch", "llama-sequential")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base-model key or checkpoint dir")
    parser.add_argument("--limit", type=int, default=16, help="validation items (the default run grades 16)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--phases", action="store_true", help="time the fp32 batcher's phases, nothing else")
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="a --target folder holding llama-cpp-cffi 0.4.42 (adds the wheel's llama.cpp engines)")
    parser.add_argument("--llama-cpp-native", type=Path, default=None,
                        help="a folder made by bench/build_llama_cpp_native.sh (adds the native llama.cpp engines)")
    parser.add_argument("--native-amx", choices=("on", "off", "both"), default="both",
                        help="the native build with its AMX weight repacking (library default), without, or both")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"comma-separated subset of {','.join(ENGINES)} (llama-* run for each build given)")
    args = parser.parse_args()
    engines = set(args.engines.split(","))
    if engines - set(ENGINES) or "fp32" not in engines:
        parser.error(f"--engines: a subset of {','.join(ENGINES)} holding fp32, not {args.engines!r}")
    builds = {b: d for b, d in (("wheel", args.llama_cpp), ("native", args.llama_cpp_native),
                                ("native-noamx", args.llama_cpp_native)) if d is not None}  # fmt: skip
    builds = {b: d for b, d in builds.items() if args.native_amx in ("both", {"native": "on"}.get(b, "off"))
              or b == "wheel"}  # fmt: skip

    import torch

    from a2rl_bench.base_models.registry import DEFAULT_BASE_MODEL, REGISTRY, gguf_path, resolve_base_model
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference.decode_engine import shared_prefix
    from a2rl_bench.inference.generation import (MIN_SHARED_PREFIX, _eos_ids, _finish_rows, generate, load_model,
                                           render_prompt)  # fmt: skip
    from a2rl_bench.inference.prefix_batching import DRAFT_ENV

    torch.set_num_threads(1)
    task = get_task("gsm8k")
    task.prepare("offline")
    items = task.load_split("offline", "validation", args.limit)
    conversations = [task.build_prompt(item) for item in items]
    d = task.decoding
    model_dir = resolve_base_model(args.model)
    if args.phases:
        _phases(load_model(model_dir, "cpu"), conversations, d, args.batch_size)
        return
    models = {"fp32": load_model(model_dir, "cpu"), "bf16": load_model(model_dir, "cpu", dtype=torch.bfloat16)}
    tokenizer = models["fp32"].tokenizer
    ids = tokenizer([render_prompt(tokenizer, c) for c in conversations], add_special_tokens=False)["input_ids"]
    prefix = shared_prefix(ids)
    prefix = prefix if len(prefix) >= MIN_SHARED_PREFIX else []
    eos = _eos_ids(models["fp32"].model, tokenizer)
    paths = [p for e, p in (("fp32-nodraft", ("fp32", "nodraft")), ("fp32-static", ("fp32", "static")),
                            ("fp32", ("fp32", "auto")), ("bf16", ("bf16", "auto"))) if e in engines]  # fmt: skip
    for build in builds:
        paths += [("q4_1", f"llama.cpp {build} {m}") for e, m in (("llama-batch", f"batch {args.batch_size}"),
                  ("llama-sequential", "sequential")) if e in engines]  # fmt: skip
    if builds:
        request = {"gguf": str(gguf_path(REGISTRY[args.model if args.model in REGISTRY else DEFAULT_BASE_MODEL])),
                   "prefix": prefix, "rows": [r[len(prefix):] for r in ids], "max_new_tokens": d.max_new_tokens,
                   "eos": sorted(eos), "stop": list(d.stop), "threads": 1}  # fmt: skip
    print(json.dumps({"threads": torch.get_num_threads(), "items": len(items), "prefix_tokens": len(prefix)}),
          flush=True)  # fmt: skip
    wall: dict = {p: [] for p in paths}
    cpu: dict = {p: [] for p in paths}
    outs: dict = {}
    for _ in range(args.repeats):
        for dtype, engine in paths:
            w, c = time.perf_counter(), time.process_time()
            if engine.startswith("llama.cpp"):
                slots = 1 if engine.endswith("sequential") else args.batch_size
                build = engine.split()[1]
                got = _llama_cpp(build, builds[build], {**request, "batch": slots, "build": build})
                texts, counts = _finish_rows(got["new_tokens"], tokenizer, tuple(d.stop), eos)
                outs[(dtype, engine)] = (texts, sum(counts))
                cpu_s = got["cpu_s"]  # the child's decoding alone (its model load is reported apart)
                print(json.dumps({"llama_cpp": build, "load_cpu_s": round(got["load_cpu_s"], 2),
                                  "system_info": got["system_info"]}), flush=True)  # fmt: skip
            else:
                os.environ[DRAFT_ENV] = "0" if engine == "nodraft" else "1"
                out = generate(models[dtype], conversations, max_new_tokens=d.max_new_tokens, temperature=0.0,
                               stop=d.stop, batch_size=args.batch_size,
                               engine="auto" if engine == "nodraft" else engine)  # fmt: skip
                outs[(dtype, engine)] = (out.completions, out.generated_tokens)
                cpu_s = time.process_time() - c
            wall[(dtype, engine)].append(time.perf_counter() - w)
            cpu[(dtype, engine)].append(cpu_s)
            print(json.dumps({"dtype": dtype, "engine": engine, "wall_s": round(wall[(dtype, engine)][-1], 1),
                              "cpu_s": round(cpu_s, 1), "tokens": outs[(dtype, engine)][1],
                              "load": round(os.getloadavg()[0], 1)}), flush=True)  # fmt: skip
    reference = outs[paths[0]][0]
    floor = _floor_cpu_s(models["fp32"].model, len(prefix) + sum(len(r) - len(prefix) for r in ids),
                         outs[("fp32", "auto")][1])  # fmt: skip
    base_cpu = statistics.median(cpu[paths[0]])
    print(f"\nfloor: {floor['cpu_s']:.1f} CPU s ({floor['gflop']:.0f} GFLOP of fp32 matrix products at "
          f"{floor['gflops']:.1f} GFLOP per CPU s, n = {len(items)} items)\n")
    base = _name(paths[0])
    print(f"| engine | CPU s (each run) | x {base} (CPU, medians) | x floor | tokens | tokens / CPU s "
          f"| same completions as {base} | correct |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        texts, tokens = outs[path]
        same = sum(a == b for a, b in zip(reference, texts))
        correct = sum(r.correct for r in task.score_items(items, texts))
        mc = statistics.median(cpu[path])
        print(f"| {_name(path)} | {', '.join(f'{s:.1f}' for s in cpu[path])} | {base_cpu / mc:.2f}x | "
              f"{mc / floor['cpu_s']:.1f}x | {tokens} | {tokens / mc:.1f} | {same}/{len(items)} "
              f"| {correct}/{len(items)} |")  # fmt: skip


def _name(path: tuple[str, str]) -> str:
    dtype, engine = path
    if engine.startswith("llama.cpp"):
        return engine
    return f"a2rl {dtype} " + {"static": "static engine", "nodraft": "batcher, drafting off"}.get(engine, "batcher")


def _phases(loaded, conversations, d, batch_size: int) -> None:
    """The fp32 batcher's CPU seconds per phase: each forward of `PrefixBatcher._run` timed and grouped."""
    from collections import defaultdict

    import torch

    from a2rl_bench.inference import prefix_batching
    from a2rl_bench.inference.generation import generate

    model = loaded.model
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    body, head_params = sum(m.weight.numel() for m in linears), head.weight.numel()
    weight_bytes = 4 * (body + head_params)
    phases: dict = defaultdict(lambda: {"cpu_s": 0.0, "forwards": 0, "tokens": 0, "gflop": 0.0})
    run = prefix_batching.PrefixBatcher._run

    def timed(self, f, input_ids, positions, last):
        b, q = input_ids.shape
        phase = "prefix prefill" if not f.prefix_keys and q > 1 else "prompt prefill" if q > 1 else (
            f"decode, {(b - 1) // 4 * 4 + 1}-{(b - 1) // 4 * 4 + 4} rows")
        c = time.process_time()
        out = run(self, f, input_ids, positions, last)
        p = phases[phase]
        p["cpu_s"] += time.process_time() - c
        p["forwards"] += 1
        p["tokens"] += b * q
        p["gflop"] += 2 * (body * b * q + head_params * b) / 1e9
        return out

    verify = prefix_batching.PrefixBatcher._verify

    def timed_verify(self, f, fed, p, lengths):
        b, tokens = len(fed), sum(map(len, fed))
        c = time.process_time()
        out = verify(self, f, fed, p, lengths)
        phase = phases[f"drafted decode, {(b - 1) // 4 * 4 + 1}-{(b - 1) // 4 * 4 + 4} rows"]
        phase["cpu_s"] += time.process_time() - c
        phase["forwards"] += 1
        phase["tokens"] += tokens
        phase["gflop"] += 2 * (body + head_params) * tokens / 1e9
        return out

    prefix_batching.PrefixBatcher._run = timed
    prefix_batching.PrefixBatcher._verify = timed_verify
    c = time.process_time()
    out = generate(loaded, conversations, max_new_tokens=d.max_new_tokens, temperature=0.0, stop=d.stop,
                   batch_size=batch_size)  # fmt: skip
    total = time.process_time() - c
    drafting = "on" if prefix_batching.drafting_enabled() else f"off ({prefix_batching.DRAFT_ENV}=0)"
    print(f"{len(conversations)} items, {out.generated_tokens} generated tokens, {total:.1f} CPU s in all, "
          f"drafting {drafting}; "
          f"weights {weight_bytes / 2**20:.0f} MiB streamed once per forward\n")
    print("| phase | forwards | tokens | CPU s | share | GFLOP | GFLOP per CPU s | weight GB per CPU s |")
    print("|---|---|---|---|---|---|---|---|")

    def order(name: str) -> tuple:  # prefills, then decode steps by rows, plain before drafted
        rows = int(name.split(", ")[1].split("-")[0]) if name.endswith("rows") else 0
        return not name.startswith("prefix"), not name.startswith("prompt"), rows, name

    for name in sorted(phases, key=order):
        p = phases[name]
        print(f"| {name} | {p['forwards']} | {p['tokens']} | {p['cpu_s']:.1f} | {p['cpu_s'] / total:.0%} | "
              f"{p['gflop']:.0f} | {p['gflop'] / p['cpu_s']:.1f} | "
              f"{p['forwards'] * weight_bytes / 1e9 / p['cpu_s']:.1f} |")  # fmt: skip


def _llama_cpp(build: str, site: Path, request: dict) -> dict:
    """`bench/llama_cpp_grading.py` in its own process, the build's folder on its path (the wheel's with the shim
    preloaded)."""
    here = Path(__file__).resolve().parent
    from llama_cpp_grading import shim_library  # noqa: PLC0415 - bench/ is this script's folder

    env = {**os.environ, "PYTHONPATH": str(site)}
    if build == "wheel":
        env["LD_PRELOAD"] = str(shim_library(site))
    out = subprocess.run([sys.executable, str(here / "llama_cpp_grading.py")], input=json.dumps(request), env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _floor_cpu_s(model, fed_tokens: int, generated_tokens: int) -> dict:
    """CPU seconds of the grading's matrix products at this CPU's fp32 GEMM rate (one thread, best of 3)."""
    import torch

    head = model.get_output_embeddings()  # on generated tokens only (a prompt's last position is one of them)
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    gflop = 2 * (body * (fed_tokens + generated_tokens) + head.weight.numel() * generated_tokens) / 1e9
    x, w = torch.randn(64, 576), torch.randn(1536, 576)
    best = float("inf")
    with torch.inference_mode():
        torch.nn.functional.linear(x, w)
        for _ in range(3):
            c = time.process_time()
            for _ in range(200):
                torch.nn.functional.linear(x, w)
            best = min(best, time.process_time() - c)
    gflops = 200 * 2 * x.shape[0] * w.numel() / 1e9 / best
    return {"gflop": gflop, "gflops": gflops, "cpu_s": gflop / gflops}


if __name__ == "__main__":
    main()
