"""Per stream of one device: the idle time between its activities by cause, its launch queue
over time, and the delay from each launch call to its activity's start. Pure functions.

Definitions (HolisticTraceAnalysis's, where it has one; docs/hta-parity.md compares the two
on every trace HTA reads):

- An activity is a kernel, memcpy or memset of the device. Its launch call is the runtime
  call recorded with its correlation id (cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel,
  cudaMemcpyAsync, cudaGraphLaunch, ...): the last one when several carry the id.
- Idle time of a stream: the gaps between its consecutive activities (by start), each gap
  given one cause: `host_wait` when the next activity's launch call started after the
  previous activity ended (the host had not issued it yet); else `kernel_wait` when the gap
  is shorter than KERNEL_WAIT_MAX_US (back-to-back launches); else `other` (work was queued,
  yet the stream waited: on an event, another stream, a copy). Time before a stream's first
  activity and after its last is not idle time of that stream. Overlapping activities of
  one stream (never seen on real traces) leave no gap.
- Queue length of a stream: +1 when a launch call starts, -1 when its activity starts (a
  graph launch adds one per activity it launched); launches and starts at the same instant
  count the launch first. Activities without a launch call are left out.
- Launch delay: activity start - (launch call start + its duration), clipped at 0.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis.derived import (
    TraceIndex,
    frozen,
    index_of,
    kernel_columns,
    kernel_ids,
    last_call_of,
    lex_order,
    lookup,
    memo,
    percentile,
    runtime_starts,
)
from gpuprof_nb.analysis.derived import (
    median as median_of,
)
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.timeline import LaunchDelays, LaunchWait, StreamIdle, StreamQueue

__all__ = [
    "KERNEL_WAIT_MAX_US",
    "QUEUE_STRIP_BINS",
    "launch_calls",
    "kernel_streams",
    "launch_delays",
    "runtime_durs",
    "stream_columns",
    "stream_idle",
    "stream_queues",
]

# A gap between two activities of one stream shorter than this, with the next one already
# launched, is the launch path itself (HolisticTraceAnalysis's consecutive_kernel_delay: its
# documentation says 30 ns, but its times are microseconds, so the threshold it applies is
# 30 us).
KERNEL_WAIT_MAX_US = 30.0
# Bins of a queue strip (a few per pixel of the drawn timeline's width).
QUEUE_STRIP_BINS = 300
# Activities listed as the ones that waited longest after their launch.
LONGEST_WAITS = 5
_STREAM, _DUR = attrgetter("stream"), attrgetter("dur_us")


def launch_calls(trace: Trace | TraceIndex) -> np.ndarray:
    """Return, per activity in trace.kernels, the position in trace.runtime of its launch
    call (the last call recorded with its correlation id), -1 without one (computed once)."""
    ix = index_of(trace)

    def compute() -> np.ndarray:
        keys, calls = last_call_of(ix)
        corr, has, _, _ = kernel_ids(ix)
        return frozen(np.where(has, lookup(keys, calls, corr), -1).astype(np.intp))

    return memo(ix, "launch_calls", compute)


def kernel_streams(trace: Trace | TraceIndex) -> np.ndarray:
    """Return each activity's stream, in trace.kernels' order, once."""
    ix = index_of(trace)
    trace = ix.trace
    return memo(
        ix,
        "kernel_streams",
        lambda: frozen(
            np.fromiter(map(_STREAM, trace.kernels), dtype=np.int64, count=len(trace.kernels))
        ),
    )


def runtime_durs(trace: Trace | TraceIndex) -> np.ndarray:
    """Return trace.runtime's durations, once."""
    ix = index_of(trace)
    trace = ix.trace
    return memo(
        ix,
        "runtime_durs",
        lambda: frozen(
            np.fromiter(map(_DUR, trace.runtime), dtype=float, count=len(trace.runtime))
        ),
    )


