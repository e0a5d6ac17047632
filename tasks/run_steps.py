"""Prefect tasks of a benchmark run: thin wrappers over the a2rl library, one step each."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from prefect import get_run_logger, task
from prefect.exceptions import MissingContextError
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from a2rl_bench.inference.evaluation import EvalSpec, shares_one_process, splits_label
from a2rl_bench.isolation import procs
from a2rl_bench.tasks import baseline_ahead
from a2rl_bench.grading.ledger import Ledger
from a2rl_bench.grading.record import RunBook, evaluate_and_record, evaluate_and_record_splits
from a2rl_bench.base_models.build import MARKER
from a2rl_bench.base_models.registry import REGISTRY, resolve_base_model
from a2rl_bench.ops.progress import EVAL_PROGRESS_FILE
from a2rl_bench.paths import models_dir
from a2rl_bench.base_models.hashing import weights_hash
from a2rl_bench.records import LedgerEntry, RunConfig
from a2rl_bench.protocol.feedback import scored_on_test_in_session
from a2rl_bench.protocol.picking import final_pick, latest_submissions
from a2rl_bench.summary.headline import baseline_scores
from a2rl_bench.run import RunContext, host_name, make_run_id, write_manifest
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.workspace import RunPaths, build_workspace, render_instructions
from a2rl_bench.agents import get_agent
from a2rl_bench.benchmarks import get_task
from a2rl_bench.capture.attempts import read_attempts

PROTOCOL_TEXT = {
    "heldout": "Each submission is scored on a **validation** set. A hidden test set, which you never see, "
    "is evaluated once after the session on your final pick: the submission you declare with "
    "`POST /final {\"submission_id\": N}`, or else your best submission by validation score. That is your final score.",
    "paper": "Each submission is scored on the **test** set, as in the original benchmark; the best score counts.",
}
MODE_TEXT = {
    "free": "Any post-training method is allowed.",
    "sft-only": "Only supervised fine-tuning is allowed (no RL).",
    "rl-only": "You must use reinforcement learning (e.g. GRPO or PPO); an SFT warm-up is allowed.",
}


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """Prefect's run logger inside a flow (shown in the terminal and the UI), else a plain one."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("a2rl")


def book_of(ctx: RunContext, store: ResultsStore | None = None) -> RunBook:
    """The run's ledger with its results store (`store`, else the run's): every append anchors the new head there,
    which the ledger's end is checked against, and writes its row."""
    return RunBook(ctx.run_id, ctx.paths.harness_dir, store or ResultsStore(ctx.results_path))


def ledger_of(ctx: RunContext, store: ResultsStore | None = None) -> Ledger:
    """The run's ledger (`book_of`'s), to read."""
    return book_of(ctx, store).ledger


@task(name="open-run", cache_policy=NO_CACHE)
def open_run(config: RunConfig, results_path: Path, runs_dir: Path, attempt: int = 1) -> RunContext:
    """Give the run its id and directories, write its manifest and its first row in the results store. Attempt
    `attempt` goes on only from the directory of the attempt just before it: a directory an older attempt left
    here (later ones ran on other hosts) is set aside (`set_aside_stale_run_dir`) and the run starts over."""
    bench = get_task(config.task)
    run_id = make_run_id(config, flow_run.get_id())
    ctx = RunContext(
        run_id=run_id,
        config=config,
        paths=RunPaths.for_run(runs_dir, run_id),
        results_path=Path(results_path).resolve(),
        variant_label=bench.variant_labels.get(config.variant, config.variant),
    )
    if (moved := set_aside_stale_run_dir(ctx.paths.run_dir, attempt)) is not None:
        store = ResultsStore(ctx.results_path)
        store.delete_run_children(run_id)  # the rows and ledger anchors of the directory set aside: not this run's
        store.adopt_ledger_heads(run_id, [])
        _SET_ASIDE[run_id] = moved
    ctx.paths.create()
    write_manifest(ctx)
    ResultsStore(ctx.results_path).start_run(run_id, config, str(ctx.paths.harness_dir), ctx.variant_label)
    return ctx


