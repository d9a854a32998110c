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

from gpuprof_nb.analysis.derived import (
    TraceIndex,
    codes_of,
    index_of,
    kernel_columns,
    memo,
    op_columns,
    runtime_starts,
    runtime_threads,
)
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


def _host_ranges(trace: Trace | TraceIndex) -> list[Op]:
    # Only the ops that are not torch ops (the op columns hold those) can be ranges.
    ix = index_of(trace)
    trace = ix.trace
    others = np.ones(len(trace.ops), dtype=bool)
    others[op_columns(ix).positions] = False
    ops = trace.ops
    return [
        o
        for o in (ops[i] for i in np.flatnonzero(others).tolist())
        if o.kind == "annotation" and o.dur_us >= 0
    ]


def _nest(ranges: Sequence[Op]) -> tuple[list[int], dict[tuple[Any, Any], np.ndarray]]:
    """Return each range's parent (index into `ranges`, -1 at the top: the innermost range
    of its thread still open when it starts) and, per thread, the range indices in (start,
    longer first, file position) order."""
    by_thread: dict[tuple[Any, Any], list[int]] = {}
    for i, r in enumerate(ranges):
        by_thread.setdefault((r.pid, r.tid), []).append(i)
    starts = np.array([r.start_us for r in ranges], dtype=float)
    ends = np.array([r.end_us for r in ranges], dtype=float)
    index = np.array([r.index for r in ranges], dtype=np.int64)
    parent = np.full(len(ranges), -1, dtype=np.intp)
    ordered: dict[tuple[Any, Any], np.ndarray] = {}
    for thread, members in by_thread.items():
        m = np.array(members, dtype=np.intp)
        m = m[np.lexsort((index[m], starts[m] - ends[m], starts[m]))]
        found = nearest_open_before(ends[m], starts[m], np.zeros(len(m), np.intp), strict=True)
        parent[m] = np.where(found >= 0, m[np.maximum(found, 0)], -1)
        ordered[thread] = m
    return parent.tolist(), ordered


def _launched_in(
    trace: Trace | TraceIndex, ranges: Sequence[Op], ordered: dict[tuple[Any, Any], np.ndarray]
) -> np.ndarray:
    """Return, per activity in trace.kernels, the innermost host range (index into `ranges`)
    of its launch call's thread open at the call's start, -1 when none is."""
    ix = index_of(trace)
    trace = ix.trace
    out = np.full(len(trace.kernels), -1, dtype=np.intp)
    calls = launch_calls(ix)
    has = np.flatnonzero(calls >= 0)
    if not len(has) or not ranges:
        return out
    codes, pairs = runtime_threads(ix)
    call_thread = codes[calls[has]]
    call_start = runtime_starts(ix)[calls[has]]
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
    """The activities of each (device, stream), by start, with the latest end so far at
    each (activities of a stream do not overlap, so it is their own end where the trace
    is sound; the running maximum keeps the search right where it is not)."""

    def __init__(self, trace: Trace | TraceIndex) -> None:
        ix = index_of(trace)
        kc = kernel_columns(ix)
        streams = kernel_streams(ix)
        self.groups: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        order = np.lexsort((np.arange(len(streams)), kc.start, streams, kc.device))
        keys = np.stack((kc.device[order], streams[order]), axis=1) if len(order) else None
        if keys is None:
            return
        cuts = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
        for part in np.split(order, cuts):
            key = (int(kc.device[part[0]]), int(streams[part[0]]))
            self.groups[key] = (part, kc.start[part], np.maximum.accumulate(kc.end[part]))

    def overlapping(self, device: int, stream: int, lo: float, hi: float) -> np.ndarray:
        """Positions in trace.kernels of the stream's activities overlapping [lo, hi)."""
        group = self.groups.get((device, stream))
        if group is None:
            return np.zeros(0, dtype=np.intp)
        pos, starts, ends_so_far = group
        last = np.searchsorted(starts, hi, side="left")
        first = np.searchsorted(ends_so_far, lo, side="right")
        return pos[first:last]


def _stream_kernels(trace: Trace | TraceIndex) -> _StreamKernels:
    ix = index_of(trace)
    return memo(ix, "stream_kernels", lambda: _StreamKernels(ix))


def kernel_gpu_annotations(trace: Trace | TraceIndex) -> np.ndarray:
    """Return, per activity in trace.kernels, the index in trace.gpu_annotations of the
    innermost device range on its stream overlapping it (the shortest; ties: later in the
    file), -1 when none does."""
    ix = index_of(trace)
    trace = ix.trace

    def compute() -> np.ndarray:
        out = np.full(len(trace.kernels), -1, dtype=np.intp)
        gann = trace.gpu_annotations
        sk = _stream_kernels(ix)
        # Longest first: shorter (inner) ranges overwrite what their parents assigned.
        for g in sorted(range(len(gann)), key=lambda i: (-gann[i].dur_us, gann[i].index)):
            a = gann[g]
            out[sk.overlapping(a.device, a.stream, a.start_us, a.end_us)] = g
        return out

    return memo(ix, "kernel_gpu_annotations", compute)


