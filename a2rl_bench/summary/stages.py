"""What each training stage added, on the hidden test: the post-hoc evaluations of every submission
(`test_every_submission`) grouped by the stage the agent named when it submitted (`stage`, e.g. SFT, GRPO).

The stage label is the agent's own word: it only groups submissions, it never changes a score. RL's share of a
run compares its last RL checkpoint with the SFT checkpoint RL started from: the one the first RL submission names
as its `parent` (the agent's word too, used only where it names an earlier SFT submission), else the one RL most
likely started from, the best SFT submission on validation (what the agent itself could see) made before its first
RL submission. Both are evaluated on the same hidden items, so the difference gets a paired item-level interval.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from a2rl_bench.grading.record import read_evaluation
from a2rl_bench.records import LedgerEntry
from a2rl_bench.summary.intervals import paired_item_interval
from a2rl_bench.protocol.picking import latest_submissions, pick_best
from a2rl_bench.safetext import md_text

RL_STAGES = ("GRPO", "GIGPO", "RL", "PPO", "RLOO", "DPO", "REINFORCE")
"""Stage labels (case-insensitive prefixes) that count as reinforcement learning."""


def stage_kind(stage: str | None) -> str | None:
    """`SFT`, `RL`, or None for a stage label that names neither."""
    label = (stage or "").strip().upper()
    if label.startswith("SFT"):
        return "SFT"
    return "RL" if label.startswith(RL_STAGES) else None


class SubmissionTest(BaseModel):
    """One submission's post-hoc hidden-test evaluation (analysis only)."""

    submission_id: int
    stage: str | None
    validation: float | None
    test: float | None
    parent: int | None = None
    """The earlier submission the agent said this checkpoint's training started from (None: not said)."""


START_WORDS = {"declared": "the SFT submission the first RL one names as its parent",
               "inferred": "the best SFT submission on validation before RL"}
"""How RL's SFT start was found (`StageShare.start`, the metric `rl_share_start`), as the report says it."""


class StageShare(BaseModel):
    """The hidden-test gain of a run's last RL checkpoint over the SFT checkpoint RL started from."""

    sft_submission: int
    rl_submission: int
    sft_test: float
    rl_test: float
    delta: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n_items: int | None
    method: str
    start: Literal["declared", "inferred"] = "inferred"
    """How the SFT checkpoint was found (`START_WORDS`)."""


def submission_tests(entries: list[LedgerEntry]) -> list[SubmissionTest]:
    """Every scored submission with its post-hoc hidden-test score (None where it was not evaluated)."""
    posthoc = {e.submission_id: e.score for e in entries if e.kind == "posthoc"}
    return [SubmissionTest(submission_id=e.submission_id, stage=e.detail.get("stage"), validation=e.score,
                           test=posthoc.get(e.submission_id), parent=_parent(e.detail.get("parent")))
            for e in latest_submissions(entries) if e.status == "scored"]  # fmt: skip