_SET_ASIDE: dict[str, str] = {}
"""Run id → why its directory was set aside by this process (what `record_attempt` says)."""


def set_aside_stale_run_dir(run_dir: Path, attempt: int) -> str | None:
    """A run directory whose last attempt (its `harness/attempts.json`) is older than `attempt - 1` holds work that
    later attempts on other hosts went past: renamed to `<run dir>.attempt-N-set-aside` (kept, never resumed).
    Returns what happened, or None when the directory is the previous attempt's, new, or has no attempt yet."""
    if attempt <= 1 or not (Path(run_dir) / "harness").is_dir():
        return None
    # Prefect's run count names an attempt across hosts (`number` counts this directory's attempts only).
    numbers = [a.prefect_run_count or a.number for a in read_attempts(Path(run_dir) / "harness").attempts]
    last = max(numbers, default=None)
    if last is None or last >= attempt - 1:
        return None
    target = Path(f"{run_dir}.attempt-{last}-set-aside")
    n = 1
    while target.exists():
        n += 1
        target = Path(f"{run_dir}.attempt-{last}-set-aside-{n}")
    Path(run_dir).rename(target)
    return (f"this host's run directory was left by attempt {last}, and attempts {last + 1}-{attempt - 1} ran "
            f"elsewhere: it was set aside as {target.name} and the run starts over")


def record_attempt(ctx: RunContext) -> None:
    """A retried flow run records in the ledger which attempt this is, on which host, and whether it goes on with
    this run directory or starts the run over: a retry on a host that never saw the run (its first host died, with
    the run directory), or whose directory is an older attempt's than the last one, starts it over under the same
    run id, and says so (run log, the flow run's log in the UI, the ledger). First attempts record nothing."""
    attempt = flow_run.get_run_count() or 1
    if attempt <= 1:
        return
    book = book_of(ctx)
    set_aside = _SET_ASIDE.pop(ctx.run_id, None)
    starts_over = set_aside is not None or not book.entries()
    detail = {"event": "attempt", "attempt": attempt, "host": host_name(), "starts_over": starts_over}
    if set_aside is not None:
        detail["set_aside"] = set_aside
    book.append(kind="event", detail=detail)
    run_logger().warning(
        "attempt %d of run %s on host %s: %s", attempt, ctx.run_id, detail["host"],
        f"starts the run over ({set_aside})" if set_aside is not None
        else "starts the run over (no earlier attempt left a ledger entry here: it ran on another host, or died early)"
        if starts_over
        else "goes on with this host's run directory",
    )  # fmt: skip


@task(name="prepare-task-data", cache_policy=NO_CACHE)
def prepare_task_data(ctx: RunContext) -> Path:
    return get_task(ctx.config.task).prepare(ctx.config.variant).public_dir


def base_model_step(name: str) -> str:
    """The word for the wait on the base model: a registry model not yet converted on this machine takes minutes
    (GGUF dequantized into a Hugging Face checkpoint, once); anything else loads in seconds."""
    if name in REGISTRY and not (models_dir() / name / MARKER).is_file():
        return f"converting the base model {name} (first use on this machine; once)"
    return f"resolving the base model {name}"


@task(name="prepare-base-model", cache_policy=NO_CACHE)
def prepare_base_model(name: str) -> Path:
    """Resolve (and on first use convert) the base model into the machine-wide model cache."""
    return resolve_base_model(name)


