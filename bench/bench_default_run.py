"""The default `a2rl run` (no arguments) of two revisions, alternating, in one sitting (issue 48, item 5).

Each run: a `git archive` of its revision as the code imported, a fresh A2RL_HOME holding only the converted base
model (hard links to `--models`, so no evaluation is cached), a fresh Prefect home, results and runs dir. Prints and
appends to `--out` one JSON line a run: wall and CPU seconds, the phases (`attempts.json`), the seconds from the
command's start to the baseline's end, the scores, the 1-minute load at start and end.

    python bench/bench_default_run.py --rev before=c03747e --rev after=HEAD --order after,before,after,before
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def source(rev: str, root: Path) -> Path:
    out = root / f"src-{rev}"
    if not out.exists():
        out.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def one_run(name: str, rev: str, root: Path, models: Path) -> dict:
    src = source(rev, root)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    home = work / "home"
    home.mkdir()
    subprocess.run(["cp", "-al", str(models), str(home / "models")], check=True)
    env = dict(os.environ, A2RL_HOME=str(home), PREFECT_HOME=str(work / "prefect"), PYTHONPATH=str(src))
    env.pop("PREFECT_API_URL", None)
    imported = subprocess.run([sys.executable, "-c", "import a2rl_bench.tasks.run_steps as m; print(m.__file__)"],
                              env=env, cwd=src, capture_output=True, text=True, check=True).stdout.strip()
    assert imported.startswith(str(src)), imported  # the revision's code, not the editable install's
    cmd = [sys.executable, "-m", "a2rl_bench.cli", "run", "--runs-dir", str(work / "runs"),
           "--results", str(work / "a2rl.duckdb")]  # fmt: skip
    load0, started_at = os.getloadavg()[0], datetime.now(timezone.utc).strftime("%H:%M:%S")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (work / "out.txt").write_text(proc.stdout + proc.stderr)
    harness = next((work / "runs").glob("*/harness"))
    attempt = json.loads((harness / "attempts.json").read_text())["attempts"][-1]
    ledger = [json.loads(line) for line in (harness / "ledger.jsonl").read_text().splitlines()]
    baseline_end = max(datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp()
                       for e in ledger if e["kind"] == "baseline")  # fmt: skip
    scores = {f"{e['kind']}-{e.get('submission_id') or 0}-{e['split']}": e["score"] for e in ledger
              if e["kind"] in ("baseline", "final") or (e["kind"] == "submission" and e["status"] == "scored")}
    end = next((e for e in ledger if (e.get("detail") or {}).get("ended_by")), {"detail": {}})
    return {
        "name": name, "rev": rev, "rc": proc.returncode, "start": started_at, "load": [round(load0, 2),
        round(os.getloadavg()[0], 2)], "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "phases": {k: round(v, 1) for k, v in attempt["phases"].items()},
        "start_to_baseline_end_s": round(baseline_end - (time.time() - (time.perf_counter() - t)), 1),
        "agent_s": end["detail"].get("agent_seconds"), "grading_s": end["detail"].get("grading_seconds"),
        "scores": scores, "dir": str(work),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", action="append", required=True, help="name=git revision")
    parser.add_argument("--order", required=True, help="names, comma-separated, in the order run")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache/a2rl/models")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "a2rl-bench-default-run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    revs = dict(r.split("=", 1) for r in args.rev)
    args.root.mkdir(parents=True, exist_ok=True)
    for name in args.order.split(","):
        row = one_run(name, revs[name], args.root, args.models)
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
