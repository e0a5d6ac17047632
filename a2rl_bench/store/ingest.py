"""(Re)building a run's rows in the results store from its run directory, and writing a run's process facts."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

from a2rl_bench.grading.ledger import LedgerCorrupted, LedgerHead, mac_matches, read_ledger
from a2rl_bench.grading.record import eval_key, read_evaluations
from a2rl_bench.summary.leak_audit import LeakReport, leak_metrics
from a2rl_bench.protocol.picking import latest_submissions
from a2rl_bench.capture.calls import read_llm_calls, read_tool_calls
from a2rl_bench.capture.resources import read_resources, resource_rows
from a2rl_bench.capture.snapshots import CodeSnapshots
from a2rl_bench.records import EvalResult, LedgerEntry, RunConfig, RunSummary
from a2rl_bench.store.results import ITEM_COLUMNS, item_rows, metric_cells
from a2rl_bench.summary.headline import numbers_disagree
from a2rl_bench.summary.process_facts import ProcessFacts, summarize_process
from a2rl_bench.summary.record import RunRecord, read_run_record

log = logging.getLogger(__name__)


def store_process_report(store: Any, report: ProcessFacts, harness_dir: Path | str) -> None:
    """Write a run's process facts to the results store: metrics (+ failure class), route labels, LLM and
    tool calls, and resource samples. Each write replaces the run's earlier rows, so calling it again is harmless."""
    harness_dir = Path(harness_dir)
    store.record_metrics(report.run_id, report.metrics.model_dump() | {"failure_reason": report.failure_reason})
    store.record_routes(report.run_id, report.routes, report.code_shas)
    store.replace_run_rows("llm_calls", report.run_id, read_llm_calls(harness_dir / "llm_calls.jsonl"))
    store.replace_run_rows("tool_calls", report.run_id, read_tool_calls(harness_dir / "tool_calls.jsonl"))
    store.replace_run_rows("resources", report.run_id, resource_rows(read_resources(harness_dir / "resources.jsonl")))


def ingest_run_dir(store: Any, run_dir: Path | str, unverified_ok: bool = False) -> ProcessFacts:
    """(Re)build every row of one run in the results store from its run directory, in one transaction.

    Reads `harness/manifest.json`, the verified ledger (`verified_entries`), `report.json` (if written; through
    `read_run_record`, which migrates an older format and refuses a newer one),
    per-evaluation files, the code snapshots, `resources.jsonl` and `llm_calls.jsonl`. All timestamps come from
    those files, so ingesting the same directory twice leaves the store exactly as it was. No narrative is
    requested. A run that does not verify (`verified_entries`) is refused: its row is marked failed with the
    reason, no score is written, and LedgerCorrupted is raised.
    """
    import pandas as pd

    run_dir = Path(run_dir)
    harness = run_dir / "harness" if (run_dir / "harness").is_dir() else run_dir
    manifest = json.loads((harness / "manifest.json").read_text())
    run_id, config = manifest["run_id"], RunConfig.model_validate(manifest["config"])
    report_path = harness / "report.json"
    record = read_run_record(report_path) if report_path.exists() else None
    summary = record.summary if record else None
    try:
        entries, verified = verified_entries(store, run_id, harness, record, unverified_ok)
        # Per-item results only as the ledger recorded them (EvaluationsAltered: refused, verified or not).
        evaluations = read_evaluations(harness, entries)
    except LedgerCorrupted as e:
        store.replace_run(run_id, _refused_frames(run_id, config, summary, harness, str(e)))
        raise
    end = next((e for e in reversed(entries) if e.detail.get("event") == "session-end"), None)
    detail = end.detail if end else {}
    status = summary.status if summary else ("completed" if any(e.kind == "final" for e in entries) else "interrupted")
    has_code = (harness / "code.git").exists()
    snapshots = CodeSnapshots(harness, harness.parent / "workspace" / "code") if has_code else None
    process = summarize_process(
        run_id, harness, entries, config, detail, snapshots=snapshots, summary=summary, run_status=status,
        run_error=summary.error if summary else None, narrative=False, write_files=False,
    )  # fmt: skip
    row = _run_row(run_id, config, summary, process, entries, status, harness)
    if not verified:  # its own setting in every table, CSV and figure: never pooled with verified runs
        row["variant"], row["variant_label"] = unverified_variant(config.variant), unverified_variant(row["variant_label"])
    frames = {
        "runs": pd.DataFrame([row]),
        "submissions": pd.DataFrame(_submission_rows(run_id, entries, process)),
        "evaluations": pd.DataFrame(_evaluation_rows(run_id, entries, evaluations)),
        "item_results": pd.DataFrame(_item_rows(run_id, evaluations), columns=list(ITEM_COLUMNS)),
        "events": pd.DataFrame([
            {"run_id": run_id, "seq": e.seq, "created_at": e.at, "kind": e.detail.get("event", "event"),
             "detail_json": json.dumps(e.detail, sort_keys=True, default=str)}
            for e in entries if e.kind == "event"
        ]),  # fmt: skip
        "metrics": pd.DataFrame(_metric_rows(run_id, process, harness)
                                + ([] if verified else [{"run_id": run_id, "name": VERIFICATION_METRIC, "value": None,
                                                         "text": "unverified"}])),  # fmt: skip
        "llm_calls": pd.DataFrame([r | {"run_id": run_id} for r in read_llm_calls(harness / "llm_calls.jsonl")]),
        "tool_calls": pd.DataFrame([r | {"run_id": run_id} for r in read_tool_calls(harness / "tool_calls.jsonl")]),
        "resources": pd.DataFrame([r | {"run_id": run_id}
                                   for r in resource_rows(read_resources(harness / "resources.jsonl"))]),
    }
    store.replace_run(run_id, frames)
    return process