@task(name="build-workspace", cache_policy=NO_CACHE)
def build_workspace_step(ctx: RunContext, public_dir: Path, base_model_dir: Path) -> None:
    c = ctx.config
    bench = get_task(c.task)
    instructions = render_instructions(
        run_id=ctx.run_id,
        base_model=c.base_model,
        protocol=c.protocol,
        protocol_text=PROTOCOL_TEXT[c.protocol],
        budget_s=int(c.budget_s),
        max_submissions=c.max_submissions,
        mode=c.mode,
        mode_text=MODE_TEXT[c.mode],
    )
    build_workspace(ctx.paths, public_dir, base_model_dir, bench.description(), instructions)
    get_agent(c.agent).install(ctx.paths.workspace)


@task(name="evaluate-baseline", cache_policy=NO_CACHE)
def evaluate_baseline(
    ctx: RunContext, base_model_dir: Path, progress: Callable[..., None] | None = None
) -> dict[str, float]:
    """The base model's validation and test scores (cached by weights hash + evaluator config).
    `progress(baseline_done=, baseline_total=, baseline_split=)` hears of each split started and finished."""
    book = book_of(ctx)
    done = baseline_scores(book.entries())
    base_hash = weights_hash(base_model_dir)
    bench = get_task(ctx.config.task)
    sizes = {split: len(bench.load_split(ctx.config.variant, split, EvalSpec.for_run(ctx.config, split).limit))
             for split in ("validation", "test")}  # fmt: skip
    report = progress or (lambda **_: None)
    # a resumed run keeps the baseline it already recorded
    todo = [EvalSpec.for_run(ctx.config, split, bench) for split in ("validation", "test") if split not in done]
    # `a2rl run` may have begun this evaluation while Prefect started (baseline_ahead): its results, once done.
    ahead, made = baseline_ahead.take(ctx.config), None
    label = splits_label(todo)
    if ahead is not None and not todo:
        ahead.cancel()  # the baseline was recorded by an earlier attempt: its early evaluation is not needed
    elif ahead is not None:
        report(baseline_done=0, baseline_total=sum(sizes.values()), baseline_split=label)
        run_logger().info("base model: evaluating %s together, begun while Prefect started...", label)
        made = ahead.wait(base_model_dir, base_hash, todo, eval_progress_file(ctx))
    # Both splits to do on a path whose answers ignore their company: one process, one model load, one batch.
    if made is not None or shares_one_process(base_hash, todo, interactive=getattr(bench, "plays_episodes", True)):
        if made is None:
            report(baseline_done=0, baseline_total=sum(sizes.values()), baseline_split=label)
            run_logger().info("base model: evaluating %s together (%s items)...", label,
                              " + ".join(str(s.limit or "all") for s in todo))  # fmt: skip
        for _, result in evaluate_and_record_splits(book, base_model_dir, base_hash, todo, "baseline",
                                                    progress_file=eval_progress_file(ctx),
                                                    on_start=procs.record_started, results=made):  # fmt: skip
            run_logger().info("base model: %s score %.2f (%.0f s of one process shared by items, %s prompts a batch)",
                              result.split, result.score, result.duration_s, result.batch_size)  # fmt: skip
            done[result.split] = result.score
        todo = []
    for spec in todo:
        split = spec.split
        finished = sum(n for s, n in sizes.items() if s in done)
        report(baseline_done=finished, baseline_total=sum(sizes.values()), baseline_split=split)
        run_logger().info("base model: evaluating %s (%s items)...", split, spec.limit or "all")
        _, result = evaluate_and_record(book, base_model_dir, base_hash, spec, "baseline",
                                        progress_file=eval_progress_file(ctx), on_start=procs.record_started)
        run_logger().info("base model: %s score %.2f (%s%s)", split, result.score,
                          "cached" if result.cached else f"{result.duration_s:.0f} s",
                          f", {result.batch_size} prompts a batch" if result.batch_size else "")  # fmt: skip
        done[split] = result.score
        if not result.cached and result.n:
            report(baseline_item_s=result.duration_s / result.n)  # the next split's ETA until it measures its own
    report(baseline_done=sum(sizes.values()), baseline_total=sum(sizes.values()), baseline_split=None)
    return done


