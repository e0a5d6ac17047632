"""The run report: headline numbers computed from the ledger's raw scores, as report.json and report.md."""

from __future__ import annotations

import json
from pathlib import Path

from a2rl.records import LedgerEntry, RunStatus, RunSummary
from a2rl.run import RunContext


def latest_submissions(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    latest: dict[int, LedgerEntry] = {}
    for e in entries:
        if e.kind == "submission" and e.submission_id is not None:
            latest[e.submission_id] = e
    return [latest[k] for k in sorted(latest)]


def mode_breaches(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """Submissions whose code broke the run's mode when they were made (flagged by the grader, not refused)."""
    flagged = {e.submission_id: e for e in entries if e.kind == "submission" and e.detail.get("mode_ok") is False}
    return [flagged[k] for k in sorted(flagged)]


def last_event(entries: list[LedgerEntry], name: str) -> LedgerEntry | None:
    return next((e for e in reversed(entries) if e.kind == "event" and e.detail.get("event") == name), None)


def baseline_scores(entries: list[LedgerEntry]) -> dict[str, float]:
    return {e.split: e.score for e in entries if e.kind == "baseline" and e.score is not None and e.split}


def best_submission(entries: list[LedgerEntry], split: str) -> LedgerEntry | None:
    scored = [e for e in latest_submissions(entries) if e.status == "scored" and e.split == split and e.score is not None]
    return max(scored, key=lambda e: (e.score, -e.submission_id)) if scored else None


def ledger_numbers(entries: list[LedgerEntry], protocol: str) -> dict:
    """The run's headline numbers as the ledger's raw scores give them (`RunSummary` field names); Δ is derived
    here from stored raw scores, never taken from a stored difference."""
    base = baseline_scores(entries)
    subs = latest_submissions(entries)
    feedback_split = "test" if protocol == "paper" else "validation"
    best = best_submission(entries, feedback_split)
    final = next((e for e in reversed(entries) if e.kind == "final" and e.score is not None), None)
    final_test = final.score if final else None
    base_test = base.get("test")
    return {
        "baseline_val": base.get("validation"),
        "baseline_test": base_test,
        "best_val": best.score if best and feedback_split == "validation" else None,
        "best_submission_id": best.submission_id if best else None,
        "final_submission_id": final.submission_id if final else None,
        "final_test": final_test,
        "delta_test": round(final_test - base_test, 6) if final_test is not None and base_test is not None else None,
        "n_submissions": len(subs),
        "n_scored": sum(e.status == "scored" for e in subs),
        "mode_breaches": len(mode_breaches(entries)),
    }


def numbers_disagree(summary: RunSummary, entries: list[LedgerEntry]) -> list[str]:
    """Where a report's summary says otherwise than its ledger (a report edited apart from its ledger)."""
    return [f"{k}: the report says {getattr(summary, k)!r}, the ledger {v!r}"
            for k, v in ledger_numbers(entries, summary.protocol).items() if getattr(summary, k) != v]  # fmt: skip


def build_summary(
    ctx: RunContext,
    entries: list[LedgerEntry],
    status: RunStatus,
    phase_seconds: dict[str, float],
    agent_seconds: float = 0.0,
    grading_seconds: float = 0.0,
    error: str | None = None,
) -> RunSummary:
    """The run's summary: `ledger_numbers` with the run's identity, status and times."""
    return RunSummary(
        run_id=ctx.run_id,
        config=ctx.config,
        status=status,
        protocol=ctx.config.protocol,
        variant_label=ctx.variant_label,
        agent_seconds=round(agent_seconds, 3),
        grading_seconds=round(grading_seconds, 3),
        wall_seconds=round(sum(phase_seconds.values()), 3),
        phase_seconds={k: round(v, 3) for k, v in phase_seconds.items()},
        error=error,
        **ledger_numbers(entries, ctx.config.protocol),
    )


def ledger_integrity(ctx: RunContext) -> dict:
    """The ledger's head as this report is built from it, checked against the head the results store
    anchored at every append: an edited last entry, a cut-off end or entries appended past the anchored head
    show up here, as `tampered` (no number may be written from this ledger). `head_mac` authenticates the head
    for a later ingest into another store (`a2rl.grading.ledger.head_mac`)."""
    from a2rl.grading.ledger import Ledger, LedgerCorrupted, head_mac
    from a2rl.store.results import ResultsStore

    try:
        ledger = Ledger(ctx.paths.harness_dir / "ledger.jsonl")
    except LedgerCorrupted as e:
        return {"entries": None, "head_hash": None, "anchored": False, "tampered": True, "problems": [str(e)]}
    head = ledger.head()
    out = {"entries": head.entries, "head_hash": head.hash, "head_mac": head_mac(ctx.run_id, head),
           "anchored": False, "tampered": False, "problems": []}  # fmt: skip
    try:
        anchored = ResultsStore(ctx.results_path).ledger_head(ctx.run_id)
    except Exception as e:  # noqa: BLE001 - a report must still be written; it says what could not be checked
        out["problems"].append(f"the results store could not be read to check the ledger's end ({type(e).__name__})")
        return out
    out["anchored"] = anchored is not None
    if anchored is None:
        out["problems"].append("no head anchored in the results store for this run")
    elif mismatch := ledger.check_head(anchored, "the results store"):
        out["problems"].append(mismatch)
        out["tampered"] = True
    if ledger.torn_tail is not None:
        out["problems"].append(str(ledger.torn_tail))
    return out


def withheld(summary: RunSummary, reason: str) -> RunSummary:
    """A run whose ledger does not verify: marked failed, with the reason, and no number from that ledger."""
    numbers = ("baseline_val", "baseline_test", "best_val", "best_submission_id", "final_submission_id",
               "final_test", "delta_test")  # fmt: skip
    return summary.model_copy(update={**dict.fromkeys(numbers), "status": "failed", "n_scored": 0,
                                      "error": f"ledger integrity: {reason}; no number of this run is reported"})


def write_report(ctx: RunContext, summary: RunSummary, entries: list[LedgerEntry], notes: list[str],
                 integrity: dict | None = None, sections: list[str] = (), extra: dict | None = None) -> Path:
    """report.json and report.md; `sections` are markdown lines placed after the submissions, `extra` more
    top-level keys of report.json."""
    out = ctx.paths.harness_dir
    integrity = integrity if integrity is not None else ledger_integrity(ctx)
    subs = [] if integrity["tampered"] else latest_submissions(entries)
    notes = [f"LEDGER INTEGRITY: {p}" for p in integrity["problems"]] + notes
    data = {
        "summary": json.loads(summary.model_dump_json()),
        "submissions": [json.loads(e.model_dump_json()) for e in subs],
        **(extra or {}),
        "ledger": integrity,
        "notes": notes,
    }
    (out / "report.json").write_text(json.dumps(data, indent=2))
    md_path = out / "report.md"
    md_path.write_text(render_markdown(summary, subs, notes, sections))
    return md_path


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def render_markdown(s: RunSummary, subs: list[LedgerEntry], notes: list[str], sections: list[str] = ()) -> str:
    c = s.config
    lines = [
        f"# a2rl run `{s.run_id}`",
        "",
        f"**{c.task}** ({s.variant_label}) · agent **{c.agent}** · driver {c.driver} · mode {c.mode} · "
        f"base model {c.base_model} · seed {c.seed} · protocol **{s.protocol}** · status **{s.status}**",
        "",
        "| | score |",
        "|---|---|",
        f"| baseline, validation | {_fmt(s.baseline_val)} |",
        f"| baseline, hidden test | {_fmt(s.baseline_test)} |",
        f"| best validation (submission {s.best_submission_id or '-'}) | {_fmt(s.best_val)} |",
        f"| final, hidden test (submission {s.final_submission_id or 'base model'}) | {_fmt(s.final_test)} |",
        f"| **Δ test = final − baseline** | **{_fmt(s.delta_test, 2)}** |",
        f"| mode breaches (mode {c.mode}{', strict' if c.strict_mode else ''}) | "
        f"{f'**{s.mode_breaches}** of {s.n_submissions} submissions' if s.mode_breaches else 'none'} |",
        "",
        f"Submissions: {s.n_submissions} ({s.n_scored} scored). Agent time {s.agent_seconds:.0f} s of "
        f"{c.budget_s:.0f} s budget; grading {s.grading_seconds:.0f} s (not charged to the agent); "
        f"wall {s.wall_seconds:.0f} s.",
        "",
    ]
    if s.error:
        lines += [f"**Error:** {s.error}", ""]
    if subs:
        lines += ["## Submissions", "", "| # | path | status | split | score | cached | grading s | agent s at submit | error |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in subs:
            err = (e.error or "").replace("|", "/").replace("\n", " ")[:120]
            lines.append(
                f"| {e.submission_id} | `{e.model_path}` | {e.status} | {e.split} | {_fmt(e.score)} | "
                f"{'yes' if e.cached else ''} | {_fmt(e.eval_seconds, 1)} | {_fmt(e.agent_elapsed_s, 0)} | {err} |"
            )
        lines.append("")
    lines += list(sections)
    lines += ["## Phases (wall seconds)", "", "| phase | s |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in s.phase_seconds.items()]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def run_notes(ctx: RunContext, session_detail: dict) -> list[str]:
    """The report's notes on how the run was set up and how its session ended."""
    c = ctx.config
    notes = [f"Data: {ctx.variant_label}."]
    if c.val_limit or c.test_limit:
        notes.append(
            f"To stay fast, this run evaluates a fixed subset: the first {c.val_limit or 'all'} validation and "
            f"the first {c.test_limit or 'all'} hidden-test items of the split."
        )
    if c.protocol == "paper":
        notes.append("Protocol `paper`: submissions were scored on the test set and the best was kept, "
                     "i.e. selection on the test set (optimistic).")
    if session_detail.get("ended_by") == "budget":
        notes.append("The agent was stopped at the end of its budget.")
    if session_detail.get("exit_code") not in (0, None):
        notes.append(f"The agent exited with code {session_detail['exit_code']} (see harness/agent.log).")
    return notes
