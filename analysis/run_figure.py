"""The per-run figure written beside a run's report: score per submission against the baseline."""

from __future__ import annotations

from pathlib import Path

from a2rl_bench.records import LedgerEntry
from a2rl_bench.protocol.picking import final_entry, latest_submissions


def score_trajectory_png(entries: list[LedgerEntry], path: Path | str, title: str | None = None) -> Path:
    """Score per submission with the baseline, best-so-far, errors and base-model copies marked (800×450 px)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    subs = latest_submissions(entries)
    split = next((e.split for e in subs if e.split), "validation")
    base = next((e.score for e in entries if e.kind == "baseline" and e.split == split), None)
    base_hashes = {e.weights_hash for e in entries if e.kind == "baseline" and e.weights_hash}
    final = final_entry(entries)
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
