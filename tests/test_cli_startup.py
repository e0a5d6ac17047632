"""`a2rl <command> --help` stays light (issue #45: at most 1 CPU-second): it imports none of the heavy libraries,
which only the commands that use them load. Checked by what is in `sys.modules`, not by timing; the CPU-seconds
themselves are measured by bench/bench_cli_help.py (BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from a2rl_bench.cli import build_parser, command_lines

HEAVY = ("prefect", "torch", "transformers", "duckdb", "pandas", "matplotlib", "numpy")

# One child imports the command line once, then forks one grandchild per command line: each starts from the same
# modules a fresh `a2rl` has before its parser is built, and reports what its `--help` added.
PROBE = """
import contextlib, io, json, os, sys
import a2rl_bench.cli
heavy, found = {heavy!r}, {{}}
for argv in json.loads(sys.argv[1]):
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                a2rl_bench.cli.main([*argv, "--help"])
            except SystemExit:
                pass
        os.write(write, json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set(heavy))).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        found[" ".join(argv)] = json.loads(f.read() or '["(the probe failed)"]')
    os.wait()
print(json.dumps(found))
"""


def test_no_help_of_any_command_imports_a_heavy_library():
    lines = command_lines(build_parser())
    assert ["drivers", "add"] in lines and ["store", "merge"] in lines and len(lines) > 15
    before = "import sys; print(sorted({m.split('.')[0] for m in sys.modules} & set(%r)))" % (HEAVY,)
    bare = subprocess.run([sys.executable, "-c", before], capture_output=True, text=True, timeout=600)
    assert bare.stdout.strip() == "[]", bare.stderr[-2000:]  # the interpreter itself loads none of them
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), json.dumps(lines)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert set(found) == {" ".join(line) for line in lines}
    heavy = {f"a2rl {line} --help".replace("  ", " "): mods for line, mods in found.items() if mods}
    assert not heavy, f"--help imports heavy libraries (import them where they are used): {heavy}"


def test_deploy_prints_each_deployments_full_id(monkeypatch, capsys):
    """`prefect deploy` reports each deployment in a box that wraps at 80 columns (its output is not a terminal):
    the id ran onto the next line and `a2rl deploy` printed it cut. The box here is drawn by Rich as Prefect draws
    it (prefect/cli/deploy/_core.py)."""
    import io
    import uuid

    from rich.console import Console
    from rich.panel import Panel

    import a2rl_bench.cli
    from a2rl_bench.ops import prefect_local

    ids = {name: str(uuid.uuid4()) for name in ("benchmark-run/benchmark-run", "sweep/nightly-sweep")}
    box = io.StringIO()
    console = Console(file=box, width=80)
    for name, uid in ids.items():
        console.print(Panel(f"Deployment '{name}' successfully created with id '{uid}'."), style="green")
    monkeypatch.setattr(a2rl_bench.cli, "_require_api_url", lambda: "http://127.0.0.1:1/api")
    monkeypatch.setattr(prefect_local, "deploy", lambda url, names=None, pool=None: box.getvalue())
    assert a2rl_bench.cli.main(["deploy"]) == 0
    printed = capsys.readouterr().out
    for name, uid in ids.items():
        assert f"deployed {name}: id {uid}" in printed, printed
