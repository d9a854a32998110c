"""Interval arithmetic, checked against a brute-force count over integer unit cells."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpuprof_nb.analysis.intervals import (
    clip_intervals,
    device_busy_us,
    gaps_between,
    intersect_intervals,
    merge_intervals,
    nearest_open_at,
    nearest_open_before,
    union_length,
)
from gpuprof_nb.io.trace import trace_from_dict


def nearest_previous_at_least(
    b: np.ndarray,
    a: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray | None = None,
    *,
    strict: bool = False,
) -> np.ndarray:
    """For each i, return the largest j in [lo[i], hi[i]) with b[j] >= a[i] (b[j] > a[i]
    when strict), or -1 when there is none; hi defaults to i itself. A second, independent
    reference for nearest_open_before/_at (the analysis used it before them).

    The "previous greater element" that a stack of open intervals finds one by one, for all
    i at once: a sparse table of maxima over power-of-two windows, descended greedily (a
    window whose maximum cannot qualify holds no candidate and is skipped whole)."""
    a = np.asarray(a, dtype=float)
    n = len(a)
    if not n or not len(b):
        return np.full(n, -1, dtype=np.intp)
    b = np.asarray(b, dtype=float)
    lo = np.asarray(lo, dtype=np.intp)
    pos = np.arange(n, dtype=np.intp) if hi is None else np.array(hi, dtype=np.intp)
    # table[k][p] = max(b[p : p + 2**k]) where the window fits.
    table = [b]
    while 2 ** len(table) <= len(b):
        prev, half = table[-1], 2 ** (len(table) - 1)
        table.append(np.maximum(prev[:-half], prev[half:]))
    for k in range(len(table) - 1, -1, -1):
        width = 2**k
        start = pos - width
        cand = np.flatnonzero(start >= lo)
        if not len(cand):
            continue
        window_max = table[k][start[cand]]
        skip = window_max <= a[cand] if strict else window_max < a[cand]
        pos[cand[skip]] -= width
    j = pos - 1
    found = j >= lo
    hit = b[j[found]]
    found[found] = hit > a[found] if strict else hit >= a[found]
    return np.where(found, j, -1)


def _cells(intervals: list[tuple[int, int]]) -> set[int]:
    """Unit cells [i, i+1) covered by integer intervals: the brute-force union."""
    return {i for s, e in intervals for i in range(s, e)}


def _random_intervals(rng: random.Random, n: int) -> list[tuple[int, int]]:
    out = []
    for _ in range(n):
        s = rng.randrange(0, 200)
        out.append((s, s + rng.randrange(-3, 30)))  # some empty or inverted
    return out


@pytest.mark.parametrize("seed", range(20))
def test_merge_and_union_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    spans = _random_intervals(rng, rng.randrange(0, 40))
    merged = merge_intervals(spans)
    assert union_length(spans) == len(_cells(spans))
    assert _cells([(int(s), int(e)) for s, e in merged]) == _cells(spans)
    # sorted and disjoint, not touching (touching intervals are merged)
    for (_, e1), (s2, _) in zip(merged, merged[1:], strict=False):
        assert e1 < s2


@pytest.mark.parametrize("seed", range(10))
def test_clip_and_gaps_match_brute_force(seed: int) -> None:
    rng = random.Random(100 + seed)
    spans = _random_intervals(rng, 25)
    lo, hi = sorted(rng.sample(range(-10, 240), 2))
    clipped = clip_intervals(spans, lo, hi)
    assert _cells([(int(s), int(e)) for s, e in clipped]) == {
        c for c in _cells(spans) if lo <= c < hi
    }
    holes = gaps_between(merge_intervals(spans), lo, hi)
    hole_cells = _cells([(int(s), int(e)) for s, e in holes])
    assert hole_cells == set(range(lo, hi)) - _cells(spans)


def test_edge_cases() -> None:
    assert merge_intervals([]) == [] and union_length([]) == 0
    assert merge_intervals([(1.0, 2.0), (2.0, 3.0)]) == [(1.0, 3.0)]
    assert merge_intervals([(5.0, 5.0), (7.0, 6.0)]) == []
    assert gaps_between([], 0.0, 4.0) == [(0.0, 4.0)]
    assert gaps_between([(0.0, 10.0)], 2.0, 5.0) == []
    assert clip_intervals([(0.0, 1.0)], 2.0, 3.0) == []


def test_device_busy_counts_overlapping_streams_once() -> None:
    def k(ts: float, dur: float, stream: int, cat: str = "kernel") -> dict:
        return {
            "ph": "X",
            "cat": cat,
            "name": "k",
            "pid": 0,
            "tid": stream,
            "ts": ts,
            "dur": dur,
            "args": {"device": 0, "stream": stream},
        }

    trace = trace_from_dict(
        {
            "traceEvents": [
                k(0, 10, 7),
                k(5, 10, 8),
                k(30, 5, 7, "gpu_memcpy"),
                k(33, 1, 9, "gpu_memset"),
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "op",
                    "pid": 1,
                    "tid": 1,
                    "ts": -10,
                    "dur": 60,
                },
            ]
        }
    )
    # union: [0, 15) + [30, 35) = 20 us
    assert device_busy_us(trace) == 20
    assert device_busy_us(trace, 8, 32) == (15 - 8) + (32 - 30)


def _loop_merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union as a plain sort-and-sweep, for the array paths to be checked against."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _float_intervals(rng: random.Random, n: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(n):
        s = rng.choice([rng.uniform(0, 1000), float(rng.randrange(0, 100))])
        out.append((s, s + rng.choice([0.0, -1.0, rng.uniform(0, 40), float(rng.randrange(10))])))
    return out


@pytest.mark.parametrize("seed", range(30))
def test_array_paths_give_the_loops_pairs(seed: int) -> None:
    """From 64 intervals on, merge, clip and intersect run on arrays: the pairs must be the
    ones the loops give, float for float (touching intervals join, empty ones drop)."""
    rng = random.Random(seed)
    spans = _float_intervals(rng, rng.choice([64, 100, 700]))
    assert merge_intervals(spans) == _loop_merge(spans)
    assert merge_intervals(iter(spans)) == _loop_merge(spans)
    lo, hi = rng.uniform(0, 400), rng.uniform(500, 1000)
    assert clip_intervals(spans, lo, hi) == [
        (max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)
    ]
    a, b = _loop_merge(spans), _loop_merge(_float_intervals(rng, rng.choice([3, 80, 300])))
    expected = [
        (max(s1, s2), min(e1, e2)) for s1, e1 in a for s2, e2 in b if min(e1, e2) > max(s1, s2)
    ]
    assert intersect_intervals(a, b) == expected


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_nearest_previous_matches_a_scan(seed: int, strict: bool) -> None:
    """The sparse-table search finds, for every query, the nearest earlier position in its
    range whose value reaches the query's, as a backwards scan does."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 50, 300])
    b = np.array([float(rng.randrange(20)) for _ in range(n)])
    a = np.array([float(rng.randrange(20)) for _ in range(n)])
    lo = np.array([rng.randrange(i + 1) for i in range(n)])
    hi = np.array([rng.randrange(lo[i], n + 1) for i in range(n)])
    for bound in (None, hi):
        got = nearest_previous_at_least(b, a, lo, bound, strict=strict).tolist()
        for i in range(n):
            top = i if bound is None else int(bound[i])
            want = next(
                (
                    j
                    for j in range(top - 1, int(lo[i]) - 1, -1)
                    if (b[j] > a[i] if strict else b[j] >= a[i])
                ),
                -1,
            )
            assert got[i] == want, (i, bound is None)


