"""An optional LLM-written account of a run, beside (never instead of) the deterministic facts."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


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
