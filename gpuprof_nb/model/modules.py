"""What gpuprof_nb's module recorder kept beside a profiled run (capture/modules.py): that
nn.Module ranges were recorded, how many calls, each module path's class, and the first
input of each root module (for samples and tokens per second). Read by io/modules.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RootInput:
    """A module called at the top (no module around it): its path, class, calls in the
    profiled run, and the shape and dtype of the first tensor it was given (None when it was
    given no tensor)."""

    path: str
    module_type: str
    calls: int
    input_shape: tuple[int, ...] | None = None
    input_dtype: str | None = None


@dataclass(frozen=True, slots=True)
class ModuleCapture:
    """The module recorder's summary: ranges are named `prefix + path`; `calls` ranges were
    opened in all; `types` maps each path to its module's class name."""

    recorded: bool
    prefix: str
    calls: int
    roots: tuple[RootInput, ...] = ()
    types: Mapping[str, str] = field(default_factory=dict)
    note: str = ""
