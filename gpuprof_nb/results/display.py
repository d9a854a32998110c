"""One display path for every result users hold (the way rich's JupyterMixin works): the
`Displayable` mixin gives a result `_repr_mimebundle_` (what Jupyter shows: tabbed HTML
and text/plain) and `text()`, both built by the render layer.

Results never import render: imports point down, from render to results. The package root
(`gpuprof_nb/__init__.py`, above every layer and always imported before any of its modules)
hands this module the renderer with `use_renderer`; it imports `gpuprof_nb.render` only when
something is first displayed, so results stay cheap to build and to test.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


class Renderer(Protocol):
    """What the render layer provides: a result's mimebundle, its plain text and a live
    widget view."""

    def bundle(
        self, obj: object, include: Iterable[str] | None, exclude: Iterable[str] | None
    ) -> dict[str, Any]: ...

    def text(self, obj: object) -> str: ...

    def widget(self, obj: object) -> Any: ...


_renderer: Renderer | None = None


def use_renderer(renderer: Renderer) -> None:
    """Set what displays results (the package root does, once, on import)."""
    global _renderer
    _renderer = renderer


def _current() -> Renderer:
    if _renderer is None:  # pragma: no cover - the package root always sets one
        raise RuntimeError("gpuprof_nb's renderer is not set; import gpuprof_nb first")
    return _renderer


class Displayable:
    """Mixin for results: Jupyter displays them as tabbed HTML with text beside it."""

    __slots__ = ()

    def _repr_mimebundle_(
        self, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
    ) -> dict[str, Any]:
        return _current().bundle(self, include, exclude)

    def text(self) -> str:
        """Return the result as plain text (its bundle's text/plain)."""
        return _current().text(self)

    def widget(self) -> Any:
        """Return a live ipywidgets view of the result (it renders only while its kernel
        runs, so the default display is the durable HTML): `display(result.widget())`."""
        return _current().widget(self)
