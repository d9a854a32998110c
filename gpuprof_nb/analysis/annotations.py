"""Time by `record_function` range: the Annotations table (ProfileReport.annotations), and
which device-side range each kernel ran under. Pure functions.

Host ranges are the trace's `user_annotation` events (Op kind "annotation"), nested per
host thread: a range's parent is the innermost range of its thread still open when it starts.
Rows sum the ranges with the same names from the top of the tree down (`ProfilerStep#N` is
one name, `ProfilerStep#*`, so steps share their rows). A range's device time is that of the
activities launched inside it: their launch call (analysis/streams.launch_calls) started in
the range, on its thread.

Device ranges are the `gpu_user_annotation` events: the profiler's projection of a range
onto the stream its kernels ran on. Each joins the row of the host range with its External
id; one without a host twin gets a row of its own at the top. A device range spans the
activities of its stream that overlap it.

`kernel_gpu_annotations` gives each activity the innermost device range overlapping it
(the shortest, ties by position in the file), as HolisticTraceAnalysis's
get_gpu_kernels_with_user_annotations does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuprof_nb.analysis.derived import kernel_columns, memo, runtime_threads
from gpuprof_nb.analysis.intervals import nearest_open_at, nearest_open_before
from gpuprof_nb.analysis.streams import kernel_streams, launch_calls
from gpuprof_nb.model.trace import Op, Trace
from gpuprof_nb.results.annotations import AnnotationRow, AnnotationTable

__all__ = ["MAX_ROWS", "annotation_table", "kernel_gpu_annotations", "row_name"]

# Rows shown at most (a trace with thousands of distinct ranges keeps its largest).
MAX_ROWS = 300
_STEP = re.compile(r"ProfilerStep#\d+$")


def row_name(name: str) -> str:
    """Return the name a range's row carries: numbered profiler steps share one."""
    return "ProfilerStep#*" if _STEP.match(name) else name


@dataclass
class _Node:
    name: str
    parent: int
    depth: int
    children: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    host_us: float = 0.0
    device_us: float = 0.0
    kernels: int = 0
    gpu_calls: int = 0
    gpu_span_us: float = 0.0
    gpu_kernel_us: float = 0.0
    gpu_kernels: int = 0
    total_host: float = 0.0


def _host_ranges(trace: Trace) -> list[Op]:
    return [o for o in trace.ops if o.kind == "annotation" and o.dur_us >= 0]


def _nest(ranges: Sequence[Op]) -> tuple[list[int], dict[tuple[Any, Any], np.ndarray]]:
    """Return each range's parent (index into `ranges`, -1 at the top) and, per thread, the
    range indices in (start, longer first, file position) order."""
    by_thread: dict[tuple[Any, Any], list[int]] = {}
    for i, r in enumerate(ranges):
        by_thread.setdefault((r.pid, r.tid), []).append(i)
    parent = [-1] * len(ranges)
    ordered: dict[tuple[Any, Any], np.ndarray] = {}
    for thread, members in by_thread.items():
        members.sort(key=lambda i: (ranges[i].start_us, -ranges[i].dur_us, ranges[i].index))
        stack: list[int] = []
        for i in members:
            r = ranges[i]
            while stack and ranges[stack[-1]].end_us <= r.start_us:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
        ordered[thread] = np.array(members, dtype=np.intp)
    return parent, ordered