def _parent(value) -> int | None:
    """A recorded parent id (the grader accepted only an earlier submission's id), or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def stage_share(tests: list[SubmissionTest], items: Callable[[int], dict[str, float] | None]) -> StageShare | None:
    """RL's share of a run from its submissions' post-hoc tests; `items(submission_id)` gives that submission's
    hidden-test score per item (None when unknown). None where the run has no SFT-then-RL pair."""
    tested = [t for t in tests if t.test is not None and t.validation is not None]
    first_rl = next((t for t in tested if stage_kind(t.stage) == "RL"), None)
    if first_rl is None:
        return None
    sft = [t for t in tested if stage_kind(t.stage) == "SFT" and t.submission_id < first_rl.submission_id]
    if not sft:
        return None
    declared = next((t for t in sft if t.submission_id == first_rl.parent), None)
    # Without a parent (or one that is no earlier SFT submission): the earlier one on a tie
    start = declared or pick_best(sft, lambda t: t.validation, lambda t: t.submission_id)
    last = [t for t in tested if stage_kind(t.stage) == "RL"][-1]
    before, after = items(start.submission_id), items(last.submission_id)
    paired = [(before[i], after[i]) for i in sorted(before) if i in after] if before and after else []
    interval = paired_item_interval([x for x, _ in paired], [y for _, y in paired]) if paired else None
    return StageShare(
        sft_submission=start.submission_id, rl_submission=last.submission_id, sft_test=start.test, rl_test=last.test,
        delta=round(last.test - start.test, 6), ci_low=interval and interval.low, ci_high=interval and interval.high,
        p_value=interval and interval.p_value, n_items=interval and interval.n,
        method=interval.method if interval else "no item-level results",
        start="declared" if declared else "inferred",
    )  # fmt: skip


def items_from_files(harness_dir: Path | str, entries: list[LedgerEntry]) -> Callable[[int], dict[str, float] | None]:
    """Per-item hidden-test scores of a submission from the run's `harness/evaluations/posthoc-<id>-test.json`, as
    its ledger line recorded them (`read_evaluation`: an edited file gives None)."""

    def items(submission_id: int) -> dict[str, float] | None:
        result = read_evaluation(harness_dir, entries, f"posthoc-{submission_id}-test")
        return None if result is None else {i.item_id: _value(i) for i in result.items}

    return items


def _value(item) -> float:
    return item.value if item.value is not None else float(item.correct)


def run_stage_share(entries: list[LedgerEntry], harness_dir: Path | str) -> StageShare | None:
    """`stage_share` of a run from its ledger and its evaluation files."""
    return stage_share(submission_tests(entries), items_from_files(harness_dir, entries))


def stage_metrics(entries: list[LedgerEntry], harness_dir: Path | str) -> dict[str, Any]:
    """The run's metrics of this analysis (`rl_share*`), empty where it does not apply."""
    share = run_stage_share(entries, harness_dir)
    if share is None:
        return {}
    return {"rl_share": share.delta, "rl_share_ci_low": share.ci_low, "rl_share_ci_high": share.ci_high,
            "rl_share_p_value": share.p_value, "rl_share_n_items": share.n_items,
            "rl_share_sft_test": share.sft_test, "rl_share_rl_test": share.rl_test,
            "rl_share_submissions": [share.sft_submission, share.rl_submission],
            "rl_share_start": share.start}  # fmt: skip


def render_markdown(entries: list[LedgerEntry], harness_dir: Path | str) -> list[str]:
    """The report's section on the post-hoc hidden-test evaluations (no lines when there were none)."""
    tests = submission_tests(entries)
    if not any(t.test is not None for t in tests):
        return []
    final = next((e.submission_id for e in entries if e.kind == "final"), None)
    lines = ["## Every submission on the hidden test (analysis only)", "",
             "Evaluated after the session; never shown to the agent. The final pick and Δ above do not use them.",
             "", "| # | stage (agent's label) | validation | hidden test | |", "|---|---|---|---|---|"]  # fmt: skip
    for t in tests:
        fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {t.submission_id} | {md_text(t.stage, 40) if t.stage else '-'} | {fmt(t.validation)} | {fmt(t.test)} | "
                     f"{'final pick' if t.submission_id == final else ''} |")  # fmt: skip
    share = run_stage_share(entries, harness_dir)
    if share is not None:
        ci = (f"95% [{share.ci_low:+.2f}, {share.ci_high:+.2f}], p={share.p_value:.3g}, paired over {share.n_items} items"
              if share.ci_low is not None else share.method)  # fmt: skip
        lines += ["", f"RL's share: last RL checkpoint (submission {share.rl_submission}, {share.rl_test:.2f}) − the SFT "
                      f"checkpoint it started from (submission {share.sft_submission}, {share.sft_test:.2f}: "
                      f"{START_WORDS[share.start]}) = **{share.delta:+.2f}** ({ci})."]  # fmt: skip
    return lines + [""]
