"""The critical path of the median step (ProfileReport.critical_path) and the finding that
names what the step's length hangs on. Pure functions.

The path is found by walking back from the step's end along the dependencies the trace
records, always to the one that was satisfied last (the one the work was waiting for):

- on the host, the thread that runs the step (the one with its ProfilerStep range; without
  steps, the one with the most op time), merged with the autograd engine's threads of the
  same process (they run the backward pass while it waits): time there is the innermost
  torch op, runtime call or record_function range running, or Python outside them;
- a blocking call (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a
  blocking copy, any call a Stream/Context/Event Sync event names, and any call of
  BLOCKED_CALL_US or more that returned right after device work ended: a launch into a full
  queue, a free that synchronises) returned because device work ended: the last activity
  that ended inside it on the stream it waited for (the device, for a device-wide sync; the
  stream and launch the awaited event was recorded after, for an event sync). The path goes
  to that activity;
- a device activity started when the last of these was done: the previous activity of its
  stream (stream order), the activity an awaited event was recorded after (a
  cudaStreamWaitEvent on its stream before its launch), and its launch call's start
  (launch-kernel correlation). From there the walk goes on;
- a host thread other than the step's, idle, waits on the step's thread.

The segments tile the step: their durations add up to its length. A kernel's slack is how
much later it could have ended without moving the step's end, through the activities that
wait on it (the next one on its stream, cross-stream waits, the syncs it releases; the host
after a sync counted as unable to absorb any delay).

HolisticTraceAnalysis builds a graph of the same dependencies and takes its longest path
with waits weighted zero; docs/hta-parity.md compares the two on its test traces.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuprof_nb.analysis.classify import kernel_class
from gpuprof_nb.analysis.derived import (
    last_call_of,
    lookup,
    memo,
    op_names,
    runtime_starts,
)
from gpuprof_nb.analysis.rules import duration_words
from gpuprof_nb.analysis.streams import StreamColumns, stream_columns
from gpuprof_nb.analysis.timeline import (
    SYNC_RUNTIME_NAMES,
    dataloader_ops,
    device_timeline,
)
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.critical_path import CriticalPath, PathSegment, PathSync, SegmentKind
from gpuprof_nb.results.diagnosis import Finding
from gpuprof_nb.results.timeline import Timeline

__all__ = [
    "BLOCKED_CALL_US",
    "SYNC_RELEASE_SLACK_US",
    "critical_path",
    "rule_critical_path",
]

# A device activity may end a few microseconds after the host saw the call that waited for
# it return (host and device clocks differ by that much in real traces).
SYNC_RELEASE_SLACK_US = 5.0
# A runtime call this long (most take 2-10 us; HolisticTraceAnalysis flags runtime calls over
# 50 us as outliers) that returns within 2 x SYNC_RELEASE_SLACK_US of a device activity's end
# was waiting for the device: a launch into a full queue, a copy or a free that synchronises.
BLOCKED_CALL_US = 50.0
_AUTOGRAD = "autograd::engine::evaluate_function"
_HOST_SYNC_EVENTS = frozenset({"Stream Sync", "Context Sync", "Event Sync"})

# Categories of the path (CriticalPath.by_category_us), by segment kind.
HOST_OPS, RUNTIME, PYTHON, DATALOADER = "host ops", "CUDA runtime calls", "Python", "DataLoader"
SYNC, LAUNCH, KERNELS, COMM, COPIES = (
    "sync return",
    "launch latency",
    "GPU kernels",
    "communication kernels",
    "memcpy/memset",
)
GAPS, WAITS = "gaps between kernels", "cross-stream waits"
DEVICE_CATEGORIES = frozenset({LAUNCH, KERNELS, COMM, COPIES, GAPS, WAITS})


@dataclass
class _Lane:
    """A host lane's leaf stretches ("pieces"), by start: each the innermost event running
    then (an index into `events`), and the outermost torch op around it. Lists: the walk
    reads them one at a time."""

    starts: list[float]
    ends: list[float]
    label: list[int]
    context: list[str]
    events: list[tuple[str, str, int, int]]  # (kind, name, runtime index or -1, file index)
    where: str
    main: bool


def _flatten(
    items: list[tuple[float, float, int, tuple[str, str, int, int]]], where: str, main: bool
) -> _Lane:
    """Return the lane of these events (start, end, tie-break, (kind, name, runtime, index))."""
    items.sort(key=lambda it: (it[0], -it[1], it[2]))
    starts: list[float] = []
    ends: list[float] = []
    label: list[int] = []
    context: list[str] = []
    events = [it[3] for it in items]
    stack: list[int] = []
    cursor = -math.inf

    def outer_op() -> str:
        return next((events[j][1] for j in stack if events[j][0] == "op"), "")

    def emit(s: float, e: float, j: int) -> None:
        if e > s:
            starts.append(s)
            ends.append(e)
            label.append(j)
            context.append(outer_op())

    for i, (s_i, _, _, _) in enumerate(items):
        while stack and items[stack[-1]][1] <= s_i:
            end = items[stack[-1]][1]
            if end > cursor:
                emit(cursor, end, stack[-1])
                cursor = end
            stack.pop()
        if stack and s_i > cursor:
            emit(cursor, s_i, stack[-1])
        cursor = max(cursor, s_i)
        stack.append(i)
    while stack:
        end = items[stack[-1]][1]
        if end > cursor:
            emit(cursor, end, stack[-1])
            cursor = end
        stack.pop()
    return _Lane(starts, ends, label, context, events, where, main)


class _Host:
    """The host side of the window: the step's lane and, on demand, other threads' lanes."""

    def __init__(self, trace: Trace, lo: float, hi: float, step_thread: tuple[Any, Any] | None):
        self.trace = trace
        self.lo, self.hi = lo, hi
        ops = trace.ops
        o_start, o_end = _op_spans(trace)
        n = bisect.bisect_left(o_start, hi)
        self.op_idx = np.flatnonzero(o_end[:n] > lo)
        r_start, r_end = runtime_starts(trace), _runtime_ends(trace)
        m = int(np.searchsorted(r_start, hi, side="left"))
        self.rt_idx = np.flatnonzero(r_end[:m] > lo)
        self.threads: dict[tuple[Any, Any], list[int]] = {}
        for i in self.op_idx.tolist():
            o = ops[i]
            self.threads.setdefault((o.pid, o.tid), []).append(i)
        self.rt_threads: dict[tuple[Any, Any], list[int]] = {}
        for i in self.rt_idx.tolist():
            r = trace.runtime[i]
            self.rt_threads.setdefault((r.pid, r.tid), []).append(i)
        if step_thread is None:
            step_thread = self._busiest()
        self.main_thread = step_thread
        names = op_names(trace)
        engine = {n for n in names if n.startswith(_AUTOGRAD)}
        merged = [step_thread]
        if engine and step_thread is not None:
            for thread, members in self.threads.items():
                if (
                    thread != step_thread
                    and thread[0] == step_thread[0]
                    and any(ops[i].name in engine for i in members)
                ):
                    merged.append(thread)
        self.main_threads = set(merged)
        self.main = self._lane(merged, main=True)
        self.lanes: dict[tuple[Any, Any], _Lane] = {}

    def _busiest(self) -> tuple[Any, Any] | None:
        ops = self.trace.ops
        busy: dict[tuple[Any, Any], float] = {}
        for thread, members in self.threads.items():
            busy[thread] = sum(ops[i].dur_us for i in members if ops[i].kind == "op")
        if not busy:
            return next(iter(self.rt_threads), None)
        return min(busy, key=lambda t: (-busy[t], repr(t)))

    def _lane(self, threads: Sequence[tuple[Any, Any] | None], *, main: bool) -> _Lane:
        ops, runtime = self.trace.ops, self.trace.runtime
        items: list[tuple[float, float, int, tuple[str, str, int, int]]] = []
        for thread in threads:
            for i in self.threads.get(thread, []):  # type: ignore[arg-type]
                o = ops[i]
                items.append((o.start_us, o.end_us, o.index, (o.kind, o.name, -1, o.index)))
            for i in self.rt_threads.get(thread, []):  # type: ignore[arg-type]
                r = runtime[i]
                items.append((r.start_us, r.end_us, r.index, ("runtime", r.name, i, r.index)))
        shown = threads[0]
        where = f"thread {shown[1]}" if shown is not None else "host"
        return _flatten(items, where, main)

    def lane_of(self, thread: tuple[Any, Any]) -> _Lane:
        if thread in self.main_threads:
            return self.main
        lane = self.lanes.get(thread)
        if lane is None:
            lane = self.lanes[thread] = self._lane([thread], main=False)
        return lane


def _op_spans(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Every op's start and end (all kinds), in trace.ops' order (computed once)."""

    def compute() -> tuple[np.ndarray, np.ndarray]:
        n = len(trace.ops)
        start = np.fromiter((o.start_us for o in trace.ops), dtype=float, count=n)
        dur = np.fromiter((o.dur_us for o in trace.ops), dtype=float, count=n)
        return start, start + dur

    return memo(trace, "all_op_spans", compute)


