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
import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from functools import cached_property, reduce
from itertools import compress
from operator import add, attrgetter

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.derived import (
    TraceIndex,
    codes_of,
    distinct,
    first_call_of,
    frozen,
    ids_of,
    index_of,
    kernel_columns,
    kernel_ids,
    lex_order,
    lookup,
    memo,
    op_columns,
    op_name_codes,
    op_names,
    other_op_columns,
    runtime_names,
    runtime_starts,
)
from gpuprof_nb.analysis.intervals import Interval, merge_arrays, union_length
from gpuprof_nb.analysis.streams import launch_delays, runtime_durs, stream_idle, stream_queues
from gpuprof_nb.model.build import fast_maker
from gpuprof_nb.model.trace import Kernel, Op, RuntimeCall, Step, SyncEvent, Trace
from gpuprof_nb.results.timeline import (
    IDLE_CAUSES,
    IdleBreakdown,
    IdleGap,
    StepTimeline,
    Timeline,
)

# Idle gaps are made by the hundred thousand on a long trace (see fast_maker).
_new_gap = fast_maker(IdleGap)

_START = attrgetter("start_us")
_DUR = attrgetter("dur_us")
_NAME = attrgetter("name")
_CAUSE, _END = attrgetter("cause"), attrgetter("end_us")


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


def is_dataloader_name(name: str) -> bool:
    """True for the name of the DataLoader's `__next__` range
    (`enumerate(DataLoader)#...__next__`)."""
    return "DataLoader" in name and "__next__" in name


def dataloader_ops(trace: Trace | TraceIndex) -> tuple[Op, ...]:
    """Return the trace's DataLoader `__next__` ranges (is_dataloader_name), by start; names
    are tested once each, not once per op (computed once)."""
    ix = index_of(trace)
    trace = ix.trace

    def compute() -> tuple[Op, ...]:
        names = {n for n in op_names(ix) if is_dataloader_name(n)}
        return tuple(o for o in trace.ops if o.name in names) if names else ()

    return memo(ix, "dataloader_ops", compute)


def _top_level_positions(
    trace: Trace | TraceIndex, within: tuple[float, float] | None = None
) -> list[int]:
    """Return the positions in trace.ops of the torch ops (kind 'op') not nested inside
    another op on the same thread, in order; with `within` (lo, hi), of the ops overlapping
    it only (start < hi, end > lo), as if the trace held no other ops.

    Per thread, ops in (start, longest first, position) order: the first is top-level, and
    the next top-level op is the first to start at or after the last one's end."""
    ix = index_of(trace)
    cols = op_columns(ix)
    mask = cols.dur >= 0
    if within is not None:
        mask &= (cols.start < within[1]) & (cols.end > within[0])
    keep = np.flatnonzero(mask)
    if not len(keep):
        return []
    thread = cols.thread[keep]
    starts, durs, ends = cols.start[keep], cols.dur[keep], cols.end[keep]
    order = lex_order((keep, -durs, starts, thread))
    s_thread, s_start, s_end = thread[order], starts[order], ends[order]
    bounds = np.searchsorted(s_thread, np.arange(int(s_thread[-1]) + 2)).tolist()
    # Per op, the first later op of its thread starting at or after its end (the thread's
    # bound when none).
    nxt = np.arange(1, len(order) + 1, dtype=np.intp)
    for a, b in zip(bounds, bounds[1:], strict=False):
        np.maximum(
            nxt[a:b], a + np.searchsorted(s_start[a:b], s_end[a:b], side="left"), out=nxt[a:b]
        )
    nxt_list = nxt.tolist()
    tops: list[int] = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        i = a
        while i < b:
            tops.append(i)
            i = nxt_list[i]
    return sorted(cols.positions[keep[order[tops]]].tolist())


def top_level_positions(trace: Trace | TraceIndex) -> tuple[int, ...]:
    """Return the positions in trace.ops of its top-level torch ops (computed once)."""
    ix = index_of(trace)
    return memo(ix, "top_level_positions", lambda: tuple(_top_level_positions(ix)))