def _launched_in(
    trace: Trace, ranges: Sequence[Op], ordered: dict[tuple[Any, Any], np.ndarray]
) -> np.ndarray:
    """Return, per activity in trace.kernels, the innermost host range (index into `ranges`)
    of its launch call's thread open at the call's start, -1 when none is."""
    out = np.full(len(trace.kernels), -1, dtype=np.intp)
    calls = launch_calls(trace)
    has = np.flatnonzero(calls >= 0)
    if not len(has) or not ranges:
        return out
    codes, pairs = runtime_threads(trace)
    call_thread = codes[calls[has]]
    call_start = np.fromiter(
        (trace.runtime[c].start_us for c in calls[has].tolist()), dtype=float, count=len(has)
    )
    for code, pair in enumerate(pairs):
        members = ordered.get(pair)
        if members is None:
            continue
        mine = np.flatnonzero(call_thread == code)
        if not len(mine):
            continue
        starts = np.array([ranges[i].start_us for i in members.tolist()])
        ends = np.array([ranges[i].end_us for i in members.tolist()])
        before = nearest_open_before(ends, starts, np.zeros(len(starts), np.intp), strict=True)
        t = call_start[mine]
        hi = np.searchsorted(starts, t, side="right")
        found = nearest_open_at(ends, t, np.zeros(len(t), np.intp), hi, before, strict=True)
        out[has[mine]] = np.where(found >= 0, members[np.maximum(found, 0)], -1)
    return out


class _StreamKernels:
    """The activities of each (device, stream), by start, with cumulative durations."""

    def __init__(self, trace: Trace) -> None:
        kc = kernel_columns(trace)
        streams = kernel_streams(trace)
        self.groups: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        order = np.lexsort((np.arange(len(streams)), kc.start, streams, kc.device))
        keys = np.stack((kc.device[order], streams[order]), axis=1) if len(order) else None
        if keys is None:
            return
        cuts = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
        for part in np.split(order, cuts):
            key = (int(kc.device[part[0]]), int(streams[part[0]]))
            self.groups[key] = (part, kc.start[part], kc.end[part])

    def overlapping(self, device: int, stream: int, lo: float, hi: float) -> np.ndarray:
        """Positions in trace.kernels of the stream's activities overlapping [lo, hi)."""
        group = self.groups.get((device, stream))
        if group is None:
            return np.zeros(0, dtype=np.intp)
        pos, starts, ends = group
        last = np.searchsorted(starts, hi, side="left")
        # Activities of a stream do not overlap, so their ends rise with their starts.
        first = np.searchsorted(np.maximum.accumulate(ends), lo, side="right")
        return pos[first:last]


def _stream_kernels(trace: Trace) -> _StreamKernels:
    return memo(trace, "stream_kernels", lambda: _StreamKernels(trace))


def kernel_gpu_annotations(trace: Trace) -> np.ndarray:
    """Return, per activity in trace.kernels, the index in trace.gpu_annotations of the
    innermost device range on its stream overlapping it (the shortest; ties: later in the
    file), -1 when none does."""

    def compute() -> np.ndarray:
        out = np.full(len(trace.kernels), -1, dtype=np.intp)
        gann = trace.gpu_annotations
        sk = _stream_kernels(trace)
        # Longest first: shorter (inner) ranges overwrite what their parents assigned.
        for g in sorted(range(len(gann)), key=lambda i: (-gann[i].dur_us, gann[i].index)):
            a = gann[g]
            out[sk.overlapping(a.device, a.stream, a.start_us, a.end_us)] = g
        return out

    return memo(trace, "kernel_gpu_annotations", compute)