def _runtime_ends(trace: Trace) -> np.ndarray:
    return memo(
        trace,
        "runtime_ends",
        lambda: (
            runtime_starts(trace)
            + np.fromiter((r.dur_us for r in trace.runtime), dtype=float, count=len(trace.runtime))
        ),
    )


class _Device:
    """The device side: stream order, launches, cross-stream waits, sync releases."""

    def __init__(self, trace: Trace, device: int | None) -> None:
        self.trace = trace
        d: StreamColumns = stream_columns(trace, device)
        self.d = d
        n = len(d.pos)
        self.index_of = {int(p): i for i, p in enumerate(d.pos.tolist())}
        # Per activity (in d's order): its stream run's first index.
        self.run_start = np.zeros(n, dtype=np.intp)
        self.run_of_stream: dict[int, tuple[int, int]] = {}
        for j, stream in enumerate(d.streams.tolist()):
            a, b = int(d.bounds[j]), int(d.bounds[j + 1])
            self.run_start[a:b] = a
            self.run_of_stream[int(stream)] = (a, b)
        # Ends never fall within a stream run (activities of a stream do not overlap), but
        # a damaged trace could: searches use the running maximum.
        self.end_acc = np.empty(n)
        self.launch_acc = np.empty(n)
        for a, b in self.run_of_stream.values():
            self.end_acc[a:b] = np.maximum.accumulate(d.end[a:b])
            self.launch_acc[a:b] = np.fmax.accumulate(
                np.where(np.isnan(d.launch[a:b]), -np.inf, d.launch[a:b])
            )
        self.by_end = np.argsort(d.end, kind="stable")
        self.ends_sorted = d.end[self.by_end]
        self.keys, self.calls = last_call_of(trace)
        self.sync_of = {s.correlation: s for s in trace.syncs if s.correlation is not None}
        self.waits = self._cross_stream_waits()

    def _call(self, correlation: int | None) -> int:
        if correlation is None:
            return -1
        found = lookup(self.keys, self.calls, np.array([correlation], dtype=np.int64))
        return int(found[0])

    def last_launched_before(self, stream: int, t: float) -> int:
        """The last activity of `stream` whose launch call started before t, or -1."""
        run = self.run_of_stream.get(stream)
        if run is None:
            return -1
        a, b = run
        j = a + int(np.searchsorted(self.launch_acc[a:b], t, side="left")) - 1
        return j if j >= a else -1

    def _cross_stream_waits(self) -> dict[int, list[int]]:
        """Activity index -> the activities it waited on through a cudaStreamWaitEvent: the
        wait applies to the first activity of its stream launched after the wait call, and
        waits for the last activity of the event's stream launched before the record call."""
        out: dict[int, list[int]] = {}
        starts = runtime_starts(self.trace)
        for s in self.trace.syncs:
            if s.name != "Stream Wait Event" or s.wait_on_stream is None:
                continue
            wait_call = self._call(s.correlation)
            record_call = self._call(s.wait_on_event_record)
            if record_call < 0:
                continue
            at = float(starts[wait_call]) if wait_call >= 0 else s.start_us
            run = self.run_of_stream.get(s.stream)
            if run is None:
                continue
            a, b = run
            target = a + int(np.searchsorted(self.launch_acc[a:b], at, side="left"))
            source = self.last_launched_before(s.wait_on_stream, float(starts[record_call]))
            if target < b and source >= 0:
                out.setdefault(target, []).append(source)
        return out

    def _latest_ending(self, stream: int | None, lo: float, hi: float) -> int:
        """The activity ending last in (lo, hi], on one stream or any, or -1."""
        d = self.d
        if stream is None:
            j = int(np.searchsorted(self.ends_sorted, hi, side="right")) - 1
            if j >= 0 and self.ends_sorted[j] > lo:
                return int(self.by_end[j])
            return -1
        run = self.run_of_stream.get(stream)
        if run is None:
            return -1
        a, b = run
        j = a + int(np.searchsorted(self.end_acc[a:b], hi, side="right")) - 1
        return j if j >= a and d.end[j] > lo else -1

    def release(self, r: int) -> int:
        """The activity whose end let runtime call `r` return, or -1 when it did not wait."""
        call = self.trace.runtime[r]
        lo, hi = call.start_us, call.end_us + SYNC_RELEASE_SLACK_US
        sync = self.sync_of.get(call.correlation) if call.correlation is not None else None
        if sync is not None and sync.name in _HOST_SYNC_EVENTS:
            if sync.name == "Stream Sync" and sync.stream >= 0:
                return self._latest_ending(sync.stream, lo, hi)
            if sync.name == "Event Sync" and sync.wait_on_stream is not None:
                record = self._call(sync.wait_on_event_record)
                if record >= 0:
                    j = self.last_launched_before(
                        sync.wait_on_stream, float(runtime_starts(self.trace)[record])
                    )
                    return j if j >= 0 and lo < self.d.end[j] <= hi else -1
            return self._latest_ending(None, lo, hi)
        if "Memcpy" in call.name or "memcpy" in call.name:
            # A blocking copy waits for its own copy (and what its stream ran before it); an
            # asynchronous one returns before its copy ends.
            own = np.flatnonzero(self.d.call == r)
            own = own[(self.d.end[own] > lo) & (self.d.end[own] <= call.end_us)]
            return int(own[np.argmax(self.d.end[own])]) if len(own) else -1
        if call.name in SYNC_RUNTIME_NAMES:
            return self._latest_ending(None, lo, hi)
        if call.dur_us >= BLOCKED_CALL_US:
            # A long call that returned right after another activity ended was held by the
            # device: a launch into a full queue, a copy or free that synchronises. (One that
            # returns as its own kernel ends was slow itself: a module loaded on first use.)
            j = self._latest_ending(None, lo, hi)
            if (
                j >= 0
                and self.d.call[j] != r
                and call.end_us - float(self.d.end[j]) <= 2 * SYNC_RELEASE_SLACK_US
            ):
                return j
        return -1


