"""What displays results (the renderer the package root hands to results/display.py):
every render module registers the result types it shows (render/bundle.py), and importing
them here puts every registration in place before the first result is shown."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuprof_nb.gcpause import gc_paused
from gpuprof_nb.render import annotations as _annotations  # noqa: F401

# Imported for their registrations with report_of / text_of / widget_of.
from gpuprof_nb.render import (  # noqa: F401
    compare,
    compile,
    diagnosis,
    distributed,
    hotspots,
    ladder,
    memory,
    modules,
    profile,
    roofline,
    timeline,
)
from gpuprof_nb.render.bundle import report_bundle, report_of, text_of, widget_of
from gpuprof_nb.render.limits import visible_surrogates


def bundle(
    obj: object, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
) -> dict[str, Any]:
    """Return a result's mimebundle: tabbed HTML and text/plain (see render/bundle.py)."""
    with gc_paused():  # many short-lived strings; no collection need walk the trace
        title, sections = report_of(obj)
        return report_bundle(title, sections, include, exclude)


def text(obj: object) -> str:
    """Return a result's plain text, the same as its bundle's text/plain (lone surrogates
    replaced, so it prints on any terminal)."""
    return visible_surrogates(text_of(obj))


def widget(obj: object, **options: Any) -> Any:
    """Return a live ipywidgets view of a result; `options` go to its type's view (a
    ProfileReport's `resort`, render/profile.py)."""
    return widget_of(obj, **options) if options else widget_of(obj)
