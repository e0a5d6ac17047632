"""CPU grading of the default run on three paths, side by side in one process, same items, same token ids.

* `fp32 static`: the decode engine over a static cache, the shared exemplars copied into every row, fixed
  batches (the CPU path before issue #37);
* `fp32 batcher`: `a2rl.inference.prefix_batching` (the exemplars' KV once for all rows, continuous batching,
  prompts prefilled in groups of similar length): the default greedy CPU path, same numeric path;
* `bf16 batcher`: the same with bf16 weights (what evaluation uses where `a2rl.inference.numerics` measures bf16
  matmuls faster).

Runs alternate so machine load hits every path alike; wall and CPU seconds are both printed (on a shared machine
CPU seconds vary less). Completions are compared with the fp32 static path's (fp32 paths: identical expected;
bf16: the agreement is the measure).

    python bench/bench_cpu_grading.py --model smollm2-135m-instruct --limit 16 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the evaluation process runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base-model key or checkpoint dir")
    parser.add_argument("--limit", type=int, default=16, help="validation items (the default run grades 16)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch

    from a2rl.base_models.registry import resolve_base_model
    from a2rl.inference.generation import generate, load_model
    from a2rl.inference.numerics import probe
    from a2rl.benchmarks import get_task

    task = get_task("gsm8k")
    task.prepare("offline")
    items = task.load_split("offline", "validation", args.limit)
    conversations = [task.build_prompt(item) for item in items]
    d = task.decoding
    model_dir = resolve_base_model(args.model)
    models = {"fp32": load_model(model_dir, "cpu"), "bf16": load_model(model_dir, "cpu", dtype=torch.bfloat16)}
    paths = [("fp32", "static"), ("fp32", "auto"), ("bf16", "auto")]
    print(json.dumps({"threads": torch.get_num_threads(), "items": len(items), "probe": probe()}), flush=True)
    wall: dict = {p: [] for p in paths}
    cpu: dict = {p: [] for p in paths}
    outs = {}
    for _ in range(args.repeats):
        for dtype, engine in paths:
            w, c = time.perf_counter(), time.process_time()
            out = generate(models[dtype], conversations, max_new_tokens=d.max_new_tokens, temperature=0.0,
                           stop=d.stop, batch_size=args.batch_size, engine=engine)  # fmt: skip
            wall[(dtype, engine)].append(time.perf_counter() - w)
            cpu[(dtype, engine)].append(time.process_time() - c)
            outs[(dtype, engine)] = out
            print(json.dumps({"dtype": dtype, "engine": engine, "wall_s": round(wall[(dtype, engine)][-1], 1),
                              "cpu_s": round(cpu[(dtype, engine)][-1], 1), "tokens": out.generated_tokens,
                              "load": round(os.getloadavg()[0], 1)}), flush=True)  # fmt: skip
    reference = outs[paths[0]]
    base_wall, base_cpu = statistics.median(wall[paths[0]]), statistics.median(cpu[paths[0]])
    print(f"\n| path | wall s (each run) | CPU s (each run) | speed-up wall / CPU (medians) | tokens | tok/s (wall) "
          f"| same completions as fp32 static | correct |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        out = outs[path]
        same = sum(a == b for a, b in zip(reference.completions, out.completions))
        correct = sum(r.correct for r in task.score_items(items, out.completions))
        mw, mc = statistics.median(wall[path]), statistics.median(cpu[path])
        print(f"| {path[0]} {'static engine' if path[1] == 'static' else 'batcher'} "
              f"| {', '.join(f'{s:.1f}' for s in wall[path])} | {', '.join(f'{s:.1f}' for s in cpu[path])} "
              f"| {base_wall / mw:.2f}x / {base_cpu / mc:.2f}x | {out.generated_tokens} "
              f"| {out.generated_tokens / mw:.1f} | {same}/{len(items)} | {correct}/{len(items)} |")  # fmt: skip


if __name__ == "__main__":
    main()
