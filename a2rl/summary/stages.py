"""What each training stage added, on the hidden test: the post-hoc evaluations of every submission
(`test_every_submission`) grouped by the stage the agent named when it submitted (`stage`, e.g. SFT, GRPO).

The stage label is the agent's own word: it only groups submissions, it never changes a score. Within a stage
the pick is the submission with the best validation score (what the agent itself could see), so "RL's share"
is the hidden-test score of the best RL checkpoint minus that of the best SFT checkpoint, with the paired
item-level interval over the same hidden items.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from a2rl.records import EvalResult, LedgerEntry
from a2rl.summary.intervals import paired_item_interval
from a2rl.summary.report import latest_submissions

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


class StageShare(BaseModel):
    """The hidden-test gain of the best RL checkpoint over the best SFT checkpoint of one run."""

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


def submission_tests(entries: list[LedgerEntry]) -> list[SubmissionTest]:
    """Every scored submission with its post-hoc hidden-test score (None where it was not evaluated)."""
    posthoc = {e.submission_id: e.score for e in entries if e.kind == "posthoc"}
    return [SubmissionTest(submission_id=e.submission_id, stage=e.detail.get("stage"), validation=e.score,
                           test=posthoc.get(e.submission_id))
            for e in latest_submissions(entries) if e.status == "scored"]  # fmt: skip


def stage_share(entries: list[LedgerEntry], harness_dir: Path | str) -> StageShare | None:
    """RL's share for a run with SFT and RL submissions evaluated post hoc; None where it has not both."""
    tests = [t for t in submission_tests(entries) if t.test is not None and t.validation is not None]
    picks: dict[str, SubmissionTest] = {}
    for t in tests:  # best validation per kind; the earlier submission on a tie
        kind = stage_kind(t.stage)
        if kind and (kind not in picks or t.validation > picks[kind].validation):
            picks[kind] = t
    if set(picks) != {"SFT", "RL"}:
        return None
    sft, rl = picks["SFT"], picks["RL"]
    interval = _paired(Path(harness_dir) / "evaluations", sft.submission_id, rl.submission_id)
    return StageShare(
        sft_submission=sft.submission_id, rl_submission=rl.submission_id, sft_test=sft.test, rl_test=rl.test,
        delta=round(rl.test - sft.test, 6), ci_low=interval and interval.low, ci_high=interval and interval.high,
        p_value=interval and interval.p_value, n_items=interval and interval.n,
        method=interval.method if interval else "no item-level results",
    )  # fmt: skip


def _paired(folder: Path, before: int, after: int) -> Any:
    try:
        a, b = (EvalResult.model_validate_json((folder / f"posthoc-{sid}-test.json").read_text()) for sid in (before, after))
    except (OSError, ValueError):
        return None
    scores = {i.item_id: _value(i) for i in a.items}
    paired = [(scores[i.item_id], _value(i)) for i in b.items if i.item_id in scores]
    return paired_item_interval([x for x, _ in paired], [y for _, y in paired]) if paired else None


def _value(item) -> float:
    return item.value if item.value is not None else float(item.correct)


def stage_metrics(entries: list[LedgerEntry], harness_dir: Path | str) -> dict[str, Any]:
    """The run's metrics of this analysis (`rl_share*`), empty where it does not apply."""
    share = stage_share(entries, harness_dir)
    if share is None:
        return {}
    return {"rl_share": share.delta, "rl_share_ci_low": share.ci_low, "rl_share_ci_high": share.ci_high,
            "rl_share_p_value": share.p_value, "rl_share_n_items": share.n_items,
            "rl_share_sft_test": share.sft_test, "rl_share_rl_test": share.rl_test,
            "rl_share_submissions": [share.sft_submission, share.rl_submission]}  # fmt: skip


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
        lines.append(f"| {t.submission_id} | {t.stage or '-'} | {fmt(t.validation)} | {fmt(t.test)} | "
                     f"{'final pick' if t.submission_id == final else ''} |")  # fmt: skip
    share = stage_share(entries, harness_dir)
    if share is not None:
        ci = (f"95% [{share.ci_low:+.2f}, {share.ci_high:+.2f}], p={share.p_value:.3g}, paired over {share.n_items} items"
              if share.ci_low is not None else share.method)  # fmt: skip
        lines += ["", f"RL's share: best RL checkpoint (submission {share.rl_submission}, {share.rl_test:.2f}) − best SFT "
                      f"checkpoint (submission {share.sft_submission}, {share.sft_test:.2f}) = **{share.delta:+.2f}** ({ci}); "
                      "each stage's pick is its best on validation."]  # fmt: skip
    return lines + [""]
