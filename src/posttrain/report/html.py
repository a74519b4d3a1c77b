"""HTML pieces the pages are made of: a self-contained document, sections, escaped tables.

Every value that comes from data (prompts, completions, reasons, names) goes through `html.escape` here, so
a page builder never writes raw text into markup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

_CSS = """
.posttrain-report{font-family:system-ui,sans-serif;color:#222}
.posttrain-report section{margin-bottom:1.5em}
.posttrain-report figure.chart{display:inline-block;margin:0.3em}
.posttrain-report figure.chart svg{max-width:100%;height:auto}
.posttrain-report table{border-collapse:collapse;font-size:0.85em;margin:0.3em 0}
.posttrain-report th,.posttrain-report td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
.posttrain-report td.text{white-space:pre-wrap;max-width:40em;font-family:monospace,monospace}
.posttrain-report .note{color:#555;font-size:0.85em}
.posttrain-report .ok{color:#1a7f37;font-weight:bold}
.posttrain-report .bad{color:#cf222e;font-weight:bold}
"""
"""Scoped to the report's own <div>: inside a Flyte Deck the page shares the document with Flyte's tabs."""


def esc(value: object) -> str:
    """`value` as HTML-escaped text; floats with 4 significant digits, None as an em dash."""
    if value is None:
        return "&mdash;"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def page(title: str, sections: Iterable[str]) -> str:
    """One report as an HTML fragment - a `<div class="posttrain-report">` with its own inline CSS, no scripts
    and no external resources - ready to be a Flyte Deck tab, or a file through `document`."""
    body = "\n".join(sections)
    return f'<div class="posttrain-report"><style>{_CSS}</style><h1>{esc(title)}</h1>\n{body}\n</div>'


def document(fragment: str, title: str) -> str:
    """A complete HTML document around a `page` fragment, for a file opened from disk."""
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{esc(title)}</title></head>\n'
            f"<body>{fragment}</body></html>\n")


def section(name: str, title: str, *parts: str) -> str:
    """A titled `<section id="section-<name>">` holding `parts` (already HTML)."""
    return f'<section id="section-{name}"><h2>{esc(title)}</h2>\n' + "\n".join(parts) + "\n</section>"


def note(text: str) -> str:
    """A small explanatory paragraph (escaped)."""
    return f'<p class="note">{esc(text)}</p>'


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, text_columns: Sequence[int] = ()) -> str:
    """An escaped table (no header row when `headers` is empty); `text_columns` (indexes) keep line breaks and
    use a monospace font (prompts, completions)."""
    head = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>" if headers else ""
    body = "".join("<tr>" + "".join(f'<td class="text">{esc(v)}</td>' if i in text_columns else f"<td>{esc(v)}</td>"
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def key_values(items: dict) -> str:
    """A two-column table of `items` (name, value)."""
    return table((), items.items())
