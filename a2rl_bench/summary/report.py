"""The run report: a run's record (`a2rl_bench.summary.record`) written as report.json and rendered as report.md."""

from __future__ import annotations

import json
from pathlib import Path

from a2rl_bench.records import LedgerEntry, RunSummary, utcnow
from a2rl_bench.run import Provenance, RunContext
from a2rl_bench.safetext import md_code, md_text
from a2rl_bench.summary.record import RUN_RECORD_VERSION, RunRecord


def last_event(entries: list[LedgerEntry], name: str) -> LedgerEntry | None:
    return next((e for e in reversed(entries) if e.kind == "event" and e.detail.get("event") == name), None)


def write_report(harness_dir: Path, record: RunRecord, sections: list[str] = ()) -> Path:
    """report.json (the record, stamped with its format version, the run's provenance and when it was written) and
    report.md (rendered from it); `sections` are markdown lines placed after the submissions."""
    record = record.model_copy(update={"format_version": RUN_RECORD_VERSION, "created_at": utcnow(),
                                       "provenance": Provenance.of_run(harness_dir)})  # fmt: skip
    (harness_dir / "report.json").write_text(json.dumps(record.model_dump(mode="json"), indent=2))
    md_path = harness_dir / "report.md"
    md_path.write_text(render_markdown(record.summary, record.submissions, record.notes, sections))
    return md_path


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def render_markdown(s: RunSummary, subs: list[LedgerEntry], notes: list[str], sections: list[str] = ()) -> str:
    c = s.config
    lines = [
        f"# a2rl run {md_code(s.run_id)}",
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
        lines += [f"**Error:** {md_text(s.error, 500)}", ""]
    if subs:
        lines += ["## Submissions", "", "| # | path | status | split | score | cached | grading s | agent s at submit | error |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in subs:
            lines.append(
                f"| {e.submission_id} | {md_code(e.model_path)} | {e.status} | {e.split} | {_fmt(e.score)} | "
                f"{'yes' if e.cached else ''} | {_fmt(e.eval_seconds, 1)} | {_fmt(e.agent_elapsed_s, 0)} | {md_text(e.error or '', 120)} |"
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
    notes.append("Wall time: this report's is the run's own, every phase of every attempt; the Prefect UI's duration "
                 "of the flow run counts only its time in the Running state (a 24-minute run read 9m 39s there).")
    if session_detail.get("ended_by") == "budget":
        notes.append("The agent was stopped at the end of its budget.")
    if rule := session_detail.get("clock_rule"):
        how = f"; stopped by: {rule['freeze']}" if rule.get("freeze") else ""  # sessions before issue 43: unnamed
        unconfirmed = (f"; {rule['unconfirmed']} not confirmed stopped in time, charged to the agent"
                       if rule.get("unconfirmed") else "")  # fmt: skip
        notes.append(f"Budget clock: {rule['clock_rule']} ({rule['freezes']} freezes, {rule['frozen_s']:.0f} s "
                     f"frozen{how}{unconfirmed}).")
    elif session_detail:
        notes.append("Budget clock: paused while grading; the agent's processes were not frozen (a session "
                     "recorded before issue 33).")
    if session_detail.get("exit_code") not in (0, None):
        notes.append(f"The agent exited with code {session_detail['exit_code']} (see harness/agent.log).")
    if paths := graded_numeric_paths(ctx.paths.harness_dir / "evaluations"):
        notes.append("Graded on the numeric path " + ", ".join(f"`{p}`" for p in paths) + " (the evaluator id's "
                     "suffix: cached results of other paths are never reused; `A2RL_CPU_EVAL_DTYPE` chooses on CPU).")
        if len(paths) > 1:
            notes.append("Warning: this run's evaluations mix numeric paths, which give different answers: its "
                         "scores on different paths are not comparable.")
    return notes


def graded_numeric_paths(evaluations: Path) -> list[str]:
    """The numeric paths (`cpu-fp32`, `cpu-bf16`, `cuda-bf16`, ...) the run's evaluations name in their evaluator ids."""
    found = set()
    for f in sorted(evaluations.glob("*.json")) if evaluations.is_dir() else []:
        try:
            evaluator = json.loads(f.read_text()).get("evaluator_id") or ""
        except (OSError, ValueError, AttributeError):
            continue
        if "@" in evaluator:
            found.add(evaluator.rsplit("@", 1)[1])
    return sorted(found)
