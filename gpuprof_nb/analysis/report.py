"""The whole analysis of a trace or snapshot, as `analyze` and `analyze_memory` return it:
every table, the timeline, the roofline and the diagnosis, in one report. Pure functions:
the same trace gives the same report on every machine. The ceilings and the timed samples
come in as arguments; without them a GPU trace is drawn against its datasheet row. The
public front end (session/analyze.py) reads what `measure_ceilings()` cached for the
trace's GPU and the samples a saved report kept with its trace, and passes them in."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuprof_nb.analysis.annotations import annotation_table
from gpuprof_nb.analysis.compile import compile_report
from gpuprof_nb.analysis.critical_path import critical_path
from gpuprof_nb.analysis.cudagraphs import graph_replays
from gpuprof_nb.analysis.derived import TraceIndex, index_of
from gpuprof_nb.analysis.diagnose import diagnose
from gpuprof_nb.analysis.fit import categories_and_fit, fit_batch_size
from gpuprof_nb.analysis.hotspots import compute_hotspots
from gpuprof_nb.analysis.lanes import timeline_lanes
from gpuprof_nb.analysis.memory import analyze_snapshot, parse_window
from gpuprof_nb.analysis.mfu import model_flops_utilisation
from gpuprof_nb.analysis.modules import module_breakdown
from gpuprof_nb.analysis.ops import SORT_KEYS, kernel_table, summarize_trace, top_ops
from gpuprof_nb.analysis.plan import plan_checkpointing
from gpuprof_nb.analysis.roofline import compute_roofline
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.gcpause import gc_paused
from gpuprof_nb.model.arguments import check_number, check_type, describe
from gpuprof_nb.model.device import DeviceSpec, lookup_device_spec
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.annotations import AnnotationTable
from gpuprof_nb.results.compile import CompileReport, GraphReplays
from gpuprof_nb.results.critical_path import CriticalPath
from gpuprof_nb.results.diagnosis import Diagnosis
from gpuprof_nb.results.fit import check_batch_size, check_budget
from gpuprof_nb.results.hotspots import Hotspots
from gpuprof_nb.results.mfu import Mfu
from gpuprof_nb.results.modules import ModuleBreakdown
from gpuprof_nb.results.report import MemoryReport, ProfileReport
from gpuprof_nb.results.roofline import Roofline
from gpuprof_nb.results.timeline import Timeline, TimelineLanes

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
    trace: Trace | TraceIndex,
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
    table); without it, against the datasheet row of the trace's GPU (the roofline's note
    says which). `timing`: the run's timed samples, when there are any. `notes` come first
    in the report's notes."""
    ix = index_of(trace)
    trace = ix.trace
    check_analyze_arguments(trace, device, timing, top, sort)
    # The analyses make many short-lived objects and no cycles worth collecting: automatic
    # collections would walk the whole trace's objects again and again (gcpause.py).
    with gc_paused():
        ops = top_ops(ix, n=top, sort=sort)
        kernels = kernel_table(ix)
        summary = summarize_trace(ix)
        all_notes = list(notes)
        ceilings = device if device is not None else datasheet_ceilings(trace)
        judged = _judgement(ix, ceilings, timing, all_notes)
    return ProfileReport(
        timing=timing,
        trace=trace,
        ops=ops,
        kernels=kernels,
        summary=summary,
        timeline=judged.timeline,
        roofline=judged.roofline,
        diagnosis=judged.diagnosis,
        artifact=artifact,
        notes=tuple(all_notes),
        top=top,
        sort=ops.sort_key,
        hotspots=judged.hotspots,
        modules=judged.modules,
        mfu=judged.mfu,
        compile=judged.compiled,
        graph_replays=judged.replays,
        annotations=judged.annotations,
        critical_path=judged.path,
        timeline_lanes=judged.lanes,
    )


@dataclass(frozen=True, slots=True)
class _Judgement:
    """The analyses that add judgement on top of the tables; None where one failed (its
    note says why) or where what it needs failed."""

    timeline: Timeline | None
    roofline: Roofline | None
    hotspots: Hotspots | None
    modules: ModuleBreakdown | None
    mfu: Mfu | None
    compiled: CompileReport | None
    replays: GraphReplays | None
    annotations: AnnotationTable | None
    path: CriticalPath | None
    lanes: TimelineLanes | None
    diagnosis: Diagnosis | None