VERIFICATION_METRIC = "ledger_verification"
"""A metric of runs taken without a verified ledger (text `unverified`); verified runs have none."""


def unverified_variant(variant: str) -> str:
    """The `variant` column of a run taken unverified: a setting of its own, flagged wherever it is shown."""
    return f"{variant} [UNVERIFIED]"


class Verified(NamedTuple):
    entries: list
    verified: bool
    """False: taken with `unverified_ok`, its ledger shown to be nobody's in particular."""


def verified_entries(store: Any, run_id: str, harness: Path, record: RunRecord | None,
                     unverified_ok: bool = False) -> Verified:  # fmt: skip
    """The run's ledger entries, once they are shown to be the ones the harness wrote; LedgerCorrupted otherwise.

    The chain must verify; the ledger must end where this store anchored it and continue the head the report was
    built on; the report's numbers must be the ledger's. Without an anchor in this store (a new store), the
    report's head must carry a MAC under a key this machine trusts (its own or a registered host's,
    `ledger.mac_matches`): a ledger and report edited to agree, or a
    run with no report at all, cannot be told from the real one, and are refused unless `unverified_ok` (runs
    from before MACs, from another machine). A head verified by its MAC is then anchored in this store."""
    path = harness / "ledger.jsonl"
    recorded, summary = (record.ledger, record.summary) if record else (None, None)
    head = LedgerHead(recorded.entries, recorded.head_hash) if recorded and recorded.entries else None
    anchored = store.ledger_head(run_id)
    entries = read_ledger(path, {"the results store": anchored}, head)
    if recorded and recorded.tampered:
        raise LedgerCorrupted(f"{path}: the run report says its ledger did not verify: {recorded.problems}")
    mac = mac_matches(run_id, head, recorded.head_mac) if head and recorded.head_mac else None
    if mac is False:
        raise LedgerCorrupted(f"{path}: the report's ledger head does not carry this harness's MAC: the ledger "
                              "and its report were rewritten together")  # fmt: skip
    if head is not None and summary is not None and not (summary.error or "").startswith("ledger integrity"):
        if problems := numbers_disagree(summary, entries[: head.entries]):
            raise LedgerCorrupted(f"{path}: report.json disagrees with the ledger ({'; '.join(problems[:3])})")
    if anchored is None and not mac and not unverified_ok:
        raise LedgerCorrupted(f"{path}: cannot be verified here: this results store anchored no head for the run "
                              "and its report carries no MAC this machine can check (ingest it into the store "
                              "that ran it, or pass unverified_ok to accept it unverified)")  # fmt: skip
    if anchored is None and mac:
        store.record_ledger_head(run_id, head.entries - 1, head.hash)
    return Verified(entries, anchored is not None or bool(mac))


def _refused_frames(run_id: str, config: RunConfig, summary: RunSummary | None, harness: Path,
                    reason: str) -> dict[str, Any]:  # fmt: skip
    """A run that does not verify: its row marked failed with the reason, no score in any table."""
    import pandas as pd

    row = {"run_id": run_id, "config_hash": config.config_hash(), "task": config.task, "variant": config.variant,
           "variant_label": summary.variant_label if summary else config.variant, "agent": config.agent,
           "driver": config.driver, "mode": config.mode, "base_model": config.base_model, "seed": config.seed,
           "budget_s": config.budget_s, "protocol": config.protocol, "status": "failed",
           "error": f"ledger integrity: {reason}; no number of this run is reported", "config_json":
           config.model_dump_json(), "harness_dir": str(harness), "failure_class": "ledger tampered"}  # fmt: skip
    empty = {t: pd.DataFrame() for t in ("submissions", "evaluations", "events", "llm_calls", "tool_calls",
                                         "resources")}  # fmt: skip
    metrics = pd.DataFrame([{"run_id": run_id, "name": "failure_class", "value": None, "text": "ledger tampered"}])
    return {"runs": pd.DataFrame([row]), **empty, "metrics": metrics,
            "item_results": pd.DataFrame(columns=list(ITEM_COLUMNS))}


