"""gpuprof_nb: Jupyter-native profiling for PyTorch.

`%load_ext gpuprof_nb`, then `%%gpuprofile` or `%%memsnap` on a cell. Offline:
`load_trace` + `analyze` (+ `diagnose`), `load_snapshot` + `analyze_memory`, `compare`,
`analyze_run` (every rank of a distributed run). Scripts and CI: `profile_function`,
`save_baseline` / `load_baseline`, and the `gpuprof` command line (cli.py).

Public names are imported lazily so `import gpuprof_nb` pulls in neither torch nor IPython.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuprof_nb.errors import CaptureError, GpuprofError, SnapshotFormatError, TraceFormatError
from gpuprof_nb.results import display as _display
from gpuprof_nb.results import exports as _exports
from gpuprof_nb.results import fit as _fit
from gpuprof_nb.version import __version__ as __version__

_LAZY: dict[str, tuple[str, str]] = {
    "load_trace": ("gpuprof_nb.io.trace", "load_trace"),
    "analyze": ("gpuprof_nb.session.analyze", "analyze"),
    "compare": ("gpuprof_nb.session.analyze", "compare"),
    "Comparison": ("gpuprof_nb.results.compare", "Comparison"),
    "ProfileReport": ("gpuprof_nb.results.report", "ProfileReport"),
    "diagnose": ("gpuprof_nb.analysis.diagnose", "diagnose"),
    "load_snapshot": ("gpuprof_nb.io.snapshot", "load_snapshot"),
    "analyze_memory": ("gpuprof_nb.session.analyze", "analyze_memory"),
    "analyze_batches": ("gpuprof_nb.session.analyze", "analyze_batches"),
    "MemoryReport": ("gpuprof_nb.results.report", "MemoryReport"),
    "measure_ceilings": ("gpuprof_nb.capture.device", "measure_ceilings"),
    "analyze_run": ("gpuprof_nb.session.distributed", "analyze_run"),
    "RunReport": ("gpuprof_nb.results.distributed", "RunReport"),
    "profile_function": ("gpuprof_nb.session.functions", "profile_function"),
    "save_baseline": ("gpuprof_nb.session.baselines", "save_baseline"),
    "load_baseline": ("gpuprof_nb.session.baselines", "load_baseline"),
}

__all__ = [
    "CaptureError",
    "Comparison",
    "GpuprofError",
    "MemoryReport",
    "ProfileReport",
    "RunReport",
    "SnapshotFormatError",
    "TraceFormatError",
    "analyze",
    "analyze_batches",
    "analyze_memory",
    "analyze_run",
    "compare",
    "diagnose",
    "ladder",
    "load_baseline",
    "load_ipython_extension",
    "load_snapshot",
    "load_trace",
    "measure_ceilings",
    "profile_function",
    "save_baseline",
]

if TYPE_CHECKING:
    from gpuprof_nb.analysis.diagnose import diagnose
    from gpuprof_nb.capture.device import measure_ceilings
    from gpuprof_nb.io.snapshot import load_snapshot
    from gpuprof_nb.io.trace import load_trace
    from gpuprof_nb.results.compare import Comparison
    from gpuprof_nb.results.distributed import RunReport
    from gpuprof_nb.results.report import MemoryReport, ProfileReport
    from gpuprof_nb.session.analyze import analyze, analyze_batches, analyze_memory, compare
    from gpuprof_nb.session.baselines import load_baseline, save_baseline
    from gpuprof_nb.session.distributed import analyze_run
    from gpuprof_nb.session.functions import profile_function


def __getattr__(name: str) -> Any:
    if name == "ladder":  # the optimisation ladder, a subpackage (torch only when it runs)
        module = importlib.import_module("gpuprof_nb.ladder")
        globals()[name] = module
        return module
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'gpuprof_nb' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


class _Renderer:
    """Displays results (see results/display.py): the render layer, imported on first use."""

    def bundle(self, obj: object, include: Any, exclude: Any) -> dict[str, Any]:
        from gpuprof_nb.render.display import bundle

        return bundle(obj, include, exclude)

    def text(self, obj: object) -> str:
        from gpuprof_nb.render.display import text

        return text(obj)

    def widget(self, obj: object) -> Any:
        from gpuprof_nb.render.display import widget
        from gpuprof_nb.session.analyze import ops_resort

        resort = ops_resort(obj)
        return widget(obj, resort=resort) if resort is not None else widget(obj)


_display.use_renderer(_Renderer())


class _Exporter:
    """Builds exports (see results/exports.py): the render layer, imported on first use."""

    def record(self, obj: object) -> dict[str, Any]:
        from gpuprof_nb.render.records import record

        return record(obj)

    def markdown(self, obj: object) -> str:
        from gpuprof_nb.render.markdown import markdown

        return markdown(obj)

    def log_to(self, obj: object, run: Any, prefix: str, step: int | None) -> dict[str, float]:
        from gpuprof_nb.render.trackers import log_to

        return log_to(obj, run, prefix=prefix, step=step)

    def to_tensorboard(self, obj: object, writer: Any, prefix: str, step: int) -> dict[str, float]:
        from gpuprof_nb.render.trackers import to_tensorboard

        return to_tensorboard(obj, writer, prefix=prefix, step=step)


_exports.use_exporter(_Exporter())


def _plan_checkpointing(*args: Any, **kwargs: Any) -> Any:
    """Builds MemoryReport.checkpoint_plan (results never import analysis)."""
    from gpuprof_nb.analysis.plan import plan_checkpointing

    return plan_checkpointing(*args, **kwargs)


_fit.use_planner(_plan_checkpointing)


def load_ipython_extension(ipython: Any) -> None:
    """Register %%gpuprofile and %%memsnap (called by `%load_ext gpuprof_nb`)."""
    from gpuprof_nb.magics import register

    register(ipython)
