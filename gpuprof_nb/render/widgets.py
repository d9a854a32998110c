"""The live ipywidgets view of a result (`result.widget()`): its sections as tabs, the same
HTML as the static report. It renders only while its kernel runs, so it is never the
default display (see render/bundle.py); ipywidgets is imported only when one is built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render.html import STYLE, esc
from gpuprof_nb.render.sections import Section

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


def report_widget(title: str, sections: Sequence[Section]) -> Any:
    """Return an ipywidgets VBox (title + Tab, one tab per section, the same HTML as the
    static report). Only for explicit `display()`: it renders only while its kernel lives."""
    import ipywidgets as widgets

    children = [widgets.HTML(widget_html(s.html)) for s in sections]
    tab = widgets.Tab(children=children)
    tab.titles = tuple(s.title for s in sections)
    return widgets.VBox([widgets.HTML(f"<b>{esc(title)}</b>"), tab])
