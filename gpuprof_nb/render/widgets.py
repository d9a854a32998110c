"""The live ipywidgets view of a result (`result.widget()`): its sections as tabs, the same
HTML as the static report. It renders only while its kernel runs, so it is never the
default display (see render/bundle.py); ipywidgets is imported only when one is built.

Where the live view cannot render (an HTML export, a closed kernel, an untrusted notebook:
docs/viewers.md), its output must not be blank. Displaying it therefore publishes two
outputs: the widget view (with a one-line text/plain), then the static report, whose own
style hides it while the output before it holds a drawn widget. JupyterLab's untrusted
view shows the static report (widget views are not "safe" there); nbconvert shows it beside
a widget view with saved state (drawn by a script from a CDN, blank offline) and alone
without; JupyterLab after a kernel restart shows it under "Error displaying widget"."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render.html import STYLE, esc
from gpuprof_nb.render.sections import Section, report_text

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def live_kernel() -> bool:
    """True inside a Jupyter kernel (where a frontend may render widgets)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def widget_html(html: str) -> str:
    """Return a section's HTML wrapped with the report's style, as one widget tab shows it."""
    return f'<div class="gpuprof"><style>{STYLE}</style>{html}</div>'


# Hides the static copy while the output before it holds a drawn widget (JupyterLab and
# nbconvert's lab template wrap each output in .jp-OutputArea-child; a drawn VBox is a
# .widget-box; "Error displaying widget" is not).
_FALLBACK_STYLE = (
    ".jp-OutputArea-child:has(.widget-box) + .jp-OutputArea-child:has(.gp-widget-fallback)"
    " { display: none; }"
)
FALLBACK_NOTE = (
    "The live view (report.widget()) renders while its kernel runs. Where it cannot (an "
    "exported page, a closed kernel, an untrusted notebook), this is the same report, static."
)


def fallback_bundle(title: str, sections: Sequence[Section], static_html: str) -> dict[str, Any]:
    """Return the static report shown beside a live view: its HTML (`static_html`, the
    report's tabbed HTML) under a note, hidden by its own style while the widget before it
    is drawn, and the text."""
    html = (
        f'<div class="gp-widget-fallback"><style>{_FALLBACK_STYLE}</style>'
        f'<p class="note">{esc(FALLBACK_NOTE)}</p>{static_html}</div>'
    )
    return {"text/html": html, "text/plain": report_text(title, sections)}


@functools.cache
def _live_report_class() -> type:
    """The VBox every live view is: displayed, it publishes itself and its static copy."""
    import ipywidgets as widgets

    class LiveReport(widgets.VBox):  # type: ignore[misc]  # ipywidgets is untyped
        """A live report view (a VBox: title and tabs). Displaying it shows the widget and
        the static report beside it (see the module docstring)."""

        def __init__(
            self, children: Sequence[Any], title: str, sections: Sequence[Section], static: str
        ):
            super().__init__(list(children))
            self._gp_title = title
            self._gp_sections = tuple(sections)
            self._gp_static = static

        def __repr__(self) -> str:
            return f"<gpuprof_nb live view of {self._gp_title!r}: it renders while its kernel runs>"

        def _ipython_display_(self, **kwargs: Any) -> None:
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)
            fallback = fallback_bundle(self._gp_title, self._gp_sections, self._gp_static)
            display(fallback, raw=True)

    return LiveReport


def report_widget(title: str, sections: Sequence[Section], static_html: str) -> Any:
    """Return an ipywidgets VBox (title + Tab, one tab per section, the same HTML as the
    static report). Displayed, it shows the static report (`static_html`) beside it for
    viewers that cannot draw it (see the module docstring)."""
    import ipywidgets as widgets

    children = [widgets.HTML(widget_html(s.html)) for s in sections]
    tab = widgets.Tab(children=children)
    tab.titles = tuple(s.title for s in sections)
    head = widgets.HTML(f"<b>{esc(title)}</b>")
    return _live_report_class()([head, tab], title, sections, static_html)