class StreamColumns:
    """The activities of one device as columns, ordered by (stream, start, position)."""

    def __init__(self, trace: Trace | TraceIndex, device: int | None) -> None:
        ix = index_of(trace)
        kc = kernel_columns(ix)
        pos = np.flatnonzero(kc.device == device) if device is not None else np.zeros(0, int)
        streams = kernel_streams(ix)[pos]
        order = lex_order((pos, kc.start[pos], streams))
        self.pos = pos[order]
        self.stream = streams[order]
        self.start = kc.start[self.pos]
        self.end = kc.end[self.pos]
        self.call = launch_calls(ix)[self.pos]
        starts = runtime_starts(ix)
        has = self.call >= 0
        self.launch = np.full(len(self.pos), np.nan)
        self.launch[has] = starts[self.call[has]]
        self.device = device
        # Each stream's run in that order: [bounds[i], bounds[i + 1]).
        self.streams, first = np.unique(self.stream, return_index=True)
        self.bounds = np.append(first, len(self.pos))


def stream_columns(trace: Trace | TraceIndex, device: int | None) -> StreamColumns:
    """Return the device's activities as columns ordered by (stream, start, position), with
    their launch calls and each stream's run (computed once per device)."""
    ix = index_of(trace)
    return memo(ix, ("stream_columns", device), lambda: StreamColumns(ix, device))


def stream_idle(trace: Trace | TraceIndex, device: int | None) -> tuple[StreamIdle, ...]:
    """Return each stream's idle time between its activities by cause (see the module's
    docstring), streams in ascending order; empty without a device."""
    ix = index_of(trace)
    d = stream_columns(ix, device)
    if device is None or not len(d.pos):
        return ()
    out = []
    for i, stream in enumerate(d.streams.tolist()):
        a, b = int(d.bounds[i]), int(d.bounds[i + 1])
        start, end, launch = d.start[a:b], d.end[a:b], d.launch[a:b]
        prev_end = end[:-1]
        gap = np.maximum(start[1:] - prev_end, 0.0)
        host = launch[1:] > prev_end  # nan (no launch call) is never a host wait
        kernel = ~host & (gap < KERNEL_WAIT_MAX_US)
        other = ~host & ~kernel
        out.append(
            StreamIdle(
                device=device,
                stream=int(stream),
                activities=b - a,
                busy_us=float((end - start).sum()),
                host_wait_us=float(gap[host].sum()),
                kernel_wait_us=float(gap[kernel].sum()),
                other_us=float(gap[other].sum()),
            )
        )
    return tuple(out)


