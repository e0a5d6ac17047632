"""The process facts of a run (README, "Where results land"): how the agent worked — its process metrics, route
labels, failure class and narrative (`ProcessFacts`, written to `harness/process.json`) — and the summary step that
gathers them (`summarize_process`). "Process" is the agent's way of working, not an operating-system process
(those are `a2rl_bench.isolation.procs`); the run's report is `a2rl_bench.summary.report`.

Everything except the narrative is computed deterministically from the ledger, the code snapshots and the
resource samples, so a re-run of the summary gives the same facts. Times are on the agent's budget clock
(`agent_elapsed_s`: grading pauses it), not wall-clock seconds as in the original. The other parts live in
their own modules: route labels (`a2rl_bench.summary.route_labels`), failure classes (`a2rl_bench.summary.verdicts`),
the narrative
(`a2rl_bench.summary.narrative`) and store ingestion (`a2rl_bench.store.ingest`); the per-run figure (`a2rl_bench.analysis.run_figure`) is drawn by
the flow's summary step, since the library does not import `analysis`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from a2rl_bench.grading.record import read_evaluation
from a2rl_bench.safetext import md_text
from a2rl_bench.summary.headline import baseline_scores, delta, headline
from a2rl_bench.summary.intervals import paired_item_interval
from a2rl_bench.summary.metrics import RunMetrics
from a2rl_bench.summary.narrative import deterministic_narrative, narrate
from a2rl_bench.protocol.feedback import feedback_split
from a2rl_bench.protocol.picking import (best_so_far, best_submission, final_entry, final_evaluation_key,
                                   latest_submissions, scored_submissions)
from a2rl_bench.records import LedgerEntry, RunConfig, RunSummary
from a2rl_bench.capture.calls import read_llm_calls, summarize_llm_calls
from a2rl_bench.capture.resources import ResourceSample, gpu_crowded_at_end, read_resources, summarize_resources
from a2rl_bench.summary.route_labels import label_routes
from a2rl_bench.summary.stages import stage_metrics
from a2rl_bench.summary.report import last_event
from a2rl_bench.summary.verdicts import FailureClass, environment_fault, explain_failure


class ProcessFacts(BaseModel):
    """The post-hoc facts of one run, written to `harness/process.json` and the results store."""

    run_id: str
    metrics: RunMetrics
    routes: dict[int, str] = Field(default_factory=dict)
    """Route label per submission id, from static analysis of the code snapshot taken at submission."""
    code_shas: dict[int, str] = Field(default_factory=dict)
    routes_note: str | None = None
    """Why route labels are missing, where they are."""
    failure_class: FailureClass
    failure_reason: str
    narrative: str | None = None
    """LLM-written account, beside (never instead of) the facts; None unless A2RL_NARRATIVE_MODEL is set."""
    narrative_model: str | None = None
    narrative_note: str | None = None
    """Why an LLM narrative that was asked for is missing (no key, API error); the deterministic one stands."""


# ---- process metrics -------------------------------------------------------------------------------------


def process_metrics(entries: list[LedgerEntry], config: RunConfig, session_detail: Mapping[str, Any]) -> RunMetrics:
    """The original's §5.2 process metrics and more, from the ledger (see the module docstring for times).

    Args:
        entries: the run's ledger entries (baseline, submission, final, event), in ledger order.
        config: the run's config (protocol, budget, submission cap).
        session_detail: the `session-end` event's detail (`agent_seconds`, `grading_seconds`, `ended_by`,
            `exit_code`); empty when the session never ended.
    """
    split = feedback_split(config.protocol)
    subs = latest_submissions(entries)
    numbers = headline(entries, config.protocol)  # the final score and Δ test, computed there only
    base = baseline_scores(entries).get(split)
    base_hashes = {e.weights_hash for e in entries if e.kind == "baseline" and e.weights_hash}
    scored = scored_submissions(entries)
    agent_s = _num(session_detail.get("agent_seconds"))
    grading_s = _num(session_detail.get("grading_seconds"))
    n = len(subs)

    best = best_submission(entries, split)
    first_valid = scored[0] if scored else None
    first_better = next((e for e in scored if base is not None and e.score > base), None)
    seen_hashes: set[str] = set()
    duplicates = 0
    for e in subs:
        if e.weights_hash and e.weights_hash in seen_hashes and e.weights_hash not in base_hashes:
            duplicates += 1
        if e.weights_hash:
            seen_hashes.add(e.weights_hash)
    pairs = list(zip(scored, scored[1:]))
    trajectory = best_so_far([e.score if e.status == "scored" else None for e in subs])
    last_at = max((e.agent_elapsed_s for e in subs if e.agent_elapsed_s is not None), default=None)
    delta_test = numbers.delta_test
    improvement = delta(best.score if best else None, base)
    # heldout only: the validation gain of the best submission that did not carry over to the hidden test.
    has_gap = split == "validation" and improvement is not None and delta_test is not None
    selection_gap = round(improvement - delta_test, 6) if has_gap else None

    return RunMetrics.model_validate({
        "feedback_split": split,
        "n_submissions": n,
        "n_scored": len(scored),
        "n_errors": sum(e.status == "error" for e in subs),
        "n_unfinished": sum(e.status in ("queued", "running") for e in subs),
        "n_cached": sum(bool(e.cached) for e in subs),
        "valid_submission_rate": _ratio(len(scored), n),
        "nonzero_score_rate": _ratio(sum((e.score or 0) > 0 for e in scored), n),
        "first_valid_idx": first_valid.submission_id if first_valid else None,
        "first_valid_delay": first_valid.agent_elapsed_s if first_valid else None,
        "baseline_feedback": base,
        "best_feedback": best.score if best else None,
        "best_submission_id": best.submission_id if best else None,
        "improvement_feedback": improvement,
        "time_to_first_improvement": first_better.agent_elapsed_s if first_better else None,
        "time_to_best": best.agent_elapsed_s if best else None,
        "monotonic_ratio": _ratio(sum(b.score > a.score for a, b in pairs), len(pairs)),
        "copy_model_count": sum(bool(e.weights_hash) and e.weights_hash in base_hashes for e in subs),
        "duplicate_submission_count": duplicates,
        "budget_s": config.budget_s,
        "agent_seconds": agent_s,
        "time_used_ratio": _ratio(agent_s, config.budget_s) if agent_s is not None else None,
        "last_submit_gap": round(agent_s - last_at, 3) if agent_s is not None and last_at is not None else None,
        "grading_seconds": grading_s,
        "grading_seconds_share": _ratio(grading_s, (agent_s or 0) + grading_s) if grading_s else None,
        "eval_seconds_total": round(sum(e.eval_seconds or 0 for e in subs if not e.cached), 3),
        "submissions_used_ratio": _ratio(n, config.max_submissions),
        "ended_by": session_detail.get("ended_by"),
        "exit_code": session_detail.get("exit_code"),
        "baseline_test": numbers.baseline_test,
        "final_test": numbers.final_test,
        "final_submission_id": numbers.final_submission_id,
        "delta_test": delta_test,
        "selection_gap": selection_gap,
        "improved": (delta_test > 0) if delta_test is not None else (improvement is not None and improvement > 0),
        "submission_ids": [e.submission_id for e in subs],
        "scored_submission_ids": [e.submission_id for e in scored],
        "score_trajectory": [e.score if e.status == "scored" else None for e in subs],
        "best_so_far_trajectory": trajectory,
        "submission_times": [e.agent_elapsed_s for e in subs],
    })


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 6) if a is not None and b else None


# ---- the summary step --------------------------------------------------------------------------------------------


def summarize_process(
    run_id: str,
    harness_dir: Path | str,
    entries: list[LedgerEntry],
    config: RunConfig,
    session_detail: Mapping[str, Any],
    *,
    snapshots: Any = None,
    summary: RunSummary | None = None,
    run_status: str | None = None,
    run_error: str | None = None,
    narrative_client: Any = None,
    narrative: bool = True,
    write_files: bool = True,
) -> ProcessFacts:
    """Metrics, route labels, resource summary and failure class of a finished run; writes `process.json` and
    (when a narrative model is set) `narrative.md` to the harness dir. The flow's summary step draws the figure.

    Args:
        snapshots: the run's `CodeSnapshots` (for route labels); None skips code-based labels.
        summary: the run's `RunSummary`, given to the narrative as context.
        run_status, run_error: the run's final status and harness error (for the infrastructure rule).
        narrative: False never asks an LLM (re-ingesting must be deterministic).
    """
    harness_dir = Path(harness_dir)
    metrics = process_metrics(entries, config, session_detail)
    samples = read_resources(harness_dir / "resources.jsonl")
    metrics.add(summarize_resources(samples))
    metrics.add(summarize_llm_calls(read_llm_calls(harness_dir / "llm_calls.jsonl")))
    metrics.add(item_level_intervals(harness_dir, entries, config))
    metrics.add(stage_metrics(entries, harness_dir))
    labels = label_routes(entries, snapshots)
    metrics.route_counts = {r: list(labels.routes.values()).count(r) for r in sorted(set(labels.routes.values()))}
    context = dict(session_detail) | {
        "environment_fault": starved(entries, samples, session_detail),
        "gpu_crowded": crowded_early_end(metrics, samples),
        "run_status": run_status,
        "run_error": run_error,
        "submission_errors": [e.error for e in latest_submissions(entries) if e.status == "error" and e.error],
    }
    verdict = explain_failure(metrics, labels.routes, context)
    metrics.failure_class = verdict.label
    report = ProcessFacts(
        run_id=run_id, metrics=metrics, routes=labels.routes, code_shas=labels.code_shas, routes_note=labels.note,
        failure_class=verdict.label, failure_reason=verdict.reason,
    )  # fmt: skip
    facts = {"summary": summary.model_dump(mode="json") if summary else None, "process": report.model_dump(mode="json")}
    wanted = narrative and os.environ.get("A2RL_NARRATIVE_MODEL")
    story = narrate(facts, client=narrative_client) if wanted else None
    if story and story.text:
        report.narrative, report.narrative_model = story.text, os.environ.get("A2RL_NARRATIVE_MODEL")
    elif story is not None:  # a model was asked for and gave nothing: the facts, told plainly, and why
        report.narrative, report.narrative_model = deterministic_narrative(report), "deterministic (no LLM)"
        report.narrative_note = story.note
    if write_files:
        harness_dir.mkdir(parents=True, exist_ok=True)
        (harness_dir / "process.json").write_text(report.model_dump_json(indent=2))
        if report.narrative:
            (harness_dir / "narrative.md").write_text(_narrative_md(report))
    return report


EARLY_END_SHARE = 0.9
"""A session that used less of its budget than this ended early (the reference agent in mode free stops at ~82%
when no RL update fits: that alone is no fault, a full card just before the end is)."""


def starved(entries: list[LedgerEntry], samples: list[ResourceSample], session_detail: Mapping[str, Any]) -> str | None:
    """Whether the machine starved the run, from what the harness recorded: the session's start delay (its
    `session-start` event), the load per core and the agent's CPU in the resource samples taken while it ran."""
    start = last_event(entries, "session-start")
    delay = _num(start.detail.get("start_delay_s")) if start else None
    loads = [float(s.extra["load_per_core"]) for s in samples if isinstance(s.extra.get("load_per_core"), (int, float))]
    cpu_s = sum(s.cpu_percent / 100 * (b.elapsed_s - s.elapsed_s) for s, b in zip(samples, samples[1:])) or None
    return environment_fault(delay, loads, cpu_s, _num(session_detail.get("agent_seconds")))


