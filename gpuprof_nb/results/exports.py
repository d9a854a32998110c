"""Exports every report shares (ProfileReport, MemoryReport, RunReport, Comparison): JSON,
Markdown, and the headline numbers sent to an experiment tracker. Built by the render layer
(render/records.py, render/markdown.py, render/trackers.py), handed to this module by the
package root the way results/display.py gets its renderer: results never import render."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.guards import check_writable, open_for_writing
from gpuprof_nb.model.arguments import describe


class Exporter(Protocol):
    """What the render layer provides for exports."""

    def record(self, obj: object) -> dict[str, Any]: ...

    def markdown(self, obj: object) -> str: ...

    def log_to(self, obj: object, run: Any, prefix: str, step: int | None) -> dict[str, float]: ...

    def to_tensorboard(
        self, obj: object, writer: Any, prefix: str, step: int
    ) -> dict[str, float]: ...


_exporter: Exporter | None = None


def use_exporter(exporter: Exporter) -> None:
    """Set what builds exports (the package root does, once, on import)."""
    global _exporter
    _exporter = exporter


def _current() -> Exporter:
    if _exporter is None:  # pragma: no cover - the package root always sets one
        raise RuntimeError("gpuprof_nb's exporter is not set; import gpuprof_nb first")
    return _exporter


def write_export(text: str, path: str | os.PathLike[str], what: str = "the export") -> Path:
    """Write `text` (UTF-8) at `path`, creating its folder; return the path. A path that is
    not a regular file (a FIFO, a directory, a device) is refused before opening: writing to
    a FIFO waits for a reader forever. Every failure is a GpuprofError naming the path."""
    if not isinstance(path, (str, os.PathLike)):
        raise GpuprofError(f"the path to write {what} to must be a string, got {describe(path)}")
    target = Path(check_writable(path, what=what, error=GpuprofError))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuprofError(f"cannot write {target}: {exc.strerror or exc}") from None
    with open_for_writing(target, what=what, error=GpuprofError) as out:
        try:
            out.write(text.encode("utf-8", "replace"))
        except OSError as exc:
            raise GpuprofError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


# json.dumps indents each level by this much at most (an indent of 10**9 spaces would make
# a report of a few kB take gigabytes).
MAX_INDENT = 16


def _check_indent(indent: Any) -> int | str | None:
    if indent is None:
        return None
    if isinstance(indent, str) and len(indent) <= MAX_INDENT and not indent.strip():
        return indent
    if isinstance(indent, int) and not isinstance(indent, bool) and 0 <= indent <= MAX_INDENT:
        return indent
    raise GpuprofError(
        f"to_json's indent must be None, 0 to {MAX_INDENT} spaces or a short whitespace "
        f"string, got {describe(indent)}"
    )


class Exportable:
    """Mixin for reports: `to_dict`, `to_json`, `to_markdown`, `headline`, `log_to` and
    `to_tensorboard` (docs/exports.md)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the report as the JSON-able record of the export schema: `schema`,
        `schema_version`, `kind`, `headline` (scalars, units in their names) and the
        report's own fields (docs/exports.md)."""
        return _current().record(self)

    def headline(self) -> dict[str, float]:
        """Return the headline scalars (what log_to and to_tensorboard send), units in
        their names: `step_time_us`, `peak_memory_bytes`, `finding/<kind>/share_fraction`."""
        return dict(self.to_dict()["headline"])

    def to_json(self, path: str | os.PathLike[str] | None = None, *, indent: int = 2) -> str:
        """Return the record as JSON text (keys in a stable order); with `path`, also write
        it there."""
        text = json.dumps(self.to_dict(), indent=_check_indent(indent), allow_nan=False) + "\n"
        if path is not None:
            write_export(text, path, "the JSON export")
        return text

    def to_markdown(self, path: str | os.PathLike[str] | None = None) -> str:
        """Return the report as Markdown for a pull-request comment or a CI job summary
        (the headline, the findings, the full text folded); with `path`, also write it."""
        text = _current().markdown(self)
        if path is not None:
            write_export(text, path, "the Markdown export")
        return text

    def log_to(
        self, run: Any, *, prefix: str = "gpuprof/", step: int | None = None
    ) -> dict[str, float]:
        """Log the headline scalars to a W&B run, an MLflow run (or the `mlflow` module's
        active run); return what was logged. The tracker is imported only here."""
        return _current().log_to(self, run, prefix, step)

    def to_tensorboard(
        self, writer: Any, *, prefix: str = "gpuprof/", step: int = 0
    ) -> dict[str, float]:
        """Write the headline scalars to a TensorBoard SummaryWriter at `step`; return them."""
        return _current().to_tensorboard(self, writer, prefix, step)
