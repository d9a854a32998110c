"""Deprecated module: its names moved when the results layer was made (see CHANGELOG).

`MemoryReport` is in gpuprof_nb.results.report, `analyze_memory` in
gpuprof_nb.analysis.report; `gpuprof_nb.analyze_memory` and `gpuprof_nb.MemoryReport` are the
public names. Importing them from here still works, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    "MemoryReport": "gpuprof_nb.results.report",
    "analyze_memory": "gpuprof_nb.analysis.report",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'gpuprof_nb.memory_report' has no attribute {name!r}")
    where = _MOVED[name]
    warnings.warn(
        f"gpuprof_nb.memory_report.{name} moved to {where}.{name}", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(where), name)
