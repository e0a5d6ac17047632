"""From a model's reply to a runnable HumanEval program: pull out the code, complete the function, add the tests."""

from __future__ import annotations

import re

# An opening fence with an optional language tag, up to the closing fence or the end of the text (a reply
# cut off by the token limit has no closing fence).
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL | re.IGNORECASE)
_TOP_LEVEL_START = re.compile(r"(?:def|class|import|from|async)\b|[@#]")


def extract_code(completion: str, entry_point: str) -> str:
    """The code in a reply: the fenced block defining `entry_point` (else the first fenced block), or
    the whole reply when it has no fence."""
    blocks = _FENCE.findall(completion)
    if not blocks:
        return completion
    defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    return next((block for block in blocks if defines.search(block)), blocks[0])


def defines_function(code: str, entry_point: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def complete_function(prompt: str, code: str, entry_point: str) -> str:
    """The solution module: the HumanEval prompt (its imports and helper functions) followed by the code.

    A reply that defines the function replaces the prompt's stub (a later `def` wins); a reply that is
    only the body continues the prompt, indented if the model wrote it flush left.
    """
    if defines_function(code, entry_point):
        return f"{prompt}\n{code}\n"
    body = code.strip("\n")
    first = next((line for line in body.splitlines() if line.strip()), "")
    if first and not first[0].isspace() and not _TOP_LEVEL_START.match(first):
        body = "\n".join(f"    {line}" if line.strip() else line for line in body.splitlines())
    return f"{prompt}{body}\n"


def build_program(prompt: str, code: str, test: str, entry_point: str) -> str:
    """A program that defines the solution, then runs the problem's `check(candidate)` on it."""
    return f"{complete_function(prompt, code, entry_point)}\n\n{test}\n\ncheck({entry_point})\n"
