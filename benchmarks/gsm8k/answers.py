"""Final-answer extraction for GSM8K: find the number a completion commits to, in a canonical form."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number as models write it: optional sign and dollar sign, thousands separators only in groups of
# three (so "3,4 and 5" is three numbers, not 34), optional decimals. A minus right after a word or
# digit is a hyphen or a subtraction ("5-day", "10-4"), not a sign. `(?!\d)` stops "1,2345" from being
# read as "1,234".
_NUMBER = r"(?:(?<![\w)])-)?\$?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)

# Explicit answer markers, tried before falling back to the last number. "#### N" is the GSM8K
# reference format, "The answer is N" the few-shot format, \boxed{N} what chat models often write.
_MARKED_RE = re.compile(
    r"####\s*(?P<hash>" + _NUMBER + r")"
    r"|answer\s+is\s*[:=]?\s*[*$\\(\s]*(?P<said>" + _NUMBER + r")"
    r"|\\boxed\{\s*(?P<boxed>" + _NUMBER + r")",
    re.IGNORECASE,
)

# The few-shot prompt starts each exemplar with "Question:"; anything after it is the model inventing
# the next exemplar, not answering this one (as OpenCompass' gsm8k postprocessing also assumes).
_NEXT_QUESTION = "Question:"


def normalize_number(text: str) -> str | None:
    """Canonical string for a number: no `$`, no thousands separators, no trailing zeros.

    >>> normalize_number("$1,200.00"), normalize_number("42.0"), normalize_number("-0.50")
    ('1200', '42', '-0.5')
    """
    cleaned = re.sub(r"[\s$,]", "", text)
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))  # also turns -0 into 0
    return format(value.normalize(), "f")


def extract_answer(text: str) -> str | None:
    """The normalised final number of a completion, or None when it states none.

    The first explicit marker ("#### N", "The answer is N", "\\boxed{N}") wins, since small models
    often keep generating after stating their answer; without one, the last number counts.
    """
    text = text.split(_NEXT_QUESTION, 1)[0]
    marked = _MARKED_RE.search(text)
    if marked:
        return normalize_number(marked.group("hash") or marked.group("said") or marked.group("boxed"))
    numbers = _NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def reference_target(answer: str) -> str:
    """The target of a GSM8K reference solution: the number on its `#### N` line."""
    head, sep, tail = answer.rpartition("####")
    target = normalize_number(tail) if sep else None
    if target is None:
        raise ValueError(f"GSM8K reference answer has no '#### <number>' line: {answer[-80:]!r}")
    return target
