"""One rule for text an agent chose (checkpoint names, stage labels, its log lines and tool calls, error text):
wherever the harness shows it, it stays text. It never becomes markdown structure in report.md or a Prefect
artifact, terminal control on a console or in a log, or Rich markup in the live display; and it is bounded.

Every function starts from `terminal`: escape sequences (CSI, OSC with its hyperlinks, DCS...) removed, then every
control (Unicode category Cc), format (Cf: the Bidi_Control marks and overrides U+061C, U+200E/F, U+202A-E,
U+2066-9, zero-width and invisible characters, soft hyphen...) and line or paragraph separator (Zl, Zp)
character, tabs and newlines made spaces, the text cut with `…`. `md_text`, `md_code`, `rich` and `cell` then
make it inert for their sink.
"""

from __future__ import annotations

import re
import unicodedata

MAX_CHARS = 200
"""Default bound on one piece of agent text as shown (the full text stays in the harness's own files)."""

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?|[@-Z\\-_])")
"""CSI (colours, cursor moves, screen clears), OSC (window titles, hyperlinks), DCS/SOS/PM/APC strings, and the
two-byte escapes."""

_INVISIBLE = frozenset(("Cc", "Cf", "Zl", "Zp"))
"""C0 (bar newline, handled apart), DEL, C1, and every format character: the bidirectional marks and overrides that
reorder what a reader sees (U+061C, U+200E/F, U+202A-E, U+2066-9), zero-width and invisible characters; line and
paragraph separators."""
_PRE_CUT = 16
"""Text longer than `limit * _PRE_CUT` characters is cut before it is cleaned (a megabyte line costs no more)."""
_CODE_LOOKALIKES = str.maketrans({"`": "ˋ", "|": "¦", "<": "‹", ">": "›"})
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def _bound(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def _visible(s: str) -> str:
    if s.isprintable():  # the usual case: no character of Cc, Cf, Zl, Zp (nor other separators but the space)
        return s
    return "".join(c for c in s if c == "\n" or unicodedata.category(c) not in _INVISIBLE)


def terminal(text: object, limit: int = MAX_CHARS, keep_lines: bool = False) -> str:
    """For a terminal or a log line: escape sequences and control characters removed (BEL, backspace, carriage
    return, C1, bidi overrides), tabs and newlines made spaces (kept as newlines with `keep_lines`), bounded."""
    raw = str(text)
    raw = raw[: max(limit, 64) * _PRE_CUT + 1] if len(raw) > max(limit, 64) * _PRE_CUT else raw
    s = _visible(_ANSI.sub("", raw.replace("\t", " ")).replace("\r\n", "\n"))
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


def cell(text: object, limit: int = MAX_CHARS) -> str:
    """For a cell of a Prefect table artifact (or any table shown as text or markdown): `terminal`, then backticks,
    pipes and angle brackets replaced by look-alikes (ˋ ¦ ‹ ›) that neither split a row nor read as HTML."""
    return terminal(text, limit).translate(_CODE_LOOKALIKES)


def cells(rows: list[dict]) -> list[dict]:
    """Rows of a table artifact with every text value passed through `cell` (numbers and None as they are)."""
    return [{k: cell(v) if isinstance(v, str) else v for k, v in row.items()} for row in rows]
