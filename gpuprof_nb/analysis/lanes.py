"""What a timeline drawing shows of a trace: lanes of bars over one step (or the whole
window), the busiest CPU threads' top-level torch ops first, then the streams of the
timeline's device, each kernel by its class. `analyze` computes the lanes of the step the
report draws (its representative step) and the report carries them, so drawing it calls no
analysis; `timeline_lanes` gives the lanes of any other step for `plot_timeline`."""

from __future__ import annotations

import bisect
from operator import attrgetter
from typing import cast

import numpy as np

from gpuprof_nb.analysis.classify import kernel_class
from gpuprof_nb.analysis.derived import TraceIndex, index_of, kernel_columns
from gpuprof_nb.analysis.timeline import top_level_ops_within
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.timeline import (
    Bar,
    BarKind,
    StepTimeline,
    Timeline,
    TimelineLane,
    TimelineLanes,
)

# The most lanes drawn: the busiest CPU threads, the device's first streams.
MAX_CPU_LANES = 4
MAX_GPU_LANES = 8

_start = attrgetter("start_us")


def timeline_lanes(
    trace: Trace | TraceIndex, timeline: Timeline, step: StepTimeline | int | None = None
) -> TimelineLanes:
    """Return the lanes of a drawing of `step` (a StepTimeline, its number, or None: the
    whole window; Timeline.drawn_span) of the trace `timeline` describes: per CPU thread
    (the MAX_CPU_LANES busiest), the top-level torch ops overlapping the span; per stream of
    the timeline's device (the first MAX_GPU_LANES), the activities overlapping it. Bars in
    each lane are by (start, end)."""
    ix = index_of(trace)
    trace = ix.trace
    _, lo, hi = timeline.drawn_span(step)
    lanes: list[tuple[str, str, list[Bar]]] = []
    # Only ops overlapping the drawn span are drawn, and an op enclosing one of them
    # overlaps it too: the top-level test on those finds the same ops as on the whole
    # trace, for a fraction of the cost when one step of a long trace is drawn.
    by_thread: dict[str, list[Bar]] = {}
    for o in top_level_ops_within(ix, lo, hi):
        by_thread.setdefault(str(o.tid), []).append(
            (o.start_us, o.start_us + o.dur_us, "op", o.name)
        )
    busy = {t: sum(e - s for s, e, _, _ in items) for t, items in by_thread.items()}
    for t in sorted(by_thread, key=lambda t: (-busy[t], t))[:MAX_CPU_LANES]:
        lanes.append((f"CPU thread {t}", "ops", by_thread[t]))
    if timeline.device is not None:
        by_stream: dict[int, list[Bar]] = {}
        device = timeline.device
        # The device's activities starting before hi and ending after lo (the columns' ends
        # are the same sums), found in the columns, not by reading every earlier activity.
        kc = kernel_columns(ix)
        m = bisect.bisect_left(trace.kernels, hi, key=_start)
        for i in np.flatnonzero((kc.device[:m] == device) & (kc.end[:m] > lo)).tolist():
            k = trace.kernels[i]
            by_stream.setdefault(k.stream, []).append(
                (k.start_us, k.start_us + k.dur_us, cast(BarKind, kernel_class(k)), k.name)
            )
        for st in sorted(by_stream)[:MAX_GPU_LANES]:
            lanes.append((f"GPU {device} stream {st}", "kernels", by_stream[st]))
    for _, _, items in lanes:
        items.sort(key=lambda it: (it[0], it[1]))
    return TimelineLanes(
        lo, hi, tuple(TimelineLane(label, what, tuple(bars)) for label, what, bars in lanes)
    )
