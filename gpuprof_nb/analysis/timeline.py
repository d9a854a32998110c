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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import add, attrgetter, le, lt, methodcaller, not_
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

_NAME = attrgetter("name")
_KIND = attrgetter("kind")
_START = attrgetter("start_us")
_DUR = attrgetter("dur_us")
_DEVICE = attrgetter("device")
_CORRELATION = attrgetter("correlation")
_INDEX = attrgetter("index")
_THREAD = attrgetter("pid", "tid")

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


def _top_level_positions(ops: Sequence[Op]) -> list[int]:
    """Return the positions in `ops` of the torch ops (kind 'op') not nested inside another op
    on the same thread, ordered by (start, index)."""
    n = len(ops)
    if not n:
        return []
    starts = list(map(_START, ops))
    durs = list(map(_DUR, ops))
    by_raw: dict[Any, list[int]] = {}
    for i, kind, dur, thread in zip(range(n), map(_KIND, ops), durs, map(_THREAD, ops),
                                    strict=True):
        if kind == "op" and dur >= 0:
            group = by_raw.get(thread)
            if group is None:
                by_raw[thread] = [i]
            else:
                group.append(i)
    # Threads are keyed by their ids as text (an int and a str id naming the same thread are
    # one thread); positions stay in file order within a thread for the stable sorts below.
    by_thread: dict[tuple[str, str], list[int]] = {}
    for (pid, tid), group in by_raw.items():
        key = (str(pid), str(tid))
        if key in by_thread:
            by_thread[key] = sorted(by_thread[key] + group)
        else:
            by_thread[key] = group
    ends = list(map(add, starts, durs))
    top: list[int] = []
    index: list[int] | None = None
    for key in sorted(by_thread):
        group = by_thread[key]
        first = [starts[i] for i in group]
        if not all(map(lt, first, first[1:])):
            # Order (start, longest first, index) by three stable sorts with C key functions
            # (a Python key per op costs more than the sorts).
            if index is None:
                index = list(map(_INDEX, ops))
            group.sort(key=index.__getitem__)
            group.sort(key=durs.__getitem__, reverse=True)
            group.sort(key=starts.__getitem__)
        end = float("-inf")
        for i in group:
            if starts[i] >= end:
                top.append(i)
                end = ends[i]
    if len(by_thread) > 1 or index is not None:
        if index is None:
            index = list(map(_INDEX, ops))
        top.sort(key=index.__getitem__)
        top.sort(key=starts.__getitem__)
    return top


def _top_level_ops(ops: Sequence[Op]) -> list[Op]:
    """Return the torch ops (kind 'op') not nested inside another op on the same thread."""
    return [ops[i] for i in _top_level_positions(ops)]


def top_level_ops(trace: Trace) -> tuple[Op, ...]:
    """Return the trace's torch ops not nested in another op on their thread, by start."""
    return tuple(_top_level_ops(trace.ops))


def _device_choice(trace: Trace) -> tuple[int | None, tuple[str, ...], bool]:
    """Return (device, notes, whether every kernel ran on that device)."""
    if not trace.kernels:
        return None, (), True
    devices = set(map(_DEVICE, trace.kernels))
    if len(devices) == 1:
        return next(iter(devices)), (), True
    busy: dict[int, list[Interval]] = {}
    for k in trace.kernels:
        busy.setdefault(k.device, []).append((k.start_us, k.end_us))
    lengths = {d: union_length(spans) for d, spans in busy.items()}
    device = min(lengths, key=lambda d: (-lengths[d], d))
    note = (f"the trace has activity on {len(busy)} devices {sorted(busy)}; "
            f"the timeline shows device {device}, the busiest")
    return device, (note,), False


