"""A report is a title and ordered sections; each section carries its text and HTML forms.
The same sections feed the static tabbed HTML (render/bundle.py), the live widget
(render/widgets.py) and the plain text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
