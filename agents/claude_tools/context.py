"""Keeping a long session inside the context window: old tool outputs are shortened first; if that is not
enough, the middle of the conversation is dropped and replaced by a digest of what happened in it.

Invariants kept: the conversation starts with the task message (user) and alternates user/assistant; every
`tool_result` follows the assistant message holding its `tool_use` (the kept tail starts at an assistant
message, so no result loses its call and no call loses its result).
"""

from __future__ import annotations

import copy
import json
from typing import Any

Message = dict[str, Any]
OLD_RESULT_CHARS = 1_500
DIGEST_MAX_LINES = 150
CHARS_PER_TOKEN = 3.5


def estimate_tokens(messages: list[Message], system_chars: int = 0) -> int:
    """A rough prompt size for when no usage has been reported yet (about 3.5 characters per token)."""
    return int((len(json.dumps(messages, ensure_ascii=False)) + system_chars) / CHARS_PER_TOKEN)


def shorten_old_results(messages: list[Message], keep_last: int, limit: int = OLD_RESULT_CHARS) -> int:
    """Cut `tool_result` texts outside the last `keep_last` messages to `limit` characters, in place.

    Returns:
        How many results were shortened.
    """
    n = 0
    for message in messages[: max(0, len(messages) - keep_last)]:
        if message["role"] != "user" or not isinstance(message["content"], list):
            continue
        for block in message["content"]:
            if block.get("type") != "tool_result":
                continue
            text = _result_text(block)
            if len(text) > limit:
                block["content"] = text[: limit // 2] + "\n... [old output shortened] ...\n" + text[-limit // 2 :]
                n += 1
    return n


def drop_middle(messages: list[Message], keep_last: int, digest: list[str]) -> list[Message]:
    """The first message (with `digest` of everything dropped so far appended) + the last turns.

    Args:
        messages: the conversation; `messages[0]` is the task.
        keep_last: about how many trailing messages to keep (more when needed to start at an assistant).
        digest: one line per earlier action; this call appends the dropped messages' lines to it.
    """
    if len(messages) <= keep_last + 2:
        return messages
    start = len(messages) - max(1, keep_last)
    while start > 1 and messages[start]["role"] != "assistant":  # back to the call of the results kept
        start -= 1
    if start <= 1:
        return messages
    first = messages[0]
    if first.get("_original") is None:
        first = {**first, "_original": copy.deepcopy(first["content"])}
    digest.extend(digest_lines(messages[1:start]))
    if len(digest) > DIGEST_MAX_LINES:
        del digest[: len(digest) - DIGEST_MAX_LINES]
        digest.insert(0, "(earlier actions omitted)")
    original = first["_original"]
    blocks = [{"type": "text", "text": original}] if isinstance(original, str) else copy.deepcopy(original)
    blocks.append({"type": "text", "text": "[The middle of this session was removed to save context. "
                                            "What happened in it, one line per action:]\n" + "\n".join(digest)})
    return [{"role": "user", "content": blocks, "_original": original}, *messages[start:]]


def digest_lines(messages: list[Message]) -> list[str]:
    """One line per tool call (with the start of its result) and per assistant remark."""
    results: dict[str, str] = {}
    for m in messages:
        if m["role"] == "user" and isinstance(m["content"], list):
            for b in m["content"]:
                if b.get("type") == "tool_result":
                    flag = "ERROR " if b.get("is_error") else ""
                    results[b.get("tool_use_id", "")] = flag + " ".join(_result_text(b).split())[:160]
    lines = []
    for m in messages:
        if m["role"] != "assistant" or not isinstance(m["content"], list):
            continue
        for b in m["content"]:
            if b.get("type") == "text" and b.get("text", "").strip():
                lines.append("- said: " + " ".join(b["text"].split())[:200])
            elif b.get("type") == "tool_use":
                args = json.dumps(b.get("input", {}), ensure_ascii=False)
                lines.append(f"- {b.get('name')}({args[:200]}) -> {results.get(b.get('id', ''), '(no result)')}")
    return lines


def for_request(messages: list[Message]) -> list[Message]:
    """The messages as sent: private keys removed, a cache breakpoint on the last block of the last message."""
    out = [{"role": m["role"], "content": copy.deepcopy(m["content"])} for m in messages]
    last = out[-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    if last["content"]:
        last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


def _result_text(block: dict) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        return "\n".join(c.get("text", "") for c in content if isinstance(c, dict))
    return str(content)
