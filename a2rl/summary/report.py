"""The run report: headline numbers computed from the ledger's raw scores, as report.json and report.md."""

from __future__ import annotations

import json
from pathlib import Path

from a2rl.protocol.picking import latest_submissions
from a2rl.summary.headline import SCORES, headline
from a2rl.records import LedgerEntry, RunStatus, RunSummary
from a2rl.run import RunContext


def last_event(entries: list[LedgerEntry], name: str) -> LedgerEntry | None:
    return next((e for e in reversed(entries) if e.kind == "event" and e.detail.get("event") == name), None)


def build_summary(
    ctx: RunContext,
    entries: list[LedgerEntry],
    status: RunStatus,
    phase_seconds: dict[str, float],
    agent_seconds: float = 0.0,
    grading_seconds: float = 0.0,
    error: str | None = None,
    grace_seconds: float = 0.0,
    attempts: int = 1,
) -> RunSummary:
    """The run's summary: its `headline` numbers with the run's identity, status and times."""
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
        **headline(entries, ctx.config.protocol).model_dump(),
        grace_seconds=round(grace_seconds, 3),
        attempts=attempts,
    )


def withheld(summary: RunSummary, reason: str) -> RunSummary:
    """A run whose ledger does not verify: marked failed, with the reason, and no number from that ledger."""
    return summary.model_copy(update={**dict.fromkeys(SCORES), "status": "failed", "n_scored": 0,
                                      "error": f"ledger integrity: {reason}; no number of this run is reported"})


def write_report(ctx: RunContext, summary: RunSummary, entries: list[LedgerEntry], notes: list[str],
                 integrity: dict, sections: list[str] = (), extra: dict | None = None) -> Path:
    """report.json and report.md; `integrity` is the ledger's check against the store's anchor
    (`tasks.summary_steps.ledger_integrity`), `sections` are markdown lines placed after the submissions, `extra`
    more top-level keys of report.json."""
    out = ctx.paths.harness_dir
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
        f"{c.budget_s:.0f} s budget" + (f" (+{s.grace_seconds:.1f} s grace past it, to stop)" if s.grace_seconds else "")
        + f"; grading {s.grading_seconds:.0f} s (not charged to the agent); wall {s.wall_seconds:.0f} s"
        + (f" over {s.attempts} attempts" if s.attempts > 1 else "") + ".",
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
    lines += ["## Phases (wall seconds" + (", summed over the attempts)" if s.attempts > 1 else ")"), "",
              "| phase | s |", "|---|---|"]
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