def _category(seg: PathSegment, kernel_kind: str | None) -> str:
    if seg.kind == "cpu":
        return HOST_OPS
    if seg.kind == "runtime":
        return RUNTIME
    if seg.kind == "python":
        return PYTHON
    if seg.kind == "sync":
        return SYNC
    if seg.kind == "launch":
        return LAUNCH
    if seg.kind == "gpu_gap":
        return GAPS
    if seg.kind == "stream_wait":
        return WAITS
    if kernel_kind == "comm":
        return COMM
    if kernel_kind == "copy":
        return COPIES
    return KERNELS


def critical_path(
    trace: Trace, timeline: Timeline | None = None, window: tuple[float, float] | None = None
) -> CriticalPath | None:
    """Return the critical path of the timeline's representative step (the median one), or
    of the whole window without steps, or of `window` (start, end in the trace's
    microseconds) when given (see the module's docstring); None for an empty window or a
    trace without host or device events."""
    tl = timeline if timeline is not None else device_timeline(trace)
    step = tl.representative_step if window is None else None
    if window is not None:
        lo, hi = window
    else:
        lo, hi = (step.start_us, step.end_us) if step is not None else (tl.start_us, tl.end_us)
    if not hi > lo:
        return None
    step_thread = None
    if step is not None:
        marker = next(
            (
                o
                for o in trace.ops
                if o.kind == "annotation" and o.name == step.name and o.start_us >= lo - 1e-6
            ),
            None,
        )
        if marker is not None:
            step_thread = (marker.pid, marker.tid)
    host = _Host(trace, lo, hi, step_thread)
    if host.main_thread is None and not trace.kernels:
        return None
    device = _Device(trace, tl.device) if tl.on_device else None
    kind_of: dict[str, str] = {}
    latest_first, on_path, met = _walk(trace, host, device, lo, hi, kind_of)
    syncs = _path_syncs(trace, latest_first, met)
    return _result(trace, step, lo, hi, _merged(latest_first), on_path, syncs, device, kind_of)


