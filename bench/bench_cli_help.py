"""CPU-seconds of `a2rl <command> --help` for every command and subcommand (issue #45: at most 1 CPU-second).

CPU time (user + system of the child, from `resource.getrusage(RUSAGE_CHILDREN)`), not wall time: on a loaded
machine wall time is the load's. Usage: `.venv/bin/python bench/bench_cli_help.py [--n 3]`; prints one line per
command line with its n values and their median.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys


def cpu_seconds(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "a2rl_bench", *argv, "--help"], stdout=subprocess.DEVNULL, check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3)
    n = parser.parse_args().n
    from a2rl_bench.cli import build_parser, command_lines

    for argv in command_lines(build_parser()):
        values = [cpu_seconds(argv) for _ in range(n)]
        print(f"a2rl {' '.join(argv + ['--help']):<28} n={n} CPU-s {', '.join(f'{v:.2f}' for v in values)}"
              f"  median {statistics.median(values):.2f}", flush=True)


if __name__ == "__main__":
    main()
