"""Sum up the kill-point matrix (tests/test_kill_points.py) per retry: how many cells, how many ended ok, how long
from the kill to the next attempt, and the agent-clock errors measured at resumed sessions.

    .venv/bin/pytest -q -s tests/test_kill_points.py | tee matrix.log
    .venv/bin/python bench/kill_point_summary.py matrix.log

Reads the cell tables the tests print (one `| kill point | retry | ... |` row per cell); lines of a failing
assertion's message (prefixed `E`) are skipped, so each cell counts once.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

RETRIES = ("ui@0", "ui@1", "ui@3", "ui@10", "ui@20", "a2rl retry")


def cells(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| kill point"):
            continue
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(row) == 10 and row[1] in RETRIES:
            rows.append(row)
    return rows


def seconds(cell: str) -> float | None:
    return None if cell == "-" else float(cell.split()[0])


def main(paths: list[str]) -> None:
    rows = [row for path in paths for row in cells(Path(path).read_text())]
    by_retry: dict[str, list[list[str]]] = defaultdict(list)
    for row in rows:
        by_retry[row[1]].append(row)
    print("| retry | cells | ok | next attempt after the kill: median (min-max) s |")
    print("|---|---|---|---|")
    for retry in RETRIES:
        group = by_retry[retry]
        took = [t for r in group if (t := seconds(r[6])) is not None]
        span = f"{statistics.median(took):.1f} ({min(took):.1f}-{max(took):.1f})" if took else "-"
        print(f"| {retry} | {len(group)} | {sum(r[9] == 'ok' for r in group)} | {span} |")
    clock = [c for r in rows if (c := seconds(r[7])) is not None]
    if clock:
        print(f"\n{len(rows)} cells; agent clock checked at {len(clock)} resumed sessions: largest error "
              f"{max(abs(c) for c in clock):.2f} s, mean {statistics.mean(clock):+.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
