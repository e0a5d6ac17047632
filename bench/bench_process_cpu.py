"""Where a command's CPU goes, by kind of process: every process on the machine sampled from /proc while it runs.

    python bench/bench_process_cpu.py record OUT.json -- make test     # samples until the command ends
    python bench/bench_process_cpu.py summarize OUT.json [--top 25]

Made for the suite (issue 48): its CPU is spread over servers, workers, flow-run processes, trainers and
evaluations that pytest's own timings and `time` (waited-for children only) do not separate. Each process's last
seen utime + stime is kept, keyed by (pid, start time), so a reused pid is another process. Limits, said with the
figures: a process that lives less than one period (0.25 s) is missed, and one that dies loses up to a period of
its CPU; the whole machine is sampled, so other work on it counts too (compare the total with /proc/stat's).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

TICK = os.sysconf("SC_CLK_TCK")
KINDS = (  # (kind, pattern over the command line): the first that matches names the process
    ("pytest (tests, in-process flows)", r"bin/pytest|-m pytest"),
    ("flow-run process", r"prefect\.runner\._workspace_supervisor|prefect\.engine"),
    ("evaluation process", r"a2rl_bench\.inference\.evaluation"),
    ("agent trainer (SFT)", r"train_sft\.py"),
    ("agent trainer (GRPO)", r"train_grpo"),
    ("agent script", r"agent\.py"),
    ("Prefect server", r"crash_reports server|uvicorn|server start"),
    ("Prefect worker", r"crash_reports worker|worker start"),
    ("Prefect CLI (deploy, pools)", r"-m prefect "),
    ("a2rl CLI", r"a2rl_bench\.cli|bin/a2rl"),
    ("load generator (tests)", r"-c while True"),
    ("sandbox helpers", r"isolation/procs\.py|bwrap|setpriv|unshare"),
    ("agent CLIs (node, OpenHands)", r"node|npm|opencode|openhands"),
    ("PostgreSQL", r"postgres"),
    ("browser", r"chrom"),
)


@dataclass
class Sample:
    pid: int
    start_s: float
    comm: str
    cmd: str
    cpu_s: float = 0.0


def read_proc(pid: str) -> tuple[tuple[int, int], str, float] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        comm, rest = stat[stat.index("(") + 1 :].rsplit(")", 1)
        fields = rest.split()
        return (int(pid), int(fields[19])), comm, (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, ValueError, IndexError):  # gone, or caught half-way out: the next sweep has no more of it
        return None


def record(out: str, command: list[str], period_s: float) -> int:
    seen: dict[tuple[int, int], Sample] = {}
    me = os.getpid()
    # What the machine's processes had used before the command: only their CPU from now on counts.
    before = {got[0]: got[2] for pid in os.listdir("/proc") if pid.isdigit() and (got := read_proc(pid))}
    proc = subprocess.Popen(command)
    while True:
        done = proc.poll() is not None
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me or not (got := read_proc(pid)):
                continue
            key, comm, cpu = got
            if key not in seen:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    continue
                seen[key] = Sample(key[0], key[1] / TICK, comm, cmd[:1000])
            seen[key].cpu_s = cpu - before.get(key, 0.0)
        if done:
            break
        time.sleep(period_s)
    with open(out, "w") as f:
        json.dump([asdict(s) for s in seen.values()], f)
    return proc.returncode


def kind_of(s: dict) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, s["cmd"]):
            return kind
    return f"other: {s['comm']}"


def summarize(path: str, top: int) -> None:
    samples = json.load(open(path))
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for s in samples:
        by_kind[kind_of(s)].append(s["cpu_s"])
    total = sum(map(sum, by_kind.values()))
    print(f"{total:.0f} CPU s sampled over {len(samples)} processes")
    print("| kind | CPU s | share | processes | CPU s each (mean) |\n|---|---|---|---|---|")
    for kind, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))[:top]:
        cpu = sum(cpus)
        print(f"| {kind} | {cpu:.0f} | {100 * cpu / total:.1f}% | {len(cpus)} | {cpu / len(cpus):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record", help="run a command, sampling every process's CPU until it ends")
    rec.add_argument("out")
    rec.add_argument("--period-s", type=float, default=0.25)
    rec.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    summ = sub.add_parser("summarize", help="CPU seconds by kind of process")
    summ.add_argument("path")
    summ.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    if args.what == "record":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            ap.error("record: give the command after --")
        sys.exit(record(args.out, command, args.period_s))
    summarize(args.path, args.top)


if __name__ == "__main__":
    main()