def chosen_device(trace: Trace) -> tuple[int | None, tuple[str, ...]]:
    """Return the device the timeline describes (the busiest; ties: lowest index) and notes."""
    device, notes, _ = _device_choice(trace)
    return device, notes


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
    """Assigns causes to idle gaps; built once per trace so each gap costs a few bisects.
    What only some gaps need (launch times, kernels by start) is built on first use."""

    def __init__(self, trace: Trace, device: int | None, busy: Sequence[Interval],
                 top: Sequence[int], kernels: Sequence[Kernel]):
        self.on_device = device is not None
        self.trace = trace
        ops = trace.ops
        self.op_spans = merge_intervals((ops[i].start_us, ops[i].end_us) for i in top)
        self.op_starts = [s for s, _ in self.op_spans]
        names = list(map(_NAME, ops))
        self.dl_spans = merge_intervals(
            (ops[i].start_us, ops[i].end_us) for i, name in enumerate(names)
            if "DataLoader" in name and "__next__" in name)
        self.dl_starts = [s for s, _ in self.dl_spans]
        runtime = trace.runtime
        sync_spans = [(runtime[i].start_us, runtime[i].end_us)
                      for i, name in enumerate(map(_NAME, runtime))
                      if name in SYNC_RUNTIME_NAMES]
        sync_spans += [(s.start_us, s.end_us) for s in trace.syncs
                       if s.name in HOST_SYNC_EVENT_NAMES and (device is None
                                                               or s.device in (device, -1))]
        self.sync_spans = merge_intervals(sync_spans)
        self.sync_starts = [s for s, _ in self.sync_spans]
        self.sync_ends = [e for _, e in self.sync_spans]
        self.busy_starts = [s for s, _ in busy]
        self.kernels = kernels
        self._next_launch: dict[int, float | None] = {}
        self._launch_at: dict[Any, float] | None = None
        self._k_starts: list[float] = []
        self._k_corr: list[int | None] = []

    def _next_launch_at(self, j: int) -> float | None:
        """When was the first kernel of busy stretch `j` launched (the earliest launch among
        kernels starting together)? A later launch than the gap's start means the host had not
        issued it yet. None without launch information."""
        if j in self._next_launch:
            return self._next_launch[j]
        if self._launch_at is None:
            runtime = self.trace.runtime
            # Reversed, so the first call with a correlation id wins.
            launch_at: dict[Any, float] = dict(zip(reversed(list(map(_CORRELATION, runtime))),
                                                   reversed(list(map(_START, runtime))),
                                                   strict=True))
            launch_at.pop(None, None)
            self._launch_at = launch_at
            starts = list(map(_START, self.kernels))
            corr = list(map(_CORRELATION, self.kernels))
            if not all(map(le, starts, starts[1:])):
                order = sorted(range(len(starts)), key=starts.__getitem__)
                starts = [starts[i] for i in order]
                corr = [corr[i] for i in order]
            self._k_starts, self._k_corr = starts, corr
        launch_at, k_starts, k_corr = self._launch_at, self._k_starts, self._k_corr
        s = self.busy_starts[j]
        k = bisect.bisect_left(k_starts, s)
        launched: float | None = None
        while k < len(k_starts) and k_starts[k] <= s:
            c = k_corr[k]
            if c is not None and c in launch_at:
                t = launch_at[c]
                launched = t if launched is None else min(launched, t)
            k += 1
        self._next_launch[j] = launched
        return launched

    def _sync_at(self, lo: float) -> bool:
        """True if a blocking sync was under way when the gap began at `lo` (or returned within
        the slack before it):
        the host was waiting, so the queue drained. A sync that starts later in the gap did
        not cause it (the device had gone idle before the host asked to wait)."""
        i = bisect.bisect_left(self.sync_ends, lo - th.SYNC_SLACK_US)
        return i < len(self.sync_spans) and self.sync_starts[i] <= lo

    def classify(self, lo: float, hi: float, leading: bool, trailing: bool) -> list[IdleGap]:
        """Return the pieces of one idle gap [lo, hi] with their causes."""
        if not self.dl_spans:
            return [IdleGap(lo, hi, self._cause(lo, lo, hi, leading, trailing))]
        pieces: list[IdleGap] = []
        dl = _overlap(self.dl_spans, self.dl_starts, lo, hi)
        for a, b in dl:
            pieces.append(IdleGap(a, b, "dataloader"))
        rest = gaps_between(dl, lo, hi) if dl else [(lo, hi)]
        for a, b in rest:
            pieces.append(IdleGap(a, b, self._cause(a, lo, hi, leading, trailing)))
        pieces.sort(key=_START)
        return pieces

    def _cause(self, a: float, lo: float, hi: float, leading: bool, trailing: bool) -> IdleCause:
        if self.on_device and self.sync_spans and self._sync_at(a):
            return "sync"
        short = (th.LAUNCH_GAP_MAX_US if self.on_device else th.CPU_DISPATCH_GAP_MAX_US)
        if not leading and not trailing and (hi - lo) < short:
            return "launch"
        if not self.on_device or leading or trailing:
            return "host"
        j = bisect.bisect_left(self.busy_starts, hi)
        launched = self._next_launch_at(j) if j < len(self.busy_starts) else None
        if launched is None:
            return "other"
        return "host" if launched > lo else "other"

    def host_in_ops_us(self, lo: float, hi: float) -> float:
        """Return the microseconds of [lo, hi] during which a torch op ran on the host."""
        # The same sum as union_length(_overlap(...)): the op spans are merged (sorted, apart),
        # so their clipped parts need no merging again.
        spans = self.op_spans
        i = bisect.bisect_right(self.op_starts, lo) - 1
        if i < 0:
            i = 0
        lengths = []
        while i < len(spans):
            s, e = spans[i]
            if s >= hi:
                break
            a, b = max(s, lo), min(e, hi)
            if b > a:
                lengths.append(b - a)
            i += 1
        return sum(lengths)

    def gaps(self, busy: Sequence[Interval], lo: float, hi: float) -> list[IdleGap]:
        """Return the idle gaps of [lo, hi] around the busy stretches, with their causes."""
        holes = gaps_between(busy, lo, hi) if hi > lo else []
        out: list[IdleGap] = []
        if self.dl_spans:
            for a, b in holes:
                out.extend(self.classify(a, b, leading=(a <= lo), trailing=(b >= hi)))
            return out
        # No DataLoader: each hole is one gap; _cause's checks inlined (one call per gap
        # is most of the cost on traces with 10^5 gaps).
        on_device = self.on_device
        short = th.LAUNCH_GAP_MAX_US if on_device else th.CPU_DISPATCH_GAP_MAX_US
        check_sync = on_device and bool(self.sync_spans)
        sync_starts, sync_ends, slack = self.sync_starts, self.sync_ends, th.SYNC_SLACK_US
        busy_starts = self.busy_starts
        cause: IdleCause
        for a, b in holes:
            edge = a <= lo or b >= hi
            if check_sync and (i := bisect.bisect_left(sync_ends, a - slack)) < len(
                    sync_ends) and sync_starts[i] <= a:
                cause = "sync"
            elif not edge and (b - a) < short:
                cause = "launch"
            elif edge or not on_device:
                cause = "host"
            else:
                j = bisect.bisect_left(busy_starts, b)
                launched = self._next_launch_at(j) if j < len(busy_starts) else None
                cause = "other" if launched is None or launched <= a else "host"
            out.append(IdleGap(a, b, cause))
        return out


