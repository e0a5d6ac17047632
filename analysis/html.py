"""One static HTML report: tables and figures (PNG embedded as base64), no scripts, opens from disk."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       color: #222; line-height: 1.45; padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2.2rem; }
table { border-collapse: collapse; font-size: .85rem; margin: .6rem 0 1.2rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: right; }
th { background: #f3f3f3; } td.text { text-align: left; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: .3rem 0; }
figure { margin: 1rem 0 1.6rem; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #555; } .notes li { margin: .2rem 0; } .meta { color: #666; font-size: .85rem; }
"""


@dataclass
class Section:
    title: str
    text: str = ""
    """Plain text (escaped); paragraphs separated by blank lines."""
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    figures: list[tuple[str, Path]] = field(default_factory=list)


def _cell(value: object) -> tuple[str, bool]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–", False
    if isinstance(value, bool):
        return ("yes" if value else "no"), True
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e4 or (value != 0 and abs(value) < 1e-2) else f"{value:.2f}", False
    if isinstance(value, (int,)):
        return str(value), False
    return html.escape(str(value)), True


def table_html(caption: str, frame: pd.DataFrame, max_rows: int = 200) -> str:
    """An escaped HTML table; longer frames are cut at `max_rows` (and say so)."""
    shown = frame.head(max_rows)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for record in shown.itertuples(index=False):
        cells = []
        for v in record:
            text, is_text = _cell(v.item() if hasattr(v, "item") else v)
            cells.append(f'<td class="text">{text}</td>' if is_text else f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = f" (first {max_rows} of {len(frame)} rows; all rows in the CSV)" if len(frame) > max_rows else ""
    body = "".join(rows) or f'<tr><td class="text" colspan="{max(len(shown.columns), 1)}">no rows</td></tr>'
    return (f"<table><caption>{html.escape(caption + more)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def figure_html(caption: str, png: Path) -> str:
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    alt = html.escape(caption, quote=True)
    return f'<figure><img src="data:image/png;base64,{data}" alt="{alt}"><figcaption>{alt}</figcaption></figure>'


def render_report(title: str, sections: list[Section], notes: list[str], source: str) -> str:
    """The whole report as one HTML string."""
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">Source: {html.escape(source)} · generated '
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC</p>",
    ]  # fmt: skip
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        parts += [f"<p>{html.escape(p)}</p>" for p in s.text.split("\n\n") if p.strip()]
        parts += [figure_html(c, p) for c, p in s.figures]
        parts += [table_html(c, f) for c, f in s.tables]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html_report(path: Path | str, title: str, sections: list[Section], notes: list[str], source: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(title, sections, notes, source), encoding="utf-8")
    return path
