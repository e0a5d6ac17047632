"""Post-hoc summary of a run (SPEC §7): process metrics, route labels, failure class, optional narrative.

Everything except the narrative is computed deterministically from the ledger, the code snapshots and the
resource samples, so a re-run of the summary gives the same facts. Times are on the agent's budget clock
(`agent_elapsed_s`: grading pauses it), not wall-clock seconds as in the original.

Failure class (first rule that matches wins; operational, not semantic, like the paper's A.11 labels):

| # | class | rule |
|---|---|---|
| 1 | `none` | the run improved: Δ test > 0 (or, with no final test score, best feedback score > baseline) |
| 2 | `infrastructure failure` | the agent could not be launched; or no baseline was recorded; or the session was interrupted by a harness crash; or the run failed (a harness error), or was interrupted before the agent session ended; or every submission failed with a grader-side error (`INFRA_ERROR_MARKERS`) |
| 3 | `static shortcut` | every scored submission has the base model's weights (route `copy`) |
| 4 | `early coding failure` | no submission was scored: the agent never closed one train → submit → score cycle |
| 5 | `static shortcut` | heldout: the validation score improved but the hidden test score did not (no transfer) |
| 6 | `training collapse` | the best scored submission is below baseline by more than max(1 point, 10% of baseline) |
| 7 | `rollout construction failure` | an RL route (GRPO, PPO, RLOO, RL, SFT+RL) was submitted, and every RL submission errored or scored exactly the baseline (the policy never moved) |
| 8 | `reward/data design failure` | otherwise: models trained and scored, near the baseline, without improving |

Infrastructure failure is kept apart from the agent's failures: it says the harness, not the agent, failed.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field

from a2rl.records import LedgerEntry, RunConfig, RunSummary

log = logging.getLogger(__name__)

FailureClass = Literal[
    "none",
    "infrastructure failure",
    "early coding failure",
    "static shortcut",
    "training collapse",
    "rollout construction failure",
    "reward/data design failure",
]
RL_ROUTES = frozenset({"GRPO", "PPO", "RLOO", "RL", "SFT+RL"})  # as a2rl.routes.RL_LABELS
# Error texts of failed evaluations that point at the grader or the machine, not at the agent's checkpoint.
INFRA_ERROR_MARKERS = ("grader crash", "cuda out of memory", "no space left on device", "cuda error",
                       "nccl", "evaluator error", "connection refused")  # fmt: skip
COLLAPSE_MIN_POINTS = 1.0
COLLAPSE_FRACTION = 0.10


class FailureVerdict(NamedTuple):
    label: FailureClass
    reason: str


class ProcessReport(BaseModel):
    """The post-hoc facts of one run, written to `harness/process.json` and the results store."""

    run_id: str
    metrics: dict[str, Any]
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


# ---- process metrics -------------------------------------------------------------------------------------


def _latest_submissions(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    latest: dict[int, LedgerEntry] = {}
    for e in entries:
        if e.kind == "submission" and e.submission_id is not None:
            latest[e.submission_id] = e
    return [latest[k] for k in sorted(latest)]


def process_metrics(entries: list[LedgerEntry], config: RunConfig, session_detail: Mapping[str, Any]) -> dict:
    """The original's §5.2 process metrics and more, from the ledger (see the module docstring for times).

    Args:
        entries: the run's ledger entries (baseline, submission, final, event), in ledger order.
        config: the run's config (protocol, budget, submission cap).
        session_detail: the `session-end` event's detail (`agent_seconds`, `grading_seconds`, `ended_by`,
            `exit_code`); empty when the session never ended.
    """
    split = "test" if config.protocol == "paper" else "validation"
    subs = _latest_submissions(entries)
    baselines = [e for e in entries if e.kind == "baseline"]
    base = next((e.score for e in baselines if e.split == split and e.score is not None), None)
    base_test = next((e.score for e in baselines if e.split == "test" and e.score is not None), None)
    base_hashes = {e.weights_hash for e in baselines if e.weights_hash}
    scored = [e for e in subs if e.status == "scored" and e.score is not None]
    final = next((e for e in reversed(entries) if e.kind == "final" and e.score is not None), None)
    agent_s = _num(session_detail.get("agent_seconds"))
    grading_s = _num(session_detail.get("grading_seconds"))
    n = len(subs)

    best = max(scored, key=lambda e: (e.score, -e.submission_id)) if scored else None
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
    best_so_far: list[float | None] = []
    running: float | None = None
    for e in subs:
        if e.status == "scored" and e.score is not None:
            running = e.score if running is None else max(running, e.score)
        best_so_far.append(running)
    last_at = max((e.agent_elapsed_s for e in subs if e.agent_elapsed_s is not None), default=None)
    delta_test = round(final.score - base_test, 6) if final and base_test is not None else None
    improvement = round(best.score - base, 6) if best and base is not None else None
    # heldout only: the validation gain of the best submission that did not carry over to the hidden test.
    has_gap = split == "validation" and improvement is not None and delta_test is not None
    selection_gap = round(improvement - delta_test, 6) if has_gap else None

    return {
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
        "baseline_test": base_test,
        "final_test": final.score if final else None,
        "final_submission_id": final.submission_id if final else None,
        "delta_test": delta_test,
        "selection_gap": selection_gap,
        "improved": (delta_test > 0) if delta_test is not None else (improvement is not None and improvement > 0),
        "submission_ids": [e.submission_id for e in subs],
        "scored_submission_ids": [e.submission_id for e in scored],
        "score_trajectory": [e.score if e.status == "scored" else None for e in subs],
        "best_so_far_trajectory": best_so_far,
        "submission_times": [e.agent_elapsed_s for e in subs],
    }


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 6) if a is not None and b else None


# ---- route labels ------------------------------------------------------------------------------------------


class RouteLabels(NamedTuple):
    routes: dict[int, str]
    code_shas: dict[int, str]
    note: str | None


def label_routes(entries: list[LedgerEntry], snapshots: Any) -> RouteLabels:
    """Route label per submission from its code snapshot (`a2rl.routes.route_label`, imported lazily).

    The snapshot of submission N is found by the ledger's `code-snapshot` event or the label `submission-N`
    in the snapshot log; a submission whose weights equal the base model's is labelled `copy` whatever its code.
    """
    subs = _latest_submissions(entries)
    base_hashes = {e.weights_hash for e in entries if e.kind == "baseline" and e.weights_hash}
    by_event = {e.detail.get("submission_id"): e.detail.get("sha") for e in entries
                if e.kind == "event" and e.detail.get("event") == "code-snapshot"}  # fmt: skip
    shas: dict[int, str] = {}
    for e in subs:
        sha = (e.detail or {}).get("code_sha") or by_event.get(e.submission_id)
        if sha is None and snapshots is not None:
            sha = snapshots.sha_for(f"submission-{e.submission_id}")
        if sha:
            shas[e.submission_id] = sha
    routes = {e.submission_id: "copy" for e in subs if e.weights_hash and e.weights_hash in base_hashes}
    try:
        from a2rl.routes import route_label
    except ImportError:
        return RouteLabels(routes, shas, "route labels unavailable: a2rl.routes is not installed")
    if snapshots is None:
        return RouteLabels(routes, shas, "route labels unavailable: no code snapshots were recorded")
    labelled: dict[str, str] = {}
    note = None
    with tempfile.TemporaryDirectory(prefix="a2rl-routes-") as tmp:
        for sid, sha in shas.items():
            if sid in routes:
                continue
            if sha not in labelled:
                try:
                    labelled[sha] = route_label(snapshots.export(sha, Path(tmp) / sha))
                except Exception as e:  # one unreadable snapshot must not lose the other labels
                    note = f"route labelling failed for snapshot {sha[:10]}: {type(e).__name__}: {e}"
                    continue
            routes[sid] = labelled[sha]
    missing = [e.submission_id for e in subs if e.submission_id not in routes]
    if missing and note is None:
        note = f"no code snapshot for submissions {missing}"
    return RouteLabels(dict(sorted(routes.items())), shas, note)


# ---- failure class -------------------------------------------------------------------------------------------


def explain_failure(
    metrics: Mapping[str, Any], routes: Mapping[int, str], session_detail: Mapping[str, Any]
) -> FailureVerdict:
    """Apply the rule table of the module docstring. `session_detail` may also carry `run_status` and
    `run_error` (the run's final status and harness error) and `submission_errors` (error texts)."""
    m = metrics
    n, n_scored = m.get("n_submissions") or 0, m.get("n_scored") or 0
    base = m.get("baseline_feedback")
    if session_detail.get("run_status") == "failed":  # a harness error is never the agent's result
        return FailureVerdict("infrastructure failure", f"the run failed: {session_detail.get('run_error')}")
    if m.get("improved"):
        what = f"Δ test = {m['delta_test']:+.2f}" if m.get("delta_test") is not None else (
            f"best {m.get('feedback_split')} score {m.get('best_feedback')} > baseline {base}")
        return FailureVerdict("none", f"improved: {what}")
    errors = [str(x).lower() for x in session_detail.get("submission_errors", [])]
    if session_detail.get("ended_by") == "launch-error":
        why = f"the agent could not be launched: {session_detail.get('error')}"
        return FailureVerdict("infrastructure failure", why)
    if base is None:
        return FailureVerdict("infrastructure failure", "no baseline score was recorded")
    if session_detail.get("ended_by") == "interrupted":
        why = f"the session was interrupted by a harness crash: {session_detail.get('error')}"
        return FailureVerdict("infrastructure failure", why)
    if session_detail.get("run_status") in ("failed", "interrupted") and not session_detail.get("ended_by"):
        why = f"the run {session_detail['run_status']} before the agent session ended"
        return FailureVerdict("infrastructure failure", f"{why}: {session_detail.get('run_error')}")
    if n_scored == 0 and errors and all(any(k in x for k in INFRA_ERROR_MARKERS) for x in errors):
        return FailureVerdict("infrastructure failure", "every submission failed with a grader-side error")
    scored_ids = m.get("scored_submission_ids") or []
    if scored_ids and all(routes.get(sid) == "copy" for sid in scored_ids):
        return FailureVerdict("static shortcut", "every scored submission is the base model (weights or route `copy`)")
    if n_scored == 0:
        why = "no submission" if n == 0 else f"{n} submission(s), none scored"
        return FailureVerdict("early coding failure", f"{why}: no train → submit → score cycle completed")
    if (m.get("improvement_feedback") or 0) > 0 and m.get("delta_test") is not None and m["delta_test"] <= 0:
        return FailureVerdict(
            "static shortcut",
            f"validation improved by {m['improvement_feedback']:+.2f} but the hidden test by {m['delta_test']:+.2f}",
        )
    tol = max(COLLAPSE_MIN_POINTS, COLLAPSE_FRACTION * abs(base))
    best = m.get("best_feedback")
    if best is not None and best < base - tol:
        return FailureVerdict("training collapse", f"best score {best:.2f} is below baseline {base:.2f} by > {tol:.2f}")
    trajectory = m.get("score_trajectory") or []
    rl = [sid for sid, label in routes.items() if label in RL_ROUTES]
    if rl:
        scores = dict(zip(m.get("submission_ids") or [], trajectory))
        rl_scores = [scores.get(sid) for sid in rl]
        if all(s is None or s == base for s in rl_scores):
            return FailureVerdict(
                "rollout construction failure",
                f"RL submissions {rl} errored or scored exactly the baseline: the policy never moved",
            )
    routes_seen = sorted(set(routes.values())) or ["unlabelled"]
    return FailureVerdict(
        "reward/data design failure",
        f"trained models scored near the baseline (best {best}, baseline {base}) with routes {routes_seen}",
    )


def failure_class(
    metrics: Mapping[str, Any], routes: Mapping[int, str], session_detail: Mapping[str, Any]
) -> FailureClass:
    """The failure class label alone (see `explain_failure`)."""
    return explain_failure(metrics, routes, session_detail).label


# ---- narrative -----------------------------------------------------------------------------------------------

NARRATIVE_SYSTEM = (
    "You write a short account (at most 200 words) of one benchmark run in which an AI agent tried to "
    "post-train a base model. Use only the facts in the JSON you are given; do not invent numbers, methods "
    "or causes. Say what the agent did (routes, submissions), how the score moved, and the failure class "
    "with its stated reason. Plain prose, no headings."
)


def narrate(report_json: Mapping[str, Any], client: Any = None, model: str | None = None,
            max_tokens: int = 600) -> str | None:
    """An LLM-written narrative of a run's facts, or None when off (A2RL_NARRATIVE_MODEL unset) or failed.

    Args:
        report_json: the facts (summary + process report) as JSON-able data; the narrative may use only these.
        client: an `anthropic.Anthropic` client; one is built from the environment when None.
        model: overrides A2RL_NARRATIVE_MODEL.
    """
    model = model or os.environ.get("A2RL_NARRATIVE_MODEL")
    if not model:
        return None
    import anthropic

    client = client or anthropic.Anthropic()
    facts = json.dumps(report_json, indent=1, sort_keys=True, default=str)
    try:
        message = client.messages.create(
            model=model, max_tokens=max_tokens, system=NARRATIVE_SYSTEM,
            messages=[{"role": "user", "content": f"Facts of the run:\n```json\n{facts}\n```"}],
        )  # fmt: skip
    except anthropic.APIError as e:  # the narrative is optional: the facts stand without it
        log.warning("narrative skipped: %s", e)
        return None
    text = "".join(getattr(block, "text", "") for block in message.content).strip()
    return text or None


# ---- figure ----------------------------------------------------------------------------------------------------


def score_trajectory_png(entries: list[LedgerEntry], path: Path | str, title: str | None = None) -> Path:
    """Score per submission with the baseline, best-so-far, errors and base-model copies marked (800×450 px)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    subs = _latest_submissions(entries)
    split = next((e.split for e in subs if e.split), "validation")
    base = next((e.score for e in entries if e.kind == "baseline" and e.split == split), None)
    base_hashes = {e.weights_hash for e in entries if e.kind == "baseline" and e.weights_hash}
    final = next((e for e in reversed(entries) if e.kind == "final" and e.score is not None), None)
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    xs = [e.submission_id for e in subs if e.status == "scored" and e.score is not None]
    ys = [e.score for e in subs if e.status == "scored" and e.score is not None]
    ax.plot(xs, ys, "o-", color="tab:blue", label=f"{split} score")
    best, run = [], None
    for y in ys:
        run = y if run is None else max(run, y)
        best.append(run)
    if xs:
        ax.step(xs, best, where="post", color="tab:green", alpha=0.6, label="best so far")
    if base is not None:
        ax.axhline(base, color="grey", ls="--", label=f"baseline ({split}) {base:.1f}")
    low = min(ys + ([base] if base is not None else []), default=0.0)
    errs = [e.submission_id for e in subs if e.status == "error"]
    if errs:
        ax.plot(errs, [low] * len(errs), "x", color="tab:red", ms=9, label="evaluation error")
    copies = [(e.submission_id, e.score) for e in subs if e.weights_hash in base_hashes and e.score is not None]
    if copies:
        ax.plot(*zip(*copies), "s", mfc="none", color="tab:orange", ms=11, label="base-model copy")
    if final is not None and final.score is not None:
        ax.plot([], [], " ", label=f"final hidden test {final.score:.1f} (submission {final.submission_id or 'base'})")
    ax.set_xlabel("submission")
    ax.set_ylabel("score (0–100)")
    run_id = entries[0].run_id if entries else ""
    ax.set_title(title or f"{run_id}: score per submission")
    if subs:
        ax.set_xticks([e.submission_id for e in subs])
    else:
        ax.text(0.5, 0.5, "no submissions", transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


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
) -> ProcessReport:
    """Metrics, route labels, resource summary and failure class of a finished run; writes
    `process.json`, `score_trajectory.png` and (when a narrative model is set) `narrative.md` to the harness dir.

    Args:
        snapshots: the run's `CodeSnapshots` (for route labels); None skips code-based labels.
        summary: the run's `RunSummary`, given to the narrative as context.
        run_status, run_error: the run's final status and harness error (for the infrastructure rule).
        narrative: False never asks an LLM (re-ingesting must be deterministic).
    """
    from a2rl.recording import read_llm_calls, read_resources, summarize_llm_calls, summarize_resources

    harness_dir = Path(harness_dir)
    metrics = process_metrics(entries, config, session_detail)
    metrics |= summarize_resources(read_resources(harness_dir / "resources.jsonl"))
    metrics |= summarize_llm_calls(read_llm_calls(harness_dir / "llm_calls.jsonl"))
    labels = label_routes(entries, snapshots)
    metrics["route_counts"] = {r: list(labels.routes.values()).count(r) for r in sorted(set(labels.routes.values()))}
    context = dict(session_detail) | {
        "run_status": run_status,
        "run_error": run_error,
        "submission_errors": [e.error for e in _latest_submissions(entries) if e.status == "error" and e.error],
    }
    verdict = explain_failure(metrics, labels.routes, context)
    metrics["failure_class"] = verdict.label
    report = ProcessReport(
        run_id=run_id, metrics=metrics, routes=labels.routes, code_shas=labels.code_shas, routes_note=labels.note,
        failure_class=verdict.label, failure_reason=verdict.reason,
    )  # fmt: skip
    facts = {"summary": summary.model_dump(mode="json") if summary else None, "process": report.model_dump(mode="json")}
    text = narrate(facts, client=narrative_client) if narrative else None
    if text:
        report.narrative, report.narrative_model = text, os.environ.get("A2RL_NARRATIVE_MODEL")
    if write_files:
        harness_dir.mkdir(parents=True, exist_ok=True)
        (harness_dir / "process.json").write_text(report.model_dump_json(indent=2))
        try:
            score_trajectory_png(entries, harness_dir / "score_trajectory.png")
        except ImportError as error:  # matplotlib is optional (e.g. a GPU image without it): only the figure is lost
            log.warning("score trajectory figure skipped: %s", error)
        if report.narrative:
            (harness_dir / "narrative.md").write_text(_narrative_md(report))
    return report


def _narrative_md(report: ProcessReport) -> str:
    return (f"## Narrative (LLM-written by {report.narrative_model}; the deterministic facts are authoritative)\n\n"
            f"{report.narrative}\n")


def render_process_markdown(report: ProcessReport) -> str:
    """A markdown section for report.md: the facts first, the narrative (if any) clearly apart."""
    m = report.metrics

    def f(key: str, digits: int = 2) -> str:
        v = m.get(key)
        return "n/a" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    rows = [
        ("failure class", f"**{report.failure_class}** — {report.failure_reason}"),
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
         "n/a" if m.get("rss_peak_bytes") is None else f"{m['rss_peak_bytes'] / 1e9:.2f}"),
    ]
    lines = ["## Process", "", "| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if report.routes:
        lines += ["", "Routes per submission (static analysis of the code snapshot): "
                  + ", ".join(f"#{sid} {label}" for sid, label in report.routes.items())]
    if report.routes_note:
        lines += ["", f"_{report.routes_note}_"]
    if report.narrative:
        lines += ["", _narrative_md(report)]
    return "\n".join(lines) + "\n"


def store_process_report(store: Any, report: ProcessReport, harness_dir: Path | str) -> None:
    """Write a run's process facts to the results store: metrics (+ failure class), route labels, LLM and
    tool calls, and resource samples. Each write replaces the run's earlier rows, so calling it again is harmless."""
    from a2rl.recording import read_llm_calls, read_resources, read_tool_calls, resource_rows

    harness_dir = Path(harness_dir)
    store.record_metrics(report.run_id, report.metrics | {"failure_reason": report.failure_reason})
    store.record_routes(report.run_id, report.routes, report.code_shas)
    store.replace_run_rows("llm_calls", report.run_id, read_llm_calls(harness_dir / "llm_calls.jsonl"))
    store.replace_run_rows("tool_calls", report.run_id, read_tool_calls(harness_dir / "tool_calls.jsonl"))
    store.replace_run_rows("resources", report.run_id, resource_rows(read_resources(harness_dir / "resources.jsonl")))


# ---- re-ingesting a run directory ---------------------------------------------------------------------------------


def ingest_run_dir(store: Any, run_dir: Path | str) -> ProcessReport:
    """(Re)build every row of one run in the results store from its run directory, in one transaction.

    Reads `harness/manifest.json`, the verified ledger, `report.json` (if written), per-evaluation files,
    the code snapshots, `resources.jsonl` and `llm_calls.jsonl`. All timestamps come from those files, so
    ingesting the same directory twice leaves the store exactly as it was. No narrative is requested.
    """
    import pandas as pd

    from a2rl.grading.ledger import read_ledger
    from a2rl.recording import CodeSnapshots, read_llm_calls, read_resources, read_tool_calls, resource_rows

    run_dir = Path(run_dir)
    harness = run_dir / "harness" if (run_dir / "harness").is_dir() else run_dir
    manifest = json.loads((harness / "manifest.json").read_text())
    run_id, config = manifest["run_id"], RunConfig.model_validate(manifest["config"])
    entries = read_ledger(harness / "ledger.jsonl")
    report_path = harness / "report.json"
    summary = None
    if report_path.exists():
        summary = RunSummary.model_validate(json.loads(report_path.read_text())["summary"])
    end = next((e for e in reversed(entries) if e.detail.get("event") == "session-end"), None)
    detail = end.detail if end else {}
    status = summary.status if summary else ("completed" if any(e.kind == "final" for e in entries) else "interrupted")
    has_code = (harness / "code.git").exists()
    snapshots = CodeSnapshots(harness, harness.parent / "workspace" / "code") if has_code else None
    process = summarize_process(
        run_id, harness, entries, config, detail, snapshots=snapshots, summary=summary, run_status=status,
        run_error=summary.error if summary else None, narrative=False, write_files=False,
    )  # fmt: skip
    frames = {
        "runs": pd.DataFrame([_run_row(run_id, config, summary, process, entries, status, harness)]),
        "submissions": pd.DataFrame(_submission_rows(run_id, entries, process)),
        "evaluations": pd.DataFrame(_evaluation_rows(run_id, entries, harness)),
        "events": pd.DataFrame([
            {"run_id": run_id, "seq": e.seq, "created_at": e.at, "kind": e.detail.get("event", "event"),
             "detail_json": json.dumps(e.detail, sort_keys=True, default=str)}
            for e in entries if e.kind == "event"
        ]),  # fmt: skip
        "metrics": pd.DataFrame(_metric_rows(run_id, process)),
        "llm_calls": pd.DataFrame([r | {"run_id": run_id} for r in read_llm_calls(harness / "llm_calls.jsonl")]),
        "tool_calls": pd.DataFrame([r | {"run_id": run_id} for r in read_tool_calls(harness / "tool_calls.jsonl")]),
        "resources": pd.DataFrame([r | {"run_id": run_id}
                                   for r in resource_rows(read_resources(harness / "resources.jsonl"))]),
    }
    store.replace_run(run_id, frames)
    return process


def _run_row(run_id: str, config: RunConfig, summary: RunSummary | None, process: ProcessReport,
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
        "best_val": m["best_feedback"] if m["feedback_split"] == "validation" else None,
        "best_submission_id": m["best_submission_id"], "final_submission_id": m["final_submission_id"],
        "final_test": m["final_test"], "delta_test": m["delta_test"], "n_submissions": m["n_submissions"],
        "n_scored": m["n_scored"], "agent_seconds": m["agent_seconds"], "grading_seconds": m["grading_seconds"],
        "error": None, "config_json": config.model_dump_json(), "harness_dir": str(harness),
        "failure_class": process.failure_class, "updated_at": last_at,
    }  # fmt: skip
    if summary is not None:  # the report's numbers are the run's own word where it wrote one
        row |= {k: getattr(summary, k) for k in (
            "baseline_val", "baseline_test", "best_val", "best_submission_id", "final_submission_id", "final_test",
            "delta_test", "n_submissions", "n_scored", "agent_seconds", "grading_seconds", "wall_seconds", "error")}
        row["phase_seconds_json"] = json.dumps(summary.phase_seconds)
    return row


def _submission_rows(run_id: str, entries: list[LedgerEntry], process: ProcessReport) -> list[dict[str, Any]]:
    first_at: dict[int, Any] = {}
    for e in entries:
        if e.kind == "submission" and e.submission_id is not None:
            first_at.setdefault(e.submission_id, e.at)
    return [
        {"run_id": run_id, "submission_id": e.submission_id, "created_at": first_at[e.submission_id],
         "model_path": e.model_path, "weights_hash": e.weights_hash, "size_bytes": e.size_bytes, "status": e.status,
         "split": e.split, "score": e.score, "cached": e.cached, "eval_seconds": e.eval_seconds,
         "agent_elapsed_s": e.agent_elapsed_s, "error": e.error, "route": process.routes.get(e.submission_id),
         "code_sha": process.code_shas.get(e.submission_id)}
        for e in _latest_submissions(entries)
    ]  # fmt: skip


def _evaluation_rows(run_id: str, entries: list[LedgerEntry], harness: Path) -> list[dict[str, Any]]:
    """One row per scored evaluation, keyed as the live flow keys them (`<kind>-<submission or 0>-<split>`)."""
    from a2rl.records import EvalResult

    rows: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.kind not in ("baseline", "submission", "final") or e.status != "scored" or e.score is None:
            continue
        key = f"{e.kind}-{e.submission_id or 0}-{e.split}"
        saved = harness / "evaluations" / f"{key}.json"
        result = EvalResult.model_validate_json(saved.read_text()) if saved.exists() else None
        rows[key] = {
            "run_id": run_id, "eval_key": key, "kind": e.kind, "submission_id": e.submission_id, "split": e.split,
            "score": e.score, "n": result.n if result else None, "n_correct": result.n_correct if result else None,
            "evaluator_id": result.evaluator_id if result else None, "weights_hash": e.weights_hash,
            "generated_tokens": result.generated_tokens if result else None,
            "duration_s": result.duration_s if result else e.eval_seconds, "cached": e.cached, "created_at": e.at,
        }  # fmt: skip
    return list(rows.values())


def _metric_rows(run_id: str, process: ProcessReport) -> list[dict[str, Any]]:
    from a2rl.store import metric_cells

    values = process.metrics | {"failure_reason": process.failure_reason}
    return [{"run_id": run_id, "name": k, "value": v, "text": t}
            for k, (v, t) in ((k, metric_cells(v)) for k, v in values.items())]
