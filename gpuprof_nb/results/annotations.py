"""Time by annotation: every `record_function` range (`user_annotation` on the host) and its
device-side twin (`gpu_user_annotation`), as a tree where ranges nest (built by
analysis/annotations.py). Microseconds."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof_nb.results.display import Displayable


@dataclass(frozen=True, slots=True)
class AnnotationRow:
    """The ranges of one name at one place in the tree (the names of the ranges around it
    on its host thread; `ProfilerStep#N` counts as `ProfilerStep#*`), summed over their
    calls.

    Host side: `calls` ranges, `host_us` their summed duration; `device_us` the device time
    of the kernels, memcpys and memsets launched inside them (their launch call started in
    the range, on its thread; nested ranges' too), `kernels` how many.
    Device side, from the `gpu_user_annotation` ranges of the same calls (matched by
    External id): `gpu_calls` of them, `gpu_span_us` their summed duration (first kernel's
    start to last kernel's end on their stream), `gpu_kernel_us` the time of the activities
    they span on that stream (each counted once per range), `gpu_kernels` how many.
    `parent` is the index of the enclosing row in AnnotationTable.rows (-1 at the top)."""

    name: str
    depth: int
    parent: int
    calls: int
    host_us: float
    device_us: float
    kernels: int
    gpu_calls: int = 0
    gpu_span_us: float = 0.0
    gpu_kernel_us: float = 0.0
    gpu_kernels: int = 0


@dataclass(frozen=True, slots=True)
class AnnotationTable(Displayable):
    """Every annotation of a trace as a tree: rows in pre-order (a row, then its children,
    larger host time first; ties by name). `ranges` and `gpu_ranges` count the events read;
    `device_us` is all device time of the trace, for shares; `rows_left_out` the rows past
    the table's limit (their time is still in their ancestors' rows)."""

    rows: tuple[AnnotationRow, ...]
    ranges: int
    gpu_ranges: int
    device_us: float
    rows_left_out: int = 0
    notes: tuple[str, ...] = ()

    def row(self, name: str) -> AnnotationRow | None:
        """Return the first row (in tree order) with this name, or None."""
        return next((r for r in self.rows if r.name == name), None)

    def path(self, index: int) -> tuple[str, ...]:
        """Return the names from the top of the tree down to row `index`."""
        names = []
        while index >= 0:
            names.append(self.rows[index].name)
            index = self.rows[index].parent
        return tuple(reversed(names))