def _scan(b: np.ndarray, a: np.ndarray, lo: np.ndarray, top: list[int], strict: bool) -> list[int]:
    """The nearest j in [lo[i], top[i]) with b[j] reaching a[i], by a backwards scan."""
    return [
        next(
            (
                j
                for j in range(top[i] - 1, int(lo[i]) - 1, -1)
                if (b[j] > a[i] if strict else b[j] >= a[i])
            ),
            -1,
        )
        for i in range(len(a))
    ]


def _runs(rng: random.Random, n: int) -> np.ndarray:
    """lo of each position: positions cut into runs (one thread's ops each)."""
    lo, first = [], 0
    for i in range(n):
        if i and rng.random() < 0.1:
            first = i
        lo.append(first)
    return np.array(lo, dtype=np.intp)


def _nested(rng: random.Random, n: int, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts sorted within each run and ends that nest, overlap or leave gaps at random,
    with ties (small integer grid), as op trees of real and damaged traces have."""
    starts, ends = [], []
    for i in range(n):
        s = float(rng.randrange(4)) if i == lo[i] else starts[-1] + rng.randrange(3)
        starts.append(s)
        ends.append(s + rng.randrange(12))
    return np.array(starts), np.array(ends)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_nearest_open_before_matches_the_sparse_table(seed: int, strict: bool) -> None:
    """Following answers back finds what the sparse table and a scan find, on the two shapes
    of input the op trees give: starts sorted within each run against ends, and ends against
    ends shifted up (the nesting test's rounding allowance)."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 50, 400])
    lo = _runs(rng, n)
    starts, ends = _nested(rng, n, lo)
    top = list(range(n))
    for b, a in ((ends, starts), (ends + rng.choice([0.0, 0.5, 1.0]), ends)):
        got = nearest_open_before(b, a, lo, strict=strict).tolist()
        assert got == nearest_previous_at_least(b, a, lo, strict=strict).tolist()
        assert got == _scan(b, a, lo, top, strict)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_nearest_open_at_matches_the_sparse_table(seed: int, strict: bool) -> None:
    """Queries between a run's positions (launch calls among ops) get the nearest position
    open at their time, as the sparse table and a scan find it."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 50, 400])
    lo_ops = _runs(rng, n)
    starts, ends = _nested(rng, n, lo_ops)
    before = nearest_open_before(ends, starts, lo_ops, strict=strict)
    firsts = sorted(set(lo_ops.tolist()))
    bounds = firsts + [n]
    q_lo, q_hi, q_a = [], [], []
    for _ in range(rng.choice([0, 1, 30, 300])):
        r = rng.randrange(len(firsts))
        a0, b0 = bounds[r], bounds[r + 1]
        t = float(rng.randrange(int(starts[b0 - 1]) + 6)) + rng.choice([0.0, 0.5])
        q_a.append(t)
        q_lo.append(a0)
        q_hi.append(a0 + int(np.searchsorted(starts[a0:b0], t, side="right")))
    a = np.array(q_a, dtype=float)
    lo, hi = np.array(q_lo, dtype=np.intp), np.array(q_hi, dtype=np.intp)
    got = nearest_open_at(ends, a, lo, hi, before, strict=strict).tolist()
    assert got == nearest_previous_at_least(ends, a, lo, hi, strict=strict).tolist()
    assert got == _scan(ends, a, lo, hi.tolist(), strict)


def test_tree_depths_match_walking_up_each_node() -> None:
    import numpy as np

    from gpuprof_nb.analysis.intervals import tree_depths

    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 10, 300):
        parent = np.array([int(rng.integers(-1, i)) if i else -1 for i in range(n)], dtype=np.intp)
        want = []
        for i in range(n):
            d, j = 0, parent[i]
            while j >= 0:
                d, j = d + 1, parent[j]
            want.append(d)
        assert tree_depths(parent).tolist() == want
    chain = np.arange(-1, 99_999, dtype=np.intp)  # 100,000 ops nested one in the next
    assert tree_depths(chain)[-1] == 99_999