def annotation_table(trace: Trace | TraceIndex, max_rows: int = MAX_ROWS) -> AnnotationTable:
    """Return the Annotations table of a trace (see the module's docstring): one row per
    range name and place in the tree, with host time, device time launched inside, calls,
    and the device-side ranges' span and kernels; at most `max_rows` rows (the largest by
    host time, ancestors kept)."""
    ix = index_of(trace)
    trace = ix.trace
    ranges = _host_ranges(ix)
    parent_list, ordered = _nest(ranges)
    parent = np.asarray(parent_list, dtype=np.intp)
    n_ranges = len(ranges)
    launched = _launched_in(ix, ranges, ordered)
    k_dur = kernel_columns(ix).dur
    depth = _depths(parent)
    # Device time launched inside each range, then added up to its ancestors, deepest first.
    inside = np.bincount(launched[launched >= 0], k_dur[launched >= 0], minlength=n_ranges)
    inside_n = np.bincount(launched[launched >= 0], minlength=n_ranges).astype(float)
    for level in range(int(depth.max(initial=0)), 0, -1):
        at = np.flatnonzero(depth == level)
        np.add.at(inside, parent[at], inside[at])
        np.add.at(inside_n, parent[at], inside_n[at])

    tree = _RowTree()
    node_of = tree.place(ranges, parent, depth)
    if n_ranges:
        host = np.array([r.dur_us for r in ranges], dtype=float)
        count = len(tree.nodes)
        calls = np.bincount(node_of, minlength=count).tolist()
        host_us = np.bincount(node_of, host, minlength=count).tolist()
        device_us = np.bincount(node_of, inside, minlength=count).tolist()
        kernels = np.bincount(node_of, inside_n, minlength=count).tolist()
        for n, node in enumerate(tree.nodes):
            node.calls, node.host_us = int(calls[n]), float(host_us[n])
            node.device_us, node.kernels = float(device_us[n]), int(kernels[n])
    _add_gpu_ranges(ix, tree, ranges, node_of, k_dur)
    rows, left_out = _ordered_rows(tree.nodes, tree.top, max_rows)
    return AnnotationTable(
        rows=rows,
        ranges=n_ranges,
        gpu_ranges=len(trace.gpu_annotations),
        device_us=float(k_dur.sum()),
        rows_left_out=left_out,
    )


def _depths(parent: np.ndarray) -> np.ndarray:
    """Return each range's depth in the tree `parent` gives (0 at the top)."""
    depth = np.zeros(len(parent), dtype=np.intp)
    up = parent.copy()
    while (live := up >= 0).any():
        depth[live] += 1
        up[live] = parent[up[live]]
    return depth


class _RowTree:
    """The table's rows as a tree of nodes, one per range name under its parent's row."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.top: dict[str, int] = {}

    def child(self, of: int, name: str) -> int:
        """Return the node named `name` under node `of` (-1: at the top), made if new."""
        nodes = self.nodes
        table = nodes[of].children if of >= 0 else self.top
        got = table.get(name)
        if got is None:
            got = table[name] = len(nodes)
            nodes.append(_Node(name, of, nodes[of].depth + 1 if of >= 0 else 0))
        return got

    def place(self, ranges: Sequence[Op], parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
        """Return each range's node, made level by level: a (parent's node, name) pair is
        looked up once."""
        n_ranges = len(ranges)
        names, name_code = codes_of((row_name(r.name) for r in ranges), n_ranges)
        node_of = np.zeros(n_ranges, dtype=np.intp)
        for level in range(int(depth.max(initial=0)) + 1):
            at = np.flatnonzero(depth == level)
            above = node_of[parent[at]] if level else np.full(len(at), -1, dtype=np.intp)
            pairs, inverse = np.unique(
                np.stack((above, name_code[at])), axis=1, return_inverse=True
            )
            made = [self.child(int(a), names[int(c)]) for a, c in pairs.T.tolist()]
            node_of[at] = np.asarray(made, dtype=np.intp)[inverse.reshape(-1)]
        return node_of


def _add_gpu_ranges(
    ix: TraceIndex, tree: _RowTree, ranges: Sequence[Op], node_of: np.ndarray, k_dur: np.ndarray
) -> None:
    """Add each device-side range to the row of the host range of its External id and name,
    else to a top-level row of its name: its span and the kernels on its stream inside it."""
    by_external: dict[int, int] = {}
    for i, r in enumerate(ranges):
        if r.external_id is not None:
            by_external.setdefault(r.external_id, i)
    for g in ix.trace.gpu_annotations:
        host_range = by_external.get(g.external_id) if g.external_id is not None else None
        if host_range is not None and row_name(ranges[host_range].name) == row_name(g.name):
            n = int(node_of[host_range])
        else:
            n = tree.child(-1, row_name(g.name))
        spanned = _stream_kernels(ix).overlapping(g.device, g.stream, g.start_us, g.end_us)
        node = tree.nodes[n]
        node.gpu_calls += 1
        node.gpu_span_us += g.dur_us
        node.gpu_kernels += len(spanned)
        node.gpu_kernel_us += float(k_dur[spanned].sum())


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