def _walk(
    trace: Trace, host: _Host, dev: _Device | None, lo: float, hi: float, kind_of: dict[str, str]
) -> tuple[list[PathSegment], set[int], list[tuple[int, int, str]]]:
    """Walk back from the step's end; return the segments (latest first), the activities on
    the path (indices in the device's columns) and the syncs met (runtime index, where its
    segments start in the list, its context). `kind_of` gets each kernel name's class on
    the path."""
    segments: list[PathSegment] = []
    on_path: set[int] = set()
    syncs: list[tuple[int, int, str]] = []
    lane = host.main
    kernel = -1  # on the device when >= 0
    t = hi
    if dev is not None and len(dev.d.pos):
        # Without a host lane, or when the device's last activity outlives the host's work,
        # the window ends on the device.
        last = dev._latest_ending(None, lo, hi)
        if last >= 0 and (not lane.ends or dev.d.end[last] > max(lane.ends)):
            kernel = last
    budget = 4 * (len(lane.starts) + (len(dev.d.pos) if dev is not None else 0)) + 100
    runtime = trace.runtime
    while t > lo and budget > 0:
        budget -= 1
        if kernel >= 0:
            assert dev is not None
            d = dev.d
            k = trace.kernels[int(d.pos[kernel])]
            on_path.add(kernel)
            kind_of.setdefault(k.name, kernel_class(k))
            start = max(float(d.start[kernel]), lo)
            if t > start:
                segments.append(
                    PathSegment(start, t, "kernel", k.name, f"stream {k.stream}", "", k.index)
                )
            t = min(t, start)
            if t <= lo:
                break
            # What it waited for: the last satisfied of stream order, cross-stream waits and
            # its launch.
            best, ready = -1, -math.inf
            kind: SegmentKind | None = None
            prev = kernel - 1 if kernel > dev.run_start[kernel] else -1
            if prev >= 0:
                best, ready, kind = prev, float(d.end[prev]), "gpu_gap"
            for src in dev.waits.get(kernel, ()):
                if float(d.end[src]) > ready:
                    best, ready, kind = src, float(d.end[src]), "stream_wait"
            call = int(d.call[kernel])
            if call >= 0 and float(d.launch[kernel]) > ready:
                best, ready, kind = call, float(d.launch[kernel]), "launch"
            if kind is None:
                kernel = -1  # nothing recorded before it: back to the step's host lane
                lane = host.main
                continue
            ready = min(ready, t)
            gap_from = max(ready, lo)
            if t > gap_from:
                name = runtime[call].name if kind == "launch" else ""
                at = runtime[call].index if kind == "launch" else -1
                segments.append(PathSegment(gap_from, t, kind, name, f"stream {k.stream}", "", at))
            t = gap_from
            if kind == "launch":
                launcher = runtime[call]
                lane = host.lane_of((launcher.pid, launcher.tid))
                kernel = -1
            else:
                kernel = best
            continue
        # On the host: the piece running just before t.
        p = bisect.bisect_left(lane.starts, t) - 1
        if p < 0 or lane.ends[p] < t:
            gap_from = max(lane.ends[p] if p >= 0 else lo, lo)
            if not lane.main:
                lane = host.main  # an idle helper thread waits on the step's thread
                continue
            segments.append(PathSegment(gap_from, t, "python", "", lane.where))
            t = gap_from
            continue
        kind_, name, rt, at = lane.events[lane.label[p]]
        start = max(lane.starts[p], lo)
        if rt >= 0 and dev is not None:
            released = dev.release(rt)
            if (
                released >= 0
                and float(dev.d.end[released]) > start
                and float(dev.d.start[released]) < t
            ):
                back = min(float(dev.d.end[released]), t)
                syncs.append((rt, len(segments), lane.context[p]))
                if t > back:
                    segments.append(
                        PathSegment(back, t, "sync", name, lane.where, lane.context[p], at)
                    )
                t = back
                kernel = released
                continue
        seg_kind: SegmentKind = (
            "cpu" if kind_ == "op" else "runtime" if kind_ == "runtime" else "python"
        )
        segments.append(
            PathSegment(
                start,
                t,
                seg_kind,
                name,
                lane.where,
                lane.context[p],
                at if kind_ != "annotation" else -1,
            )
        )
        t = start
    return segments, on_path, syncs


