"""The whole analysis of a trace or snapshot, as `analyze` and `analyze_memory` return it:
every table, the timeline, the roofline and the diagnosis, in one report. Pure functions;
the ceilings of a GPU trace come from the datasheet, or from what `measure_ceilings()`
recorded for that GPU (io/ceilings.py), and the roofline says which."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from gpuprof_nb.analysis.annotations import annotation_table
from gpuprof_nb.analysis.critical_path import critical_path
from gpuprof_nb.analysis.diagnose import diagnose
from gpuprof_nb.analysis.hotspots import compute_hotspots
from gpuprof_nb.analysis.memory import analyze_snapshot, parse_window
from gpuprof_nb.analysis.ops import kernel_table, summarize_trace, top_ops
from gpuprof_nb.analysis.roofline import compute_roofline
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.ceilings import trace_ceilings
from gpuprof_nb.io.gcpause import gc_paused
from gpuprof_nb.io.snapshot import snapshot_from_dict
from gpuprof_nb.model.device import DeviceSpec
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.report import MemoryReport, ProfileReport

T = TypeVar("T")


def count_steps_per_run(trace: Trace) -> int | None:
    """Return how many training steps one profiled run of the cell held: the distinct
    `ProfilerStep#N` annotations, else the calls of the most frequent `Optimizer.step#...`
    annotation (each optimizer step ends one training step, even the first, which
    `Trace.steps` cannot bound), else None."""
    if trace.steps and trace.steps[0].name.startswith("ProfilerStep#"):
        return len(trace.steps)
    counts: dict[str, int] = {}
    for op in trace.ops:
        if op.kind == "annotation" and op.name.startswith("Optimizer.step#"):
            counts[op.name] = counts.get(op.name, 0) + 1
    if not counts:
        return None
    return max(counts.values())


def _attempt(what: str, compute: Callable[[], T], notes: list[str]) -> T | None:
    """Return compute(), or None with a note naming the error when it raises."""
    try:
        return compute()
    except Exception as exc:  # noqa: BLE001 - reported in the notes, not hidden
        notes.append(f"{what} could not be computed: {type(exc).__name__}: {exc}")
        return None


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
    """Return the ProfileReport of a trace: top ops (`top` rows ordered by `sort`, the
    default being self device time when there are kernels, else self CPU time), kernels,
    summary, device timeline, roofline, annotations, critical path and diagnosis. The
    roofline is drawn against `device` (a DeviceSpec, or a GPU name from the datasheet
    table); without it, against the ceilings `measure_ceilings()` cached for the trace's GPU,
    else its datasheet row (io/ceilings.py; the roofline's note says which). `timing` is
    given by the live magic; offline it stays None."""
    # The analyses make many short-lived objects and no cycles worth collecting: automatic
    # collections would walk the whole trace's objects again and again (io/gcpause.py).
    with gc_paused():
        ops = top_ops(trace, n=top, sort=sort)
        kernels = kernel_table(trace)
        summary = summarize_trace(trace)
        all_notes = list(notes)
        ceilings = device if device is not None else trace_ceilings(trace)
        # The remaining analyses add judgement on top of the tables; one failing on an
        # unusual trace should cost its own tab, not the whole report, and the note says
        # what broke.
        timeline = _attempt("timeline", lambda: device_timeline(trace), all_notes)
        roofline = _attempt("roofline", lambda: compute_roofline(trace, ceilings), all_notes)
        hotspots = (
            None
            if timeline is None
            else _attempt("hotspots", lambda: compute_hotspots(trace, timeline), all_notes)
        )
        annotations = _attempt("annotations", lambda: annotation_table(trace), all_notes)
        path = (
            None
            if timeline is None
            else _attempt("critical path", lambda: critical_path(trace, timeline), all_notes)
        )
        diagnosis = _attempt(
            "diagnosis",
            lambda: diagnose(
                trace,
                timeline=timeline,
                roofline=roofline,
                timing=timing,
                hotspots=hotspots,
                critical_path=path,
            ),
            all_notes,
        )
    return ProfileReport(
        timing=timing,
        trace=trace,
        ops=ops,
        kernels=kernels,
        summary=summary,
        timeline=timeline,
        roofline=roofline,
        diagnosis=diagnosis,
        artifact=artifact,
        notes=tuple(all_notes),
        top=top,
        sort=ops.sort_key,
        hotspots=hotspots,
        annotations=annotations,
        critical_path=path,
    )


def analyze_memory(
    snapshot: MemorySnapshot | Mapping[str, Any],
    *,
    device: int | None = None,
    window: str | tuple[float | None, float | None] | None = None,
    step_starts: Sequence[int] | None = None,
    oom_message: str | None = None,
) -> MemoryReport:
    """Return the MemoryReport of one device of a snapshot (default: the busiest); a raw
    snapshot dict (what torch.cuda.memory._snapshot() returns) is accepted too.
    `window` is 'START:END' or (start, end) in ms when the snapshot has time_us, else in
    history entries; `step_starts` are the entry indices where repeats began."""
    if isinstance(snapshot, Mapping):
        snapshot = snapshot_from_dict(snapshot)
    if not isinstance(snapshot, MemorySnapshot):
        raise GpuprofError(
            f"analyze_memory expects a MemorySnapshot, got {type(snapshot).__name__}; "
            "load one with gpuprof_nb.load_snapshot(path)"
        )
    if isinstance(window, str):
        try:
            window = parse_window(window)
        except ValueError as e:
            raise GpuprofError(str(e)) from None
    if device is not None and device not in snapshot.devices:
        raise GpuprofError(
            f"the snapshot has no device {device}; it has {list(snapshot.devices) or 'none'}"
        )
    analysis = analyze_snapshot(snapshot, device=device, window=window, step_starts=step_starts)
    return MemoryReport(snapshot=snapshot, analysis=analysis, oom_message=oom_message)
