"""The rules' column paths (top-level ops, names and spans read as arrays) against the op by
op computations they replace, on recorded traces: the same values, of the same types."""

from __future__ import annotations

import bisect
import dataclasses
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from gpuprof_nb.analysis import model_rules
from gpuprof_nb.analysis.derived import TraceIndex
from gpuprof_nb.analysis.diagnose import _context
from gpuprof_nb.analysis.intervals import as_pairs, intersect_intervals, merge_arrays, union_length
from gpuprof_nb.analysis.modules import module_breakdown, modules_at
from gpuprof_nb.analysis.roofline import compute_roofline, roofline_anchors
from gpuprof_nb.analysis.rules import cold_ops_idle_us, rule_dtype_cast
from gpuprof_nb.analysis.rules.compute import _rule_dtype_cast_ops
from gpuprof_nb.analysis.rules.context import (
    names_of_class,
    overlap_us,
    spans_length,
    top_rows,
)
from gpuprof_nb.analysis.timeline import chosen_device, device_timeline
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parent.parent / "data"
TRACES = [
    "a100_alexnet_sync",
    "ddp_nccl_sampled",
    "h100_bert_small",
    "mi300_compile_triton",
    "a100_nccl",
    "mi300_bert_small",
]


def _contexts():
    for name in TRACES:
        path = next((DATA / name).glob("*.json*"), None)
        if path is None:
            continue
        ix = TraceIndex(load_trace(path))
        tl = device_timeline(ix)
        device, _ = chosen_device(ix)
        yield name, ix, _context(ix, tl, device, None)


@pytest.fixture(scope="module")
def contexts():
    found = list(_contexts())
    if not found:
        pytest.skip("no recorded traces")
    return found


def _random_union(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
    starts = np.array(
        [rng.choice([rng.uniform(0, 100), float(rng.randint(0, 100))]) for _ in range(n)]
    )
    ends = starts + np.array(
        [rng.choice([0.0, rng.uniform(0, 10), float(rng.randint(0, 5))]) for _ in range(n)]
    )
    return merge_arrays(starts, ends)


def test_overlap_is_union_length_of_the_intersection():
    rng = random.Random(7)
    for _ in range(400):
        a = _random_union(rng, rng.randint(0, 80))
        b = _random_union(rng, rng.randint(0, 80))
        want = union_length(intersect_intervals(as_pairs(*a), as_pairs(*b)))
        got = overlap_us(a, b)
        assert got == want and type(got) is type(want)
        want_a = union_length(as_pairs(*a))
        got_a = spans_length(*a)
        assert got_a == want_a and type(got_a) is type(want_a)


def test_per_step_counts_as_bisect_does(contexts):
    rng = random.Random(3)
    for _, ix, c in contexts:
        steps = ix.trace.steps
        lo, hi = c.lo - 10, c.hi + 10
        values = [rng.uniform(lo, hi) for _ in range(300)]
        values += [s.start_us for s in steps] + [s.end_us for s in steps]
        bounds = sorted((st.start_us, st.end_us) for st in steps)
        begins = [a for a, _ in bounds]
        inside = 0
        for t in values:
            k = bisect.bisect_right(begins, t) - 1
            inside += k >= 0 and t < bounds[k][1]
        want = inside / len(steps) if steps else float(len(values))
        assert c.per_step(iter(values)) == want
        assert c.per_step(np.array(values)) == want


def test_cold_start_and_casts_from_columns_match_op_by_op(contexts):
    casts = 0
    for name, ix, c in contexts:
        assert top_rows(c) is not None, name
        # A copy of the top-level ops is not the index's: the rules read them op by op.
        by_ops = dataclasses.replace(c, top_ops=tuple(list(c.top_ops)))
        assert top_rows(by_ops) is None
        assert cold_ops_idle_us(c) == cold_ops_idle_us(by_ops), name
        found = rule_dtype_cast(c)
        assert found == _rule_dtype_cast_ops(c, names_of_class(ix, "cast")), name
        casts += found is not None
    assert casts


def _is_low(cost, spec):
    """Whether an op is memory-bound, as model_rules judged it op by op."""
    if spec is not None and cost.bytes_moved:
        roof = "bf16" if cost.dtype in ("bf16", "fp16") else "fp32"
        ridge = spec.ridge_flop_per_byte(roof) or spec.ridge_flop_per_byte("fp32")
        if ridge:
            return bool(cost.flops / cost.bytes_moved < ridge)
    if cost.category in model_rules._LOW_INTENSITY:
        return True
    if cost.category in model_rules._HIGH_INTENSITY:
        return False
    return None


def test_bound_time_by_module_matches_the_walk_up_the_tree(contexts):
    checked = 0
    for name, ix, c in contexts:
        roofline = compute_roofline(ix)
        mb = module_breakdown(ix, c.timeline)
        anchors = roofline_anchors(ix)
        if not anchors or not mb.rows:
            continue
        # The walk as it was: each op's module, then up the parents, one op at a time.
        positions = [a for a, cost, t in anchors if cost is not None and t > 0]
        costs = {a: (cost, t) for a, cost, t in anchors if cost is not None and t > 0}
        parents = {r.path: r.parent for r in mb.rows}
        mem, comp, every = defaultdict(float), defaultdict(float), defaultdict(float)
        for a, (path, _) in zip(positions, modules_at(ix, positions), strict=True):
            if path is None:
                continue
            cost, t = costs[a]
            low = _is_low(cost, roofline.device)
            p = path
            while p is not None:
                every[p] += t
                if low:
                    mem[p] += t
                elif low is False:
                    comp[p] += t
                p = parents.get(p)
        got = model_rules._bound_time_by_module(c, mb, roofline)
        assert got == (mem, comp, every), name
        checked += bool(every)
    if not checked:
        pytest.skip("no trace with modules and a roofline")
