"""A hostile agent against the grading freeze (tests/test_redteam_freeze.py), run inside the real sandbox.

Its main worker counts in a shared file the harness reads (bytes 0-8: the worker's progress; 8-16: the hopper's
hops; 16-24: the vfork parents in place; 24-32: the worker's longest gap between two steps, in seconds, as a
double the harness may reset to 0). Attacks and load, by flag:

- `--hop`: a process that forks and exits in a loop (its pid changes all the time, so no listing of the agent's
  processes holds it for long), each generation sending `kill(-1, SIGCONT)` to every process of the agent.
- `--vfork N`: N processes parked in uninterruptible sleep as vfork parents (glibc's posix_spawn is a vfork;
  the child blocks opening a FIFO that nobody opens for writing), all started before the worker.
- `--sleepers N` / `--spinners N`: N more processes sleeping / N busy (load for the benchmark).

Standard library only: it runs on the interpreter the sandbox binds in.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import struct
import time


def _counter(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 32)
    return mmap.mmap(fd, 32)


def _hopper(shared: mmap.mmap) -> None:
    hops = 0
    while True:
        try:
            os.kill(-1, signal.SIGCONT)
        except OSError:
            pass
        hops += 1
        if hops % 16 == 0:
            shared[8:16] = struct.pack("<Q", hops)
        if os.fork():  # the parent leaves; the child carries on under a new pid
            os._exit(0)


def _vfork_parent(fifo: str) -> None:
    """Sit in a vfork (uninterruptible sleep) until the FIFO gets a writer, which never comes."""
    try:
        os.posix_spawn("/bin/true", ["true"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 0, fifo, os.O_RDONLY, 0)])
    finally:
        os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("counter")
    ap.add_argument("--hop", action="store_true")
    ap.add_argument("--vfork", type=int, default=0)
    ap.add_argument("--sleepers", type=int, default=0)
    ap.add_argument("--spinners", type=int, default=0)
    args = ap.parse_args()
    shared = _counter(args.counter)
    if args.vfork:
        fifo = os.path.join(os.path.dirname(os.path.abspath(args.counter)), "never-written.fifo")
        if not os.path.exists(fifo):
            os.mkfifo(fifo)
        for i in range(args.vfork):
            if os.fork() == 0:
                _vfork_parent(fifo)
            shared[16:24] = struct.pack("<Q", i + 1)
    for _ in range(args.sleepers):
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "100000"])
    for _ in range(args.spinners):
        if os.fork() == 0:
            while True:
                pass
    if args.hop and os.fork() == 0:
        _hopper(shared)
    if os.fork() == 0:  # the worker: the youngest process, listed after every other
        n, last = 0, time.monotonic()
        while True:
            n += 1
            if n % 256 == 0:
                shared[0:8] = struct.pack("<Q", n)
                now = time.monotonic()
                if now - last > struct.unpack("<d", shared[24:32])[0]:
                    shared[24:32] = struct.pack("<d", now - last)
                last = now
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
