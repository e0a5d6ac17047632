"""One rule for text an agent chose (checkpoint names, stage labels, its log lines and tool calls, error text):
wherever the harness shows it, it stays text. It never becomes markdown structure in report.md or a Prefect
artifact, terminal control on a console or in a log, or Rich markup in the live display; and it is bounded.
"""

from __future__ import annotations

import re

MAX_CHARS = 200
"""Default bound on one piece of agent text as shown (the full text stays in the harness's own files)."""

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?|[@-Z\\-_])")
"""CSI (colours, cursor moves, screen clears), OSC (window titles, hyperlinks), DCS/SOS/PM/APC strings, and the
two-byte escapes."""
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""C0 (bar tab and newline, handled apart), DEL, C1, and the bidirectional overrides that reorder what a reader
sees (tab and newline are turned into spaces unless lines are kept)."""
_CODE_LOOKALIKES = str.maketrans({"`": "ˋ", "|": "¦", "<": "‹", ">": "›"})
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def _bound(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def terminal(text: object, limit: int = MAX_CHARS, keep_lines: bool = False) -> str:
    """For a terminal or a log line: escape sequences and control characters removed (BEL, backspace, carriage
    return, C1, bidi overrides), tabs and newlines made spaces (kept as newlines with `keep_lines`), bounded."""
    s = _CONTROL.sub("", _ANSI.sub("", str(text).replace("\t", " ")).replace("\r\n", "\n"))
    if not keep_lines:
        s = s.replace("\n", " ")
    return _bound(s, limit)


def rich(text: object, limit: int = MAX_CHARS) -> str:
    """For Rich: `terminal`, then markup escaped (`step done [/done]` shows as written, never raises)."""
    from rich.markup import escape

    return escape(terminal(text, limit))


def md_text(text: object, limit: int = MAX_CHARS) -> str:
    """For markdown prose or a table cell: one line, every markdown punctuation mark backslash-escaped (no
    heading, table row, emphasis, link or code can start), HTML made inert."""
    s = _MD_SPECIAL.sub(r"\\\1", terminal(text, limit))
    return s.replace("&", "&amp;").replace("<", "&lt;")


def md_code(text: object, limit: int = MAX_CHARS) -> str:
    """For a name shown in a code span: one line, backticks, pipes and angle brackets replaced by look-alikes
    (ˋ ¦ ‹ ›) that cannot close the span, split a table cell, or be read as HTML by a lax renderer."""
    s = terminal(text, limit).translate(_CODE_LOOKALIKES)
    return f"`{s}`" if s.strip() else "` `"
