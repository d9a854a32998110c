"""A report is a title and ordered sections; each section carries its text and HTML forms.
The same sections feed the static tabbed HTML (render/bundle.py), the live widget
(render/widgets.py) and the plain text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuprof_nb.render.limits import MAX_SHOWN_CHARS, clip
from gpuprof_nb.render.text import heading

# A line of text longer than this (a finding's title naming a name of millions of
# characters) is cut; table rows are far narrower, as their cells are cut already.
_MAX_LINE_CHARS = 4 * MAX_SHOWN_CHARS


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    text: str
    html: str


def report_text(title: str, sections: Sequence[Section]) -> str:
    """Return the whole report as plain text, sections in order."""
    parts = [heading(title)]
    for s in sections:
        parts.append(f"\n-- {s.title} --\n{_clip_lines(s.text)}")
    return "\n".join(parts)


def _clip_lines(text: str) -> str:
    if len(text) <= _MAX_LINE_CHARS or all(
        len(line) <= _MAX_LINE_CHARS for line in text.split("\n")
    ):
        return text
    return "\n".join(clip(line, _MAX_LINE_CHARS) for line in text.split("\n"))
