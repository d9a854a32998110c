"""What a recorded training step did, as its modules and optimizers saw it: which module
ran when, when backward reached the model's output, when the optimizer stepped, and which
storages held parameters, gradients and optimizer state. Recorded beside the memory history
by capture/step.py and kept in the snapshot under gpuprof_nb's own key.

Positions are counts of allocations: a position p lies between the history's p-th and
(p+1)-th `alloc` entry (counted from 0 since recording began), so it needs no clock shared
with the allocator. Addresses and sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

# The largest batch size anything here takes or predicts (a step of 2**31 samples is far
# past any real one; largest_batch stops there too).
MAX_BATCH_SIZE = 2**31

# What a tag may say about a storage.
TAG_CATEGORIES: tuple[str, ...] = ("parameter", "buffer", "gradient", "optimizer_state")


@dataclass(frozen=True, slots=True)
class RootModule:
    """A module whose forward was called from outside any other module (the model)."""

    name: str  # the user's variable bound to it ("" when none was found)
    type_name: str


@dataclass(frozen=True, slots=True)
class ModuleCall:
    """One forward call of a module: its path under its root ("" for the root itself), the
    positions where it began and returned (exit -1: it did not return), its wall time in
    microseconds (NaN when unknown) and the storages it returned (address, bytes)."""

    root: int
    path: str
    type_name: str
    depth: int
    enter: int
    exit: int
    forward_us: float
    outputs: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Tag:
    """The storage at `address` (of `size` bytes) held a `category` at position `at`."""

    address: int
    size: int
    category: str
    at: int


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Everything recorded about the step's structure (see the module docstring).

    `backward[k]` is the position where backward first reached the output of root call k
    (-1: it did not); `optimizer_steps` are (start, end) positions; `allocations` is how
    many allocations the recorder counted in all, so a history that lost its oldest entries
    can be aligned. `batch_size` and `batch_variable` are set when the cell was recorded at
    a known batch size (`%%memsnap --fit VAR`)."""

    roots: tuple[RootModule, ...]
    calls: tuple[ModuleCall, ...]
    backward: tuple[int, ...]
    optimizer_steps: tuple[tuple[int, int], ...]
    tags: tuple[Tag, ...]
    allocations: int
    device: str = "cpu"
    batch_size: int | None = None
    batch_variable: str = ""

    @property
    def root_calls(self) -> tuple[int, ...]:
        """Indices into `calls` of the roots' own calls, in call order."""
        return tuple(i for i, c in enumerate(self.calls) if c.depth == 0)