def crowded_early_end(metrics: RunMetrics, samples: list[ResourceSample]) -> str | None:
    """Why the machine, not the agent, ended the session early (the reason), or None: the agent used less than
    `EARLY_END_SHARE` of its budget and its GPU was full of other processes' memory just before the end
    (`gpu_crowded_at_end`)."""
    used = metrics.time_used_ratio
    if used is None or used >= EARLY_END_SHARE:
        return None
    crowded = gpu_crowded_at_end(samples)
    return f"the session ended at {used:.0%} of its budget; {crowded}" if crowded else None


def _narrative_md(report: ProcessFacts) -> str:
    note = f"\n_{report.narrative_note}_\n" if report.narrative_note else ""
    if report.narrative_model and report.narrative_model.startswith("deterministic"):
        return f"## Narrative (written from the facts, no LLM)\n\n{report.narrative}\n{note}"
    return (f"## Narrative (LLM-written by {report.narrative_model}; the deterministic facts are authoritative)\n\n"
            f"{report.narrative}\n{note}")


def render_process_markdown(report: ProcessFacts) -> str:
    """A markdown section for report.md: the facts first, the narrative (if any) clearly apart."""
    m = report.metrics

    def f(key: str, digits: int = 2) -> str:
        v = getattr(m, key)
        return "n/a" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    rows = [
        ("failure class", f"**{report.failure_class}** — {md_text(report.failure_reason, 300)}"),
        ("valid submission rate (scored / submitted)", f("valid_submission_rate")),
        ("first valid submission (agent s)", f"#{f('first_valid_idx')} at {f('first_valid_delay', 0)}"),
        ("time to first improvement / to best (agent s)",
         f"{f('time_to_first_improvement', 0)} / {f('time_to_best', 0)}"),
        ("monotonic ratio", f("monotonic_ratio")),
        ("base-model copies / duplicate submissions", f"{f('copy_model_count')} / {f('duplicate_submission_count')}"),
        ("cached evaluations", f("n_cached")),
        ("budget used (agent time / budget)", f("time_used_ratio")),
        ("last-submit gap (agent s)", f("last_submit_gap", 0)),
        ("grading share of session time", f("grading_seconds_share")),
        ("selection gap (validation gain − test gain)", f("selection_gap")),
        ("peak RSS of the agent (GB)",
         "n/a" if m.rss_peak_bytes is None else f"{m.rss_peak_bytes / 1e9:.2f}"),
    ]
    if m.gpu_shared_procs_peak is not None:  # a budget on a shared card is not the budget of a card of its own
        rows.append(("other processes on the agent's GPUs outside gradings (median / peak)",
                     f"{m.gpu_shared_procs_median} / {m.gpu_shared_procs_peak}"))
    lines = ["## Process", "", "| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if report.routes:
        lines += ["", "Routes per submission (static analysis of the code snapshot): "
                  + ", ".join(f"#{sid} {label}" for sid, label in report.routes.items())]
    if report.routes_note:
        lines += ["", f"_{report.routes_note}_"]
    if report.narrative:
        lines += ["", _narrative_md(report)]
    return "\n".join(lines) + "\n"


def item_level_intervals(harness_dir: Path, entries: list[LedgerEntry], config: RunConfig) -> dict[str, Any]:
    """The run's Δ test and best feedback gain with 95% intervals from the paired per-item results the evaluations
    wrote (`harness/evaluations/<kind>-<submission>-<split>.json`): the same items, base model against the pick.
    Missing files give None (the verdicts then say the change was not tested for significance)."""
    final = final_entry(entries)
    final_key = final_evaluation_key(config.protocol, final) if final else None
    split = feedback_split(config.protocol)
    best = best_submission(entries, split)
    out: dict[str, Any] = {}
    for name, key, base_key in (("delta_test", final_key, "baseline-0-test"),
                                ("improvement_feedback", best and f"submission-{best.submission_id}-{split}",
                                 f"baseline-0-{split}")):  # fmt: skip
        interval = _paired_from_files(harness_dir, entries, base_key, key) if key else None
        out |= {f"{name}_ci_low": interval and interval.low, f"{name}_ci_high": interval and interval.high,
                f"{name}_p_value": interval and interval.p_value, f"{name}_n_items": interval and interval.n,
                f"{name}_interval": interval.method if interval else "no item-level results"}  # fmt: skip
    out["verdict"] = _verdict(out, entries)
    if not out["verdict"].startswith("not tested"):
        out["improved"] = out["verdict"] == "improved"
    return out


def _paired_from_files(harness_dir: Path, entries: list[LedgerEntry], base_key: str, key: str):
    """The paired interval of two evaluation files, each as its ledger line recorded it (an edited one: None)."""
    base, pick = (read_evaluation(harness_dir, entries, k) for k in (base_key, key))
    if base is None or pick is None:
        return None
    scores = {i.item_id: (i.value if i.value is not None else float(i.correct)) for i in base.items}
    paired = [(scores[i.item_id], i.value if i.value is not None else float(i.correct))
              for i in pick.items if i.item_id in scores]
    if not paired:
        return None
    return paired_item_interval([b for b, _ in paired], [f for _, f in paired])


def _verdict(intervals: Mapping[str, Any], entries: list[LedgerEntry]) -> str:
    """`improved` / `worse` only where the 95% interval of Δ test excludes 0; else `no significant change`."""
    low, high = intervals.get("delta_test_ci_low"), intervals.get("delta_test_ci_high")
    if low is None or high is None or low != low:
        return "not tested (no item-level results)"
    return "improved" if low > 0 else "worse" if high < 0 else "no significant change"
