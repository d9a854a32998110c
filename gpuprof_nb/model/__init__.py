"""Frozen dataclasses that every layer above io shares. No torch, IPython or ipywidgets here."""

from gpuprof_nb.model.trace import (
    DeviceInfo,
    DistributedInfo,
    GpuAnnotation,
    Kernel,
    MemoryEvent,
    Op,
    RuntimeCall,
    Step,
    SyncEvent,
    Trace,
)

__all__ = [
    "DeviceInfo",
    "DistributedInfo",
    "GpuAnnotation",
    "Kernel",
    "MemoryEvent",
    "Op",
    "RuntimeCall",
    "Step",
    "SyncEvent",
    "Trace",
]
