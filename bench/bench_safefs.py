"""Cost of the link-safe walks (a2rl_bench.isolation.safefs) against the path walks they replaced, on a workspace-like tree.

The sandbox shim runs the ownership walk and the quota count at the start of every sandbox (every bash command
of `claude-tools`), so their cost over a large workspace matters. Builds a tree of `--files` small files in
`--dirs` directories (plus a few large ones, like checkpoints), then times, interleaved, `--repeats` times:

- ownership walk: `os.walk` + `os.lchown` per name (the old `_give_workspace`) against `safefs.chown_tree`
  (open each file without following links, `fstat`, `fchown`), on a tree owned by someone else ("chown") and
  on one the agent owns already ("again": every later sandbox of a session);
- quota count: the old `os.scandir` path walk against `safefs.disk_usage`.

    python bench/bench_safefs.py --files 20000 --dirs 200 --repeats 5

Run as root (chown to another uid); prints a table with medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from a2rl_bench.isolation import safefs  # noqa: E402

UID = 1_000_777_777


def build(root: Path, files: int, dirs: int) -> None:
    for d in range(dirs):
        (root / f"code/d{d}").mkdir(parents=True)
    for i in range(files):
        (root / f"code/d{i % dirs}/f{i}.py").write_text("x = 1\n")
    (root / "output/v1").mkdir(parents=True)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        (root / "output/v1" / name).write_bytes(os.urandom(1 << 20))


def old_chown(ws: str, uid: int) -> None:
    for root, dirs, files in os.walk(ws):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def old_usage(ws: str) -> int:
    total, seen, stack = 0, set(), [ws]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--dirs", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the ownership walk changes owners")
    with tempfile.TemporaryDirectory(prefix="bench-safefs-") as tmp:
        ws = Path(tmp) / "workspace"
        build(ws, args.files, args.dirs)
        rows = {k: [] for k in ("chown old", "chown safefs", "again old", "again safefs", "usage old",
                                "usage safefs")}  # fmt: skip
        for i in range(args.repeats):
            uid = UID + i  # a real change every time
            rows["chown old"].append(timed(old_chown, str(ws), uid))
            rows["chown safefs"].append(timed(safefs.chown_tree, ws, uid + 100, uid + 100))
            # The next sandbox of the same session: everything is the agent's already.
            rows["again old"].append(timed(old_chown, str(ws), uid + 100))
            rows["again safefs"].append(timed(safefs.chown_tree, ws, uid + 100, uid + 100))
            rows["usage old"].append(timed(old_usage, str(ws)))
            rows["usage safefs"].append(timed(safefs.disk_usage, ws))
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"tree: {args.files} files in {args.dirs} dirs + 3 x 1 MiB; {args.repeats} runs each, interleaved")
        print("| walk | path walk (old) | safefs | safefs / old |")
        print("|---|---|---|---|")
        for what in ("chown", "again", "usage"):
            old, new = med[f"{what} old"], med[f"{what} safefs"]
            print(f"| {what} | {old * 1000:.1f} ms | {new * 1000:.1f} ms | {new / old:.2f} |")


if __name__ == "__main__":
    main()