def _merged(segments: list[PathSegment]) -> list[PathSegment]:
    """Segments in time order, neighbours that are pieces of one event (or of one Python
    stretch) joined."""
    out: list[PathSegment] = []
    for seg in reversed(segments):
        if seg.end_us <= seg.start_us:
            continue
        if out:
            last = out[-1]
            same = (last.kind, last.name, last.where, last.context, last.index) == (
                seg.kind,
                seg.name,
                seg.where,
                seg.context,
                seg.index,
            )
            if same and abs(last.end_us - seg.start_us) < 1e-9:
                out[-1] = PathSegment(
                    last.start_us,
                    seg.end_us,
                    last.kind,
                    last.name,
                    last.where,
                    last.context,
                    last.index,
                )
                continue
        out.append(seg)
    return out


def _slack(dev: _Device, lo: float, hi: float, releases: dict[int, float]) -> np.ndarray:
    """Each activity's slack (see the module's docstring), over the activities that end
    after lo and start before hi; nan for the others."""
    d = dev.d
    n = len(d.pos)
    slack = np.full(n, np.nan)
    live = np.flatnonzero((d.end > lo) & (d.start < hi))
    waited_by: dict[int, list[int]] = {}
    for target, sources in dev.waits.items():
        for s in sources:
            waited_by.setdefault(s, []).append(target)
    for j in sorted(live.tolist(), key=lambda j: -float(d.start[j])):
        end = float(d.end[j])
        best = max(hi - end, 0.0)
        nxt = j + 1
        if nxt < n and dev.run_start[nxt] == dev.run_start[j] and d.start[nxt] < hi:
            best = min(best, slack[nxt] + max(float(d.start[nxt]) - end, 0.0))
        for target in waited_by.get(j, ()):
            if not math.isnan(slack[target]):
                best = min(best, slack[target] + max(float(d.start[target]) - end, 0.0))
        if j in releases:
            best = min(best, max(releases[j] - end, 0.0))
        slack[j] = max(best, 0.0)
    return slack


