"""Per-operator and per-kernel tables, and the one-line summary of a trace. Pure functions.

Rules (they decide every number these tables show):

- Op rows are torch operators only (`Op.kind == "op"`); annotations such as `ProfilerStep#3`
  and Python functions are never rows, and never parents in the nesting below.
- Nesting is per host thread (pid, tid): an op is a child of the innermost op on the same
  thread that is still open when it starts. Self CPU time = duration minus the time its
  direct children overlap it (never below 0). Total CPU time = duration.
- Device work (kernels, memcpys and memsets alike) belongs to the op that launched it: the
  runtime call with the same correlation id sits inside that op on the same thread (the
  innermost op open at the call's start). When no runtime call matches (or the call ran
  outside every op), the device event's External id names the op instead. Self device time =
  device time of events owned by the op; total device time = that of its whole subtree.
  Device time that no op owns is reported as `unattributed_device_us`.
- Rows group ops by name; sorting is descending on the sort key, ties broken by name.
- Device work no op owns but a runtime call launched (outside every op: Triton and custom
  kernels, cuLaunchKernel, hipLaunchKernel) is listed by that call (and the Python line that
  made it, with stacks) in `OpTable.launchers` (analysis/launchers.py).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from functools import reduce
from itertools import repeat
from operator import add, attrgetter
from typing import Any

import numpy as np

from gpuprof_nb.analysis.derived import (
    KERNEL_KINDS,
    OpColumns,
    TraceIndex,
    codes_of,
    distinct,
    index_of,
    kernel_columns,
    kernel_ids,
    last_call_of,
    lex_order,
    lookup,
    memo,
    op_columns,
    op_input_dims,
    op_name_codes,
    runtime_correlations,
    runtime_starts,
    runtime_threads,
)
from gpuprof_nb.analysis.intervals import (
    device_busy_us,
    nearest_open_at,
    nearest_open_before,
    tree_depths,
)
from gpuprof_nb.analysis.launchers import launch_rows
from gpuprof_nb.analysis.streams import kernel_streams
from gpuprof_nb.analysis.timeline import activity_window, unrecorded_launches
from gpuprof_nb.model.trace import Kernel, KernelKind, Op, Trace
from gpuprof_nb.results.tables import (
    _FRACTION_BASE,
    KernelRow,
    KernelTable,
    OpRow,
    OpTable,
    SortKey,
    TraceSummary,
)

__all__ = [
    "KernelRow",
    "KernelTable",
    "OpRow",
    "OpTable",
    "SORT_KEYS",
    "TraceSummary",
    "kernel_table",
    "summarize_trace",
    "top_ops",
]

# Valid `sort` values for top_ops: the canonical field names, plus the short and the
# torch.profiler key_averages() spellings users already know.
SORT_KEYS: dict[str, SortKey] = {
    "self_device_us": "self_device_us",
    "total_device_us": "total_device_us",
    "self_cpu_us": "self_cpu_us",
    "total_cpu_us": "total_cpu_us",
    "calls": "calls",
    "self_device": "self_device_us",
    "device": "total_device_us",
    "total_device": "total_device_us",
    "self_cpu": "self_cpu_us",
    "cpu": "total_cpu_us",
    "total_cpu": "total_cpu_us",
    "self_cuda_time_total": "self_device_us",
    "cuda_time_total": "total_device_us",
    "self_device_time_total": "self_device_us",
    "device_time_total": "total_device_us",
    "self_cpu_time_total": "self_cpu_us",
    "cpu_time_total": "total_cpu_us",
    "count": "calls",
}
_MAX_SHAPES = 5
_NAME_KIND = attrgetter("name", "kind")


# --------------------------------------------------------------------------------------------
# results


# --------------------------------------------------------------------------------------------
# ops


def _attribute(
    trace: Trace | TraceIndex,
) -> tuple[list[Op], np.ndarray, np.ndarray, np.ndarray, float, np.ndarray]:
    """Return the torch ops, their self CPU, self device and total device microseconds (float
    arrays in the same order), the device time owned by no op, and each device activity's
    owner (an index into the ops, -1 for none)."""
    ix = index_of(trace)
    cols = op_columns(ix)
    ops = list(cols.ops)
    n = len(ops)
    k_corr, k_has_corr, k_ext, k_has_ext = kernel_ids(ix)
    # Only calls that launched some device work matter (not cudaGetDevice and friends).
    r_corr, r_has = runtime_correlations(ix)
    calls = np.flatnonzero(r_has & np.isin(r_corr, k_corr[k_has_corr])).tolist()
    # Each call's thread as a code of the distinct (pid, tid) pairs of the launch calls.
    codes, pairs = runtime_threads(ix)
    used, call_code = np.unique(codes[calls], return_inverse=True)
    call_pairs = [pairs[i] for i in used.tolist()]
    nest = _Nesting(cols, call_pairs)

    # Each device event's owner: the op holding its launch call, else the op its External id
    # names (first op with that id), else -1.
    owners = np.full(len(ix.trace.kernels), -1, dtype=np.intp)
    if calls and n:
        # A launch call's owner: the innermost op of its thread open at the call's start
        # (ops starting at that very time open first).
        c_thread = np.array([nest.rank[t] for t in call_pairs], dtype=np.intp)[call_code]
        call_owner = nest.open_at(c_thread, runtime_starts(ix)[calls])
        # Calls taken thread by thread, then as recorded: a correlation id belongs to the
        # last owned call with it.
        seq = np.argsort(c_thread, kind="stable")
        owned_seq = seq[call_owner[seq] >= 0][::-1]
        corr_keys, last = np.unique(r_corr[calls][owned_seq], return_index=True)
        found_k = lookup(corr_keys, call_owner[owned_seq][last], k_corr)
        owners = np.where(k_has_corr, found_k, -1)
    owners = _owners_by_external_id(cols, owners, k_ext, k_has_ext)
    owned = owners >= 0
    k_dur = kernel_columns(ix).dur
    # bincount adds each op's durations one by one in kernel order, like `+=` in a loop.
    self_device = np.bincount(owners[owned], weights=k_dur[owned], minlength=n)
    unattributed = reduce(add, k_dur[~owned].tolist(), 0.0)
    self_cpu = np.maximum(cols.dur - nest.child_cpu, 0.0)
    total = _subtree_totals(nest.order, nest.parent_sorted, self_device)
    return ops, self_cpu, self_device, total, unattributed, owners


class _Nesting:
    """The torch ops nested per host thread, and each one's CPU time covered by its
    children.

    Threads are (pid, tid) as recorded (the ops' and the launch calls'), taken in the order
    of their repr (`rank`); within one, ops by (start, longer first, file position): a
    parent before its children (`order`; `bounds` cut it per thread)."""

    __slots__ = (
        "rank",
        "order",
        "bounds",
        "s_start",
        "s_end",
        "found",
        "parent_sorted",
        "child_cpu",
    )

    def __init__(self, cols: OpColumns, call_pairs: list[Any]) -> None:
        n = len(cols.ops)
        starts, ends = cols.start, cols.end
        rank = {
            t: r for r, t in enumerate(sorted(set(cols.raw_threads) | set(call_pairs), key=repr))
        }
        thread = (
            np.array([rank[t] for t in cols.raw_threads], dtype=np.intp)[cols.raw_thread]
            if n
            else np.zeros(0, dtype=np.intp)
        )
        order = lex_order((np.arange(n), -ends, starts, thread))
        bounds = np.searchsorted(thread[order], np.arange(len(rank) + 1))
        s_start, s_end = starts[order], ends[order]
        first = np.repeat(bounds[:-1], np.diff(bounds))
        # An op's parent is the innermost op of its thread still open when it starts: the
        # nearest one before it (in that order) that ends after its start.
        found = nearest_open_before(s_end, s_start, first, strict=True)
        has = found >= 0
        parent_sorted = np.where(has, order[found], -1)
        # A child's overlap with its parent, summed per parent in that order (bincount adds
        # one by one, like `+=` in a loop).
        overlap = np.minimum(s_end[has], s_end[found[has]]) - s_start[has]
        self.child_cpu = np.bincount(parent_sorted[has], weights=overlap, minlength=n)
        self.rank, self.order, self.bounds = rank, order, bounds
        self.s_start, self.s_end, self.found = s_start, s_end, found
        self.parent_sorted = parent_sorted

    def open_at(self, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Return the innermost op (an index into the ops, -1 for none) of each thread (a
        rank) open at each time; ops starting at that very time open first."""
        bounds = self.bounds
        lo = bounds[thread]
        hi = lo.copy()
        for r in distinct(thread).tolist():
            a, b = int(bounds[r]), int(bounds[r + 1])
            mine = np.flatnonzero(thread == r)
            hi[mine] = a + np.searchsorted(self.s_start[a:b], t[mine], side="right")
        owner = nearest_open_at(self.s_end, t, lo, hi, self.found, strict=True)
        inner: np.ndarray = np.where(owner >= 0, self.order[owner], -1)
        return inner


