"""Run directories and host-store rows written the way a benchmark run writes them, without an agent or a model:
an offline stand-in for tests and benchmarks of the store (merge, ingest). The scores are made up; everything else
goes through the run's own code: manifest, the anchored ledger, evaluations and their per-item files, events,
submission rows, and the summary step (report, leak audit, process metrics, final row)."""

from __future__ import annotations

from pathlib import Path

from a2rl_bench.records import EvalResult, ItemResult, RunConfig
from a2rl_bench.run import RunContext, make_run_id, write_manifest
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.workspace import RunPaths
from a2rl_bench.tasks.run_steps import book_of


def synthetic_eval(split: str, n: int, n_correct: int) -> EvalResult:
    items = [ItemResult(item_id=f"{split}-{i}", completion="", prediction=None, target="", correct=i < n_correct)
             for i in range(n)]  # fmt: skip
    return EvalResult(task="gsm8k", split=split, score=100.0 * n_correct / n, n=n, n_correct=n_correct,
                      evaluator_id="gsm8k/synthetic", items=items)  # fmt: skip


def write_run(results: Path, runs_dir: Path, config: RunConfig, flow_run_id: str, *, submissions: int = 2,
              status: str | None = "completed", session: bool = True) -> RunContext:
    """One run of `config` recorded in the store `results` with its directory under `runs_dir`.

    `status` None leaves it as a killed run leaves it: the row `running`, no report. `session` False stops before
    the agent session (baselines only)."""
    from a2rl_bench.tasks.summary_steps import write_summary

    ctx = RunContext(run_id=make_run_id(config, flow_run_id), config=config,
                     paths=RunPaths.for_run(runs_dir, make_run_id(config, flow_run_id)),
                     results_path=Path(results).resolve(), variant_label="offline")  # fmt: skip
    ctx.paths.create()
    write_manifest(ctx)
    ResultsStore(ctx.results_path).start_run(ctx.run_id, config, str(ctx.paths.harness_dir), ctx.variant_label)
    book = book_of(ctx)
    for split, n in (("validation", 4), ("test", 8)):
        result = synthetic_eval(split, n, 1)
        book.record_scored(result, kind="baseline", split=split, weights_hash="base")
    if session:
        book.append(kind="event", detail={"event": "session-start", "budget_s": config.budget_s})
        for sid in range(1, submissions + 1):
            fields = dict(kind="submission", submission_id=sid, model_path=f"output/v{sid}", weights_hash=f"w{sid}",
                          size_bytes=1000, split="validation", agent_elapsed_s=5.0 * sid)  # fmt: skip
            book.append(**fields, status="queued")
            result = synthetic_eval("validation", 4, min(4, 1 + sid))
            book.record_scored(result, **fields)
        book.append(kind="event", detail={"event": "session-end", "ended_by": "exited", "exit_code": 0,
                                          "agent_seconds": 10.0, "wall_seconds": 11.0, "grading_seconds": 1.0})
        if submissions:
            result = synthetic_eval("test", 8, 3)
            book.record_scored(result, kind="final", split="test", submission_id=submissions,
                               weights_hash=f"w{submissions}")
    if status is not None:
        write_summary(ctx, status, {"agent_session": 11.0}, error=None if status == "completed" else "stopped")
    return ctx


STORE_TABLES = ("runs", "submissions", "evaluations", "item_results", "events", "metrics", "llm_calls", "tool_calls",
                "resources", "ledger_heads")  # fmt: skip


def dump_store(path: Path) -> dict[str, list]:
    """Every row of every table of a store, in a stable order: two dumps are equal when the stores hold the same."""
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in STORE_TABLES}