def _breakdown(busy: Sequence[Interval], busy_starts: Sequence[float], busy_ends: Sequence[float],
               gaps: Sequence[IdleGap], first: int, last: int, lo: float, hi: float,
               classifier: _Classifier, gap_host_us: dict[int, float]) -> IdleBreakdown:
    """The breakdown of [lo, hi] from the gaps first..last-1 (those that can reach it)."""
    span = max(hi - lo, 0.0)
    per = dict.fromkeys(IDLE_CAUSES, 0.0)
    host_in_ops = 0.0
    with_ops = classifier.on_device
    for j in range(first, last):
        g = gaps[j]
        a, b = max(g.start_us, lo), min(g.end_us, hi)
        if b > a:
            per[g.cause] += b - a
            if with_ops and g.cause == "host":
                if a == g.start_us and b == g.end_us:
                    # A whole gap (most of them): computed once, shared by window and step.
                    us = gap_host_us.get(j)
                    if us is None:
                        us = gap_host_us[j] = classifier.host_in_ops_us(a, b)
                else:
                    us = classifier.host_in_ops_us(a, b)
                host_in_ops += us
    # Only the busy stretches that end after lo and start before hi can reach [lo, hi]:
    # bisect instead of clipping every stretch of the trace for every step.
    reach = busy[bisect.bisect_right(busy_ends, lo):bisect.bisect_left(busy_starts, hi)]
    busy_us = _sum_clipped(reach, lo, hi)
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
    ops = trace.ops
    starts = list(map(_START, ops))
    ends = list(map(add, starts, map(_DUR, ops)))
    profiler = list(map(methodcaller("startswith", "PyTorch Profiler"), map(_NAME, ops)))
    if any(profiler):
        keep = list(map(not_, profiler))
        starts = list(compress(starts, keep))
        ends = list(compress(ends, keep))
    for seq in (trace.kernels, trace.runtime):
        seq_starts = list(map(_START, seq))
        starts += seq_starts
        ends += map(add, seq_starts, map(_DUR, seq))
    lo, hi = trace.window_us
    if not starts:
        return lo, max(hi, lo)
    a, b = max(min(starts), lo), min(max(ends), hi)
    return (a, b) if b > a else (lo, max(hi, lo))


