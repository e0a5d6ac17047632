"""What counts as a mode breach: a submission the grader flagged (not refused) because the agent's code broke
the run's mode (e.g. RL in an `sft-only` run) when it was made."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from a2rl_bench.records import LedgerEntry


def breaks_mode(detail: Mapping[str, Any] | None) -> bool:
    """A submission's ledger detail says its code broke the mode (`mode_ok` false; absent means not checked)."""
    return (detail or {}).get("mode_ok") is False


def mode_breaches(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """The submissions that broke the mode, each once (its latest line), in submission order."""
    flagged = {e.submission_id: e for e in entries if e.kind == "submission" and breaks_mode(e.detail)}
    return [flagged[k] for k in sorted(flagged)]