def annotation_table(trace: Trace, max_rows: int = MAX_ROWS) -> AnnotationTable:
    """Return the Annotations table of a trace (see the module's docstring): one row per
    range name and place in the tree, with host time, device time launched inside, calls,
    and the device-side ranges' span and kernels; at most `max_rows` rows (the largest by
    host time, ancestors kept)."""
    ranges = _host_ranges(trace)
    parent, ordered = _nest(ranges)
    launched = _launched_in(trace, ranges, ordered)
    k_dur = kernel_columns(trace).dur
    # Device time launched inside each range, then added up to its ancestors.
    inside = np.bincount(launched[launched >= 0], k_dur[launched >= 0], minlength=len(ranges))
    inside_n = np.bincount(launched[launched >= 0], minlength=len(ranges)).astype(float)
    depth = [_depth(parent, i) for i in range(len(ranges))]
    for i in sorted(range(len(ranges)), key=lambda i: -depth[i]):
        if parent[i] >= 0:
            inside[parent[i]] += inside[i]
            inside_n[parent[i]] += inside_n[i]

    nodes: list[_Node] = []
    top: dict[str, int] = {}
    node_of = [0] * len(ranges)

    def child(of: int, name: str) -> int:
        table = nodes[of].children if of >= 0 else top
        got = table.get(name)
        if got is None:
            got = table[name] = len(nodes)
            nodes.append(_Node(name, of, nodes[of].depth + 1 if of >= 0 else 0))
        return got

    for i in sorted(range(len(ranges)), key=lambda i: depth[i]):
        r = ranges[i]
        n = node_of[i] = child(node_of[parent[i]] if parent[i] >= 0 else -1, row_name(r.name))
        node = nodes[n]
        node.calls += 1
        node.host_us += r.dur_us
        node.device_us += float(inside[i])
        node.kernels += int(inside_n[i])

    by_external: dict[int, int] = {}
    for i, r in enumerate(ranges):
        if r.external_id is not None:
            by_external.setdefault(r.external_id, i)
    sk = _stream_kernels(trace)
    for g in trace.gpu_annotations:
        host = by_external.get(g.external_id) if g.external_id is not None else None
        if host is not None and row_name(ranges[host].name) == row_name(g.name):
            n = node_of[host]
        else:
            n = child(-1, row_name(g.name))
        spanned = sk.overlapping(g.device, g.stream, g.start_us, g.end_us)
        node = nodes[n]
        node.gpu_calls += 1
        node.gpu_span_us += g.dur_us
        node.gpu_kernels += len(spanned)
        node.gpu_kernel_us += float(k_dur[spanned].sum())

    rows, left_out = _ordered_rows(nodes, top, max_rows)
    return AnnotationTable(
        rows=rows,
        ranges=len(ranges),
        gpu_ranges=len(trace.gpu_annotations),
        device_us=float(k_dur.sum()),
        rows_left_out=left_out,
    )


def _depth(parent: Sequence[int], i: int) -> int:
    d = 0
    while parent[i] >= 0:
        i = parent[i]
        d += 1
    return d


def _ordered_rows(
    nodes: list[_Node], top: dict[str, int], max_rows: int
) -> tuple[tuple[AnnotationRow, ...], int]:
    """Rows in pre-order, children by host time (then device-side span) descending, ties by
    name; past `max_rows`, the nodes with the least host time go (never an ancestor of a
    kept one)."""

    def weight(n: int) -> tuple[float, float, str]:
        node = nodes[n]
        return (-node.host_us, -node.gpu_span_us, node.name)

    keep = set(range(len(nodes)))
    if len(nodes) > max_rows:
        ranked = sorted(range(len(nodes)), key=weight)[:max_rows]
        keep = set()
        for n in ranked:
            while n >= 0 and n not in keep:
                keep.add(n)
                n = nodes[n].parent
    rows: list[AnnotationRow] = []
    index: dict[int, int] = {}
    stack = sorted((n for n in top.values() if n in keep), key=weight, reverse=True)
    while stack:
        n = stack.pop()
        node = nodes[n]
        index[n] = len(rows)
        rows.append(
            AnnotationRow(
                name=node.name,
                depth=node.depth,
                parent=index[node.parent] if node.parent >= 0 else -1,
                calls=node.calls,
                host_us=node.host_us,
                device_us=node.device_us,
                kernels=node.kernels,
                gpu_calls=node.gpu_calls,
                gpu_span_us=node.gpu_span_us,
                gpu_kernel_us=node.gpu_kernel_us,
                gpu_kernels=node.gpu_kernels,
            )
        )
        kids = [c for c in node.children.values() if c in keep]
        stack.extend(sorted(kids, key=weight, reverse=True))
    return tuple(rows), len(nodes) - len(keep)
