"""A report is a title and ordered sections; each section carries its text and HTML forms.
The same sections feed the live widget (tabs), the static HTML and the plain text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuprof_nb.render.html import STYLE, esc
from gpuprof_nb.render.text import heading


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    text: str
    html: str


def report_text(title: str, sections: Sequence[Section]) -> str:
    """Return the whole report as plain text, sections in order."""
    parts = [heading(title)]
    for s in sections:
        parts.append(f"\n-- {s.title} --\n{s.text}")
    return "\n".join(parts)


def report_html(title: str, sections: Sequence[Section], *, open_first: int = 2) -> str:
    """Return self-contained static HTML: every section present (no JavaScript needed, so
    nbviewer, GitHub and nbconvert show it), the first `open_first` expanded."""
    body = "".join(
        f'<details{" open" if i < open_first else ""} data-section="{esc(s.title)}">'
        f"<summary>{esc(s.title)}</summary>{s.html}</details>"
        for i, s in enumerate(sections)
    )
    return (
        f'<div class="gpuprof"><style>{STYLE}</style>'
        f"<h3>{esc(title)}</h3>{body}</div>"
    )
