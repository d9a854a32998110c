"""The mimebundle every result displays: tabbed HTML that needs no JavaScript, plus text;
and the registry that says which sections each result type shows.

Every render module registers its result types with `report_of` (title and sections);
`render/display.py` imports them all and is what the package root hands to
`results.display` (see there). A result type can also register its own `text_of` (a
shorter way to the same text) or `widget_of` (a richer live view).

Why no ipywidgets view in the bundle: a `application/vnd.jupyter.widget-view+json` output
outranks `text/html` in every frontend, yet it only renders while the kernel that made it is
alive (JupyterLab shows "Error displaying widget: model not found" after a restart, VS Code the
same), and where widget state was saved (nbclient and `nbconvert --execute` save it by default)
nbconvert and nbviewer replace the HTML with a script that loads the widget manager from a CDN,
so the report is blank offline. Tabs made of radio inputs and CSS (`render/html.STYLE`) are
clickable in JupyterLab, VS Code, Colab, nbconvert and nbviewer, and where CSS is stripped
(GitHub) every section simply shows one after the other. `render/widgets.py` builds the live
ipywidgets view for code that asks for one (`result.widget()`).
"""

from __future__ import annotations

import functools
import hashlib
import html as _html
from collections.abc import Iterable, Sequence
from typing import Any

from gpuprof_nb.render.html import STYLE, esc
from gpuprof_nb.render.limits import MAX_REPORT_CHARS, visible_surrogates
from gpuprof_nb.render.sections import Section, report_text


@functools.singledispatch
def report_of(obj: object) -> tuple[str, Sequence[Section]]:
    """Return (title, sections) of a result; each render module registers its types."""
    raise TypeError(f"gpuprof_nb has no display for a {type(obj).__name__}")


@functools.singledispatch
def text_of(obj: object) -> str:
    """Return a result's plain text: every section in order (types may register a shorter
    way to the same text)."""
    title, sections = report_of(obj)
    return report_text(title, sections)


@functools.singledispatch
def widget_of(obj: object) -> Any:
    """Return a live ipywidgets view of a result: its sections as tabs (types may register
    a richer view)."""
    from gpuprof_nb.render.widgets import report_widget

    title, sections = report_of(obj)
    return report_widget(title, sections, tabbed_html(title, sections))


def _group_and_surrogates(title: str, sections: Sequence[Section]) -> tuple[str, bool]:
    """Return (a radio-group name unique to this report's content, whether the title or a
    section's title or HTML holds a lone surrogate). The name is deterministic, so the same
    report renders to the same bytes; two identical reports on one page share a group, and
    the CSS then falls back to showing the first tab of the one left unchecked. The digest
    encodes every section's HTML anyway: encoding strictly first tells, in the same pass,
    whether the report's HTML needs `visible_surrogates` (the rest of it is fixed markup and
    escaped titles)."""
    surrogates = False

    def encoded(text: str) -> bytes:
        nonlocal surrogates
        try:
            # The same bytes as with "surrogatepass" wherever there is no lone surrogate.
            return text.encode("utf-8")
        except UnicodeEncodeError:
            surrogates = True
            return text.encode("utf-8", "surrogatepass")

    digest = hashlib.sha1(encoded(title))
    for s in sections:
        # One update per piece hashes the same bytes as their concatenation.
        digest.update(b"\x00")
        digest.update(encoded(s.title))
        digest.update(b"\x00")
        digest.update(encoded(s.html))
    return "gp-" + digest.hexdigest()[:12], surrogates


# The first line of the report where a viewer strips its style (docs/viewers.md): what the
# full view adds and how to get it. The report's own style hides it.
BANNER = (
    "Static view: sections follow one another and charts are pictures. Trust the notebook "
    "(JupyterLab: command palette, Trust Notebook) or run the cell again for tabs and "
    "charts with numbers on hover; every number is also in the tables."
)
_BANNER_STYLE = "border-left:3px solid #1565c0;padding:2px 8px;margin:2px 0 8px 0"


def tabbed_html(title: str, sections: Sequence[Section]) -> str:
    """Return self-contained HTML for the report: one clickable tab per section, made of
    radio inputs and CSS only (no script, no CDN). Where a viewer strips the style (an
    untrusted notebook, GitHub) a one-line banner comes first, the tab bar is hidden and
    every section shows in order under its own heading."""
    return _tabbed_html(title, sections)[0]


def _tabbed_html(title: str, sections: Sequence[Section]) -> tuple[str, bool]:
    """Return (tabbed_html, whether it may hold a lone surrogate: see
    _group_and_surrogates)."""
    group, surrogates = _group_and_surrogates(title, sections)
    labels = " ".join(
        f'<label class="gp-tab" title="{esc(s.title)}">'
        f'<input type="radio" name="{group}" value="{i}"{" checked" if i == 0 else ""}/>'
        f"{esc(s.title)}</label>"
        for i, s in enumerate(sections)
    )
    panels = "".join(
        f'<div class="gp-panel" data-section="{esc(s.title)}">'
        f'<h4 class="gp-h">{esc(s.title)}</h4>{s.html}</div>'
        for s in sections
    )
    html = (
        f'<div class="gpuprof gp-report"><style>{STYLE}</style>'
        f'<p class="gp-banner" style="{_BANNER_STYLE}">{esc(BANNER)}</p>'
        f'<h3>{esc(title)}</h3><div class="gp-tabs">'
        f'<div class="gp-tabbar" hidden="hidden" style="display:none">{labels}</div>'
        f'<div class="gp-panels">{panels}</div></div></div>'
    )
    return html, surrogates


def report_bundle(
    title: str,
    sections: Sequence[Section],
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Return a mimebundle {"text/html": tabbed HTML, "text/plain": the text report}, the
    same in a live kernel, nbconvert, nbviewer or a saved file. Respects IPython's
    include/exclude."""
    sections = _bounded(sections)
    html, surrogates = _tabbed_html(title, sections)
    bundle: dict[str, Any] = {
        "text/plain": visible_surrogates(report_text(title, sections)),
        "text/html": visible_surrogates(html) if surrogates else html,
    }
    return _filtered(bundle, include, exclude)


def _bounded(sections: Sequence[Section]) -> Sequence[Section]:
    """Return the sections, the largest ones shortened until the report's HTML and text
    each fit in MAX_REPORT_CHARS (render/limits.py): each cut section says so and where
    its numbers are. Real reports are far smaller, and pass through unchanged."""
    html = sum(len(s.html) for s in sections)
    text = sum(len(s.text) for s in sections)
    if html <= MAX_REPORT_CHARS and text <= MAX_REPORT_CHARS:
        return sections
    share = MAX_REPORT_CHARS // (2 * max(len(sections), 1))
    out = []
    for s in sections:
        if len(s.html) <= share and len(s.text) <= share:
            out.append(s)
            continue
        why = (
            f"This section is too large to show whole ({len(s.html):,} characters of HTML, "
            f"{len(s.text):,} of text); its start is below. The result object holds every value."
        )
        body = s.text[:share]
        out.append(
            Section(
                s.title,
                f"{why}\n{body}",
                f'<p class="note">{esc(why)}</p><pre>{_html.escape(body)}</pre>',
            )
        )
    return out


def _filtered(
    bundle: dict[str, Any], include: Iterable[str] | None, exclude: Iterable[str] | None
) -> dict[str, Any]:
    if include is not None:
        keep = set(include)
        bundle = {k: v for k, v in bundle.items() if k in keep}
    if exclude is not None:
        drop = set(exclude)
        bundle = {k: v for k, v in bundle.items() if k not in drop}
    return bundle