def eval_progress_file(ctx: RunContext) -> Path:
    """Where the next evaluation of the run counts its finished items (a fresh file: the display never shows
    the previous evaluation's count as this one's)."""
    path = ctx.paths.harness_dir / EVAL_PROGRESS_FILE
    path.unlink(missing_ok=True)
    return path


@task(name="evaluate-final", cache_policy=NO_CACHE)
def evaluate_final(ctx: RunContext, base_model_dir: Path) -> LedgerEntry:
    """Evaluate the final pick on the hidden test set, once (admin action, not on the agent's API).

    heldout: the agent's declared pick (POST /final), else its best submission on validation; with no
    scored submission the base model stands (Δ = 0). paper: the best test score already seen (the original).
    """
    book = book_of(ctx)
    entries = book.entries()
    existing = next((e for e in entries if e.kind == "final"), None)
    if existing is not None:  # resumed after the final evaluation was recorded
        return existing
    chosen = final_pick(entries, ctx.config.protocol)
    pick, selection = chosen.entry, chosen.selection
    if scored_on_test_in_session(ctx.config.protocol):  # scored on the test set already: no evaluation of its own
        score = pick.score if pick else baseline_scores(entries).get("test")
        return book.append(kind="final", split="test", status="scored", score=score,
                           submission_id=pick.submission_id if pick else None, detail={"selection": selection})
    path = Path(pick.resolved_path) if pick else base_model_dir
    whash = pick.weights_hash if pick else weights_hash(base_model_dir)
    entry, _ = evaluate_and_record(  # on_start: a retry ends the evaluation should this attempt die first
        book, path, whash, EvalSpec.for_run(ctx.config, "test", get_task(ctx.config.task)), "final",
        progress_file=eval_progress_file(ctx), on_start=procs.record_started,
        submission_id=pick.submission_id if pick else None, model_path=pick.model_path if pick else None,
        detail={"selection": selection},
    )  # fmt: skip
    return entry


@task(name="evaluate-every-submission", cache_policy=NO_CACHE)
def evaluate_every_submission(ctx: RunContext) -> list[LedgerEntry]:
    """Every scored submission on the hidden test set, after the session and for analysis only (kind `posthoc`:
    the test curve, what each training stage added). The final pick and the headline stay as they are; the
    agent's session is over, so nothing of this reaches it. Resumable: submissions already done are skipped,
    and the final pick's own evaluation comes from the cache."""
    book = book_of(ctx)
    entries = book.entries()
    if scored_on_test_in_session(ctx.config.protocol):
        return []  # every submission was scored on the test set already
    done = {e.submission_id for e in entries if e.kind == "posthoc"}
    spec = EvalSpec.for_run(ctx.config, "test", get_task(ctx.config.task))
    out = []
    for sub in latest_submissions(entries):
        if sub.status != "scored" or sub.submission_id in done or not sub.resolved_path:
            continue
        entry, _ = evaluate_and_record(
            book, Path(sub.resolved_path), sub.weights_hash, spec, "posthoc",
            progress_file=eval_progress_file(ctx), on_start=procs.record_started,
            submission_id=sub.submission_id, model_path=sub.model_path,
            detail={"purpose": "analysis only", **({"stage": sub.detail["stage"]} if sub.detail.get("stage") else {})},
        )  # fmt: skip
        out.append(entry)
    return out


@task(name="prune-snapshots", cache_policy=NO_CACHE)
def prune_snapshots(ctx: RunContext) -> None:
    """Graded snapshots are only needed until the final (and post-hoc) evaluations; the final pick's stays for
    audit."""
    final = next((e for e in ledger_of(ctx).entries() if e.kind == "final"), None)
    keep = final.submission_id if final else None
    root = ctx.paths.harness_dir / "snapshots"
    for snap in root.glob("s*") if root.exists() else []:
        if snap.name != f"s{keep}":
            shutil.rmtree(snap, ignore_errors=True)