def _judgement(
    ix: TraceIndex,
    ceilings: DeviceSpec | str | None,
    timing: TimingStats | None,
    all_notes: list[str],
) -> _Judgement:
    """Run the analyses beyond the tables, in order (later ones read earlier ones). One
    failing on an unusual trace should cost its own tab, not the whole report: it comes
    back None and a note in `all_notes` says what broke."""
    timeline = _attempt("timeline", lambda: device_timeline(ix), all_notes)
    roofline = _attempt("roofline", lambda: compute_roofline(ix, ceilings), all_notes)
    hotspots = (
        None
        if timeline is None
        else _attempt("hotspots", lambda: compute_hotspots(ix, timeline), all_notes)
    )
    modules = _attempt("modules", lambda: module_breakdown(ix, timeline), all_notes)
    mfu = (
        None
        if roofline is None
        else _attempt("MFU", lambda: model_flops_utilisation(ix, roofline, timing), all_notes)
    )
    compiled = _attempt("torch.compile", lambda: compile_report(ix), all_notes)
    replays = _attempt("CUDA graphs", lambda: graph_replays(ix), all_notes)
    annotations = _attempt("annotations", lambda: annotation_table(ix), all_notes)
    path = (
        None
        if timeline is None
        else _attempt("critical path", lambda: critical_path(ix, timeline), all_notes)
    )
    lanes = (
        None
        if timeline is None
        else _attempt(
            "timeline lanes",
            lambda: timeline_lanes(ix, timeline, timeline.representative_step),
            all_notes,
        )
    )
    diagnosis = _attempt(
        "diagnosis",
        lambda: diagnose(
            ix,
            timeline=timeline,
            roofline=roofline,
            timing=timing,
            hotspots=hotspots,
            critical_path=path,
        ),
        all_notes,
    )
    return _Judgement(
        timeline,
        roofline,
        hotspots,
        modules,
        mfu,
        compiled,
        replays,
        annotations,
        path,
        lanes,
        diagnosis,
    )


def datasheet_ceilings(trace: Trace) -> DeviceSpec | None:
    """Return the datasheet row of the trace's GPU (Trace.recorded_gpu); None for a CPU
    trace or a GPU the table lacks."""
    info = trace.recorded_gpu
    return None if info is None else lookup_device_spec(info.name, info.total_memory_bytes)


def check_analyze_arguments(trace: Any, device: Any, timing: Any, top: Any, sort: Any) -> None:
    """Raise GpuprofError naming the first argument of `analyze` that is not what it takes."""
    if isinstance(trace, (str, os.PathLike)):
        raise GpuprofError(
            f"analyze expects a Trace, got the path {describe(os.fspath(trace))}; load it "
            "first: gpuprof_nb.analyze(gpuprof_nb.load_trace(path))"
        )
    check_type(trace, Trace, "analyze's trace", "a Trace (from gpuprof_nb.load_trace(path))")
    # A GPU name the datasheet lacks is said in the roofline's note (analysis/roofline.py).
    if device is not None and not isinstance(device, str):
        check_type(device, DeviceSpec, "analyze's device", "a DeviceSpec, a GPU name or None")
    if timing is not None:
        check_type(timing, TimingStats, "analyze's timing", "TimingStats or None")
    if top is not None:
        check_number(top, "analyze's top", low=1, integer=True, hint="or None for every op")
    if sort is not None and sort not in SORT_KEYS:
        raise GpuprofError(
            f"analyze: sort {describe(sort)} is not one of: {', '.join(sorted(SORT_KEYS))}"
        )


def _check_window(window: Any) -> tuple[float | None, float | None] | None:
    """Return the memory window as (start, end), or raise GpuprofError: each bound a finite
    number or None, the end not before the start."""
    if window is None:
        return None
    if isinstance(window, str):
        try:
            return parse_window(window)
        except ValueError as e:
            raise GpuprofError(str(e)) from None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise GpuprofError(
            f"analyze_memory: window must be 'START:END' or (start, end), got {describe(window)}"
        )
    start, end = window
    for name, bound in (("start", start), ("end", end)):
        if bound is not None:
            check_number(bound, f"analyze_memory's window {name}", hint="or None for open")
    if start is not None and end is not None and end < start:
        raise GpuprofError(f"analyze_memory: window ({start}, {end}) ends before it starts")
    return start, end