def _result(
    trace: Trace,
    step: Any,
    lo: float,
    hi: float,
    segments: list[PathSegment],
    on_path: set[int],
    syncs: tuple[PathSync, ...],
    dev: _Device | None,
    kind_of: dict[str, str],
) -> CriticalPath:
    loader = [(o.start_us, o.end_us) for o in dataloader_ops(trace)]
    totals: dict[str, float] = {}
    for seg in segments:
        cat = _category(seg, kind_of.get(seg.name) if seg.kind == "kernel" else None)
        if cat in (HOST_OPS, PYTHON, RUNTIME) and any(
            a <= seg.start_us and seg.end_us <= b for a, b in loader
        ):
            cat = DATALOADER
        totals[cat] = totals.get(cat, 0.0) + seg.dur_us
    by_category = tuple(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))
    off = 0
    off_us = 0.0
    median_slack = None
    notes: list[str] = []
    if dev is not None and len(dev.d.pos):
        releases: dict[int, float] = {}
        for r in np.flatnonzero(
            (runtime_starts(trace) < hi) & (_runtime_ends(trace) > lo)
        ).tolist():
            rel = dev.release(r)
            if rel >= 0:
                releases[rel] = min(releases.get(rel, math.inf), trace.runtime[r].end_us)
        slack = _slack(dev, lo, hi, releases)
        d = dev.d
        inside = np.flatnonzero((d.start >= lo) & (d.end <= hi))
        off_idx = np.array([j for j in inside.tolist() if j not in on_path], dtype=np.intp)
        if len(off_idx):
            off = len(off_idx)
            off_us = float((d.end[off_idx] - d.start[off_idx]).sum())
            median_slack = float(np.median(slack[off_idx]))
    if not trace.syncs and any(seg.kind == "sync" or seg.kind == "runtime" for seg in segments):
        notes.append(
            "the trace has no cuda_sync events: which stream a synchronisation waited for "
            "is inferred from the device work that ended inside it"
        )
    return CriticalPath(
        step_number=step.number if step is not None else None,
        step_name=step.name if step is not None else "the window",
        start_us=lo,
        end_us=hi,
        segments=tuple(segments),
        by_category_us=by_category,
        syncs=syncs,
        off_path_kernels=off,
        off_path_kernel_us=off_us,
        median_slack_us=median_slack,
        notes=tuple(notes),
    )


