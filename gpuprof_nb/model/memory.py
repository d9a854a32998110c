"""A CUDA caching-allocator memory snapshot as compact, frozen model objects.

What `torch.cuda.memory._snapshot()` returns (and `_dump_snapshot` pickles) has two parts:
the allocator's state at dump time (`segments`, each with its `blocks`) and the recorded
history (`device_traces`, one list of entries per device). The history can hold millions of
entries, so it is stored here column-wise (one numpy array per field, one row per entry)
with the stack traces interned once in a frame table, instead of one Python object per
entry. Sizes and addresses are bytes; times are microseconds on the allocator's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuprof_nb.model.frames import Frame
from gpuprof_nb.model.step import StepRecord

# Trace entry actions in the order of their codes in `DeviceTrace.action`. "other" keeps
# entries of actions newer than this list (they are counted, never replayed).
ACTIONS: tuple[str, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "other",
)
ACTION_CODE: Mapping[str, int] = {name: code for code, name in enumerate(ACTIONS)}

ALLOC = ACTION_CODE["alloc"]
FREE_REQUESTED = ACTION_CODE["free_requested"]
FREE_COMPLETED = ACTION_CODE["free_completed"]
SEGMENT_ALLOC = ACTION_CODE["segment_alloc"]
SEGMENT_FREE = ACTION_CODE["segment_free"]
SEGMENT_MAP = ACTION_CODE["segment_map"]
SEGMENT_UNMAP = ACTION_CODE["segment_unmap"]
SNAPSHOT = ACTION_CODE["snapshot"]
OOM = ACTION_CODE["oom"]
OTHER = ACTION_CODE["other"]

# File name given to the torch op that allocated (the innermost frame) in stacks the CPU
# fallback rebuilds from profiler events.
OP_FILENAME = "<torch op>"

# Block states that hold memory: in use, or freed by the program but still awaited by a
# stream. Older PyTorch releases spell the second one "active_pending_free", the
# documentation "active_awaiting_free"; both count.
ACTIVE_STATES: frozenset[str] = frozenset(
    {"active_allocated", "active_pending_free", "active_awaiting_free"}
)


@dataclass(frozen=True, slots=True)
class Block:
    """A piece of a segment at dump time: in use (`active_*` states) or cached and free."""

    address: int
    size: int
    requested_size: int
    state: str
    stack: int = -1  # index into MemorySnapshot.stacks; -1 when no stack was recorded

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES


@dataclass(frozen=True, slots=True)
class Segment:
    """Memory the allocator got from cudaMalloc (or mapped), split into blocks. Bytes."""

    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    stream: int
    segment_type: str
    blocks: tuple[Block, ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class DeviceTrace:
    """The recorded history of one device, column-wise: row i of every array is entry i.

    action: int8 codes of ACTIONS; addr, size, stream: int64 (size in bytes; 0 where the
    entry has none); stack: int32 index into MemorySnapshot.stacks (-1: none);
    time_us: float64 microseconds, or None when the snapshot predates `time_us`
    (NaN for single entries without one); device_free: int64 bytes CUDA reported free,
    -1 except on `oom` entries; category: int16 index into MemorySnapshot.categories
    (-1: none; only the CPU fallback and newer profiler-made snapshots carry one).
    """

    device: int
    action: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    stack: np.ndarray
    time_us: np.ndarray | None
    device_free: np.ndarray
    category: np.ndarray

    @property
    def n_events(self) -> int:
        return int(self.action.shape[0])

    @property
    def has_time(self) -> bool:
        return self.time_us is not None


@dataclass(frozen=True, slots=True, eq=False)
class MemorySnapshot:
    """A whole snapshot: allocator state at dump time plus the history per device.

    `frames` is the interned frame table; `stacks[i]` is a tuple of indices into it,
    innermost frame first (as the allocator records them). `source` says what produced
    it: "cuda" (the caching allocator) or "cpu-profiler" (the CPU fallback, rebuilt from
    torch.profiler memory events). `step_starts` holds, per device, the trace indices where
    repeats of a cell began (empty when unknown); `notes` explain anything approximate;
    `cells` names notebook cells' files by their execution numbers.
    """

    segments: tuple[Segment, ...]
    traces: tuple[DeviceTrace, ...]
    frames: tuple[Frame, ...]
    stacks: tuple[tuple[int, ...], ...]
    categories: tuple[str, ...] = ()
    allocator_settings: Mapping[str, Any] = field(default_factory=dict)
    source: str = "cuda"
    step_starts: tuple[tuple[int, ...], ...] = ()
    notes: tuple[str, ...] = ()
    # Notebook cells' file names -> their execution numbers (`In [n]`), as the recording
    # shell knew them (see analysis/sources.py); empty when not recorded in a notebook.
    cells: Mapping[str, int] = field(default_factory=dict)
    # The step's modules, optimizer steps and tagged storages, when gpuprof_nb recorded
    # them beside the history (model/step.py); None otherwise.
    step: StepRecord | None = None
    # The Python frames of profiler-made stacks (source "cpu-profiler") carry the line that
    # ran, read from exact line events; else the line where each function starts.
    exact_lines: bool = False

    @property
    def devices(self) -> tuple[int, ...]:
        """Devices with a non-empty history or at least one segment, ascending."""
        found = {t.device for t in self.traces if t.n_events}
        found.update(s.device for s in self.segments)
        return tuple(sorted(found))

    @property
    def n_events(self) -> int:
        return sum(t.n_events for t in self.traces)

    def trace(self, device: int) -> DeviceTrace | None:
        """Return the history of `device`, or None when the snapshot has none for it."""
        for t in self.traces:
            if t.device == device:
                return t
        return None

    def segments_of(self, device: int) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.device == device)
