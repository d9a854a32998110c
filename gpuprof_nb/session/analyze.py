"""The public front end of the analyses: `gpuprof_nb.analyze`, `analyze_memory`,
`analyze_batches` and `compare`. What users hand them is read into the model here (a raw
snapshot dict, a trace file's path), and what the pure analyses must not read themselves is
read here and passed in as arguments: the ceilings `measure_ceilings()` cached for the
trace's GPU (io/ceilings.py; else its datasheet row) and the timed samples a saved
%%gpuprofile report kept with its trace (io/timing.py). The regression gate is re-exported
for the front doors (the command line, the pytest helper)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuprof_nb.analysis import compare as _compare
from gpuprof_nb.analysis import report as _report
from gpuprof_nb.analysis.derived import TraceIndex
from gpuprof_nb.analysis.gate import check_threshold, regression_gate
from gpuprof_nb.analysis.ops import top_ops
from gpuprof_nb.io.ceilings import trace_ceilings
from gpuprof_nb.io.snapshot import snapshot_from_dict
from gpuprof_nb.io.timing import timing_of
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.device import DeviceSpec
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.compare import COMPARE_NOISE_FLOOR, Comparison
from gpuprof_nb.results.report import MemoryReport, ProfileReport
from gpuprof_nb.results.tables import OpTable

__all__ = [
    "analyze",
    "analyze_batches",
    "analyze_memory",
    "check_threshold",
    "compare",
    "ops_resort",
    "regression_gate",
]

SnapshotLike = MemorySnapshot | Mapping[str, Any]
Side = ProfileReport | Trace | str | os.PathLike[str]


def analyze(
    trace: Trace,
    device: DeviceSpec | str | None = None,
    *,
    timing: TimingStats | None = None,
    top: int | None = 20,
    sort: str | None = None,
    artifact: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> ProfileReport:
    """Return the ProfileReport of a trace (analysis/report.py: analyze). The roofline is
    drawn against `device` (a DeviceSpec, or a GPU name from the datasheet table); without
    it, against the ceilings `measure_ceilings()` cached for the trace's GPU, else its
    datasheet row (the roofline's note says which). Without `timing`, the timed samples a
    saved %%gpuprofile report kept with its trace, else None (a damaged entry is a note)."""
    _report.check_analyze_arguments(trace, device, timing, top, sort)
    all_notes = list(notes)
    if timing is None:
        timing = saved_timing(trace, all_notes)
    if device is None:
        device = trace_ceilings(trace)
    return _report.analyze(
        trace, device, timing=timing, top=top, sort=sort, artifact=artifact, notes=all_notes
    )


def trace_inputs(trace: Trace) -> tuple[DeviceSpec | None, TimingStats | None]:
    """Return what `analyze` reads for `trace` when it is given none: the ceilings (cached,
    else the datasheet row) and the saved timed samples (None when damaged)."""
    return trace_ceilings(trace), saved_timing(trace, [])


def saved_timing(trace: Trace, notes: list[str]) -> TimingStats | None:
    """Return the timed samples a saved %%gpuprofile report kept with its trace, None when
    it kept none; a damaged entry is said in `notes` instead."""
    try:
        return timing_of(trace.metadata)
    except Exception as exc:  # noqa: BLE001 - reported in the notes, not hidden
        notes.append(f"timed samples could not be computed: {type(exc).__name__}: {exc}")
        return None


def analyze_memory(
    snapshot: SnapshotLike,
    *,
    device: int | None = None,
    window: str | tuple[float | None, float | None] | None = None,
    step_starts: Sequence[int] | None = None,
    oom_message: str | None = None,
) -> MemoryReport:
    """Return the MemoryReport of one device of a snapshot (analysis/report.py:
    analyze_memory); a raw snapshot dict (what torch.cuda.memory._snapshot() returns) is
    read first."""
    return _report.analyze_memory(
        _snapshot(snapshot),
        device=device,
        window=window,
        step_starts=step_starts,
        oom_message=oom_message,
    )


def analyze_batches(
    snapshot: SnapshotLike,
    batch_size: int,
    other: SnapshotLike,
    other_batch_size: int,
    *,
    device: int | None = None,
    variable: str = "",
    budget_bytes: int | None = None,
    budget_source: str = "",
) -> MemoryReport:
    """Return the MemoryReport of `snapshot` with its fit measured against `other`
    (analysis/report.py: analyze_batches); raw snapshot dicts are read first."""
    return _report.analyze_batches(
        _snapshot(snapshot),
        batch_size,
        _snapshot(other),
        other_batch_size,
        device=device,
        variable=variable,
        budget_bytes=budget_bytes,
        budget_source=budget_source,
    )


def _snapshot(snapshot: SnapshotLike) -> MemorySnapshot:
    if isinstance(snapshot, Mapping):
        return snapshot_from_dict(snapshot)
    return snapshot


def compare(
    before: Side,
    after: Side,
    *,
    before_label: str | None = None,
    after_label: str | None = None,
    noise_floor: float = COMPARE_NOISE_FLOOR,
) -> Comparison:
    """Return `before` and `after` side by side (analysis/compare.py: compare). A side may
    be a ProfileReport, a Trace or a trace file's path: a Trace is analysed as `analyze`
    does; a path is loaded first and names its side by its file name."""
    b, before_label = _side(before, before_label)
    a, after_label = _side(after, after_label)
    return _compare.compare(
        b, a, before_label=before_label, after_label=after_label, noise_floor=noise_floor
    )


def _side(value: Side, label: str | None) -> tuple[ProfileReport | Trace, str | None]:
    """The side as a report where this front end reads it (a Trace, a path), and its label;
    a report goes on as it is (and anything else too, for the analysis to refuse)."""
    if isinstance(value, Trace):
        return analyze(value), label
    if isinstance(value, (str, os.PathLike)):
        return analyze(load_trace(value)), label or Path(value).name
    return value, label


def ops_resort(report: object) -> Callable[[str], OpTable] | None:
    """Return what a report's top-ops table is in another order (by a sort key, as many rows
    as the report shows), for its live view's "sort by" dropdown; None for anything else
    than a ProfileReport with a trace and a table. The trace's columns are derived once for
    all the orders asked."""
    if not isinstance(report, ProfileReport) or report.trace is None or report.ops is None:
        return None
    index, top = TraceIndex(report.trace), report.top

    def resort(key: str) -> OpTable:
        return top_ops(index, n=top, sort=key)

    return resort