def top_level_spans(trace: Trace | TraceIndex) -> tuple[np.ndarray, np.ndarray]:
    """Return the union of the top-level torch ops' spans as sorted, disjoint (starts, ends)
    arrays (computed once): what merge_intervals of their (start, end) pairs gives."""
    ix = index_of(trace)

    def compute() -> tuple[np.ndarray, np.ndarray]:
        # The top-level ops' rows in the op columns (they are torch ops: all there), whose
        # ends are the same start + dur sums.
        cols = op_columns(ix)
        at = np.searchsorted(cols.positions, np.array(top_level_positions(ix), dtype=np.intp))
        starts, ends = merge_arrays(cols.start[at], cols.end[at])
        return frozen(starts), frozen(ends)

    return memo(ix, "top_level_spans", compute)


def top_level_ops_within(trace: Trace | TraceIndex, lo: float, hi: float) -> tuple[Op, ...]:
    """Return the top-level torch ops among the ops overlapping [lo, hi], nested among
    themselves only (what a drawing of that span shows), by start."""
    ix = index_of(trace)
    trace = ix.trace
    ops = trace.ops
    return tuple([ops[i] for i in _top_level_positions(ix, (lo, hi))])


def top_level_ops(trace: Trace | TraceIndex) -> tuple[Op, ...]:
    """Return the trace's torch ops not nested in another op on their thread, by start."""
    ix = index_of(trace)
    trace = ix.trace
    ops = trace.ops
    return memo(ix, "top_level_ops", lambda: tuple([ops[i] for i in top_level_positions(ix)]))


def _device_choice(trace: Trace | TraceIndex) -> tuple[int | None, tuple[str, ...], bool]:
    """Return (device, notes, whether every kernel ran on that device)."""
    ix = index_of(trace)
    trace = ix.trace
    if not trace.kernels:
        return None, (), True
    devices = set(distinct(kernel_columns(ix).device).tolist())
    if len(devices) == 1:
        return next(iter(devices)), (), True
    busy: dict[int, list[Interval]] = {}
    for k in trace.kernels:
        busy.setdefault(k.device, []).append((k.start_us, k.end_us))
    lengths = {d: union_length(spans) for d, spans in busy.items()}
    device = min(lengths, key=lambda d: (-lengths[d], d))
    note = (
        f"the trace has activity on {len(busy)} devices {sorted(busy)}; "
        f"the timeline shows device {device}, the busiest"
    )
    return device, (note,), False


def chosen_device(trace: Trace | TraceIndex) -> tuple[int | None, tuple[str, ...]]:
    """Return the device the timeline describes (the busiest; ties: lowest index) and notes."""
    ix = index_of(trace)
    device, notes, _ = _device_choice(ix)
    return device, notes


def device_kernels(trace: Trace | TraceIndex, device: int | None) -> tuple[Kernel, ...]:
    """Return the kernels, memcpys and memsets of one device, by start (computed once)."""
    ix = index_of(trace)
    trace = ix.trace

    def compute() -> tuple[Kernel, ...]:
        kernels = trace.kernels
        if device is None or not kernels:
            return tuple(k for k in kernels if k.device == device)
        mine = kernel_columns(ix).device == device
        if mine.all():
            return kernels
        return tuple([kernels[i] for i in np.flatnonzero(mine).tolist()])

    return memo(ix, ("device_kernels", device), compute)


