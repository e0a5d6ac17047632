"""Throughput of the streaming hidden-item search (`a2rl_bench.ngrams.StreamMatcher`): how fast the agent's output can
be searched while it is written (a faster writer is slowed by the pipe to this), and how fast the leak audit reads.

    PYTHONPATH=. .venv/bin/python bench/bench_stream_matcher.py [--mb 64]

Hidden items: GSM8K's offline validation + test questions (400). Inputs, fed in 1 MiB chunks: English text (the
training questions, repeated: many tokens in the hidden vocabulary), random bytes, float32 tensor bytes, and one
token repeated. CPU seconds of this process (`time.process_time`), so other jobs on the machine count less.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from a2rl_bench.ngrams import StreamMatcher
from a2rl_bench.benchmarks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=64)
    args = parser.parse_args()
    task = get_task("gsm8k")
    prepared = task.prepare("offline")
    items = [it["question"] for split in ("validation", "test") for it in task.load_split("offline", split)]
    train = [json.loads(line)["question"] for line in (prepared.public_dir / "train.jsonl").open()]
    size = args.mb << 20
    english = (" ".join(train) + " ").encode()
    inputs = {
        "English text (GSM8K train questions)": (english * (size // len(english) + 1))[:size],
        "random bytes": os.urandom(size),
        "float32 tensor bytes": np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32).tobytes(),
        "one token repeated ('x ')": b"x " * (size // 2),
    }
    matcher = StreamMatcher(items)
    print(f"{len(items)} hidden items, {args.mb} MiB each, 1 MiB chunks")
    for name, data in inputs.items():
        m = matcher.fresh()
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(0, len(data), 1 << 20):
            m.feed(data[i : i + (1 << 20)])
        m.close()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"{name:40s} {len(data) / 2**20 / cpu:6.1f} MiB/s CPU ({cpu:5.1f} s; wall {wall:5.1f} s)  "
              f"found {len(m.found)}")


if __name__ == "__main__":
    main()
