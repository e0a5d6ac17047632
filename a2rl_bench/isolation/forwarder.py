"""Sandbox launcher: forward loopback ports to Unix sockets, apply rlimits, run the agent (stdlib only).

Inside: python -I -S forwarder.py --forward 8123=/run/a2rl/p8123.sock --rlimit nproc=4096 --signals -- CMD...
With `--report FD` the command's exit code is written to FD as soon as it exits, and the launcher (a child
subreaper) then waits for the jobs it left in the background: a tool call returns while they run on.
The host side (a2rl_bench/isolation/sandbox.py's shim) reuses `handler` the other way round: Unix socket in, TCP out.
"""

import asyncio
import ctypes
import itertools
import os
import resource
import signal
import subprocess
import sys

RLIMITS = {"nproc": "NPROC", "as": "AS", "fsize": "FSIZE", "nofile": "NOFILE", "core": "CORE"}


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close, so that a client that shuts its side down still gets its answer."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


def handler(connect):
    """A connection handler that opens `connect()` and copies bytes both ways until both sides are done."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await connect()
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:
            # The launcher is ending (asyncio.run cancels open connections): end quietly. A cancelled
            # connection task would make Python 3.11's stream callback log a CancelledError traceback.
            pass
        writer.close()
        up_writer.close()

    return handle


async def main(argv: list[str]) -> int:
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1 :]
    report = -1
    for flag, spec in itertools.pairwise(opts):
        key, _, value = spec.partition("=")
        if flag == "--forward":  # listen on 127.0.0.1:key inside, connect to the Unix socket `value`
            await asyncio.start_server(handler(lambda p=value: asyncio.open_unix_connection(p)), "127.0.0.1", int(key))
        elif flag == "--rlimit":  # soft = hard, so the agent cannot raise it again
            limit = getattr(resource, f"RLIMIT_{RLIMITS[key]}")
            hard = resource.getrlimit(limit)[1]
            value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
            resource.setrlimit(limit, (value, value))
        elif flag == "--report":
            report = int(spec)
    if report >= 0:  # orphaned background jobs become our children, not PID 1's (which ends with us)
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    # --signals: the agent gets its own group; we pass SIGTERM on and keep forwarding for its last submission.
    forward = "--signals" in opts
    libc = ctypes.CDLL(None)  # the command gets SIGKILL if we die (PR_SET_PDEATHSIG): nothing outlives its launcher
    try:
        proc = subprocess.Popen(cmd, process_group=0 if forward else None,
                                preexec_fn=lambda: libc.prctl(1, signal.SIGKILL, 0, 0, 0))
    except OSError as e:
        print(f"[sandbox] cannot start {cmd[:1]}: {e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        asyncio.get_running_loop().add_signal_handler(sig, lambda s=sig: forward and _killpg(proc.pid, s))
    code = await asyncio.to_thread(proc.wait)
    code = code if code >= 0 else 128 - code
    if report >= 0:
        os.write(report, f"{code}\n".encode())
        os.close(report)
        await asyncio.to_thread(_reap_all)
    return code


def _reap_all() -> None:
    """Wait until no child (adopted background job included) is left."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the agent's group is already gone
        pass


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