def _queue_series(d: StreamColumns, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Return one stream's queue length as a step function: the times where it changes
    and the length from each of them on."""
    has = d.call[a:b] >= 0
    launch, start = d.launch[a:b][has], d.start[a:b][has]
    times = np.concatenate((launch, start))
    delta = np.concatenate((np.ones(len(launch), np.int64), -np.ones(len(start), np.int64)))
    order = lex_order((-delta, times), lead=1)  # a launch before a start at the same instant
    return times[order], np.cumsum(delta[order])


def _strip(
    times: np.ndarray, length: np.ndarray, span: tuple[float, float], bins: int
) -> tuple[int, ...]:
    """The largest queue length in each of `bins` equal bins of `span`: the length holding
    at a bin's start, and every length reached inside it."""
    lo, hi = span
    edges = np.linspace(lo, hi, bins + 1)
    held_at = np.searchsorted(times, edges[:-1], side="right") - 1
    held = np.where(held_at >= 0, length[np.maximum(held_at, 0)], 0)
    first = np.searchsorted(times, edges[:-1], side="right")
    last = np.searchsorted(times, edges[1:], side="left")
    out = held.copy()
    reached = np.flatnonzero(last > first)
    if len(reached):
        # The largest length in each bin's [first, last): the bins' ranges are disjoint and
        # in order, so one reduceat over their bounds finds them all (every other result).
        bounds = np.empty(2 * len(reached), dtype=np.intp)
        bounds[0::2], bounds[1::2] = first[reached], last[reached]
        if bounds[-1] >= len(length):
            bounds = bounds[:-1]  # the last range runs to the end
        inside = np.maximum.reduceat(length, bounds)[0::2]
        out[reached] = np.maximum(out[reached], inside)
    return tuple(int(v) for v in out.tolist())


def stream_queues(
    trace: Trace | TraceIndex,
    device: int | None,
    span: tuple[float, float] | None = None,
    bins: int = QUEUE_STRIP_BINS,
) -> tuple[StreamQueue, ...]:
    """Return each stream's launch queue (see the module's docstring): its largest length,
    time-weighted mean and median, empty share and HolisticTraceAnalysis's event mean, with
    a strip of `bins` maxima over `span` when given; streams with a launched activity only,
    in ascending order."""
    ix = index_of(trace)
    d = stream_columns(ix, device)
    if device is None or not len(d.pos):
        return ()
    out = []
    for i, stream in enumerate(d.streams.tolist()):
        a, b = int(d.bounds[i]), int(d.bounds[i + 1])
        times, length = _queue_series(d, a, b)
        if not len(times):
            continue
        held = np.diff(times)  # how long each length (but the last, 0) holds
        lengths = length[:-1]
        total = float(held.sum())
        if total > 0:
            mean = float((lengths * held).sum() / total)
            empty = float(held[lengths == 0].sum() / total)
            # Time-weighted median: the length at which half the span is reached (lengths
            # are small counts: their time per length, added up).
            # (A kernel recorded as starting before its launch would make one negative.)
            per_length = np.cumsum(np.bincount(np.maximum(lengths, 0), weights=held))
            median = float(np.searchsorted(per_length, total / 2, side="left"))
        else:
            mean = float(length.mean())
            empty = 0.0
            median = median_of(length)
        out.append(
            StreamQueue(
                device=device,
                stream=int(stream),
                launches=len(times) // 2,
                max_length=int(length.max()),
                mean_length=mean,
                median_length=median,
                empty_fraction=empty,
                event_mean=float(length.mean()),
                strip=_strip(times, length, span, bins) if span is not None else (),
            )
        )
    return tuple(out)


def launch_delays(
    trace: Trace | TraceIndex, device: int | None, longest: int = LONGEST_WAITS
) -> LaunchDelays | None:
    """Return the delays from launch calls' returns to their activities' starts on the device
    (see the module's docstring), with the `longest` waits (ties: earlier first); None when no
    activity of the device has a launch call."""
    ix = index_of(trace)
    trace = ix.trace
    d = stream_columns(ix, device)
    has = d.call >= 0
    if device is None or not has.any():
        return None
    call = d.call[has]
    returned = d.launch[has] + runtime_durs(ix)[call]
    delay = np.maximum(d.start[has] - returned, 0.0)
    pos = d.pos[has]
    # Longest first; ties by start, then position in the file (among the candidates that
    # can be in the first `longest`: every delay at least the longest-th largest).
    floor = -np.partition(-delay, min(longest, len(delay)) - 1)[min(longest, len(delay)) - 1]
    cand = np.flatnonzero(delay >= floor)
    top = cand[np.lexsort((pos[cand], d.start[has][cand], -delay[cand]))][:longest]
    waits = []
    for j in top.tolist():
        k = trace.kernels[int(pos[j])]
        r = trace.runtime[int(call[j])]
        waits.append(LaunchWait(k.name, k.stream, k.start_us, float(delay[j]), r.name, r.dur_us))
    return LaunchDelays(
        count=int(len(delay)),
        median_us=median_of(delay),
        p95_us=percentile(delay, 95),
        max_us=float(delay.max()),
        mean_us=float(delay.mean()),
        longest=tuple(waits),
    )
