"""Where one benchmark run's wall goes, and what its flow process itself spends (issue 48, twenty-first pass).

    python bench/bench_run_profile.py                      # the end-to-end test's run: tiny model, 45 s budget
    python bench/bench_run_profile.py --budget 120 --top 40 --out run.prof

Runs `benchmark_run` in this process (inside `prefect_test_harness`, as the tests do) on the tiny model with
`test_benchmark_run_end_to_end`'s configuration and reference-agent knobs, under `cProfile`. Prints the run's
phase seconds, the wall and this process's CPU seconds over the run, and the functions of this process by
cumulative time. The agent, its trainers and the evaluations are other processes: their CPU is not in the
profile (`bench/bench_process_cpu.py` counts them by kind).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(CHECKOUT), str(CHECKOUT / "tests")]  # tests.tiny_model; live_server imports its siblings plainly


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=45.0, help="the agent's budget in seconds (default 45)")
    parser.add_argument("--top", type=int, default=30, help="functions to print by cumulative time (default 30)")
    parser.add_argument("--out", type=Path, default=None, help="also save the profile here (pstats format)")
    args = parser.parse_args(argv)

    home = Path(tempfile.mkdtemp(prefix="a2rl-run-profile-"))
    # Its own caches: the baseline is evaluated, not taken from an earlier run's evaluation cache.
    os.environ.update({"PREFECT_HOME": str(home / "prefect"), "A2RL_HOME": str(home / "a2rl-home"),
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})  # fmt: skip
    from prefect.testing.utilities import prefect_test_harness

    from a2rl_bench.records import RunConfig
    from a2rl_bench.run_options import RunOptions
    from live_server import SMALL_AGENT  # the reference agent's few-step knobs, as the tests' runs use them
    from tests.tiny_model import build_tiny_model

    os.environ.update(SMALL_AGENT)
    tiny = build_tiny_model(home / "tiny")
    with prefect_test_harness(server_startup_timeout=180):
        from a2rl_bench.flows.benchmark_run import benchmark_run

        os.chdir(home)  # the run's directories land here
        config = RunConfig(base_model=str(tiny), budget_s=args.budget, val_limit=4, test_limit=6)
        profile = cProfile.Profile()
        wall, cpu = time.monotonic(), time.process_time()
        profile.enable()
        summary = benchmark_run(config, RunOptions(results=home / "results.duckdb", grace_s=5))
        profile.disable()
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    print(f"run {summary.run_id}: {summary.status}, {summary.n_submissions} submissions, "
          f"agent {summary.agent_seconds:.1f} of {args.budget:.0f} s")  # fmt: skip
    print(f"wall {wall:.1f} s; this process {cpu:.1f} CPU s (the flow, its tasks and threads)")
    print("phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary.phase_seconds.items()))
    if args.out:
        profile.dump_stats(args.out)
    pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(args.top)
    sys.stdout.flush()
    os._exit(0)  # daemon threads of the harness outlive the run (as in tests/conftest.py): no finalization


if __name__ == "__main__":
    sys.exit(main())