def _path_syncs(
    trace: Trace, latest_first: Sequence[PathSegment], met: list[tuple[int, int, str]]
) -> tuple[PathSync, ...]:
    """The blocking calls on the path, each with the device-side time leading to it: the
    device segments that follow its own in the walk's (latest first) order."""
    device_kinds = ("kernel", "gpu_gap", "stream_wait", "launch")
    out = []
    for r, at, context in met:
        device_us = 0.0
        i = at + 1 if at < len(latest_first) and latest_first[at].kind == "sync" else at
        while i < len(latest_first) and latest_first[i].kind in device_kinds:
            device_us += latest_first[i].dur_us
            if latest_first[i].kind == "launch":
                break  # back on the host
            i += 1
        call = trace.runtime[r]
        out.append(PathSync(call.name, context, call.start_us, call.end_us, device_us))
    out.sort(key=lambda s: s.start_us)
    return tuple(out)


def _share(us: float, total: float) -> str:
    return f"{us / total * 100:.0f}%" if total > 0 else "0%"


def rule_critical_path(cp: CriticalPath | None, on_device: bool) -> Finding | None:
    """Return the finding that names what the step's length hangs on (info: it explains the
    other findings rather than adding time to recover), or None off the device or without
    a path."""
    if cp is None or not on_device or cp.dur_us <= 0 or not cp.segments:
        return None
    total = cp.dur_us
    device_us = sum(us for c, us in cp.by_category_us if c in DEVICE_CATEGORIES)
    host_us = total - device_us
    what = f"step {cp.step_number}" if cp.step_number is not None else "the window"
    parts = ", ".join(f"{c} {_share(us, total)}" for c, us in cp.by_category_us[:4] if us > 0)
    main_sync = max(cp.syncs, key=lambda s: (s.device_us, -s.start_us), default=None)
    if main_sync is not None and main_sync.device_us >= 0.2 * total:
        where = f"{main_sync.name} in {main_sync.context}" if main_sync.context else main_sync.name
        work = f"the GPU works through {_share(main_sync.device_us, total)} of the step"
        how = (
            f"launches block on a full queue ({where})"
            if "aunch" in main_sync.name
            else f"the host waits on {where}"
        )
        title = f"The length of {what} hangs on the GPU: {how} while {work}"
    elif device_us > host_us:
        title = f"The length of {what} hangs on the GPU's work ({_share(device_us, total)} of it)"
    else:
        title = (
            f"The length of {what} hangs on the host ({_share(host_us, total)} of it): the "
            "GPU waits for work to be launched"
        )
    title += f"; on the path: {parts}"
    evidence: dict[str, float] = {
        "step_us": total,
        "path_host_us": host_us,
        "path_device_us": device_us,
        "path_syncs_count": float(len(cp.syncs)),
        "off_path_kernels_count": float(cp.off_path_kernels),
        "off_path_kernel_us": cp.off_path_kernel_us,
    }
    if cp.median_slack_us is not None and cp.slack_fraction is not None:
        evidence["off_path_median_slack_us"] = cp.median_slack_us
        evidence["off_path_slack_fraction"] = cp.slack_fraction
        title += (
            f". Kernels off the path ({cp.off_path_kernels}) had a median slack of "
            f"{duration_words(cp.median_slack_us)} ({cp.slack_fraction * 100:.0f}% of the step)"
        )
        if cp.slack_fraction >= 0.1:
            title += ": speeding them up would not shorten it"
    fix = (
        "Shorten what is on the path: Timeline tab, the critical path lane and "
        "report.critical_path list its segments in order."
    )
    if main_sync is not None and main_sync.device_us >= 0.2 * total:
        fix = (
            "The host stops at the synchronisation until the GPU's queue drains, so nothing "
            "is launched meanwhile: move it out of the loop (keep values on the device, "
            "read them every N steps), or make the GPU work before it shorter."
        )
    elif host_us >= device_us:
        fix = (
            "The host is on the path: fewer, larger ops (torch.compile, fused optimizers, "
            "larger batches) shorten it; CUDA graphs take the launches off it."
        )
    return Finding(
        kind="critical_path",
        severity="info",
        title=title,
        evidence=evidence,
        fix=fix,
        share=0.0,
    )
