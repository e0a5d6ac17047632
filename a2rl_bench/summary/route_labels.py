"""Route label of each submission (SFT, GRPO, copy, ...) from the code snapshot taken when it was made."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from a2rl_bench.records import LedgerEntry
from a2rl_bench.protocol.picking import latest_submissions


class RouteLabels(NamedTuple):
    routes: dict[int, str]
    code_shas: dict[int, str]
    note: str | None


def label_routes(entries: list[LedgerEntry], snapshots: Any) -> RouteLabels:
    """Route label per submission from its code snapshot (`a2rl_bench.grading.route_audit.route_label`, imported
    lazily).

    The snapshot of submission N is found by the ledger's `code-snapshot` event or the label `submission-N`
    in the snapshot log; a submission whose weights equal the base model's is labelled `copy` whatever its code.
    """
    subs = latest_submissions(entries)
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
        from a2rl_bench.grading.route_audit import route_label
    except ImportError:
        return RouteLabels(routes, shas, "route labels unavailable: a2rl_bench.grading.route_audit is not installed")
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