def _owners_by_external_id(
    cols: OpColumns, owners: np.ndarray, k_ext: np.ndarray, k_has_ext: np.ndarray
) -> np.ndarray:
    """Return the owners with each device event still of none given the first op (in op
    order) with its External id, where it carries one (a copy; `owners` as it was when
    there is nothing to add)."""
    need = np.flatnonzero((owners < 0) & k_has_ext)
    if not len(need):
        return owners
    # Only the ops whose id is one of those wanted are sorted (found by a search among the
    # wanted ids).
    wanted = distinct(k_ext[need])
    with_ext = np.flatnonzero(cols.has_external_id)
    op_ext = cols.external_id[with_ext]
    at = np.minimum(np.searchsorted(wanted, op_ext), len(wanted) - 1)
    with_ext = with_ext[wanted[at] == op_ext]
    ext_keys, first = np.unique(cols.external_id[with_ext], return_index=True)
    owners = owners.copy()
    owners[need] = lookup(ext_keys, with_ext[first], k_ext[need])
    return owners


def _subtree_totals(order: np.ndarray, parent_sorted: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Return each op's `own` value plus its whole subtree's (ops nested as `order` and
    `parent_sorted`, each op's parent in that order, say).

    Deepest ops first: each op's total is complete before it is added to its parent's, and
    a parent receives its children's in reverse pre-order, one at a time (np.add.at), as a
    walk of the reversed pre-order would add them."""
    parent = np.full(len(own), -1, dtype=np.intp)
    parent[order] = parent_sorted
    depth = tree_depths(parent)
    total: np.ndarray = own.copy()
    reverse_preorder = order[::-1]
    depth_rev = depth[reverse_preorder]
    # The nodes of each level in reverse pre-order, grouped once (a stable sort), so a tree
    # thousands of levels deep costs one pass, not one per level.
    by_level = reverse_preorder[np.argsort(depth_rev, kind="stable")]
    cuts = np.cumsum([0, *np.bincount(depth_rev, minlength=1).tolist()]).tolist()
    for level in range(len(cuts) - 2, 0, -1):
        nodes = by_level[cuts[level] : cuts[level + 1]]
        np.add.at(total, parent[nodes], total[nodes])
    return total


def _shape_text(dims: Any) -> str:
    """Recorded input shapes as text: tuples as [a, b], anything else as str() writes it."""
    if isinstance(dims, tuple):
        if any(map(isinstance, dims, repeat(tuple))):
            return "[" + ", ".join(map(_shape_text, dims)) + "]"
        return "[" + ", ".join(map(str, dims)) + "]"  # one input's dims: no frame per number
    return str(dims)


def top_ops(trace: Trace | TraceIndex, n: int | None = None, sort: str | None = None) -> OpTable:
    """Return the top `n` torch operators (all when None) grouped by name, with calls and
    self/total CPU and device time in microseconds, sorted by `sort` descending (ties by name).

    `sort` defaults to self device time when the trace has device activity, else self CPU
    time. Valid keys: self_device_us, total_device_us, self_cpu_us, total_cpu_us, calls, and
    the aliases in SORT_KEYS (e.g. self_cuda_time_total). A bad key raises ValueError naming
    the valid ones.
    """
    ix = index_of(trace)
    trace = ix.trace
    key = _sort_key(trace, sort)
    if n is not None and (not isinstance(n, int) or n < 0):
        raise ValueError(f"n must be a non-negative int or None, got {n!r}")

    ops, self_cpu, self_device, total_device, unattributed, owners = _attribute(ix)
    launchers = launch_rows(ix, owners < 0)
    groups = _op_groups(ix, self_cpu, self_device, total_device)
    shapes = _op_shapes(ix)
    totals = {
        "calls": float(len(ops)),
        "self_cpu_us": sum(g[1] for g in groups.values()),
        "self_device_us": sum(g[3] for g in groups.values()),
    }
    base = totals[_FRACTION_BASE[key]]
    field_index = _GROUP_FIELDS[key]
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][field_index], kv[0]))
    if n is not None:
        ordered = ordered[:n]
    rows = []
    for name, g in ordered:
        texts = [(_shape_text(dims), calls) for dims, calls in shapes[name].items()]
        seen = sorted(texts, key=lambda kv: (-kv[1], kv[0]))[:_MAX_SHAPES]
        rows.append(
            OpRow(
                name=name,
                calls=int(g[0]),
                self_cpu_us=g[1],
                total_cpu_us=g[2],
                self_device_us=g[3],
                total_device_us=g[4],
                fraction=g[field_index] / base if base > 0 else 0.0,
                input_shapes=tuple(s for s, _ in seen),
                input_shape_calls=tuple(c for _, c in seen),
            )
        )
    return OpTable(
        rows=tuple(rows),
        sort_key=key,
        distinct_ops=len(groups),
        calls=len(ops),
        self_cpu_us=totals["self_cpu_us"],
        self_device_us=totals["self_device_us"],
        unattributed_device_us=unattributed,
        has_device_time=bool(trace.kernels),
        launchers=launchers,
        runtime_launched_us=sum(r.device_us for r in launchers),
    )


# Where each sort key's value sits in a group of _op_groups.
_GROUP_FIELDS = {
    "calls": 0,
    "self_cpu_us": 1,
    "total_cpu_us": 2,
    "self_device_us": 3,
    "total_device_us": 4,
}


def _sort_key(trace: Trace, sort: str | None) -> SortKey:
    """Return the canonical sort key for `sort` (None: self device time on a trace with
    device activity, else self CPU time). Raises ValueError naming the valid ones."""
    if sort is None:
        return "self_device_us" if trace.kernels else "self_cpu_us"
    try:
        return SORT_KEYS[sort]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(SORT_KEYS))
        raise ValueError(f"unknown sort key {sort!r}; valid keys: {valid}") from None


def _op_groups(
    ix: TraceIndex, self_cpu: np.ndarray, self_device: np.ndarray, total_device: np.ndarray
) -> dict[str, list[float]]:
    """Return, per op name in order of first appearance, [calls, self CPU, total CPU, self
    device, total device] (microseconds)."""
    names, codes = op_name_codes(ix)
    code_of = {name: c for c, name in enumerate(names)}
    k = len(code_of)
    # bincount adds each group's values one by one in op order: the same sums as a loop.
    call_counts = np.bincount(codes, minlength=k).tolist()
    sums = [
        np.bincount(codes, weights=values, minlength=k).tolist() if k else []
        for values in (self_cpu, op_columns(ix).dur, self_device, total_device)
    ]
    return {
        name: [call_counts[c], sums[0][c], sums[1][c], sums[2][c], sums[3][c]]
        for name, c in code_of.items()
    }


def _op_shapes(ix: TraceIndex) -> dict[str, Counter[Any]]:
    """Return, per op name, how many calls had each recorded input shapes."""
    names, codes = op_name_codes(ix)
    shapes: dict[str, Counter[Any]] = defaultdict(Counter)
    op_dims = op_input_dims(ix)  # shared: read only
    if op_dims.count(None) < len(op_dims):
        # Count the (shared, hashable) tuples; only distinct ones are formatted by the caller.
        for (c, d), count in Counter(zip(codes.tolist(), op_dims, strict=True)).items():
            if d is not None:
                shapes[names[c]][d] = count
    return shapes


# --------------------------------------------------------------------------------------------
# kernels


def kernel_table(trace: Trace | TraceIndex) -> KernelTable:
    """Return device activity grouped by (name, kind): calls, total/mean/max/min microseconds,
    streams, share of all device time, and for memcpy/memset the bytes and achieved GB/s
    (bytes / duration, over the calls whose bytes the trace gives). Sorted by total time
    descending, ties by name then kind."""
    ix = index_of(trace)
    trace = ix.trace
    kernels = trace.kernels
    n = len(kernels)
    kc = kernel_columns(ix)
    dur = kc.dur
    # Each (name, kind) as a code, in order of first appearance.
    group_keys, codes = codes_of(map(_NAME_KIND, kernels), n)
    code_of: dict[tuple[str, KernelKind], int] = {key: c for c, key in enumerate(group_keys)}
    g = len(code_of)
    # Sums per group and over all: bincount adds one by one in kernel order, as `+=` does.
    calls = np.bincount(codes, minlength=g).tolist()
    totals = np.bincount(codes, weights=dur, minlength=g).tolist()
    total = float(np.bincount(np.zeros(n, dtype=np.intp), weights=dur, minlength=1)[0])
    by_code = np.argsort(codes, kind="stable")
    cuts = (
        np.concatenate(([0], np.cumsum(calls)[:-1])).astype(np.intp)
        if g
        else np.zeros(0, dtype=np.intp)
    )
    sorted_dur = dur[by_code]
    maxs = np.maximum.reduceat(sorted_dur, cuts).tolist() if n else []
    mins = np.minimum.reduceat(sorted_dur, cuts).tolist() if n else []
    streams = _group_streams(ix, codes, g)
    # Bytes (ints, summed exactly) for the groups that give them: memcpys and memsets.
    sized: dict[int, list[Kernel]] = {}
    not_kernel = np.flatnonzero(kc.kind != KERNEL_KINDS.index("kernel"))
    for i, c in zip(not_kernel.tolist(), codes[not_kernel].tolist(), strict=True):
        k = kernels[i]
        if k.bytes is not None:
            sized.setdefault(c, []).append(k)
    rows = []
    for (name, kind), c in code_of.items():
        group_total = totals[c]
        ks = sized.get(c)
        total_bytes, gbps = _bytes_and_rate(ks)
        rows.append(
            KernelRow(
                name=name,
                kind=kind,
                calls=calls[c],
                total_us=group_total,
                mean_us=group_total / calls[c],
                max_us=maxs[c],
                min_us=mins[c],
                streams=tuple(streams[c]),
                fraction=group_total / total if total > 0 else 0.0,
                total_bytes=total_bytes,
                achieved_gbps=gbps,
            )
        )
    rows.sort(key=lambda r: (-r.total_us, r.name, r.kind))
    by_kind = np.bincount(
        kc.kind.astype(np.intp), weights=dur, minlength=len(KERNEL_KINDS)
    ).tolist()
    kind_us = dict(zip(KERNEL_KINDS, by_kind, strict=False))
    return KernelTable(
        rows=tuple(rows),
        total_us=total,
        calls=len(trace.kernels),
        kernel_us=kind_us["kernel"],
        memcpy_us=kind_us["memcpy"],
        memset_us=kind_us["memset"],
        unrecorded_launches=len(unrecorded_launches(trace)),
    )


def _group_streams(ix: TraceIndex, codes: np.ndarray, g: int) -> list[list[int]]:
    """Return each of the `g` groups' distinct streams, ascending (`codes`: each device
    activity's group)."""
    # (group, stream) pairs as one number each.
    stream_values, stream_code = np.unique(kernel_streams(ix), return_inverse=True)
    pairs = (
        distinct(codes * len(stream_values) + stream_code.reshape(-1))
        if len(codes)
        else np.zeros(0, dtype=np.intp)
    )
    streams: list[list[int]] = [[] for _ in range(g)]
    for c, stream in zip(
        (pairs // max(len(stream_values), 1)).tolist(),
        stream_values[pairs % max(len(stream_values), 1)].tolist(),
        strict=True,
    ):
        streams[c].append(stream)
    return streams


def _bytes_and_rate(ks: list[Kernel] | None) -> tuple[int | None, float | None]:
    """Return the bytes a group's sized copies (or memsets) moved and their achieved GB/s
    (bytes / duration); None for a group without sizes."""
    total_bytes = sum(k.bytes for k in ks if k.bytes is not None) if ks else None
    sized_us = sum(k.dur_us for k in ks) if ks else 0
    gbps = (
        total_bytes / (sized_us * 1e-6) / 1e9 if total_bytes is not None and sized_us > 0 else None
    )
    return total_bytes, gbps


# --------------------------------------------------------------------------------------------
# summary


def _count_in_steps(starts: np.ndarray, trace: Trace) -> float:
    """Mean number of `starts` (sorted) that fall in [step.start, step.end) per step."""
    ends = np.searchsorted(starts, [s.end_us for s in trace.steps], side="left")
    begins = np.searchsorted(starts, [s.start_us for s in trace.steps], side="left")
    return int((ends - begins).sum()) / len(trace.steps)


def summarize_trace(trace: Trace | TraceIndex) -> TraceSummary:
    """Return the headline numbers (computed once per index: the diagnosis's titles quote
    the same counts): device names, window and busy time (microseconds), step count and
    median step time, op/kernel counts and per-step means.

    Device names are those of the devices that ran kernels (all listed devices when the
    trace's ids do not match, as on ROCm). A kernel belongs to the step in which the runtime
    call that launched it started (its own start when no call matches); an op to the step in
    which it started.
    """
    ix = index_of(trace)
    return memo(ix, "summary", lambda: _summarize(ix))


def _summarize(ix: TraceIndex) -> TraceSummary:
    trace = ix.trace
    kc = kernel_columns(ix)
    used = set(distinct(kc.device).tolist())
    names = [d.name for d in trace.devices if d.index in used and d.name]
    if not names:
        names = [d.name for d in trace.devices if d.name]
    device_names = tuple(dict.fromkeys(names))

    # The same window as the Timeline tab: the recorded work, without the profiler's own
    # start-up/shutdown span, so both tabs show one "busy %".
    lo, hi = activity_window(ix)
    window = hi - lo
    busy = device_busy_us(ix, lo, hi)
    cols = op_columns(ix)

    ops_per_step = kernels_per_step = median_step = None
    if trace.steps:
        median_step = statistics.median(s.dur_us for s in trace.steps)
        ops_per_step = _count_in_steps(cols.start, trace)  # ops are in start order
        # A kernel's launch: the start of the (last recorded) runtime call with its
        # correlation id, else its own start.
        corr_keys, calls = last_call_of(ix)
        k_corr, k_has_corr, _, _ = kernel_ids(ix)
        call = np.where(k_has_corr, lookup(corr_keys, calls, k_corr), -1)[kc.is_kernel]
        starts = runtime_starts(ix)
        launches = np.where(
            call >= 0, starts[np.maximum(call, 0)] if len(starts) else 0.0, kc.start[kc.is_kernel]
        )
        kernels_per_step = _count_in_steps(np.sort(launches), trace)

    return TraceSummary(
        source=trace.source,
        device_names=device_names,
        window_us=window,
        step_count=len(trace.steps),
        median_step_us=median_step,
        busy_us=busy,
        busy_fraction=busy / window if window > 0 else 0.0,
        op_count=len(cols.ops),
        kernel_count=int(np.count_nonzero(kc.is_kernel)),
        memcpy_count=int(np.count_nonzero(kc.kind == KERNEL_KINDS.index("memcpy"))),
        memset_count=int(np.count_nonzero(kc.kind == KERNEL_KINDS.index("memset"))),
        ops_per_step=ops_per_step,
        kernels_per_step=kernels_per_step,
        unrecorded_launches=len(unrecorded_launches(trace)),
    )
