"""Interval arithmetic on (start_us, end_us) pairs: unions, gaps and clipping."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np

from gpuprof_nb.analysis.derived import TraceIndex, index_of, kernel_columns, lex_order
from gpuprof_nb.model.trace import Trace

Interval = tuple[float, float]


# From this many intervals on, the array versions below are faster than plain loops (they
# give the same pairs, float for float; integer bounds come back as equal floats).
_ARRAY_MIN = 64


def as_pairs(starts: np.ndarray, ends: np.ndarray) -> list[Interval]:
    """Return (start, end) arrays as the list of pairs the functions here take and give."""
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _pairs_array(pairs: Sequence[Interval]) -> np.ndarray:
    """Return (start, end) pairs as an (n, 2) float array (read in one pass: faster than
    np.array on a list of tuples, benchmarks/RESULTS.md, "Measurements behind design
    choices", M20)."""
    return np.fromiter(chain.from_iterable(pairs), dtype=float, count=2 * len(pairs)).reshape(-1, 2)


def clipped_union(
    starts: np.ndarray, ends: np.ndarray, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return merge_arrays of the spans cut to [lo, hi]: the pieces of
    merge_intervals(clip_intervals(spans, lo, hi)), as arrays."""
    return merge_arrays(np.maximum(starts, lo), np.minimum(ends, hi))


def total_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Return the summed length of disjoint spans, added in order as union_length adds them."""
    return float(sum((ends - starts).tolist()))


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Return the union of the intervals as sorted, disjoint (start, end) pairs.
    Empty or inverted intervals (end <= start) are dropped."""
    if not isinstance(intervals, (list, tuple)):
        intervals = list(intervals)
    if len(intervals) >= _ARRAY_MIN:
        both = _pairs_array(intervals)
        return as_pairs(*merge_arrays(both[:, 0], both[:, 1]))
    ordered = sorted((s, e) for s, e in intervals if e > s)
    merged: list[Interval] = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def merge_arrays(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the union of the intervals [starts[i], ends[i]] as two float arrays (starts,
    ends) of sorted, disjoint intervals: the pairs merge_intervals returns, for many at once.
    Empty or inverted intervals (end <= start) are dropped; touching ones are joined."""
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if not len(s):
        return s, e
    order = lex_order((e, s), lead=1)
    s, e = s[order], e[order]
    # An interval opens a new group when it starts after every earlier one has ended.
    reach = np.maximum.accumulate(e)
    opens = np.empty(len(s), dtype=bool)
    opens[0] = True
    np.greater(s[1:], reach[:-1], out=opens[1:])
    firsts = np.flatnonzero(opens)
    lasts = np.append(firsts[1:] - 1, len(s) - 1)
    return s[firsts], reach[lasts]


def union_length(intervals: Iterable[Interval]) -> float:
    """Return the total length in the union of the intervals (overlaps counted once)."""
    return sum(e - s for s, e in merge_intervals(intervals))


def clip_intervals(intervals: Iterable[Interval], start: float, end: float) -> list[Interval]:
    """Return the intervals cut to [start, end]; those outside it vanish."""
    if not isinstance(intervals, (list, tuple)):
        intervals = list(intervals)
    if len(intervals) >= _ARRAY_MIN:
        both = _pairs_array(intervals)
        s2, e2 = np.maximum(both[:, 0], start), np.minimum(both[:, 1], end)
        keep = e2 > s2
        return as_pairs(s2[keep], e2[keep])
    out = []
    for s, e in intervals:
        s2, e2 = max(s, start), min(e, end)
        if e2 > s2:
            out.append((s2, e2))
    return out


def gaps_between(merged: Sequence[Interval], start: float, end: float) -> list[Interval]:
    """Return the holes in `merged` (sorted, disjoint) within [start, end]."""
    holes: list[Interval] = []
    cursor = start
    for s, e in merged:
        if s > cursor:
            holes.append((cursor, min(s, end)))
        cursor = max(cursor, e)
        if cursor >= end:
            break
    if cursor < end:
        holes.append((cursor, end))
    return [(s, e) for s, e in holes if e > s]


def device_busy_us(
    trace: Trace | TraceIndex, start: float | None = None, end: float | None = None
) -> float:
    """Return microseconds in which any kernel, memcpy or memset ran on any stream or device,
    within [start, end] (default: the whole trace window)."""
    ix = index_of(trace)
    trace = ix.trace
    lo = trace.bounds_us[0] if start is None else start
    hi = trace.bounds_us[1] if end is None else end
    if len(trace.kernels) < 64:
        spans = ((k.start_us, k.end_us) for k in trace.kernels)
        return union_length(clip_intervals(spans, lo, hi))
    # The same pieces as union_length(clip_intervals(...)), merged as arrays; their lengths
    # are then summed by the same sum() in the same order.
    kc = kernel_columns(ix)
    return total_length(*clipped_union(kc.start, kc.end, lo, hi))


def intersect_intervals(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Return the intersection of two sorted disjoint interval lists."""
    if len(a) + len(b) >= _ARRAY_MIN and len(a) and len(b):
        a_arr, b_arr = _pairs_array(a), _pairs_array(b)
        # Each interval of a meets the run of b's that end after it starts and start before
        # it ends; the pieces come out in order, as the two-pointer walk below finds them.
        first = np.searchsorted(b_arr[:, 1], a_arr[:, 0], side="right")
        last = np.searchsorted(b_arr[:, 0], a_arr[:, 1], side="left")
        counts = np.maximum(last - first, 0)
        ia = np.repeat(np.arange(len(a)), counts)
        ib = (
            np.arange(int(counts.sum()))
            - np.repeat(np.cumsum(counts) - counts, counts)
            + np.repeat(first, counts)
        )
        lo = np.maximum(a_arr[ia, 0], b_arr[ib, 0])
        hi = np.minimum(a_arr[ia, 1], b_arr[ib, 1])
        keep = hi > lo
        return as_pairs(lo[keep], hi[keep])
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def nearest_open_before(
    b: np.ndarray, a: np.ndarray, lo: np.ndarray, *, strict: bool = False
) -> np.ndarray:
    """For each i, return the largest j in [lo[i], i) with b[j] >= a[i] (b[j] > a[i] when
    strict), or -1 when there is none: the "previous greater element" a stack of open
    intervals finds one by one, for all i at once, on the inputs the op trees give.

    Precondition: positions fall into runs that share lo (lo[j] == lo[i] for lo[i] <= j < i:
    one thread's ops), and within a run an earlier j that misses i's bound (b[j] < a[i], or
    b[j] <= a[i] when strict) has a[j] <= a[i]. It holds where a is sorted within each run
    (start times in start order) and where b is a shifted up by a constant >= 0 (ends
    against ends), the two shapes of the op trees here.

    Why that suffices: every position strictly between i's current candidate and i misses
    i's bound. A candidate j that misses too is replaced by j's own current candidate: all
    between them miss j's bound, a[j] <= a[i], so they miss i's. All i move at once, each
    reading the others' candidates as they stand, so a chain of misses is crossed in a few
    rounds, reading mostly neighbours (a sparse table of maxima would build log2(n) arrays
    of n and make as many random gathers per query)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    n = len(a)
    cand = np.arange(-1, n - 1, dtype=np.intp)
    if not n:
        return cand
    cand[cand < np.asarray(lo, dtype=np.intp)] = -1
    live = np.flatnonzero(cand >= 0)
    while len(live):
        j = cand[live]
        miss = b[j] <= a[live] if strict else b[j] < a[live]
        live, j = live[miss], j[miss]
        nxt = cand[j]  # -1 where j has none in the run: then neither has i
        cand[live] = nxt
        live = live[nxt >= 0]
    return cand


def nearest_open_at(
    b: np.ndarray,
    a: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    before: np.ndarray,
    *,
    strict: bool = False,
) -> np.ndarray:
    """For each query i, return the largest j in [lo[i], hi[i]) with b[j] >= a[i] (b[j] > a[i]
    when strict), or -1, for queries that come between the positions of a run: `before` is
    nearest_open_before(b, starts, ...) of the run's positions, and every position in
    [lo[i], hi[i]) starts no later than a[i] (hi from a searchsorted of a[i] in the starts).
    A candidate that misses is replaced by its own answer, which skips only positions that
    miss it, hence miss a[i]."""
    a = np.asarray(a, dtype=float)
    lo = np.asarray(lo, dtype=np.intp)
    cand = np.asarray(hi, dtype=np.intp) - 1
    cand[cand < lo] = -1
    live = np.flatnonzero(cand >= 0)
    while len(live):
        j = cand[live]
        miss = b[j] <= a[live] if strict else b[j] < a[live]
        live, j = live[miss], j[miss]
        nxt = before[j]
        nxt[nxt < lo[live]] = -1
        cand[live] = nxt
        live = live[nxt >= 0]
    return cand


def tree_depths(parent: np.ndarray) -> np.ndarray:
    """Return each node's depth (its number of ancestors) in a forest given by `parent`
    (-1 for a root). By pointer jumping: each round doubles how far every node looks up, so
    a chain of n nodes (n ops of the same start and end, nested in file order) takes log2(n)
    rounds rather than n."""
    parent = np.asarray(parent, dtype=np.intp)
    jump = parent.copy()
    # depth[i]: the distance from i to jump[i] (its depth once jump[i] is -1). Each round
    # reads the targets' values as they stood, then moves every live node's target up.
    depth = (parent >= 0).astype(np.intp)
    live = np.flatnonzero(jump >= 0)
    while len(live):
        up = jump[live]
        gained = depth[up]
        moved = jump[up]
        depth[live] += gained
        jump[live] = moved
        live = live[moved >= 0]
    return depth