def analyze_memory(
    snapshot: MemorySnapshot,
    *,
    device: int | None = None,
    window: str | tuple[float | None, float | None] | None = None,
    step_starts: Sequence[int] | None = None,
    oom_message: str | None = None,
) -> MemoryReport:
    """Return the MemoryReport of one device of a snapshot (default: the busiest).
    `window` is 'START:END' or (start, end) in ms when the snapshot has time_us, else in
    history entries; `step_starts` are the entry indices where repeats began."""
    if not isinstance(snapshot, MemorySnapshot):
        raise GpuprofError(
            f"analyze_memory expects a MemorySnapshot, got {type(snapshot).__name__}; "
            "load one with gpuprof_nb.load_snapshot(path)"
        )
    window = _check_window(window)
    if step_starts is not None:
        if not isinstance(step_starts, (list, tuple, range)) or not all(
            type(i) is int and i >= 0 for i in step_starts
        ):
            raise GpuprofError(
                "analyze_memory: step_starts must be a list of history entry indices "
                f"(integers, 0 or more), got {describe(step_starts)}"
            )
    if device is not None:
        check_number(device, "analyze_memory's device", low=0, integer=True, hint="or None")
    if oom_message is not None:
        check_type(oom_message, str, "analyze_memory's oom_message", "a string or None")
    if device is not None and device not in snapshot.devices:
        raise GpuprofError(
            f"the snapshot has no device {device}; it has {list(snapshot.devices) or 'none'}"
        )
    analysis = analyze_snapshot(snapshot, device=device, window=window, step_starts=step_starts)
    notes: list[str] = []
    recorded = snapshot
    parts = _attempt(
        "memory by category",
        lambda: categories_and_fit(
            recorded, device=analysis.device, peak_index=analysis.timeline.peak_index
        ),
        notes,
    )
    by_category, fit = parts if parts is not None else (None, None)
    if notes and by_category is None:
        snapshot = _with_notes(snapshot, notes)
    return MemoryReport(
        snapshot=snapshot,
        analysis=analysis,
        oom_message=oom_message,
        by_category=by_category,
        fit=fit,
    )


def _with_notes(snapshot: MemorySnapshot, notes: Sequence[str]) -> MemorySnapshot:
    return dataclasses.replace(snapshot, notes=snapshot.notes + tuple(notes))


def _as_snapshot(snapshot: MemorySnapshot, what: str) -> MemorySnapshot:
    if not isinstance(snapshot, MemorySnapshot):
        raise GpuprofError(
            f"{what} expects a MemorySnapshot, got {type(snapshot).__name__}; load one "
            "with gpuprof_nb.load_snapshot(path)"
        )
    return snapshot


def analyze_batches(
    snapshot: MemorySnapshot,
    batch_size: int,
    other: MemorySnapshot,
    other_batch_size: int,
    *,
    device: int | None = None,
    variable: str = "",
    budget_bytes: int | None = None,
    budget_source: str = "",
) -> MemoryReport:
    """Return the MemoryReport of `snapshot` (recorded at `batch_size`) whose fit is
    measured against `other` (the same cell recorded at `other_batch_size`, just before);
    with a budget, a checkpointing plan under it comes too."""
    batch_size = check_batch_size(batch_size, "analyze_batches' batch_size")
    other_batch_size = check_batch_size(other_batch_size, "analyze_batches' other_batch_size")
    check_type(variable, str, "analyze_batches' variable", "the batch-size variable's name")
    check_type(budget_source, str, "analyze_batches' budget_source", "a string")
    if budget_bytes is not None:
        budget_bytes = check_budget(budget_bytes)
    report = analyze_memory(_as_snapshot(snapshot, "analyze_batches"), device=device)
    return with_fit(
        report,
        batch_size,
        _as_snapshot(other, "analyze_batches"),
        other_batch_size,
        variable=variable,
        budget_bytes=budget_bytes,
        budget_source=budget_source,
    )


def with_fit(
    report: MemoryReport,
    batch_size: int | None,
    other: MemorySnapshot | None,
    other_batch_size: int | None,
    *,
    variable: str = "",
    budget_bytes: int | None = None,
    budget_source: str = "",
) -> MemoryReport:
    """Return `report` with its fit measured against `other` (when given; else the fit
    from categories, at `batch_size` when known), a budget, and a checkpointing plan under
    the budget when the snapshot has a step record."""
    fit = report.fit
    if other is not None and batch_size is not None and other_batch_size is not None:
        fit = fit_batch_size(
            report.snapshot,
            batch_size,
            other,
            other_batch_size,
            device=report.device,
            variable=variable,
        )
    elif fit is not None and batch_size is not None and fit.batch_size is None:
        fit = dataclasses.replace(fit, batch_size=batch_size, variable=variable)
    plan = None
    notes: list[str] = []
    if budget_bytes is not None and report.snapshot.step is not None:
        plan = _attempt(
            "the checkpointing plan",
            lambda: plan_checkpointing(
                report.snapshot, budget_bytes, fit=fit, device=report.device
            ),
            notes,
        )
    snap = _with_notes(report.snapshot, notes) if notes else report.snapshot
    return dataclasses.replace(
        report,
        snapshot=snap,
        fit=fit,
        budget_bytes=budget_bytes,
        budget_source=budget_source,
        plan=plan,
    )
