"""The live widget (ipywidgets Tab) and the mimebundle that degrades to HTML and text.
ipywidgets is imported only when a live kernel frontend can show it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpuprof_nb.render.html import STYLE
from gpuprof_nb.render.sections import Section, report_html, report_text

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _live_kernel() -> bool:
    """True inside a Jupyter kernel (where a frontend may render widgets)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def report_widget(title: str, sections: Sequence[Section]) -> Any:
    """Return an ipywidgets.Tab with one tab per section (HTML content, same as static)."""
    import ipywidgets as widgets

    children = [widgets.HTML(f'<div class="gpuprof"><style>{STYLE}</style>{s.html}</div>')
                for s in sections]
    tab = widgets.Tab(children=children)
    tab.titles = tuple(s.title for s in sections)
    return widgets.VBox([widgets.HTML(f"<b>{title}</b>"), tab])


def report_bundle(
    title: str,
    sections: Sequence[Section],
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Return a mimebundle: the widget view where a live kernel has ipywidgets, plus the
    static HTML and the text, always. Respects IPython's include/exclude."""
    bundle: dict[str, Any] = {
        "text/plain": report_text(title, sections),
        "text/html": report_html(title, sections),
    }
    if _live_kernel():
        try:
            widget = report_widget(title, sections)
        except ImportError:
            widget = None
        if widget is not None:
            view = widget._repr_mimebundle_()
            if isinstance(view, tuple):  # some ipywidgets versions return (data, metadata)
                view = view[0]
            if view and WIDGET_MIME in view:
                bundle[WIDGET_MIME] = view[WIDGET_MIME]
    if include is not None:
        keep = set(include)
        bundle = {k: v for k, v in bundle.items() if k in keep}
    if exclude is not None:
        drop = set(exclude)
        bundle = {k: v for k, v in bundle.items() if k not in drop}
    return bundle
