"""Do two versions of the harness derive the same results from the same runs? (issue #38: a restructure must not
change a report, a row or a figure.)

Each version, run from its own checkout, merges the same host store into a fresh central store, lists it
(`a2rl results`), analyses it, and analyses a synthetic store it writes (the generator is seeded: both versions
get the same runs). Then every table and view of the stores, every CSV, summary.json and every figure are
compared: numbers within --tol, text exactly, with timestamps, hashes and the two output paths masked. Tables
only one side has (a new stored table) are listed, not failed.

    python bench/same_results.py --old ../old-checkout --new . --host-store results/a2rl.duckdb --work results/same-results
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

MASK = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?([+-]\d\d(:\d\d)?|Z| UTC)?|\b[0-9a-f]{12,64}\b")


def derive(code: Path, host_store: Path, out: Path, synthetic: int) -> None:
    """Everything one version derives, under `out`."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(code), "PREFECT_HOME": str(out / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
    steps = [["store", "merge", str(host_store), "--into", str(out / "central.duckdb")],
             ["results", "--results", str(out / "central.duckdb")],
             ["analyze", "--results", str(out / "central.duckdb"), "--out", str(out / "analysis")],
             ["analyze", "--synthetic", str(synthetic), "--results", str(out / "syn.duckdb"), "--out",
              str(out / "syn-analysis")]]  # fmt: skip
    for argv in steps:
        done = subprocess.run([sys.executable, "-m", "a2rl_bench", *argv], cwd=code, env=env, capture_output=True,
                              text=True)
        (out / f"{argv[0]}-{argv[1]}.log").write_text(done.stdout + done.stderr)
        if done.returncode:
            raise SystemExit(f"{code}: a2rl {' '.join(argv[:2])} failed (exit {done.returncode}): see {out}")


def relations(store: Path) -> dict[str, pd.DataFrame]:
    con = duckdb.connect(str(store), read_only=True)
    names = [r[0] for r in con.execute("select table_name from information_schema.tables where table_schema='main'"
                                       " and table_name <> 'schema_version'").fetchall()]  # fmt: skip
    return {n: con.execute(f'select * from "{n}"').df() for n in names}


def frame_diff(a: pd.DataFrame, b: pd.DataFrame, tol: float) -> str | None:
    """None if equal (rows in any order, numbers within tol, text with timestamps and hashes masked)."""
    if list(a.columns) != list(b.columns) or a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}, columns {list(a.columns) == list(b.columns)}"

    def canon(df: pd.DataFrame) -> pd.DataFrame:
        text = df.apply(lambda c: c if c.dtype.kind in "fi" else c.map(lambda v: MASK.sub("<M>", str(v))))
        keys = [c for c in text.columns if text[c].dtype.kind not in "fi"] + [c for c in text.columns
                                                                             if text[c].dtype.kind in "fi"]  # fmt: skip
        return text.sort_values(keys, na_position="last").reset_index(drop=True) if keys else text

    a, b = canon(a), canon(b)
    for c in a.columns:
        x, y = a[c], b[c]
        if x.dtype.kind in "fi" and y.dtype.kind in "fi":
            xa, ya = x.to_numpy(float), y.to_numpy(float)
            if not (np.isnan(xa) == np.isnan(ya)).all() or np.nanmax(np.abs(xa - ya), initial=0) > tol:
                return f"column {c}: numbers differ beyond {tol}"
        elif not (x.astype(str) == y.astype(str)).all():
            return f"column {c}: text differs"
    return None


def compare(old: Path, new: Path, tol: float) -> list[str]:
    problems, notes = [], []
    for store in ("central.duckdb", "syn.duckdb"):
        a, b = relations(old / store), relations(new / store)
        notes += [f"{store}: only in new: {sorted(set(b) - set(a))}"] if set(b) - set(a) else []
        problems += [f"{store}: missing in new: {n}" for n in sorted(set(a) - set(b))]
        same = 0
        for n in sorted(set(a) & set(b)):
            if why := frame_diff(a[n], b[n], tol):
                problems.append(f"{store}:{n}: {why}")
            else:
                same += 1
        notes.append(f"{store}: {same} of {len(set(a) & set(b))} shared tables and views equal")
    for folder in ("analysis", "syn-analysis"):
        files = sorted(p.relative_to(old / folder) for p in (old / folder).rglob("*") if p.is_file())
        for rel in files:
            x, y = old / folder / rel, new / folder / rel
            if not y.exists():
                problems.append(f"{folder}/{rel}: missing in new")
            elif x.read_bytes() == y.read_bytes():
                continue
            elif rel.suffix == ".csv":
                if why := frame_diff(pd.read_csv(x), pd.read_csv(y), tol):
                    problems.append(f"{folder}/{rel}: {why}")
            elif rel.suffix == ".json":
                if json.loads(x.read_text().replace(str(old), "<OUT>")) != json.loads(
                        y.read_text().replace(str(new), "<OUT>")):  # fmt: skip
                    problems.append(f"{folder}/{rel}: differs")
            elif rel.suffix in (".html", ".md", ".txt"):
                # tags and lines in any order: a view without ORDER BY lists its rows as it likes
                lines = [sorted(MASK.sub("<M>", p.read_text().replace(str(d), "<OUT>")).replace(">", ">\n")
                                .splitlines()) for p, d in ((x, old), (y, new))]  # fmt: skip
                if lines[0] != lines[1]:
                    problems.append(f"{folder}/{rel}: differs")
            elif x.read_bytes() != y.read_bytes():
                problems.append(f"{folder}/{rel}: bytes differ")
        notes.append(f"{folder}: {len(files)} files compared")
    print("\n".join(notes))
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="checkout of the version to compare against")
    ap.add_argument("--new", type=Path, required=True, help="checkout of the changed version")
    ap.add_argument("--host-store", type=Path, required=True, help="a store with finished runs (a run's results)")
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (replaced)")
    ap.add_argument("--synthetic", type=int, default=240, help="runs in the synthetic store (default 240)")
    ap.add_argument("--tol", type=float, default=1e-9, help="largest absolute difference of two numbers")
    args = ap.parse_args()
    old, new = args.work.resolve() / "old", args.work.resolve() / "new"
    derive(args.old.resolve(), args.host_store.resolve(), old, args.synthetic)
    derive(args.new.resolve(), args.host_store.resolve(), new, args.synthetic)
    problems = compare(old, new, args.tol)
    print("\n".join(problems) or f"the same results (numbers within {args.tol}; timestamps, hashes, paths masked)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
