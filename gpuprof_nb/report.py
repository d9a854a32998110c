"""Deprecated module: its names moved when the results layer was made (see CHANGELOG).

`ProfileReport` is in gpuprof_nb.results.report, `analyze` and `count_steps_per_run` in
gpuprof_nb.analysis.report, `save_trace_dict` in gpuprof_nb.io.trace. `gpuprof_nb.analyze`
and `gpuprof_nb.ProfileReport` are the public names. Importing them from here still works,
with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    "ProfileReport": "gpuprof_nb.results.report",
    "analyze": "gpuprof_nb.analysis.report",
    "count_steps_per_run": "gpuprof_nb.analysis.report",
    "save_trace_dict": "gpuprof_nb.io.trace",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'gpuprof_nb.report' has no attribute {name!r}")
    where = _MOVED[name]
    warnings.warn(
        f"gpuprof_nb.report.{name} moved to {where}.{name}", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(where), name)
