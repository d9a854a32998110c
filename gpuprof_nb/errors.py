"""The exceptions gpuprof_nb raises: one base class, one subclass per kind of failure."""

from __future__ import annotations


class GpuprofError(Exception):
    """Base class of every error gpuprof_nb raises on purpose."""


class TraceFormatError(GpuprofError):
    """A trace file or dict is not a torch.profiler / Kineto Chrome trace we can read."""


class SnapshotFormatError(GpuprofError):
    """A memory snapshot is malformed, or its pickle names a class or function."""


class CaptureError(GpuprofError):
    """Recording a cell (timing, profiler, memory history) failed for a reason of ours."""


class OptionError(GpuprofError):
    """An option of a run that cannot be used: `option` names it (`--fit`), the message
    says why. The magics turn it into IPython's UsageError."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}" if option else message)
        self.option = option
        self.reason = message