def _spans(starts: Sequence[float], durs: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Return the union of [start, start + dur] spans as sorted disjoint (starts, ends)."""
    s = np.array(starts, dtype=float)
    return merge_arrays(s, s + np.array(durs, dtype=float))


_CODE = {cause: code for code, cause in enumerate(IDLE_CAUSES)}
_DATALOADER, _SYNC, _LAUNCH, _HOST, _OTHER = range(len(IDLE_CAUSES))


class _Classifier:
    """Assigns causes to idle gaps, many gaps at once: every rule is an array operation over
    the gaps (bisects become searchsorted). What only some gaps need (launch times) is built
    on first use."""

    def __init__(
        self,
        ix: TraceIndex,
        device: int | None,
        busy_starts: np.ndarray,
        kernels: Sequence[Kernel],
    ):
        trace = ix.trace
        self.on_device = device is not None
        self.index = ix
        # The top-level torch ops' spans, merged.
        self.op_starts, self.op_ends = top_level_spans(ix)
        dl = dataloader_ops(ix)
        self.dl_starts, self.dl_ends = _spans([o.start_us for o in dl], [o.dur_us for o in dl])
        sync_names = SYNC_RUNTIME_NAMES & runtime_names(ix)
        syncs: list[RuntimeCall | SyncEvent] = (
            [r for r in trace.runtime if r.name in sync_names] if sync_names else []
        )
        syncs += [
            s
            for s in trace.syncs
            if s.name in HOST_SYNC_EVENT_NAMES and (device is None or s.device in (device, -1))
        ]
        self.sync_starts, self.sync_ends = _spans(
            [s.start_us for s in syncs], [s.dur_us for s in syncs]
        )
        self.busy_starts = busy_starts
        self.kernels = kernels
        self._next_launch: np.ndarray | None = None

    def next_launch(self) -> np.ndarray:
        """For each busy stretch, when its first kernel was launched (the earliest launch
        among kernels starting together; nan without launch information). A later launch
        than a gap's start means the host had not issued it yet."""
        if self._next_launch is None:
            ix = self.index
            trace = ix.trace
            # The first call recorded with a kernel's correlation id launched it.
            keys, calls = first_call_of(ix)
            if len(self.kernels) == len(trace.kernels):
                k_corr, k_has, _, _ = kernel_ids(ix)
            else:
                k_corr, k_has = ids_of(self.kernels, "correlation")
            call = np.where(k_has, lookup(keys, calls, k_corr), -1)
            starts = runtime_starts(ix)
            nan = math.nan
            launched = np.where(call >= 0, starts[np.maximum(call, 0)] if len(starts) else nan, nan)
            k_starts = (
                kernel_columns(ix).start
                if len(self.kernels) == len(trace.kernels)
                else np.fromiter(map(_START, self.kernels), dtype=float, count=len(self.kernels))
            )
            busy_starts = self.busy_starts
            pos = np.searchsorted(busy_starts, k_starts, side="left")
            match = pos < len(busy_starts)
            match[match] = busy_starts[pos[match]] == k_starts[match]
            first = np.full(len(busy_starts), nan)
            # fmin ignores nan: a kernel without a known launch does not hide one with it.
            np.fmin.at(first, pos[match], launched[match])
            self._next_launch = first
        return self._next_launch

    def causes(
        self,
        lo_arr: np.ndarray,
        hi_arr: np.ndarray,
        leading: np.ndarray,
        trailing: np.ndarray,
        piece_lo: np.ndarray | None = None,
    ) -> np.ndarray:
        """Return the cause codes of idle pieces starting at `piece_lo` (default: the gaps'
        own starts) inside the gaps [lo_arr, hi_arr] (no DataLoader in them)."""
        a = lo_arr if piece_lo is None else piece_lo
        n = len(a)
        cause = np.full(n, _HOST, dtype=np.int8)
        decided = np.zeros(n, dtype=bool)
        edge = leading | trailing
        if self.on_device and len(self.sync_ends):
            # A blocking sync under way when the piece began (or returned within the slack
            # before it): the host was waiting, so the queue drained. A sync that starts
            # later in the gap did not cause it.
            i = np.searchsorted(self.sync_ends, a - th.SYNC_SLACK_US, side="left")
            inside = i < len(self.sync_ends)
            decided[inside] = self.sync_starts[i[inside]] <= a[inside]
            cause[decided] = _SYNC
        short = th.LAUNCH_GAP_MAX_US if self.on_device else th.CPU_DISPATCH_GAP_MAX_US
        launch = ~decided & ~edge & ((hi_arr - lo_arr) < short)
        cause[launch] = _LAUNCH
        decided |= launch
        if not self.on_device:
            return cause
        decided |= edge  # edges stay "host"
        rest = np.flatnonzero(~decided)
        if len(rest):
            j = np.searchsorted(self.busy_starts, hi_arr[rest], side="left")
            launched = np.full(len(rest), math.nan)
            known = j < len(self.busy_starts)
            launched[known] = self.next_launch()[j[known]]
            # Launched after the gap began: the host had not issued it yet.
            host = launched > lo_arr[rest]
            cause[rest] = np.where(host, _HOST, _OTHER)
        return cause

    @cached_property
    def op_spans(self) -> list[tuple[float, float]]:
        """The merged top-level op spans as (start, end) pairs, for host_in_ops_us."""
        return list(zip(self.op_starts.tolist(), self.op_ends.tolist(), strict=True))

    @cached_property
    def op_start_list(self) -> list[float]:
        return self.op_starts.tolist()  # type: ignore[no-any-return]

    def host_in_ops_us(self, lo: float, hi: float) -> float:
        """Return the microseconds of [lo, hi] during which a torch op ran on the host."""
        # The same sum as union_length(clip_intervals(...)): the op spans are merged (sorted,
        # apart), so their clipped parts need no merging again.
        spans = self.op_spans
        i = bisect.bisect_right(self.op_start_list, lo) - 1
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
        return float(sum(lengths))

    def host_in_ops_many(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """host_in_ops_us for many gaps at once: the k-th op span reaching each gap is added
        in the k-th pass over the gaps, so every gap's sum adds the same pieces in the same
        order as host_in_ops_us (which the few gaps reached by very many spans still use)."""
        out = np.zeros(len(lo))
        if not len(self.op_starts) or not len(lo):
            return out
        first = np.maximum(np.searchsorted(self.op_starts, lo, side="right") - 1, 0)
        count = np.searchsorted(self.op_starts, hi, side="left") - first
        many = count > _VECTOR_SPANS
        for g in np.flatnonzero(many).tolist():
            out[g] = self.host_in_ops_us(float(lo[g]), float(hi[g]))
        gaps = np.flatnonzero(~many & (count > 0))
        for k in range(int(count[gaps].max()) if len(gaps) else 0):
            gaps = gaps[count[gaps] > k]
            span = first[gaps] + k
            piece = np.minimum(self.op_ends[span], hi[gaps]) - np.maximum(
                self.op_starts[span], lo[gaps]
            )
            out[gaps] += np.where(piece > 0, piece, 0.0)  # + 0.0 leaves a sum as it is
        return out


# Gaps reached by more op spans than this are summed one by one (host_in_ops_many).
_VECTOR_SPANS = 64


def _per_cause(lengths: np.ndarray, causes: np.ndarray) -> dict[str, float]:
    """Return {cause: sum of its lengths}, each added one by one in gap order from 0.0."""
    return {
        cause: reduce(add, lengths[causes == code].tolist(), 0.0)
        for code, cause in enumerate(IDLE_CAUSES)
    }


def _busy_in(busy_starts: np.ndarray, busy_ends: np.ndarray, lo: float, hi: float) -> float:
    """Return union_length(clip_intervals(busy, lo, hi)) for merged busy stretches; only those
    ending after lo and starting before hi are looked at."""
    i0 = int(np.searchsorted(busy_ends, lo, side="right"))
    i1 = int(np.searchsorted(busy_starts, hi, side="left"))
    s = np.maximum(busy_starts[i0:i1], lo)
    e = np.minimum(busy_ends[i0:i1], hi)
    keep = e > s
    # Sorted, disjoint and apart after clipping: union_length's merge would change nothing.
    return float(sum((e[keep] - s[keep]).tolist()))


def activity_window(trace: Trace | TraceIndex) -> tuple[float, float]:
    """Return (start, end) in microseconds of the recorded work: ops, annotations, kernels and
    runtime calls, without the profiler's own span and instants (`PyTorch Profiler (0)`,
    `Record Window End`), which add its start-up and shutdown to the trace's window."""
    ix = index_of(trace)
    return memo(ix, "activity_window", lambda: _activity_window(ix))


def _activity_window(trace: Trace | TraceIndex) -> tuple[float, float]:
    ix = index_of(trace)
    trace = ix.trace
    ops = trace.ops
    # Few distinct names: test each once, not once per op.
    profiler = {name for name in op_names(ix) if name.startswith("PyTorch Profiler")}
    # A cell recorded with its lines (--stack) says when the user's code ran; the Python call
    # events then add only the profiler's own start-up and other threads (IPython's history
    # thread spans the whole recording), not work of the user's.
    cell = cell_span(trace)
    # Each sequence is sorted by start: its first element starts first. Of the ops, the
    # first one kept (not the profiler's; no Python events with the cell's lines).
    first_op: Op | None = ops[0] if ops else None
    if first_op is not None and (profiler or cell is not None):
        first_op = next(
            (o for o in ops if o.name not in profiler and (cell is None or o.kind != "python")),
            None,
        )
    seqs = [seq for seq in (trace.kernels, trace.runtime) if seq]
    lo, hi = trace.bounds_us
    if not seqs and first_op is None and cell is None:
        return lo, max(hi, lo)
    firsts = [seq[0].start_us for seq in seqs]
    lasts = [_last_end(ix, seq, profiler, cell is not None) for seq in seqs]
    if first_op is not None:
        firsts.append(first_op.start_us)
        lasts.append(_last_end(ix, ops, profiler, cell is not None))
    if cell is not None:
        firsts.append(cell[0])
        lasts.append(cell[1])
    a, b = max(min(firsts), lo), min(max(lasts), hi)
    return (a, b) if b > a else (lo, max(hi, lo))


def cell_span(trace: Trace) -> tuple[float, float] | None:
    """Return (start, end) in microseconds of the cell's own code in a recording with its
    lines (the first and last moment a line of the cell ran), or None without them."""
    s = trace.samples
    if s is None or not len(s):
        return None
    inside = [i for i, k in enumerate(s.stack_of) if s.stacks[k]]
    if not inside:
        return None
    first, last = inside[0], inside[-1]
    end = s.ts_us[last]
    if s.mode == "exact":  # an entry's stretch lasts until the next entry
        end = s.ts_us[last + 1] if last + 1 < len(s) else s.end_us
    return s.ts_us[first], max(end, s.ts_us[first])


def _last_end(
    trace: Trace | TraceIndex,
    seq: Sequence[Op | Kernel | RuntimeCall],
    profiler: set[str],
    no_python: bool = False,
) -> float:
    """The latest start_us + dur_us in one of the trace's sequences (the ops without the
    profiler's own), from the shared columns where they hold it (the same sums)."""
    ix = index_of(trace)
    trace = ix.trace
    if seq is trace.kernels:
        return float(kernel_columns(ix).end.max())
    if seq is trace.runtime:
        return float((runtime_starts(ix) + runtime_durs(ix)).max())
    # Ops: the torch ops' ends are a shared column; the other kinds (annotations) and the
    # profiler's ops, if any is a torch op, are few.
    cols = op_columns(ix)
    names, codes = op_name_codes(ix)
    keep = np.ones(len(codes), dtype=bool)
    for c, name in enumerate(names):
        if name in profiler:
            keep &= codes != c
    ends = [float(cols.end[keep].max())] if keep.any() else []
    # The other ops (annotations, Python events: thousands with stacks), as columns.
    other = other_op_columns(ix)
    kept = ~other.is_python if no_python else np.ones(len(other.ops), dtype=bool)
    if profiler:
        kept &= ~np.fromiter(
            map(profiler.__contains__, map(_NAME, other.ops)), dtype=bool, count=len(other.ops)
        )
    if kept.any():
        latest = float(other.end[kept].max())
        if math.isnan(latest):  # a hand-made trace: max() as Python takes it, in order
            rest = compress(other.ops, kept.tolist())
            return float(max(ends + [o.end_us for o in rest]))
        ends.append(latest)
    return float(max(ends))


# Runtime calls that queue work on the device: kernel and graph launches, copies, memsets
# (cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, ...).
_DEVICE_WORK_CALL_MARKS = ("launch", "memcpy", "memset")


def unrecorded_launches(trace: Trace) -> tuple[RuntimeCall, ...]:
    """Return the runtime calls that queued device work on a trace without kernel events (the
    device ran, but its activity was not recorded as kernels: CUPTI range-profiler mode, or a
    run without ProfilerActivity.CUDA); empty when kernels were recorded or nothing was
    launched (a CPU-only run)."""
    if trace.kernels:
        return ()
    return tuple(
        r for r in trace.runtime if any(m in r.name.lower() for m in _DEVICE_WORK_CALL_MARKS)
    )


def device_timeline(trace: Trace | TraceIndex) -> Timeline:
    """Return the device's busy and idle microseconds over the recorded activity and per step,
    with each idle gap's cause (the host's view, busy = inside torch ops, without a device)."""
    ix = index_of(trace)
    trace = ix.trace
    lo, hi = activity_window(ix)
    device, notes, only_device = _device_choice(ix)
    on_device = device is not None
    kernels: Sequence[Kernel] = ()
    if on_device:
        kernels = trace.kernels if only_device else device_kernels(ix, device)
        kc = kernel_columns(ix, kernels, key=("device", device))
        starts, ends = kc.start, kc.end
    else:
        starts, ends = _host_busy(ix)
        notes += (_host_view_note(trace),)
    # Clipped to the window, then merged: merge_intervals(clip_intervals(...)).
    busy_starts, busy_ends = merge_arrays(np.maximum(starts, lo), np.minimum(ends, hi))
    classifier = _Classifier(ix, device, busy_starts, kernels)
    gaps = _GapTable(classifier, busy_starts, busy_ends, lo, hi, on_device)
    overall = gaps.breakdown(0, len(gaps.gaps), lo, hi)
    timeline = Timeline(
        window_us=overall.span_us,
        busy_us=overall.busy_us,
        start_us=lo,
        end_us=hi,
        device=device,
        on_device=on_device,
        breakdown=overall,
        steps=gaps.steps(trace.steps, lo, hi),
        gaps=tuple(gaps.gaps),
        notes=notes,
    )
    if not on_device:
        return timeline
    # Per stream (analysis/streams.py); the queue strips cover the step the Timeline draws.
    rep = timeline.representative_step
    span = (rep.start_us, rep.end_us) if rep is not None else (lo, hi)
    return dataclasses.replace(
        timeline,
        streams=stream_idle(ix, device),
        queues=stream_queues(ix, device, span),
        queue_span_us=span,
        launch_delays=launch_delays(ix, device),
    )


def _host_busy(ix: TraceIndex) -> tuple[np.ndarray, np.ndarray]:
    """Return the starts and ends of the top-level torch ops: the host's busy time on a trace
    without device activity."""
    ops = ix.trace.ops
    top = top_level_positions(ix)
    starts = np.array([ops[i].start_us for i in top], dtype=float)
    ends = starts + np.array([ops[i].dur_us for i in top], dtype=float)
    return starts, ends


def _host_view_note(trace: Trace) -> str:
    """Return the note of a timeline of the host: why there is no device to draw."""
    launched = len(unrecorded_launches(trace))
    what = (
        f"the GPU ran ({launched} calls queued work on it) but its kernels were not recorded"
        if launched
        else "no device activity in the trace"
    )
    return (
        f"{what}: the breakdown is of the host "
        "(busy = inside torch ops, host = Python between them)"
    )


class _GapTable:
    """The idle gaps of the window between busy stretches, each with its cause (array
    columns), and the idle breakdown of any span of them."""

    def __init__(
        self,
        classifier: _Classifier,
        busy_starts: np.ndarray,
        busy_ends: np.ndarray,
        lo: float,
        hi: float,
        on_device: bool,
    ) -> None:
        self.classifier = classifier
        self.busy_starts, self.busy_ends = busy_starts, busy_ends
        self.on_device = on_device
        hole_lo, hole_hi = _holes(busy_starts, busy_ends, lo, hi)
        self.lo, self.hi, self.cause = _classify_holes(classifier, hole_lo, hole_hi, lo, hi)
        self.lo_list = self.lo.tolist()
        hi_list = self.hi.tolist()
        causes = np.array(IDLE_CAUSES, dtype=object)[self.cause].tolist() if len(self.cause) else []
        self.gaps = list(map(_new_gap, self.lo_list, hi_list, causes))
        # Host time inside torch ops, per host gap, computed once for the window and the steps.
        self.is_host = self.cause == _HOST
        self.host_us = np.zeros(len(self.gaps))
        if on_device:
            self.host_us[self.is_host] = classifier.host_in_ops_many(
                self.lo[self.is_host], self.hi[self.is_host]
            )

    def breakdown(self, first: int, last: int, a: float, b: float) -> IdleBreakdown:
        """Return the idle breakdown of [a, b], whose gaps are first..last-1 (clipped to it,
        max/min as clip_intervals does)."""
        g_lo = np.maximum(self.lo[first:last], a)
        g_hi = np.minimum(self.hi[first:last], b)
        keep = g_hi > g_lo
        causes = self.cause[first:last][keep]
        per = _per_cause((g_hi - g_lo)[keep], causes)
        host_in_ops = 0.0
        if self.on_device:
            host = np.flatnonzero(keep & self.is_host[first:last])
            whole = (g_lo[host] == self.lo[first:last][host]) & (
                g_hi[host] == self.hi[first:last][host]
            )
            values = self.host_us[first:last][host]
            for g in np.flatnonzero(~whole).tolist():  # clipped at the span's edges
                values[g] = self.classifier.host_in_ops_us(
                    float(g_lo[host[g]]), float(g_hi[host[g]])
                )
            host_in_ops = reduce(add, values.tolist(), 0.0)
        return IdleBreakdown(
            span_us=max(b - a, 0.0),
            busy_us=_busy_in(self.busy_starts, self.busy_ends, a, b),
            dataloader_us=per["dataloader"],
            sync_us=per["sync"],
            launch_us=per["launch"],
            host_us=per["host"],
            other_us=per["other"],
            host_in_ops_us=host_in_ops,
        )

    def steps(self, steps: Sequence[Step], lo: float, hi: float) -> tuple[StepTimeline, ...]:
        """Return each step's timeline, the step clipped to the window [lo, hi]."""
        out = []
        lo_list = self.lo_list
        for step in steps:
            s_lo, s_hi = max(step.start_us, lo), min(step.end_us, hi)
            if s_hi < s_lo:
                s_hi = s_lo
            first = max(bisect.bisect_right(lo_list, s_lo) - 1, 0)
            last = bisect.bisect_left(lo_list, s_hi)
            out.append(
                StepTimeline(
                    step.number,
                    step.name,
                    step.start_us,
                    step.end_us,
                    self.breakdown(first, last, s_lo, s_hi),
                )
            )
        return tuple(out)


def _holes(
    busy_starts: np.ndarray, busy_ends: np.ndarray, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return the holes between the merged busy stretches within [lo, hi] (gaps_between(busy,
    lo, hi)): their starts and ends."""
    if not hi > lo:
        return np.zeros(0), np.zeros(0)
    hole_lo = np.concatenate(([lo], busy_ends))
    hole_hi = np.concatenate((busy_starts, [hi]))
    keep = hole_hi > hole_lo
    return hole_lo[keep], hole_hi[keep]


def _classify_holes(
    classifier: _Classifier, hole_lo: np.ndarray, hole_hi: np.ndarray, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the idle gaps (starts, ends, cause codes): the holes, cut where the
    DataLoader's spans begin or end inside one."""
    leading, trailing = hole_lo <= lo, hole_hi >= hi
    dl_starts, dl_ends = classifier.dl_starts, classifier.dl_ends
    if len(dl_starts) and len(hole_lo):
        k = np.searchsorted(dl_starts, hole_hi, side="left") - 1
        with_dl = (k >= 0) & (dl_ends[np.maximum(k, 0)] > hole_lo)
    else:
        with_dl = np.zeros(len(hole_lo), dtype=bool)
    if not with_dl.any():
        return hole_lo, hole_hi, classifier.causes(hole_lo, hole_hi, leading, trailing)
    # Holes the DataLoader reaches: its parts are "dataloader", the rest of the hole is
    # judged as a whole hole would be (its bounds decide launch gaps and edges). The
    # DataLoader spans are merged (sorted, apart), so their ends strictly inside holes cut
    # the holes into pieces that are each wholly in a span or wholly out of all.
    cuts = np.concatenate((dl_starts, dl_ends))
    h = np.searchsorted(hole_lo, cuts, side="right") - 1
    inside = h >= 0
    inside[inside] = cuts[inside] < hole_hi[h[inside]]
    inside &= cuts > hole_lo[np.maximum(h, 0)]
    cuts = cuts[inside]
    # Pieces in order: the i-th start goes with the i-th end (holes are disjoint).
    gap_lo = np.sort(np.concatenate((hole_lo, cuts)))
    gap_hi = np.sort(np.concatenate((hole_hi, cuts)))
    hole = np.searchsorted(hole_lo, gap_lo, side="right") - 1
    k = np.searchsorted(dl_starts, gap_lo, side="right") - 1
    piece_dl = (k >= 0) & (dl_ends[np.maximum(k, 0)] > gap_lo)
    gap_cause = classifier.causes(
        hole_lo[hole], hole_hi[hole], leading[hole], trailing[hole], piece_lo=gap_lo
    )
    gap_cause[piece_dl] = _DATALOADER
    return gap_lo, gap_hi, gap_cause


def median_duration_us(durations: Sequence[float]) -> float:
    """Return the median of the durations in microseconds (nan when there are none)."""
    return float(statistics.median(durations)) if durations else float("nan")


def breakdown_shares(breakdown: IdleBreakdown) -> Mapping[str, float]:
    """Return {category: share of the span} for every category."""
    return {c: breakdown.fraction(c) for c in breakdown.us_by_category()}


def gap_columns(
    index: TraceIndex, timeline: Timeline
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Return the timeline's idle gaps, in its order, as columns: starts, ends, causes as
    codes, and each cause's code. Read once per timeline (the module breakdown reads the
    same gaps); the index keeps the timeline with them, so its id names no other."""

    def compute() -> tuple[Timeline, tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]]:
        gaps = timeline.gaps
        n = len(gaps)
        causes, code = codes_of(map(_CAUSE, gaps), n)
        starts = np.fromiter(map(_START, gaps), dtype=float, count=n)
        ends = np.fromiter(map(_END, gaps), dtype=float, count=n)
        code_of = {c: k for k, c in enumerate(causes)}
        return timeline, (frozen(starts), frozen(ends), frozen(code), code_of)

    return memo(index, ("timeline_gap_columns", id(timeline)), compute)[1]
