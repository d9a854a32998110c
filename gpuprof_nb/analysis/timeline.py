"""Where the device's time went: busy, or idle and why, over the window and per step.

Idle time is the time when no stream of the device runs anything (the union over streams).
Each idle gap gets one cause, checked in this order:

- ``dataloader``: the host was inside a DataLoader ``__next__`` (that part of the gap);
- ``sync``: a blocking synchronisation (cudaStreamSynchronize, cudaDeviceSynchronize, a
  blocking cudaMemcpy, a Stream/Context/Event Sync event) returned just before or during it,
  so the queue had drained;
- ``launch``: a short gap between kernels: the launch path itself;
- ``host``: nothing was launched: the next kernel's launch call came after the gap began
  (``host_in_ops_us`` says how much of that the host spent inside torch ops: dispatch,
  not the user's Python);
- ``other``: work was queued but the device still waited (cross-stream dependencies,
  missing launch information).

HolisticTraceAnalysis splits idle time into host wait / kernel wait / other; this breakdown
separates synchronisation and the DataLoader from plain host wait as well.

On a trace without device activity the same breakdown describes the host: ``busy`` is time
inside top-level torch ops, ``launch`` short dispatch gaps between ops, ``host`` the user's
Python between them, ``dataloader`` time in DataLoader ``__next__``.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.intervals import (
    Interval,
    clip_intervals,
    gaps_between,
    merge_intervals,
    union_length,
)
from gpuprof_nb.model.trace import Kernel, Op, Trace

IdleCause = Literal["dataloader", "sync", "launch", "host", "other"]
IDLE_CAUSES: tuple[IdleCause, ...] = ("dataloader", "sync", "launch", "host", "other")

# Blocking host calls: the host thread waits for the device inside them.
SYNC_RUNTIME_NAMES = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyToSymbol",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
        "hipMemcpy2D",
    }
)
# cuda_sync events where the host waited ("Stream Wait Event" is a device-side wait).
HOST_SYNC_EVENT_NAMES = frozenset({"Stream Sync", "Context Sync", "Event Sync"})


def is_dataloader_op(op: Op) -> bool:
    """True for the DataLoader's `__next__` range (`enumerate(DataLoader)#...__next__`)."""
    return "DataLoader" in op.name and "__next__" in op.name


