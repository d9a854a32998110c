"""Kernels replayed from CUDA graphs, charged to the graph launch that replayed them and to
the op (and module) around that launch. Pure functions.

A graph replay is one runtime call (`cudaGraphLaunch`, `cuGraphLaunch`, `hipGraphLaunch`);
the kernels it replays carry its correlation id. The launch is often called from Python
outside every torch op (torch.compile's `reduce-overhead` replays from its own code, inside
annotations only), so op tables leave that device time unattributed; here it is charged to
the innermost torch op around the launch, else the innermost annotation (e.g.
`## forward ##`, `Torch-Compiled Region: 0/0`), and to the innermost module.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np

from gpuprof_nb.analysis.derived import (
    TraceIndex,
    distinct,
    index_of,
    kernel_columns,
    kernel_ids,
    memo,
    op_columns,
    runtime_names,
)
from gpuprof_nb.analysis.intervals import nearest_open_at, nearest_open_before
from gpuprof_nb.analysis.modules import module_path_at
from gpuprof_nb.model.trace import Op, RuntimeCall, Trace
from gpuprof_nb.results.compile import GraphReplay, GraphReplays

NO_OP = "(no op)"


def is_graph_launch(name: str) -> bool:
    return "graphlaunch" in name.lower()


def graph_replays(trace: Trace | TraceIndex) -> GraphReplays | None:
    """Return the CUDA graph replays of the trace, None when it launched no graph."""
    ix = index_of(trace)
    return memo(ix, "graph_replays", lambda: _replays(ix))


class _Spans:
    """One thread's spans sorted by start (longer first), with each one's parent."""

    def __init__(self, spans: list[Op]) -> None:
        spans.sort(key=lambda o: (o.start_us, -o.dur_us, o.index))
        self.spans = spans
        self.starts = [o.start_us for o in spans]
        self.parent: list[int] = []
        stack: list[int] = []
        for k, o in enumerate(spans):
            while stack and spans[stack[-1]].end_us <= o.start_us:
                stack.pop()
            self.parent.append(stack[-1] if stack else -1)
            stack.append(k)

    def innermost(self, t: float) -> Op | None:
        """The innermost span open at t: the last one started by then, or the nearest of
        its ancestors still open (any span open at t that started earlier holds it)."""
        k = bisect.bisect_right(self.starts, t) - 1
        while k >= 0 and self.spans[k].end_us <= t:
            k = self.parent[k]
        return self.spans[k] if k >= 0 else None


def _innermost_ops(trace: Trace | TraceIndex, calls: list[RuntimeCall]) -> list[Op | None]:
    """The innermost torch op on each call's thread open at its start (vectorised over
    the op columns, as ops.py nests ops: per thread by start, longer first)."""
    ix = index_of(trace)
    cols = op_columns(ix)
    n = len(cols.ops)
    if not n:
        return [None] * len(calls)
    code = {pair: k for k, pair in enumerate(cols.raw_threads)}
    thread = cols.raw_thread
    order = np.lexsort((cols.index, -cols.end, cols.start, thread))
    s_thread, s_start, s_end = thread[order], cols.start[order], cols.end[order]
    bounds = np.searchsorted(s_thread, np.arange(len(cols.raw_threads) + 1))
    first = np.repeat(bounds[:-1], np.diff(bounds))
    found = nearest_open_before(s_end, s_start, first, strict=True)
    c_thread = np.array([code.get((r.pid, r.tid), -1) for r in calls], dtype=np.intp)
    c_time = np.array([r.start_us for r in calls], dtype=float)
    known = c_thread >= 0
    lo = np.where(known, bounds[np.maximum(c_thread, 0)], 0)
    hi = lo.copy()
    for t in distinct(c_thread[known]).tolist():
        a, b = int(bounds[t]), int(bounds[t + 1])
        mine = np.flatnonzero(c_thread == t)
        hi[mine] = a + np.searchsorted(s_start[a:b], c_time[mine], side="right")
    at = nearest_open_at(s_end, c_time, lo, hi, found, strict=True)
    return [
        cols.ops[order[k]] if k >= 0 and ok else None
        for k, ok in zip(at.tolist(), known.tolist(), strict=True)
    ]


def _replays(trace: Trace | TraceIndex) -> GraphReplays | None:
    ix = index_of(trace)
    trace = ix.trace
    if not any(is_graph_launch(n) for n in runtime_names(ix)) or not trace.kernels:
        return None
    launches = [r for r in trace.runtime if is_graph_launch(r.name) and r.correlation is not None]
    if not launches:
        return None
    k_corr, k_has, _, _ = kernel_ids(ix)
    durs = kernel_columns(ix).dur
    by_corr: dict[int, list[int]] = defaultdict(list)
    wanted = {int(r.correlation) for r in launches}  # type: ignore[arg-type]
    for i in np.flatnonzero(k_has & np.isin(k_corr, list(wanted))).tolist():
        by_corr[int(k_corr[i])].append(i)
    threads = {(str(r.pid), str(r.tid)) for r in launches}
    inner_op = _innermost_ops(ix, launches)
    by_thread: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for o in trace.ops:
        if o.kind == "annotation" and (str(o.pid), str(o.tid)) in threads:
            by_thread[(str(o.pid), str(o.tid))].append(o)
    notes = {key: _Spans(found) for key, found in by_thread.items()}
    empty = _Spans([])
    modules = module_path_at(ix, [((str(r.pid), str(r.tid)), r.start_us) for r in launches])
    rows: dict[tuple[str, str | None], list[float]] = {}
    outside = 0.0
    total_k = 0
    total_us = 0.0
    for r, module, op in zip(launches, modules, inner_op, strict=True):
        key = (str(r.pid), str(r.tid))
        kernels = by_corr.get(int(r.correlation), [])  # type: ignore[arg-type]
        us = float(durs[kernels].sum()) if kernels else 0.0
        where = op.name if op is not None else None
        if where is None:
            outside += us
            note = notes.get(key, empty).innermost(r.start_us)
            where = note.name if note is not None else NO_OP
        acc = rows.setdefault((where, module), [0, 0, 0.0])
        acc[0] += 1
        acc[1] += len(kernels)
        acc[2] += us
        total_k += len(kernels)
        total_us += us
    out = sorted(
        (GraphReplay(w, m, int(a[0]), int(a[1]), float(a[2])) for (w, m), a in rows.items()),
        key=lambda g: (-g.device_us, g.launched_from, g.module or ""),
    )
    return GraphReplays(
        rows=tuple(out),
        launches=len(launches),
        kernels=total_k,
        device_us=total_us,
        outside_ops_us=outside,
    )
