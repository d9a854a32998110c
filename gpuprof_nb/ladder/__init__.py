"""The optimisation ladder: measure each rung (precision, compile, fused optimizer, gradient
accumulation, DataLoader settings, activation checkpointing) on the user's own model and keep
the ones that help.

`run_ladder(...) -> LadderReport`; `sweep_batch_sizes(...) -> BatchSweep`;
`load(path) -> LadderReport`. The runners import torch, so they load lazily: a saved report
can be loaded, compared and rendered without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuprof_nb.ladder.verdicts import (
    RUNG_NAMES,
    BatchPoint,
    BatchSweep,
    LadderComparison,
    LadderReport,
    RungResult,
    ThreeRunReading,
    find_plateau,
    load,
    read_three_runs,
)

_LAZY = {
    "run_ladder": "gpuprof_nb.ladder.rungs",
    "sweep_batch_sizes": "gpuprof_nb.ladder.rungs",
    "LoaderSettings": "gpuprof_nb.ladder.measure",
    "RungConfig": "gpuprof_nb.ladder.measure",
}

__all__ = [
    "RUNG_NAMES",
    "BatchPoint",
    "BatchSweep",
    "LadderComparison",
    "LadderReport",
    "LoaderSettings",
    "RungConfig",
    "RungResult",
    "ThreeRunReading",
    "find_plateau",
    "load",
    "read_three_runs",
    "run_ladder",
    "sweep_batch_sizes",
]

if TYPE_CHECKING:
    from gpuprof_nb.ladder.measure import LoaderSettings, RungConfig
    from gpuprof_nb.ladder.rungs import run_ladder, sweep_batch_sizes


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'gpuprof_nb.ladder' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