def _run_row(run_id: str, config: RunConfig, summary: RunSummary | None, process: ProcessFacts,
             entries: list[LedgerEntry], status: str, harness: Path) -> dict[str, Any]:
    m = process.metrics
    base = {e.split: e.score for e in entries if e.kind == "baseline" and e.split}
    last_at = entries[-1].at if entries else None
    row: dict[str, Any] = {
        "run_id": run_id, "config_hash": config.config_hash(), "task": config.task, "variant": config.variant,
        "variant_label": summary.variant_label if summary else config.variant, "agent": config.agent,
        "driver": config.driver, "mode": config.mode, "base_model": config.base_model, "seed": config.seed,
        "budget_s": config.budget_s, "protocol": config.protocol, "status": status,
        "started_at": entries[0].at if entries else None, "finished_at": last_at if status != "running" else None,
        "baseline_val": base.get("validation"), "baseline_test": base.get("test"),
        "best_val": m.best_feedback if m.feedback_split == "validation" else None,
        "best_submission_id": m.best_submission_id, "final_submission_id": m.final_submission_id,
        "final_test": m.final_test, "delta_test": m.delta_test, "n_submissions": m.n_submissions,
        "n_scored": m.n_scored, "agent_seconds": m.agent_seconds, "grading_seconds": m.grading_seconds,
        "error": None, "config_json": config.model_dump_json(), "harness_dir": str(harness),
        "failure_class": process.failure_class, "updated_at": last_at,
    }  # fmt: skip
    if summary is not None:  # the report's numbers are the run's own word where it wrote one
        row |= {k: getattr(summary, k) for k in (
            "baseline_val", "baseline_test", "best_val", "best_submission_id", "final_submission_id", "final_test",
            "delta_test", "n_submissions", "n_scored", "agent_seconds", "grading_seconds", "wall_seconds", "error",
            "grace_seconds", "attempts")}
        row["phase_seconds_json"] = json.dumps(summary.phase_seconds)
    return row


def _submission_rows(run_id: str, entries: list[LedgerEntry], process: ProcessFacts) -> list[dict[str, Any]]:
    first_at: dict[int, Any] = {}
    for e in entries:
        if e.kind == "submission" and e.submission_id is not None:
            first_at.setdefault(e.submission_id, e.at)
    return [
        {"run_id": run_id, "submission_id": e.submission_id, "created_at": first_at[e.submission_id],
         "model_path": e.model_path, "weights_hash": e.weights_hash, "size_bytes": e.size_bytes, "status": e.status,
         "split": e.split, "score": e.score, "cached": e.cached, "eval_seconds": e.eval_seconds,
         "agent_elapsed_s": e.agent_elapsed_s, "error": e.error, "route": process.routes.get(e.submission_id),
         "code_sha": process.code_shas.get(e.submission_id), "stage": e.detail.get("stage")}
        for e in latest_submissions(entries)
    ]  # fmt: skip


def _evaluation_rows(run_id: str, entries: list[LedgerEntry],
                     evaluations: dict[str, EvalResult]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per scored evaluation, keyed as the live flow keys them (`<kind>-<submission or 0>-<split>`)."""
    rows: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.kind not in ("baseline", "submission", "final", "posthoc") or e.status != "scored" or e.score is None:
            continue
        key = eval_key(e.kind, e.submission_id, e.split)
        result = evaluations.get(key)
        rows[key] = {
            "run_id": run_id, "eval_key": key, "kind": e.kind, "submission_id": e.submission_id, "split": e.split,
            "score": e.score, "n": result.n if result else None, "n_correct": result.n_correct if result else None,
            "evaluator_id": result.evaluator_id if result else None, "weights_hash": e.weights_hash,
            "generated_tokens": result.generated_tokens if result else None,
            "duration_s": result.duration_s if result else e.eval_seconds, "cached": e.cached, "created_at": e.at,
        }  # fmt: skip
    return list(rows.values())


def _metric_rows(run_id: str, process: ProcessFacts, harness: Path) -> list[dict[str, Any]]:
    values = process.metrics.model_dump() | {"failure_reason": process.failure_reason}
    audit = harness / "leak_audit.json"
    if audit.exists():  # the leak audit's verdict is a metric of its own step; re-ingesting keeps it
        try:
            data = json.loads(audit.read_text())
            values |= leak_metrics(LeakReport.model_validate(data)) if "verdict" in data else \
                {"leaked_items": int(data["leaked_items"])}  # an audit from before the three-valued verdict
        except (ValueError, KeyError, TypeError) as e:
            log.warning("leak audit %s unreadable: %s", audit, e)
    return [{"run_id": run_id, "name": k, "value": v, "text": t}
            for k, (v, t) in ((k, metric_cells(v)) for k, v in values.items())]


def _item_rows(run_id: str, evaluations: dict[str, EvalResult]) -> list[dict[str, Any]]:
    """Per-item results of the evaluations the ledger vouches for (`read_evaluations`)."""
    rows: list[dict[str, Any]] = []
    for key, result in sorted(evaluations.items()):
        try:
            rows += item_rows(run_id, key, result)
        except ValueError as e:  # an item without a score must not lose the run's other rows
            log.warning("per-item results of evaluation %s skipped: %s", key, e)
    return rows
