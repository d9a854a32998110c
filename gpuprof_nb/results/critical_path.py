"""The critical path of one step: the chain of host work, launches, kernels and waits that
set when the step ended (built by analysis/critical_path.py). Microseconds."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, overload

from gpuprof_nb.results.display import Displayable

SegmentKind = Literal[
    "cpu", "runtime", "python", "sync", "launch", "kernel", "gpu_gap", "stream_wait"
]
SEGMENT_KINDS: tuple[SegmentKind, ...] = (
    "cpu",
    "runtime",
    "python",
    "sync",
    "launch",
    "kernel",
    "gpu_gap",
    "stream_wait",
)


@dataclass(frozen=True, slots=True)
class PathSegment:
    """One stretch of the path, [start_us, end_us]: what the step waited on then.

    `kind`: `cpu` a torch op's own time on a host thread (`name` the innermost op),
    `runtime` a CUDA/HIP runtime call's time, `python` host time in no op (`name` the
    enclosing record_function range, or empty), `sync` a blocking call returning after the
    device work it waited for had ended, `launch` from a launch call's start to its kernel's
    start (the kernel waited for the host), `kernel` a device activity running (`name` the
    kernel, memcpy or memset), `gpu_gap` a stream idle between two of its activities,
    `stream_wait` a stream waiting on an event recorded on another. `where` names the host
    thread or device stream; `context` the outermost torch op around a host stretch; `index`
    the event's position in the trace file (-1 for gaps and Python stretches)."""

    start_us: float
    end_us: float
    kind: SegmentKind
    name: str
    where: str
    context: str = ""
    # The event's position in the trace file (Op/RuntimeCall/Kernel.index); -1 for a gap.
    index: int = -1

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class PathSync:
    """A blocking call on the path: where the host waited for the device. `device_us` is
    the path's device-side time leading to it (kernels, gaps and launches between the host
    stretch before it and its return)."""

    name: str
    context: str
    start_us: float
    end_us: float
    device_us: float


@dataclass(frozen=True, slots=True, repr=False)
class CriticalPath(Displayable):
    """The critical path of the median step (or of the whole window, without steps), as the
    ordered list of its segments: they tile [start_us, end_us] exactly, so their durations
    add up to the step's length. Iterating, indexing and len() go over the segments.

    `by_category_us` adds the segments up by what they are (host ops, Python, GPU kernels,
    launch latency...), largest first. `syncs` are the blocking calls on the path. Kernels of
    the step off the path: how many, their device time, and their median slack (how much
    later each could have ended without delaying the step's end)."""

    step_number: int | None
    step_name: str
    start_us: float
    end_us: float
    segments: tuple[PathSegment, ...]
    by_category_us: tuple[tuple[str, float], ...] = ()
    syncs: tuple[PathSync, ...] = ()
    off_path_kernels: int = 0
    off_path_kernel_us: float = 0.0
    median_slack_us: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us

    def fraction(self, category: str) -> float:
        """Return one category's share (0..1) of the path (0 for an empty step)."""
        us = dict(self.by_category_us).get(category, 0.0)
        return us / self.dur_us if self.dur_us > 0 else 0.0

    @property
    def slack_fraction(self) -> float | None:
        """The off-path kernels' median slack as a share of the step (None without them)."""
        if self.median_slack_us is None or not math.isfinite(self.median_slack_us):
            return None
        if self.dur_us <= 0:
            return None
        return min(self.median_slack_us / self.dur_us, 1.0)

    def __iter__(self) -> Iterator[PathSegment]:
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.segments)

    @overload
    def __getitem__(self, i: int) -> PathSegment: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[PathSegment, ...]: ...
    def __getitem__(self, i: int | slice) -> PathSegment | tuple[PathSegment, ...]:
        return self.segments[i]

    def __repr__(self) -> str:
        what = f"step {self.step_number}" if self.step_number is not None else "the window"
        top = ", ".join(f"{c} {us:.4g} us" for c, us in self.by_category_us[:3])
        return f"<CriticalPath of {what}: {self.dur_us:.4g} us in {len(self)} segments; {top}>"
