"""Compile the bytecode of a venv's packages on every core, with a count that moves (`make setup`'s last step).

compileall prints nothing for minutes on a loaded machine (332 s once) and ends `Error 1` for the few files
that are not Python 3 (templates, test data in some packages), which `make` reported as "(ignored)". Here each
file is compiled as compileall would, a line says how many are done every few seconds, and files that do not
compile are counted and left as source (Python reads them as it always did).

Usage: python scripts/compile_bytecode.py DIRECTORY
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

EVERY_S = 5.0


def compile_one(path: str) -> bool:
    try:
        cached = importlib.util.cache_from_source(path)
        if os.path.exists(cached) and os.stat(cached).st_mtime >= os.stat(path).st_mtime:
            return True  # compiled already (pip's own, or an earlier set-up)
        py_compile.compile(path, doraise=True)  # raises, prints nothing
        return True
    except (py_compile.PyCompileError, OSError, ValueError, SyntaxError):
        return False


def main(root: Path) -> int:
    files = [str(p) for p in root.rglob("*.py") if p.is_file()]
    total, done, failed = len(files), 0, 0
    said = time.monotonic()
    print(f"set-up: compiling the bytecode of {total} files in {root} ...", flush=True)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for ok in pool.map(compile_one, files, chunksize=64):
            done += 1
            failed += not ok
            if time.monotonic() - said >= EVERY_S:
                print(f"set-up: bytecode {done}/{total} files", flush=True)
                said = time.monotonic()
    note = f" ({failed} are not Python 3 source and stay as they are)" if failed else ""
    print(f"set-up: bytecode {done}/{total} files done{note}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
