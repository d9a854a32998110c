"""The critical path of the median step (ProfileReport.critical_path) and the finding that
names what the step's length hangs on. Pure functions.

The path is found by walking back from the step's end along the dependencies the trace
records, always to the one that was satisfied last (the one the work was waiting for):

- on the host, the thread that runs the step (the one with its ProfilerStep range; without
  steps, the one with the most op time), merged with the autograd engine's threads of the
  same process (they run the backward pass while it waits): time there is a top-level torch
  op (what it runs inside, runtime calls included; their time is counted apart in the
  categories), a runtime call outside every op, or Python between them (named by the
  record_function range around it, if any);
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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from gpuprof_nb.analysis.classify import kernel_class
from gpuprof_nb.analysis.derived import (
    TraceIndex,
    distinct,
    index_of,
    last_call_of,
    lookup,
    median,
    memo,
    op_columns,
    op_names,
    other_op_columns,
    runtime_names,
    runtime_starts,
    runtime_threads,
)
from gpuprof_nb.analysis.intervals import merge_arrays
from gpuprof_nb.analysis.rules.context import duration_words
from gpuprof_nb.analysis.streams import StreamColumns, runtime_durs, stream_columns
from gpuprof_nb.analysis.timeline import (
    SYNC_RUNTIME_NAMES,
    dataloader_ops,
    device_timeline,
    top_level_positions,
)
from gpuprof_nb.model.build import fast_maker
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

# Path segments are made by the thousand on a long step (see fast_maker): every field
# given, positionally.
_new_segment = fast_maker(PathSegment)

# A device activity may end a few microseconds after the host saw the call that waited for
# it return (host and device clocks differ by that much in real traces).
SYNC_RELEASE_SLACK_US = 5.0
# A runtime call this long (most take 2-10 us; HolisticTraceAnalysis flags runtime calls over
# 50 us as outliers) that returns within 2 x SYNC_RELEASE_SLACK_US of a device activity's end
# was waiting for the device: a launch into a full queue, a copy or a free that synchronises.
BLOCKED_CALL_US = 50.0
_AUTOGRAD = "autograd::engine::evaluate_function"
_START = attrgetter("start_us")
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
    """A host lane by start: its units (top-level torch ops, and runtime calls outside any
    op) flattened into stretches ("pieces"), each naming the unit running then; its runtime
    calls that may have waited for the device (by end); its record_function ranges (to name
    Python stretches); its runtime calls' spans merged, with their running total (for the
    runtime time inside a host segment). Lists: the walk reads them one at a time."""

    starts: list[float]
    ends: list[float]
    label: list[int]
    units: list[tuple[str, str, int]]  # (kind "op" or "runtime", name, file index)
    waits_end: list[float]
    waits: list[int]  # runtime indices
    ranges: list[tuple[float, float, str]]
    range_starts: list[float]
    range_parent: list[int]
    rt_starts: np.ndarray  # float, as are the two below
    rt_ends: np.ndarray
    rt_before: np.ndarray  # runtime time before each merged span starts
    where: str
    main: bool

    def runtime_in(self, a: float, b: float) -> float:
        """Microseconds of [a, b] inside this lane's runtime calls."""
        return self._covered(b) - self._covered(a)

    def runtime_in_many(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """runtime_in of many stretches at once (the same arithmetic, value for value)."""
        return self._covered_many(b) - self._covered_many(a)  # type: ignore[no-any-return]

    def _covered_many(self, x: np.ndarray) -> np.ndarray:
        starts = self.rt_starts
        if not len(starts):
            return np.zeros(len(x))
        k = np.searchsorted(starts, x, side="right") - 1
        at = np.maximum(k, 0)
        start = starts[at]
        upto, whole = x - start, self.rt_ends[at] - start
        # min(upto, whole) as Python takes it: the first unless the second is smaller.
        inside = self.rt_before[at] + np.where(whole < upto, whole, upto)
        return np.where(k >= 0, inside, 0.0)

    def _covered(self, x: float) -> float:
        k = int(np.searchsorted(self.rt_starts, x, side="right")) - 1
        if k < 0:
            return 0.0
        start = self.rt_starts.item(k)
        return float(self.rt_before.item(k) + min(x - start, self.rt_ends.item(k) - start))

    def python_name(self, t: float) -> str:
        """The innermost record_function range of the lane running just before t."""
        # Ranges by (start, longest first): of those started before t and still running,
        # the last is the innermost.
        k = bisect.bisect_left(self.range_starts, t) - 1
        while k >= 0 and self.ranges[k][1] < t:
            k = self.range_parent[k]  # ended before t: try the range around it
        return self.ranges[k][2] if k >= 0 else ""


def _range_parents(ranges: list[tuple[float, float, str]]) -> list[int]:
    """Each range's enclosing range (ranges by start, longest first), -1 at the top."""
    parent: list[int] = []
    stack: list[int] = []
    for i, (start, _, _) in enumerate(ranges):
        while stack and ranges[stack[-1]][1] < start:
            stack.pop()
        parent.append(stack[-1] if stack else -1)
        stack.append(i)
    return parent


def _flatten(
    items: list[tuple[float, float, int, tuple[str, str, int]]],
) -> tuple[list[float], list[float], list[int], list[tuple[str, str, int]]]:
    """Return the pieces of these units (start, end, tie-break, (kind, name, index)): the
    stretches where each is the innermost one running."""
    items.sort(key=lambda it: (it[0], -it[1], it[2]))
    unit_end = [it[1] for it in items]
    starts: list[float] = []
    ends: list[float] = []
    label: list[int] = []
    stack: list[int] = []
    cursor = -math.inf
    for i, (s_i, _, _, _) in enumerate(items):
        while stack and unit_end[stack[-1]] <= s_i:
            top = stack.pop()
            end = unit_end[top]
            if end > cursor:
                starts.append(cursor)
                ends.append(end)
                label.append(top)
                cursor = end
        if stack and s_i > cursor:
            starts.append(cursor)
            ends.append(s_i)
            label.append(stack[-1])
        if s_i > cursor:  # max(cursor, s_i) as Python takes it
            cursor = s_i
        stack.append(i)
    while stack:
        top = stack.pop()
        end = unit_end[top]
        if end > cursor:
            starts.append(cursor)
            ends.append(end)
            label.append(top)
            cursor = end
    return starts, ends, label, [it[3] for it in items]


class _Host:
    """The host side of the window: the step's lane and, on demand, other threads' lanes.
    Threads are keyed by their ids as text (ids that print alike are one thread)."""

    def __init__(
        self,
        ix: TraceIndex,
        lo: float,
        hi: float,
        step_thread: tuple[str, str] | None,
        sync_of: dict[int, Any],
    ) -> None:
        trace = ix.trace
        self.index, self.trace = ix, trace
        self.lo, self.hi = lo, hi
        cols = op_columns(ix)
        rows = np.searchsorted(cols.positions, np.asarray(top_level_positions(ix), np.intp))
        rows = rows[(cols.start[rows] < hi) & (cols.end[rows] > lo)]
        self.top_rows: dict[tuple[str, str], np.ndarray] = {}
        keys = cols.thread_keys
        thread_of = cols.thread[rows]
        for code in distinct(thread_of).tolist():
            self.top_rows[keys[code]] = rows[thread_of == code]
        # Runtime calls of the window, by thread.
        starts, ends = runtime_starts(ix), _runtime_ends(ix)
        m = int(np.searchsorted(starts, hi, side="left"))
        calls = np.flatnonzero(ends[:m] > lo)
        codes, pairs = runtime_threads(ix)
        self.rt_rows: dict[tuple[str, str], np.ndarray] = {}
        call_codes = codes[calls]
        for code in distinct(call_codes).tolist():
            key = (str(pairs[code][0]), str(pairs[code][1]))
            mine = calls[call_codes == code]
            old = self.rt_rows.get(key)
            self.rt_rows[key] = mine if old is None else np.sort(np.concatenate((old, mine)))
        # Calls that may have waited for the device: long ones, syncs, copies, and the
        # calls a cuda_sync event names.
        names = runtime_names(ix)
        self.wait_names = {n for n in names if n in SYNC_RUNTIME_NAMES or "emcpy" in n}
        self.sync_of = sync_of
        self.durs = runtime_durs(ix)
        if step_thread is None or (
            step_thread not in self.top_rows and step_thread not in self.rt_rows
        ):
            step_thread = self._busiest()
        self.main_thread = step_thread
        engine = {n for n in op_names(ix) if n.startswith(_AUTOGRAD)}
        merged = [step_thread] if step_thread is not None else []
        if engine and step_thread is not None:
            ops = cols.ops
            for thread, top in self.top_rows.items():
                if (
                    thread != step_thread
                    and thread[0] == step_thread[0]
                    and any(ops[r].name in engine for r in top.tolist())
                ):
                    merged.append(thread)
        self.main_threads = set(merged)
        self.main = self._lane(merged, main=True)
        self.lanes: dict[tuple[str, str], _Lane] = {}

    def _busiest(self) -> tuple[str, str] | None:
        cols = op_columns(self.index)
        busy = {
            thread: float((cols.end[rows] - cols.start[rows]).sum())
            for thread, rows in self.top_rows.items()
        }
        if not busy:
            return next(iter(self.rt_rows), None)
        return min(busy, key=lambda t: (-busy[t], t))

    def _lane(self, threads: Sequence[tuple[str, str]], *, main: bool) -> _Lane:
        ix, trace = self.index, self.trace
        cols = op_columns(ix)
        ops, runtime = cols.ops, trace.runtime
        items: list[tuple[float, float, int, tuple[str, str, int]]] = []
        rt_spans: list[tuple[np.ndarray, np.ndarray]] = []
        waits: list[tuple[float, int]] = []
        wait_names, sync_of, durs = self.wait_names, self.sync_of, self.durs
        for thread in threads:
            top = self.top_rows.get(thread, np.zeros(0, np.intp))
            for r in top.tolist():
                o = ops[r]
                items.append((o.start_us, o.end_us, o.index, ("op", o.name, o.index)))
            calls = self.rt_rows.get(thread, np.zeros(0, np.intp))
            if not len(calls):
                continue
            c_start = runtime_starts(ix)[calls]
            c_end = c_start + durs[calls]
            # Calls outside every top-level op of the thread are units of their own.
            t_start, t_end = cols.start[top], cols.end[top]
            inside = np.zeros(len(calls), dtype=bool)
            if len(top):
                j = np.searchsorted(t_start, c_start, side="right") - 1
                ok = j >= 0
                inside[ok] = t_end[np.maximum(j, 0)][ok] >= c_end[ok]
            for i in calls[~inside].tolist():
                rc = runtime[i]
                items.append((rc.start_us, rc.end_us, rc.index, ("runtime", rc.name, rc.index)))
            rt_spans.append((c_start, c_end))
            waiting = durs[calls] >= BLOCKED_CALL_US
            listed = calls.tolist()
            if wait_names:
                waiting |= np.fromiter(
                    (runtime[i].name in wait_names for i in listed), dtype=bool, count=len(listed)
                )
            if sync_of:
                waiting |= np.fromiter(
                    (runtime[i].correlation in sync_of for i in listed),
                    dtype=bool,
                    count=len(listed),
                )
            waits.extend(zip(c_end[waiting].tolist(), calls[waiting].tolist(), strict=True))
        starts, ends, label, units = _flatten(items)
        waits.sort()
        rs, re_ = merge_arrays(
            np.concatenate([a for a, _ in rt_spans]) if rt_spans else np.zeros(0),
            np.concatenate([b for _, b in rt_spans]) if rt_spans else np.zeros(0),
        )
        before = np.concatenate(([0.0], np.cumsum(re_ - rs)[:-1])) if len(rs) else np.zeros(0)
        ranges = []
        for thread in threads:
            for o in self._ranges(thread):
                ranges.append((o.start_us, o.end_us, o.name))
        ranges.sort(key=lambda r: (r[0], -r[1]))
        shown = threads[0] if threads else None
        return _Lane(
            starts,
            ends,
            label,
            units,
            [w for w, _ in waits],
            [i for _, i in waits],
            ranges,
            [r[0] for r in ranges],
            _range_parents(ranges),
            rs,
            re_,
            before,
            f"thread {shown[1]}" if shown is not None else "host",
            main,
        )

    def _ranges(self, thread: tuple[str, str]) -> list[Any]:
        """The record_function ranges of a thread running in the window."""
        pos, start, end, annotation = _other_op_spans(self.index)
        keep = pos[annotation & (start < self.hi) & (end > self.lo)]
        ops = self.trace.ops
        return [ops[i] for i in keep.tolist() if (str(ops[i].pid), str(ops[i].tid)) == thread]

    def lane_of(self, thread: tuple[str, str]) -> _Lane:
        if thread in self.main_threads:
            return self.main
        lane = self.lanes.get(thread)
        if lane is None:
            lane = self.lanes[thread] = self._lane([thread], main=False)
        return lane


def _other_op_spans(
    trace: Trace | TraceIndex,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The positions, starts and ends of the ops that are not torch ops (record_function
    ranges, Python functions), and which are ranges, once."""
    other = other_op_columns(index_of(trace))
    return other.positions, other.start, other.end, other.is_annotation


def _runtime_ends(trace: Trace | TraceIndex) -> np.ndarray:
    ix = index_of(trace)
    return memo(ix, "runtime_ends", lambda: runtime_starts(ix) + runtime_durs(ix))


class _Device:
    """The device side: stream order, launches, cross-stream waits, sync releases."""

    def __init__(self, ix: TraceIndex, device: int | None) -> None:
        trace = ix.trace
        self.index, self.trace = ix, trace
        d: StreamColumns = stream_columns(ix, device)
        self.d = d
        n = len(d.pos)
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
        # The walk and the slack read one value at a time, of the few activities near the
        # step: through .item() (a Python number, cheaply), not lists of the whole device.
        self.start_l = d.start.item
        self.end_l = d.end.item
        self.call_l = d.call.item
        self.launch_l = d.launch.item
        self.pos_l = d.pos.item
        self.run_start_l = self.run_start.item
        self.by_end = np.argsort(d.end, kind="stable")
        self.ends_sorted = d.end[self.by_end]

        self.keys, self.calls = last_call_of(ix)
        self.sync_of = {s.correlation: s for s in trace.syncs if s.correlation is not None}
        self._by_call: tuple[list[int], list[int]] | None = None
        # release() of each call asked about: the walk and the slack ask about the same ones.
        self._released: dict[int, int] = {}
        self._wait_name: dict[str, bool] | None = None
        self.waits = self._cross_stream_waits()

    def launched_by(self, r: int) -> list[int]:
        """The activities (indices in the columns) runtime call `r` launched."""
        if self._by_call is None:
            by_call = np.argsort(self.d.call, kind="stable")
            self._by_call = (by_call.tolist(), self.d.call[by_call].tolist())
        order, calls = self._by_call
        return order[bisect.bisect_left(calls, r) : bisect.bisect_right(calls, r)]

    def maybe_waits(self, r: int) -> bool:
        """Whether runtime call `r` is one `release` may find waiting (a cheap test first)."""
        call = self.trace.runtime[r]
        return (
            call.dur_us >= BLOCKED_CALL_US
            or call.name in SYNC_RUNTIME_NAMES
            or "emcpy" in call.name
            or (call.correlation is not None and call.correlation in self.sync_of)
        )

    def maybe_waiting(self, calls: np.ndarray) -> np.ndarray:
        """The runtime calls among `calls` (indices) that maybe_waits() lets through, in
        their order: the long ones by their durations at once, the names and correlation
        ids of the others read one at a time."""
        trace = self.trace
        if self._wait_name is None:
            self._wait_name = {
                n: n in SYNC_RUNTIME_NAMES or "emcpy" in n for n in runtime_names(self.index)
            }
        wait_name, sync_of, runtime = self._wait_name, self.sync_of, trace.runtime
        keep = runtime_durs(self.index)[calls] >= BLOCKED_CALL_US
        rest = np.flatnonzero(~keep)
        if len(rest):
            listed = calls[rest].tolist()
            if sync_of:
                named = (
                    wait_name[c.name] or (c.correlation is not None and c.correlation in sync_of)
                    for c in map(runtime.__getitem__, listed)
                )
            else:
                named = (wait_name[c.name] for c in map(runtime.__getitem__, listed))
            keep[rest] = np.fromiter(named, dtype=bool, count=len(listed))
        return calls[keep]  # type: ignore[no-any-return]

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
        starts = runtime_starts(self.index)
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
        if stream is None:
            j = int(np.searchsorted(self.ends_sorted, hi, side="right")) - 1
            if j >= 0 and self.ends_sorted.item(j) > lo:
                return int(self.by_end.item(j))
            return -1
        run = self.run_of_stream.get(stream)
        if run is None:
            return -1
        a, b = run
        j = a + int(np.searchsorted(self.end_acc[a:b], hi, side="right")) - 1
        return j if j >= a and self.end_l(j) > lo else -1

    def release(self, r: int) -> int:
        """The activity whose end let runtime call `r` return, or -1 when it did not wait."""
        found = self._released.get(r)
        if found is None:
            found = self._released[r] = self._release(r)
        return found

    def _release(self, r: int) -> int:
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
                        sync.wait_on_stream, float(runtime_starts(self.index)[record])
                    )
                    return j if j >= 0 and lo < self.d.end[j] <= hi else -1
            return self._latest_ending(None, lo, hi)
        if "Memcpy" in call.name or "memcpy" in call.name:
            # A blocking copy waits for its own copy (and what its stream ran before it); an
            # asynchronous one returns before its copy ends.
            end_l, own = self.end_l, -1
            for j in self.launched_by(r):
                if lo < end_l(j) <= call.end_us and (own < 0 or end_l(j) > end_l(own)):
                    own = j
            return own
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


# The category of the segments that are not device activities, by kind.
_KIND_CATEGORY: dict[str, str] = {
    "cpu": HOST_OPS,
    "runtime": RUNTIME,
    "python": PYTHON,
    "sync": SYNC,
    "launch": LAUNCH,
    "gpu_gap": GAPS,
    "stream_wait": WAITS,
}


def _category(seg: PathSegment, kernel_kind: str | None) -> str:
    """A segment's category: by its kind, a device activity by its kernel's class."""
    cat = _KIND_CATEGORY.get(seg.kind)
    if cat is not None:
        return cat
    if kernel_kind == "comm":
        return COMM
    if kernel_kind == "copy":
        return COPIES
    return KERNELS


def critical_path(
    trace: Trace | TraceIndex,
    timeline: Timeline | None = None,
    window: tuple[float, float] | None = None,
) -> CriticalPath | None:
    """Return the critical path of the timeline's representative step (the median one), or
    of the whole window without steps, or of `window` (start, end in the trace's
    microseconds) when given (see the module's docstring); None for an empty window or a
    trace without host or device events."""
    ix = index_of(trace)
    trace = ix.trace
    tl = timeline if timeline is not None else device_timeline(ix)
    step = tl.representative_step if window is None else None
    if window is not None:
        lo, hi = window
    else:
        lo, hi = (step.start_us, step.end_us) if step is not None else (tl.start_us, tl.end_us)
    if not hi > lo:
        return None
    step_thread = None
    if step is not None:
        # The step's own range: among the ops starting where the step starts.
        first = bisect.bisect_left(trace.ops, lo - 1e-6, key=_START)
        marker = next(
            (
                o
                for o in trace.ops[first : first + 64]
                if o.kind == "annotation" and o.name == step.name
            ),
            None,
        )
        if marker is not None:
            step_thread = (str(marker.pid), str(marker.tid))
    device = _Device(ix, tl.device) if tl.on_device else None
    host = _Host(ix, lo, hi, step_thread, device.sync_of if device is not None else {})
    if host.main_thread is None and not trace.kernels:
        return None
    kind_of: dict[str, str] = {}
    latest_first, runtime_us, on_path, met = _walk(trace, host, device, lo, hi, kind_of)
    syncs = _path_syncs(trace, latest_first, met)
    totals = _categories(ix, latest_first, runtime_us, kind_of)
    return _result(ix, step, lo, hi, _merged(latest_first), totals, on_path, syncs, device)


def _walk(
    trace: Trace, host: _Host, dev: _Device | None, lo: float, hi: float, kind_of: dict[str, str]
) -> tuple[list[PathSegment], list[float], set[int], list[tuple[int, int, str]]]:
    """Walk back from the step's end; return the segments (latest first), the runtime-call
    time inside each, the activities on the path (indices in the device's columns) and the
    syncs met (runtime index, where its segments start in the list, its context). `kind_of`
    gets each kernel name's class on the path."""
    walk = _Walk(trace, host, dev, lo, hi, kind_of)
    budget = 4 * (len(host.main.starts) + len(host.main.waits)) + 100
    if dev is not None:
        budget += 4 * len(dev.d.pos)
    while walk.t > lo and budget > 0:
        if walk.kernel >= 0:
            budget -= 1
            walk.step_on_device()
        else:
            budget = walk.walk_host(budget)
    _fill_runtime_us(walk.host_spans, walk.runtime_us)
    return walk.segments, walk.runtime_us, walk.on_path, walk.syncs


# What walk_host reads of a lane into locals, in one call.
_LANE_FIELDS = attrgetter("starts", "ends", "label", "units", "waits_end", "where", "main")


class _Walk:
    """Where the backward walk is (at `t`, on the device activity `kernel` when it is >= 0,
    else on the host lane `lane`) and what it has found so far."""

    __slots__ = (
        "trace",
        "host",
        "dev",
        "lo",
        "kind_of",
        "segments",
        "runtime_us",
        "released",
        "on_path",
        "syncs",
        "host_spans",
        "lane",
        "kernel",
        "t",
    )

    def __init__(
        self,
        trace: Trace,
        host: _Host,
        dev: _Device | None,
        lo: float,
        hi: float,
        kind_of: dict[str, str],
    ) -> None:
        self.trace, self.host, self.dev, self.lo, self.kind_of = trace, host, dev, lo, kind_of
        self.segments: list[PathSegment] = []
        self.runtime_us: list[float] = []
        self.released: dict[int, int] = {}
        self.on_path: set[int] = set()
        self.syncs: list[tuple[int, int, str]] = []
        # Host stretches whose runtime-call time is found after the walk, lane by lane at
        # once: by id(lane), (lane, their places in runtime_us, starts, ends).
        self.host_spans: dict[int, tuple[_Lane, list[int], list[float], list[float]]] = {}
        self.lane = host.main
        self.kernel = -1  # on the device when >= 0
        self.t = hi
        if dev is not None and len(dev.d.pos):
            # A window that ends with a device activity (the whole trace's, when the GPU
            # finishes last) ends on the device.
            last = dev._latest_ending(None, lo, hi)
            lane = self.lane
            if (
                last >= 0
                and dev.d.end[last] >= hi - 1e-6
                and (not lane.ends or dev.d.end[last] > max(lane.ends))
            ):
                self.kernel = last

    def add(self, seg: PathSegment, rt: float = 0.0) -> None:
        self.segments.append(seg)
        self.runtime_us.append(rt)

    def spans_of(self, lane: _Lane) -> tuple[list[int], list[float], list[float]]:
        """The lists host_spans keeps for `lane`'s stretches (places, starts, ends)."""
        found = self.host_spans.get(id(lane))
        if found is None:
            found = self.host_spans[id(lane)] = (lane, [], [], [])
        return found[1], found[2], found[3]

    def step_on_device(self) -> None:
        """The device activity at `kernel`, then the gap to what it waited for, which the
        walk goes on from (the host lane of its launch, or back to the step's thread when
        nothing recorded comes before it)."""
        dev, kernel, lo = self.dev, self.kernel, self.lo
        assert dev is not None
        k = self.trace.kernels[dev.pos_l(kernel)]
        self.on_path.add(kernel)
        self.kind_of.setdefault(k.name, kernel_class(k))
        start = max(dev.start_l(kernel), lo)
        t = self.t
        if t > start:
            self.add(_new_segment(start, t, "kernel", k.name, f"stream {k.stream}", "", k.index))
        t = self.t = min(t, start)
        if t <= lo:
            return
        best, ready, kind, call = _waited_for(dev, kernel)
        if kind is None:
            self.kernel = -1  # nothing recorded before it: back to the step's host lane
            self.lane = self.host.main
            return
        runtime = self.trace.runtime
        ready = min(ready, t)
        gap_from = max(ready, lo)
        if t > gap_from:
            name = runtime[call].name if kind == "launch" else ""
            at = runtime[call].index if kind == "launch" else -1
            self.add(_new_segment(gap_from, t, kind, name, f"stream {k.stream}", "", at))
        self.t = gap_from
        if kind == "launch":
            launcher = runtime[call]
            self.lane = self.host.lane_of((str(launcher.pid), str(launcher.tid)))
            self.kernel = -1
        else:
            self.kernel = best

    def walk_host(self, budget: int) -> int:
        """Take host steps while the walk is on the host, before `lo` and within `budget`
        steps (one per piece, Python stretch or move to the step's thread, as the walk's
        loop counts them); return the budget left. A step: the piece of `lane` running
        just before `t` (Python between pieces when none runs), or, when it waited for the
        device, the part after the wait, the sync, and on to the device activity it waited
        for. The steps run in this one frame, the lane's lists read into locals, as a long
        step takes one per host op."""
        lo, dev, new = self.lo, self.dev, _new_segment
        add_segment, add_rt = self.segments.append, self.runtime_us.append
        runtime_us = self.runtime_us
        lane, t = self.lane, self.t
        starts, ends, label, units, waits_end, where, main = _LANE_FIELDS(lane)
        at_, a_, b_ = self.spans_of(lane)
        while t > lo and budget > 0:
            budget -= 1
            p = bisect.bisect_left(starts, t) - 1
            if p < 0 or ends[p] < t:
                gap_from = ends[p] if p >= 0 else lo
                if lo > gap_from:
                    gap_from = lo
                if not main:
                    # An idle helper thread waits on the step's thread.
                    lane = self.host.main
                    starts, ends, label, units, waits_end, where, main = _LANE_FIELDS(lane)
                    at_, a_, b_ = self.spans_of(lane)
                    continue
                add_segment(new(gap_from, t, "python", lane.python_name(t), where, "", -1))
                add_rt(0.0)
                t = gap_from
                continue
            kind_, name, at = units[label[p]]
            start = starts[p]
            if lo > start:
                start = lo
            if dev is not None:
                # Only a piece with a call that may have waited, ending inside it, can jump.
                w = bisect.bisect_right(waits_end, t) - 1
                if w >= 0 and waits_end[w] > start:
                    self.lane, self.t = lane, t
                    if self._jump_to_device(lane, start, kind_, name, at):
                        return budget
            at_.append(len(runtime_us))
            a_.append(start)
            b_.append(t)
            add_segment(new(start, t, "cpu" if kind_ == "op" else "runtime", name, where, "", at))
            add_rt(0.0)
            t = start
        self.lane, self.t = lane, t
        return budget

    def _jump_to_device(self, lane: _Lane, start: float, kind_: str, name: str, at: int) -> bool:
        """Whether the latest call of the piece (from `start` to `t`) that waited for the
        device did: then the part after the wait and the sync are added, the walk is on the
        device activity that released it, and True comes back."""
        dev, t, runtime, released = self.dev, self.t, self.trace.runtime, self.released
        assert dev is not None
        w = bisect.bisect_right(lane.waits_end, t) - 1
        while w >= 0 and lane.waits_end[w] > start:
            rt = lane.waits[w]
            w -= 1
            rel = released.get(rt)
            if rel is None:
                rel = released[rt] = dev.release(rt)
            waited = runtime[rt]
            if rel < 0 or dev.end_l(rel) <= max(waited.start_us, start):
                continue
            if dev.start_l(rel) >= min(t, waited.end_us):
                continue
            back = min(dev.end_l(rel), waited.end_us, t)
            if t > waited.end_us:
                at_, a_, b_ = self.spans_of(lane)
                at_.append(len(self.runtime_us))
                a_.append(waited.end_us)
                b_.append(t)
                self.add(
                    _new_segment(waited.end_us, t, _host_kind(kind_), name, lane.where, "", at)
                )
            upto = min(t, waited.end_us)
            self.syncs.append((rt, len(self.segments), name if kind_ == "op" else ""))
            if upto > back:
                context = name if kind_ == "op" else ""
                self.add(
                    _new_segment(back, upto, "sync", waited.name, lane.where, context, waited.index)
                )
            self.t = back
            self.kernel = rel
            return True
        return False


def _waited_for(dev: _Device, kernel: int) -> tuple[int, float, SegmentKind | None, int]:
    """Return what the device activity `kernel` waited for, the last satisfied of stream
    order, cross-stream waits and its launch: (the activity, or the launch call's runtime
    index), when it was ready, the kind of the gap (None when nothing recorded comes before
    it) and its launch call (-1 without one)."""
    best, ready = -1, -math.inf
    kind: SegmentKind | None = None
    prev = kernel - 1 if kernel > dev.run_start_l(kernel) else -1
    if prev >= 0:
        best, ready, kind = prev, dev.end_l(prev), "gpu_gap"
    for src in dev.waits.get(kernel, ()):
        if dev.end_l(src) > ready:
            best, ready, kind = src, dev.end_l(src), "stream_wait"
    call = dev.call_l(kernel)
    if call >= 0 and dev.launch_l(kernel) > ready:
        best, ready, kind = call, dev.launch_l(kernel), "launch"
    return best, ready, kind, call


def _fill_runtime_us(
    host_spans: dict[int, tuple[_Lane, list[int], list[float], list[float]]],
    runtime_us: list[float],
) -> None:
    """Set runtime_us at each host stretch's place to the runtime-call time inside it, lane
    by lane at once."""
    for lane, at_, a_, b_ in host_spans.values():
        if not at_:
            continue
        rt_us = lane.runtime_in_many(np.array(a_, dtype=float), np.array(b_, dtype=float))
        for i, v in zip(at_, rt_us.tolist(), strict=True):
            runtime_us[i] = v


def _merged(segments: list[PathSegment]) -> list[PathSegment]:
    """Segments in time order, neighbours that are pieces of one event (or of one Python
    stretch) joined."""
    out: list[PathSegment] = []
    for seg in reversed(segments):
        if seg.end_us <= seg.start_us:
            continue
        if out:
            last = out[-1]
            # Field by field, the first difference ending the test (most neighbours differ).
            if (
                last.kind == seg.kind
                and last.name == seg.name
                and last.where == seg.where
                and last.context == seg.context
                and last.index == seg.index
                and abs(last.end_us - seg.start_us) < 1e-9
            ):
                out[-1] = _new_segment(
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
    slack: dict[int, float] = {}
    live_at = np.flatnonzero((d.end > lo) & (d.start < hi))
    # Latest start first (ties by index); a live activity's start and end are never nan.
    live_at = live_at[np.argsort(-d.start[live_at], kind="stable")]
    end_at = d.end[live_at]
    # What each takes without the others' slack, and its stream's next activity (-1 when
    # none or it starts at hi or later) with the gap to it: the same arithmetic as one at a
    # time, max(x, 0.0) written as Python evaluates it (x unless 0.0 > x).
    alone = hi - end_at
    alone = np.where(0.0 > alone, 0.0, alone)
    nxt = live_at + 1
    has_next = nxt < n
    nxt_at = np.minimum(nxt, n - 1)
    has_next &= (dev.run_start[nxt_at] == dev.run_start[live_at]) & (d.start[nxt_at] < hi)
    gap = d.start[nxt_at] - end_at
    gap = np.where(0.0 > gap, 0.0, gap)
    waited_by: dict[int, list[int]] = {}
    for target, sources in dev.waits.items():
        for s in sources:
            waited_by.setdefault(s, []).append(target)
    start_l = dev.start_l
    waiters = waited_by.get
    for j, end, best, nx, g in zip(
        live_at.tolist(),
        end_at.tolist(),
        alone.tolist(),
        np.where(has_next, nxt, -1).tolist(),
        gap.tolist(),
        strict=True,
    ):
        # min(best, x) as Python takes it: best unless x is smaller.
        if nx >= 0:
            x = slack[nx] + g
            if x < best:
                best = x
        for target in waiters(j, ()):
            if target in slack:
                best = min(best, slack[target] + max(start_l(target) - end, 0.0))
        if j in releases:
            best = min(best, max(releases[j] - end, 0.0))
        slack[j] = 0.0 if 0.0 > best else best
    out = np.full(n, np.nan)
    if slack:
        out[list(slack)] = list(slack.values())
    return out


def _host_kind(unit_kind: str) -> SegmentKind:
    return "cpu" if unit_kind == "op" else "runtime"


def _categories(
    trace: Trace | TraceIndex,
    segments: Sequence[PathSegment],
    runtime_us: Sequence[float],
    kind_of: dict[str, str],
) -> dict[str, float]:
    """Add the segments up by category; a torch op's segment is split into its runtime
    calls' time and the rest; host time inside a DataLoader __next__ is DataLoader time."""
    ix = index_of(trace)
    loader = [(o.start_us, o.end_us) for o in dataloader_ops(ix)]
    totals: dict[str, float] = {}
    by_kind = _KIND_CATEGORY.get
    for seg, rt in zip(segments, runtime_us, strict=True):
        # _category, its lookup by kind inline (a device activity's is by its class).
        cat = by_kind(seg.kind)
        if cat is None:
            cat = _category(seg, kind_of.get(seg.name))
        elif loader and cat in (HOST_OPS, PYTHON, RUNTIME):
            if any(a <= seg.start_us and seg.end_us <= b for a, b in loader):
                cat = DATALOADER
        if cat == HOST_OPS and rt > 0:
            totals[RUNTIME] = totals.get(RUNTIME, 0.0) + rt
            totals[cat] = totals.get(cat, 0.0) + (seg.end_us - seg.start_us) - rt
            continue
        totals[cat] = totals.get(cat, 0.0) + (seg.end_us - seg.start_us)
    return totals


def _result(
    trace: Trace | TraceIndex,
    step: Any,
    lo: float,
    hi: float,
    segments: list[PathSegment],
    totals: dict[str, float],
    on_path: set[int],
    syncs: tuple[PathSync, ...],
    dev: _Device | None,
) -> CriticalPath:
    ix = index_of(trace)
    trace = ix.trace
    by_category = tuple(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))
    off = 0
    off_us = 0.0
    median_slack = None
    notes: list[str] = []
    if dev is not None and len(dev.d.pos):
        releases: dict[int, float] = {}
        window = np.flatnonzero((runtime_starts(ix) < hi) & (_runtime_ends(ix) > lo))
        for r in dev.maybe_waiting(window).tolist():
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
            # A zero-length kernel on the window's edge has no slack (nan): left out.
            finite = slack[off_idx][np.isfinite(slack[off_idx])]
            median_slack = median(finite) if len(finite) else None
    if not trace.syncs and any(seg.kind == "sync" for seg in segments):
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
    """A share in whole percent; a part too small to round to 1% reads "<1%", not "0%"."""
    if total <= 0 or us <= 0:
        return "0%"
    pct = us / total * 100
    return "<1%" if pct < 0.5 else f"{pct:.0f}%"


def rule_critical_path(cp: CriticalPath | None, on_device: bool) -> Finding | None:
    """Return the finding that names what the step's length hangs on (info: it explains the
    other findings rather than adding time to recover), or None off the device or without
    a path."""
    if cp is None or not on_device or cp.dur_us <= 0 or not cp.segments:
        return None
    total = cp.dur_us
    device_us = sum(us for c, us in cp.by_category_us if c in DEVICE_CATEGORIES)
    host_us = total - device_us
    main_sync = max(cp.syncs, key=lambda s: (s.device_us, -s.start_us), default=None)
    # One synchronisation the host waited at for a fifth of the step or more.
    blocking = main_sync if main_sync is not None and main_sync.device_us >= 0.2 * total else None
    title = _path_headline(cp, blocking, device_us, host_us)
    if cp.syncs and blocking is None:
        title += _many_syncs_words(cp)
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
        slack = _share(cp.slack_fraction * total, total)
        title += (
            f". Kernels off the path ({cp.off_path_kernels}) had a median slack of "
            f"{duration_words(cp.median_slack_us)} ({slack} of {_of_it(cp)})"
        )
        if cp.slack_fraction >= 0.1:
            title += ": speeding them up would not shorten it"
    return Finding(
        kind="critical_path",
        severity="info",
        title=title,
        evidence=evidence,
        fix=_path_fix(blocking is not None, device_us, host_us),
        share=0.0,
    )


def _of_it(cp: CriticalPath) -> str:
    return "the step" if cp.step_number is not None else "the window"


def _path_headline(
    cp: CriticalPath, blocking: PathSync | None, device_us: float, host_us: float
) -> str:
    """The title's start: what the length hangs on (the GPU behind one blocking sync, the
    GPU's work, or the host), then the path's largest categories."""
    total = cp.dur_us
    what = f"step {cp.step_number}" if cp.step_number is not None else "the window"
    if blocking is not None:
        where = f"{blocking.name} in {blocking.context}" if blocking.context else blocking.name
        work = f"the GPU works through {_share(blocking.device_us, total)} of {_of_it(cp)}"
        how = (
            f"launches block on a full queue ({where})"
            if "aunch" in blocking.name
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
    parts = ", ".join(f"{c} {_share(us, total)}" for c, us in cp.by_category_us[:4] if us > 0)
    return f"{title}; on the path: {parts}"


def _many_syncs_words(cp: CriticalPath) -> str:
    """Many short waits: the title's part that names the commonest blocking call and the
    GPU work they waited on."""
    groups = Counter((s.name, s.context) for s in cp.syncs)
    group_us: dict[tuple[str, str], float] = {}
    for s in cp.syncs:
        group_us[(s.name, s.context)] = group_us.get((s.name, s.context), 0.0) + s.device_us
    (name, context), count = max(groups.items(), key=lambda kv: (kv[1], group_us[kv[0]], kv[0]))
    waited = sum(s.device_us for s in cp.syncs)
    where = f"{name} in {context}" if context else name
    return (
        f"; it runs through {len(cp.syncs)} synchronisation"
        f"{'s' if len(cp.syncs) != 1 else ''} ({count} {where}), where the host waited "
        f"on {duration_words(waited)} of GPU work ({_share(waited, cp.dur_us)} of {_of_it(cp)})"
    )


def _path_fix(blocking: bool, device_us: float, host_us: float) -> str:
    """What to change: the blocking sync, the host's part, or whatever is on the path."""
    if blocking:
        return (
            "The host stops at the synchronisation until the GPU's queue drains, so nothing "
            "is launched meanwhile: move it out of the loop (keep values on the device, "
            "read them every N steps), or make the GPU work before it shorter."
        )
    if host_us >= device_us:
        return (
            "The host is on the path: fewer, larger ops (torch.compile, fused optimizers, "
            "larger batches) shorten it; CUDA graphs take the launches off it."
        )
    return (
        "Shorten what is on the path: Timeline tab, the critical path lane and "
        "report.critical_path list its segments in order."
    )
