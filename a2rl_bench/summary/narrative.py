"""An optional LLM-written account of a run, beside (never instead of) the deterministic facts."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


NARRATIVE_SYSTEM = (
    "You write a short account (at most 200 words) of one benchmark run in which an AI agent tried to "
    "post-train a base model. Use only the facts in the JSON you are given; do not invent numbers, methods "
    "or causes. Say what the agent did (routes, submissions), how the score moved, and the failure class "
    "with its stated reason. Plain prose, no headings."
)


class Narration(NamedTuple):
    text: str | None
    note: str | None
    """Why there is no LLM text (no API key, an API error, an empty answer)."""


def narrate(report_json: Mapping[str, Any], client: Any = None, model: str | None = None,
            max_tokens: int = 600) -> Narration | None:
    """An LLM-written narrative of a run's facts; None when off (A2RL_NARRATIVE_MODEL unset). Never raises: a
    missing key or a failed call gives `Narration(None, why)`, and the caller writes the deterministic one.

    Args:
        report_json: the facts (summary + process report) as JSON-able data; the narrative may use only these.
        client: an `anthropic.Anthropic` client; one is built from the environment when None.
        model: overrides A2RL_NARRATIVE_MODEL.
    """
    model = model or os.environ.get("A2RL_NARRATIVE_MODEL")
    if not model:
        return None
    facts = json.dumps(report_json, indent=1, sort_keys=True, default=str)
    try:
        import anthropic

        client = client or anthropic.Anthropic()
        message = client.messages.create(
            model=model, max_tokens=max_tokens, system=NARRATIVE_SYSTEM,
            messages=[{"role": "user", "content": f"Facts of the run:\n```json\n{facts}\n```"}],
        )  # fmt: skip
    except Exception as e:  # no key, no SDK, an API error: the narrative is optional, the facts stand without it
        why = f"LLM narrative ({model}) unavailable: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        log.warning("%s", why)
        return Narration(None, why)
    text = "".join(getattr(block, "text", "") for block in message.content).strip()
    return Narration(text or None, None if text else f"LLM narrative ({model}) came back empty")


def deterministic_narrative(report: Any) -> str:
    """A plain account of a `ProcessFacts` from its facts alone (used when the LLM narrative is unavailable)."""
    m = report.metrics
    parts = [f"The agent made {m.n_submissions or 0} submission(s), {m.n_scored or 0} of them scored."]
    if report.routes:
        parts.append("Routes: " + ", ".join(f"#{k} {v}" for k, v in report.routes.items()) + ".")
    if m.delta_test is not None:
        low, high = m.ci("delta_test")
        ci = f" (95% interval {low:+.2f} to {high:+.2f})" if low is not None and high is not None else ""
        parts.append(f"The final pick changed the hidden-test score by {m.delta_test:+.2f} points{ci}: "
                     f"{m.verdict or 'not tested'}.")
    parts.append(f"Failure class: {report.failure_class} — {report.failure_reason}.")
    return " ".join(parts)
