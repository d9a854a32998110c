"""Device work launched outside every torch op, by the runtime call that launched it
(OpTable.launchers). Pure functions.

A kernel no op owns (analysis/ops.py) but whose launch call the trace records (its
correlation id: cudaLaunchKernel, cuLaunchKernel for Triton, hipLaunchKernel, a graph
launch...) is shown under that call's name rather than as unattributed time, and, when the
trace holds Python stacks (gpuprof_nb's line sampler with `--stack`, or the profiler's
python_function events with `with_stack=True`), under the user's line running when the
call was made: the innermost frame of the user's own code (a notebook cell or their files,
analysis/hotspots.frame_kind), named as the Hotspots tab names lines.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from gpuprof_nb.analysis.derived import TraceIndex, index_of, kernel_columns, memo
from gpuprof_nb.analysis.hotspots import frame_kind
from gpuprof_nb.analysis.sources import profiler_frame_parts, source_label
from gpuprof_nb.analysis.streams import launch_calls
from gpuprof_nb.model.frames import Frame
from gpuprof_nb.model.trace import Op, Trace
from gpuprof_nb.results.tables import LaunchRow

__all__ = ["call_lines", "launch_rows", "lines_at"]


def launch_rows(trace: Trace | TraceIndex, unowned: np.ndarray) -> tuple[LaunchRow, ...]:
    """Return the device work of the activities marked `unowned` (by position in
    trace.kernels) that a recorded runtime call launched, grouped by (call name, user line),
    most device time first (ties: name, then line)."""
    ix = index_of(trace)
    trace = ix.trace
    calls = launch_calls(ix)
    pick = np.flatnonzero(unowned & (calls >= 0))
    if not len(pick):
        return ()
    dur = kernel_columns(ix).dur
    used = sorted(set(calls[pick].tolist()))
    lines = call_lines(ix, used)
    groups: dict[tuple[str, str], list[float]] = {}
    seen: set[int] = set()
    for k, c in zip(pick.tolist(), calls[pick].tolist(), strict=True):
        call = trace.runtime[c]
        g = groups.setdefault((call.name, lines.get(c, "")), [0, 0, 0.0, 0.0])
        g[1] += 1
        g[2] += float(dur[k])
        if c not in seen:
            seen.add(c)
            g[0] += 1
            g[3] += call.dur_us
    rows = [
        LaunchRow(name, line, int(g[0]), int(g[1]), g[2], g[3])
        for (name, line), g in groups.items()
    ]
    rows.sort(key=lambda r: (-r.device_us, r.name, r.line))
    return tuple(rows)


def call_lines(trace: Trace | TraceIndex, calls: Sequence[int]) -> dict[int, str]:
    """Return the user's line running when each runtime call (by position in trace.runtime)
    started, for the calls where the trace's Python stacks tell; {} without stacks."""
    ix = index_of(trace)
    trace = ix.trace
    runtime = trace.runtime
    points = [((str(runtime[c].pid), str(runtime[c].tid)), runtime[c].start_us) for c in calls]
    return {c: line for c, line in zip(calls, lines_at(ix, points), strict=True) if line}


def lines_at(
    trace: Trace | TraceIndex, points: Sequence[tuple[tuple[str, str], float]]
) -> list[str]:
    """Return the user's line running on each (thread, time) point ('' where the trace's
    Python stacks do not tell): from gpuprof_nb's line samples (of the cell's thread, so the
    thread is not checked), else from the python_function events of that thread."""
    ix = index_of(trace)
    trace = ix.trace
    samples = trace.samples
    out = [""] * len(points)
    if samples is not None and len(samples):
        ts = list(samples.ts_us)
        for n, (_, t) in enumerate(points):
            # An exact line event starts a stretch that lasts until the next one; a signal
            # sample stands for the time since the one before it; a thread sample for the
            # time around it.
            if samples.mode == "exact":
                i = bisect.bisect_right(ts, t) - 1
            else:
                i = bisect.bisect_left(ts, t)
                if (
                    samples.mode != "signal"
                    and i > 0
                    and (i == len(ts) or t - ts[i - 1] < ts[i] - t)
                ):
                    i -= 1
            if 0 <= i < len(ts):
                stack = samples.stacks[samples.stack_of[i]]
                frames = [samples.frames[f] for f in stack]
                out[n] = _innermost_user(frames, trace, first_line=False)
        return out
    threads = _python_threads(ix)
    for n, (thread, t) in enumerate(points):
        events = threads.get(thread)
        if not events:
            continue
        starts, funcs, parent = events
        # The innermost event open at t: the last to start before it, or the nearest of
        # its enclosing events still open (python events nest on a thread).
        i = bisect.bisect_right(starts, t) - 1
        while i >= 0 and funcs[i].end_us < t:
            i = parent[i]
        frames = []
        while i >= 0:
            parts = profiler_frame_parts(funcs[i].name)
            if parts is not None:
                frames.append(Frame(*parts))
            i = parent[i]
        out[n] = _innermost_user(frames[::-1], trace, first_line=True)
    return out


def _innermost_user(frames: Sequence[Frame], trace: Trace, *, first_line: bool) -> str:
    for f in reversed(frames):
        if f.file and frame_kind(f.file) == "user":
            return source_label(f.file, f.line, f.function, trace.cells, first_line=first_line)
    return ""


def _python_threads(
    trace: Trace | TraceIndex,
) -> dict[tuple[str, str], tuple[list[float], list[Op], list[int]]]:
    """Each thread's python_function events by (start, longer first), with each one's
    enclosing event (-1 at the top), computed once."""
    ix = index_of(trace)
    trace = ix.trace

    def compute() -> dict[tuple[str, str], tuple[list[float], list[Op], list[int]]]:
        by: dict[tuple[str, str], list[Op]] = {}
        for o in trace.ops:
            if o.kind == "python":
                by.setdefault((str(o.pid), str(o.tid)), []).append(o)
        out = {}
        for thread, funcs in by.items():
            funcs.sort(key=lambda o: (o.start_us, -o.dur_us, o.index))
            parent: list[int] = []
            stack: list[int] = []
            for i, o in enumerate(funcs):
                while stack and funcs[stack[-1]].end_us < o.start_us:
                    stack.pop()
                parent.append(stack[-1] if stack else -1)
                stack.append(i)
            out[thread] = ([o.start_us for o in funcs], funcs, parent)
        return out

    return memo(ix, "python_threads", compute)