def device_timeline(trace: Trace) -> Timeline:
    """Return the device's busy and idle microseconds over the recorded activity and per step,
    with each idle gap's cause (the host's view, busy = inside torch ops, without a device)."""
    lo, hi = activity_window(trace)
    device, notes, only_device = _device_choice(trace)
    on_device = device is not None
    ops = trace.ops
    top = _top_level_positions(ops)
    kernels: Sequence[Kernel] = ()
    if on_device:
        kernels = trace.kernels if only_device else device_kernels(trace, device)
        k_starts = list(map(_START, kernels))
        busy = merge_intervals(
            clip_intervals(zip(k_starts, map(add, k_starts, map(_DUR, kernels)), strict=True),
                           lo, hi))
    else:
        busy = merge_intervals(clip_intervals(
            ((ops[i].start_us, ops[i].end_us) for i in top), lo, hi))
        notes += ("no device activity in the trace: the breakdown is of the host "
                  "(busy = inside torch ops, host = Python between them)",)
    classifier = _Classifier(trace, device, busy, top, kernels)
    gaps = classifier.gaps(busy, lo, hi)
    busy_starts = classifier.busy_starts
    busy_ends = [e for _, e in busy]
    gap_host_us: dict[int, float] = {}
    overall = _breakdown(busy, busy_starts, busy_ends, gaps, 0, len(gaps), lo, hi, classifier,
                         gap_host_us)
    steps = []
    gap_starts = [g.start_us for g in gaps]
    for step in trace.steps:
        s_lo, s_hi = max(step.start_us, lo), min(step.end_us, hi)
        if s_hi < s_lo:
            s_hi = s_lo
        first = max(bisect.bisect_right(gap_starts, s_lo) - 1, 0)
        last = bisect.bisect_left(gap_starts, s_hi)
        steps.append(StepTimeline(step.number, step.name, step.start_us, step.end_us,
                                  _breakdown(busy, busy_starts, busy_ends, gaps, first, last,
                                             s_lo, s_hi, classifier, gap_host_us)))
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