@dataclass(frozen=True, slots=True)
class IdleGap:
    """One stretch of device idle time (microseconds) and its cause."""

    start_us: float
    end_us: float
    cause: IdleCause

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class IdleBreakdown:
    """Microseconds of a span by category; the six categories sum to `span_us`."""

    span_us: float
    busy_us: float
    dataloader_us: float
    sync_us: float
    launch_us: float
    host_us: float
    other_us: float
    # Part of host_us in which a host thread was inside a torch op (dispatch, not Python).
    host_in_ops_us: float = 0.0

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us

    def us_by_category(self) -> dict[str, float]:
        """Return {category: microseconds}, busy first, then the idle causes."""
        return {
            "busy": self.busy_us,
            "dataloader": self.dataloader_us,
            "sync": self.sync_us,
            "launch": self.launch_us,
            "host": self.host_us,
            "other": self.other_us,
        }

    def fraction(self, category: str) -> float:
        """Return the share (0..1) of the span in one category (0 for an empty span)."""
        return self.us_by_category()[category] / self.span_us if self.span_us > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """The breakdown of one training step (`ProfilerStep#N`)."""

    number: int
    name: str
    start_us: float
    end_us: float
    breakdown: IdleBreakdown

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class Timeline:
    """The device's busy and idle time over the profiled window (microseconds): overall,
    per step, and the gaps with their causes. `window_us` is the window's length."""

    window_us: float
    busy_us: float
    start_us: float = 0.0
    end_us: float = 0.0
    device: int | None = None
    on_device: bool = False
    breakdown: IdleBreakdown | None = None
    steps: tuple[StepTimeline, ...] = ()
    gaps: tuple[IdleGap, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0

    @property
    def representative_step(self) -> StepTimeline | None:
        """The step of median duration (the shorter of the two middle ones; ties: lower
        number), or None without steps."""
        if not self.steps:
            return None
        ordered = sorted(self.steps, key=lambda s: (s.dur_us, s.number))
        return ordered[(len(ordered) - 1) // 2]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from gpuprof_nb.render.diagnosis import timeline_section
        from gpuprof_nb.render.widgets import report_bundle

        return report_bundle("gpuprof_nb timeline", [timeline_section(self, None)],
                             include, exclude)


def _top_level_ops(ops: Iterable[Op]) -> list[Op]:
    """Return the torch ops (kind 'op') not nested inside another op on the same thread."""
    by_thread: dict[tuple[str, str], list[Op]] = {}
    for op in ops:
        if op.kind == "op" and op.dur_us >= 0:
            by_thread.setdefault((str(op.pid), str(op.tid)), []).append(op)
    top: list[Op] = []
    for key in sorted(by_thread):
        end = float("-inf")
        for op in sorted(by_thread[key], key=lambda o: (o.start_us, -o.dur_us, o.index)):
            if op.start_us >= end:
                top.append(op)
                end = op.end_us
    top.sort(key=lambda o: (o.start_us, o.index))
    return top


def top_level_ops(trace: Trace) -> tuple[Op, ...]:
    """Return the trace's torch ops not nested in another op on their thread, by start."""
    return tuple(_top_level_ops(trace.ops))


def chosen_device(trace: Trace) -> tuple[int | None, tuple[str, ...]]:
    """Return the device the timeline describes (the busiest; ties: lowest index) and notes."""
    if not trace.kernels:
        return None, ()
    busy: dict[int, list[Interval]] = {}
    for k in trace.kernels:
        busy.setdefault(k.device, []).append((k.start_us, k.end_us))
    if len(busy) == 1:
        return next(iter(busy)), ()
    lengths = {d: union_length(spans) for d, spans in busy.items()}
    device = min(lengths, key=lambda d: (-lengths[d], d))
    note = (f"the trace has activity on {len(busy)} devices {sorted(busy)}; "
            f"the timeline shows device {device}, the busiest")
    return device, (note,)


def device_kernels(trace: Trace, device: int | None) -> tuple[Kernel, ...]:
    """Return the kernels, memcpys and memsets of one device, by start."""
    return tuple(k for k in trace.kernels if k.device == device)


def _sum_clipped(intervals: Sequence[Interval], lo: float, hi: float) -> float:
    return union_length(clip_intervals(intervals, lo, hi))


def _overlap(sorted_disjoint: Sequence[Interval], starts: Sequence[float],
             lo: float, hi: float) -> list[Interval]:
    """Return the parts of [lo, hi] covered by sorted disjoint intervals (bisect-based)."""
    out: list[Interval] = []
    i = max(bisect.bisect_right(starts, lo) - 1, 0)
    while i < len(sorted_disjoint):
        s, e = sorted_disjoint[i]
        if s >= hi:
            break
        a, b = max(s, lo), min(e, hi)
        if b > a:
            out.append((a, b))
        i += 1
    return out


class _Classifier:
    """Assigns causes to idle gaps; built once per trace so each gap costs a few bisects."""

    def __init__(self, trace: Trace, device: int | None, busy: Sequence[Interval]):
        self.on_device = device is not None
        ops = _top_level_ops(trace.ops)
        self.op_spans = merge_intervals((o.start_us, o.end_us) for o in ops)
        self.op_starts = [s for s, _ in self.op_spans]
        self.dl_spans = merge_intervals(
            (o.start_us, o.end_us) for o in trace.ops if is_dataloader_op(o))
        self.dl_starts = [s for s, _ in self.dl_spans]
        sync_spans = [(r.start_us, r.end_us) for r in trace.runtime
                      if r.name in SYNC_RUNTIME_NAMES]
        sync_spans += [(s.start_us, s.end_us) for s in trace.syncs
                       if s.name in HOST_SYNC_EVENT_NAMES and (device is None
                                                               or s.device in (device, -1))]
        self.sync_spans = merge_intervals(sync_spans)
        self.sync_starts = [s for s, _ in self.sync_spans]
        self.sync_ends = [e for _, e in self.sync_spans]
        # When was the first kernel after each busy stretch launched? A later launch than
        # the gap's start means the host had not issued it yet.
        launch_at: dict[int, float] = {}
        for r in trace.runtime:
            if r.correlation is not None and r.correlation not in launch_at:
                launch_at[r.correlation] = r.start_us
        self.busy_starts = [s for s, _ in busy]
        self.next_launch: list[float | None] = []
        if self.on_device:
            kernels = sorted(device_kernels(trace, device), key=lambda k: (k.start_us, k.index))
            k_starts = [k.start_us for k in kernels]
            for s, _ in busy:
                j = bisect.bisect_left(k_starts, s)
                launched: float | None = None
                # Several kernels may start together; the earliest launch among them counts.
                while j < len(kernels) and kernels[j].start_us <= s:
                    c = kernels[j].correlation
                    if c is not None and c in launch_at:
                        t = launch_at[c]
                        launched = t if launched is None else min(launched, t)
                    j += 1
                self.next_launch.append(launched)

    def _sync_at(self, lo: float) -> bool:
        """True if a blocking sync was under way when the gap began at `lo` (or returned within
        the slack before it):
        the host was waiting, so the queue drained. A sync that starts later in the gap did
        not cause it (the device had gone idle before the host asked to wait)."""
        i = bisect.bisect_left(self.sync_ends, lo - th.SYNC_SLACK_US)
        return i < len(self.sync_spans) and self.sync_starts[i] <= lo

    def classify(self, lo: float, hi: float, leading: bool, trailing: bool) -> list[IdleGap]:
        """Return the pieces of one idle gap [lo, hi] with their causes."""
        pieces: list[IdleGap] = []
        dl = _overlap(self.dl_spans, self.dl_starts, lo, hi)
        for a, b in dl:
            pieces.append(IdleGap(a, b, "dataloader"))
        rest = gaps_between(dl, lo, hi) if dl else [(lo, hi)]
        for a, b in rest:
            pieces.append(IdleGap(a, b, self._cause(a, b, lo, hi, leading, trailing)))
        pieces.sort(key=lambda g: g.start_us)
        return pieces

    def _cause(self, a: float, b: float, lo: float, hi: float,
               leading: bool, trailing: bool) -> IdleCause:
        if self.on_device and self._sync_at(a):
            return "sync"
        short = (th.LAUNCH_GAP_MAX_US if self.on_device else th.CPU_DISPATCH_GAP_MAX_US)
        if not leading and not trailing and (hi - lo) < short:
            return "launch"
        if not self.on_device or leading or trailing:
            return "host"
        j = bisect.bisect_left(self.busy_starts, hi)
        launched = self.next_launch[j] if j < len(self.next_launch) else None
        if launched is None:
            return "other"
        return "host" if launched > lo else "other"

    def host_in_ops(self, gaps: Iterable[IdleGap]) -> float:
        """Return the microseconds of host-wait gaps during which a torch op ran on the host."""
        total = 0.0
        for g in gaps:
            if g.cause == "host":
                total += union_length(_overlap(self.op_spans, self.op_starts,
                                               g.start_us, g.end_us))
        return total


def _breakdown(busy: Sequence[Interval], gaps: Sequence[IdleGap], lo: float, hi: float,
               classifier: _Classifier | None) -> IdleBreakdown:
    span = max(hi - lo, 0.0)
    per = dict.fromkeys(IDLE_CAUSES, 0.0)
    clipped: list[IdleGap] = []
    for g in gaps:
        a, b = max(g.start_us, lo), min(g.end_us, hi)
        if b > a:
            per[g.cause] += b - a
            clipped.append(IdleGap(a, b, g.cause))
    busy_us = _sum_clipped(busy, lo, hi)
    host_in_ops = classifier.host_in_ops(clipped) if classifier and classifier.on_device else 0.0
    return IdleBreakdown(
        span_us=span,
        busy_us=busy_us,
        dataloader_us=per["dataloader"],
        sync_us=per["sync"],
        launch_us=per["launch"],
        host_us=per["host"],
        other_us=per["other"],
        host_in_ops_us=host_in_ops,
    )


def activity_window(trace: Trace) -> tuple[float, float]:
    """Return (start, end) in microseconds of the recorded work: ops, annotations, kernels and
    runtime calls, without the profiler's own span and instants (`PyTorch Profiler (0)`,
    `Record Window End`), which add its start-up and shutdown to the trace's window."""
    starts: list[float] = []
    ends: list[float] = []
    for o in trace.ops:
        if not o.name.startswith("PyTorch Profiler"):
            starts.append(o.start_us)
            ends.append(o.end_us)
    for seq in (trace.kernels, trace.runtime):
        for e in seq:
            starts.append(e.start_us)
            ends.append(e.end_us)
    lo, hi = trace.window_us
    if not starts:
        return lo, max(hi, lo)
    a, b = max(min(starts), lo), min(max(ends), hi)
    return (a, b) if b > a else (lo, max(hi, lo))


def device_timeline(trace: Trace) -> Timeline:
    """Return the device's busy and idle microseconds over the recorded activity and per step,
    with each idle gap's cause (the host's view, busy = inside torch ops, without a device)."""
    lo, hi = activity_window(trace)
    device, notes = chosen_device(trace)
    on_device = device is not None
    if on_device:
        busy = merge_intervals(
            clip_intervals(((k.start_us, k.end_us) for k in device_kernels(trace, device)),
                           lo, hi))
    else:
        busy = merge_intervals(clip_intervals(
            ((o.start_us, o.end_us) for o in _top_level_ops(trace.ops)), lo, hi))
        notes += ("no device activity in the trace: the breakdown is of the host "
                  "(busy = inside torch ops, host = Python between them)",)
    classifier = _Classifier(trace, device, busy)
    holes = gaps_between(busy, lo, hi) if hi > lo else []
    gaps: list[IdleGap] = []
    for a, b in holes:
        gaps.extend(classifier.classify(a, b, leading=(a <= lo), trailing=(b >= hi)))
    overall = _breakdown(busy, gaps, lo, hi, classifier)
    steps = []
    gap_starts = [g.start_us for g in gaps]
    for step in trace.steps:
        s_lo, s_hi = max(step.start_us, lo), min(step.end_us, hi)
        if s_hi < s_lo:
            s_hi = s_lo
        first = max(bisect.bisect_right(gap_starts, s_lo) - 1, 0)
        last = bisect.bisect_left(gap_starts, s_hi)
        steps.append(StepTimeline(step.number, step.name, step.start_us, step.end_us,
                                  _breakdown(busy, gaps[first:last], s_lo, s_hi, classifier)))
    return Timeline(
        window_us=overall.span_us,
        busy_us=overall.busy_us,
        start_us=lo,
        end_us=hi,
        device=device,
        on_device=on_device,
        breakdown=overall,
        steps=tuple(steps),
        gaps=tuple(gaps),
        notes=notes,
    )


def median_duration_us(durations: Sequence[float]) -> float:
    """Return the median of the durations in microseconds (nan when there are none)."""
    return float(statistics.median(durations)) if durations else float("nan")


def breakdown_shares(breakdown: IdleBreakdown) -> Mapping[str, float]:
    """Return {category: share of the span} for every category."""
    return {c: breakdown.fraction(c) for c in breakdown.us_by_category()}
