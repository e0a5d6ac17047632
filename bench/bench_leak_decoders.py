"""Recall of the leak audit's decoders (issue 43): 40 hidden GSM8K test questions written or printed per encoding
(tests/leak_cases.py), found n/40 each; the whole hidden set (validation and test questions and long answers) is
what the audit searches for. Also the audit's time on an honest workspace of a checkpoint's text files with and
without the issue-43 views (ratio within one run), and on hostile files made to be slow.

    .venv/bin/python bench/bench_leak_decoders.py [--seed 43] [--model-dir A2RL_HOME/models/smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from a2rl_bench.benchmarks import get_task  # noqa: E402
from a2rl_bench.summary import leak_audit  # noqa: E402
from a2rl_bench.summary.leak_audit import audit_leaks, hidden_texts  # noqa: E402
from tests.leak_cases import file_cases, output_cases  # noqa: E402


def found(ws: Path, texts: list[str], agent_log: Path | None = None) -> tuple[set[int], float, str]:
    old, leak_audit.MAX_EXAMPLES = leak_audit.MAX_EXAMPLES, 100_000
    try:
        t = time.perf_counter()
        report = audit_leaks(ws, [], texts, agent_log=agent_log)
        return {e.item for e in report.examples}, time.perf_counter() - t, report.verdict
    finally:
        leak_audit.MAX_EXAMPLES = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=43)
    ap.add_argument("--compare", action="store_true", help="hostile files through the decoders of 77516f7 too "
                    "(slow: they had no bound on the number of runs decoded)")
    ap.add_argument("--parts", default="recall,cost,hostile", help="comma-separated: recall, cost, hostile")
    ap.add_argument("--model-dir", help="a model's folder: its text files make the honest workspace timed")
    args = ap.parse_args()
    task = get_task("gsm8k")
    task.prepare("offline")
    items = [i for split in ("validation", "test") for i in task.load_split("offline", split)]
    texts = hidden_texts(items)
    rng = random.Random(args.seed)
    planted = rng.sample(range(len(items)), 40)
    questions = [items[k]["question"] for k in planted]
    want = {texts.index(q) for q in questions}
    print(f"hidden texts searched: {len(texts)}; planted per encoding: 40 (seed {args.seed})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if "recall" in args.parts:
            recall(tmp, questions, texts, want, rows)
    print("| where | encoding | found | other items | seconds |\n|---|---|---|---|---|")
    for where, name, n, other, seconds in rows:
        print(f"| {where} | {name} | {n}/40 | {other} | {seconds:.2f} |")
    if "cost" in args.parts and args.model_dir:
        cost(Path(args.model_dir), texts)
    if "hostile" in args.parts:
        hostile(texts, args.compare)


def recall(tmp: str, questions: list[str], texts: list[str], want: set[int], rows: list) -> None:
    """Found n/40 per encoding: written into a workspace, or printed amid the agent's output."""
    for name, files in file_cases(questions).items():
        ws = Path(tmp) / ("f-" + name.replace(" ", "-"))
        ws.mkdir()
        for file, data in files.items():
            (ws / file).write_bytes(data)
        got, seconds, _ = found(ws, texts)
        rows.append(("file", name, len(got & want), len(got - want), seconds))
    for name, data in output_cases(questions).items():
        ws = Path(tmp) / ("o-" + name.replace(" ", "-"))
        (ws / "workspace").mkdir(parents=True)
        (ws / "agent.log").write_bytes(data)
        got, seconds, _ = found(ws / "workspace", texts, agent_log=ws / "agent.log")
        rows.append(("output", name, len(got & want), len(got - want), seconds))


def old_views():
    """The decoders of 77516f7 (issue 33), loaded from git beside these."""
    import importlib.util
    import subprocess

    old_src = subprocess.run(["git", "show", "77516f7:a2rl/isolation/leak_decode.py"], capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parents[1]).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_leak_decode.py"
    path.write_text(old_src)
    spec = importlib.util.spec_from_file_location("old_leak_decode", path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    return old.Views


def timed(ws: Path, texts: list[str], views) -> tuple[float, str]:
    new_views, leak_audit.Views = leak_audit.Views, views
    try:
        _, seconds, verdict = found(ws, texts)
        return seconds, verdict
    finally:
        leak_audit.Views = new_views


def cost(model_dir: Path, texts: list[str]) -> None:
    """An honest workspace (the model's text files and this repository's Python): the audit's time with the
    decoders of 77516f7 (issue 33) and with these, alternately, three times each."""
    import shutil

    old = old_views()
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        (ws / "output" / "ckpt").mkdir(parents=True)
        for f in model_dir.iterdir():
            if f.is_file() and f.suffix in (".json", ".txt", ".jinja", ".model"):
                shutil.copy(f, ws / "output" / "ckpt" / f.name)
        shutil.copytree(Path(__file__).resolve().parents[1] / "a2rl_bench" / "isolation", ws / "code",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        size = sum(f.stat().st_size for f in ws.rglob("*") if f.is_file())
        times: dict[str, list[float]] = {"77516f7": [], "now": []}
        for _ in range(3):
            for label, views in (("77516f7", old), ("now", leak_audit.Views)):
                seconds, verdict = timed(ws, texts, views)
                assert verdict == "not found", verdict
                times[label].append(seconds)
    best = {k: min(v) for k, v in times.items()}
    print(f"honest workspace ({size / 1e6:.1f} MB): best of 3, decoders of 77516f7 {best['77516f7']:.2f} s, "
          f"now {best['now']:.2f} s (x{best['now'] / best['77516f7']:.1f})")


def hostile(texts: list[str], compare: bool) -> None:
    """Files made to be slow to decode, 16 MiB each (the viewed part): the audit's time per file."""
    import gzip as gz

    mib = 1 << 20
    cases = {
        "one base64 run": b"A" * 16 * mib,
        "short base64 runs": b"QUJDREVGR0hJSktMTU5PUFFSU1RVVldY\n" * (16 * mib // 33),
        "gzip magic everywhere": b"\x1f\x8b\x08\x00" * (4 * mib),
        "a gzip bomb": gz.compress(b"\0" * (512 * mib)),
        "bytes literals": b"b'\\x1f\\x8b\\x08\\x00abcdefgh' " * (16 * mib // 32),
        "character codes": b", ".join(b"72" for _ in range(16 * mib // 4)),
        "one character per line": b"a\n" * (8 * mib),
        "utf-32 run": "x".encode("utf-32-le") * (4 * mib),
    }
    old = old_views()
    print("| hostile file | seconds, decoders of 77516f7 | seconds, now | verdict now |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in cases.items():
            ws = Path(tmp) / name.replace(" ", "-")
            ws.mkdir()
            (ws / "f.bin").write_bytes(data)
            before = timed(ws, texts, old)[0] if compare else float("nan")
            seconds, verdict = timed(ws, texts, leak_audit.Views)
            print(f"| {name} ({len(data) / mib:.0f} MiB) | {before:.1f} | {seconds:.1f} | {verdict} |")


if __name__ == "__main__":
    main()
