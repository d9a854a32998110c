"""compute_roofline on a real H100 trace recorded with shapes (TraceLens' ViT inference),
checked against a plain-JSON recomputation of the same numbers."""

from __future__ import annotations

import gzip
import json

import pytest

from gpuprof_nb.analysis.roofline import compute_roofline
from gpuprof_nb.io.trace import load_trace

VIT = "h100_vit_inference/Falconsai_nsfw_image_detection__1016002.json.gz"


@pytest.fixture(scope="module")
def vit(data_dir):
    path = data_dir / VIT
    raw = json.loads(gzip.open(path).read())
    return compute_roofline(load_trace(path)), raw


def _kernel_us_by_ext(raw) -> dict[int, float]:
    out: dict[int, float] = {}
    for e in raw["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
            ext = e["args"].get("External id")
            out[ext] = out.get(ext, 0.0) + float(e["dur"])
    return out


def _cpu_ops(raw, name):
    return [e for e in raw["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == name]


def test_device_from_device_properties_is_h100_sxm(vit):
    roof, raw = vit
    assert raw["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert roof.device is not None
    assert roof.device.name == "NVIDIA H100 SXM"
    assert roof.device.bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert roof.device.ridge_flop_per_byte("bf16") == pytest.approx(989.5e12 / 3.35e12)


def test_gemm_points_match_plain_json(vit):
    roof, raw = vit
    linears = [p for p in roof.points if p.name == "aten::linear"]
    assert linears, "the ViT trace's GEMMs should be on the roofline"
    # FLOPs recomputed from the addmm children (M x K @ K x N), not the linear anchors.
    addmm_flops = 0
    for e in _cpu_ops(raw, "aten::addmm"):
        (m, k), (_, n) = e["args"]["Input Dims"][1], e["args"]["Input Dims"][2]
        addmm_flops += 2 * m * k * n
    assert sum(p.flops for p in linears) == addmm_flops
    assert sum(p.calls for p in linears) == len(_cpu_ops(raw, "aten::linear"))
    # Their device time: every kernel launched by an addmm (by External id).
    by_ext = _kernel_us_by_ext(raw)
    addmm_us = sum(by_ext.get(e["args"]["External id"], 0.0) for e in _cpu_ops(raw, "aten::addmm"))
    assert sum(p.time_us for p in linears) == pytest.approx(addmm_us)
    for p in linears:
        assert p.dtype == "bf16" and p.roof == "bf16"
        assert p.bound in ("memory", "compute")
        assert 0 < p.fraction_of_roof < 1


def test_convolution_point_is_its_convolution_kernels_and_the_bias_add_its_own(vit):
    """A matmul-family point runs at its GEMM kernels' rate (issue 32): the bias add the
    convolution launched (an aten::add_ under aten::_convolution) is its own memory-bound
    point, not part of the convolution's time; the op table keeps the whole op's time."""
    roof, raw = vit
    (conv,) = [p for p in roof.points if p.category == "conv"]
    assert conv.name == "aten::conv2d" and conv.calls == 1
    (c2d,) = _cpu_ops(raw, "aten::conv2d")
    x, w = c2d["args"]["Input Dims"][0], c2d["args"]["Input Dims"][1]
    out_hw = (x[2] // 16) * (x[3] // 16)  # stride 16, no padding
    assert conv.flops == 2 * x[0] * w[0] * out_hw * w[1] * w[2] * w[3]
    # By hand: the ops nested in conv2d on its thread, and the kernels of each (External id).
    inner = [
        e
        for e in raw["traceEvents"]
        if e.get("cat") == "cpu_op"
        and e["tid"] == c2d["tid"]
        and c2d["ts"] <= e["ts"]
        and e["ts"] + e["dur"] <= c2d["ts"] + c2d["dur"]
    ]
    by_ext = _kernel_us_by_ext(raw)
    bias = [e for e in inner if e["name"] == "aten::add_"]
    assert len(bias) == 1
    bias_us = by_ext[bias[0]["args"]["External id"]]
    conv_us = sum(by_ext.get(e["args"]["External id"], 0.0) for e in inner if e not in bias)
    assert bias_us > 0 and conv_us > 0
    assert conv.time_us == pytest.approx(conv_us)
    (add,) = [p for p in roof.points if p.name == "aten::add_" and p.shapes.startswith("4x768")]
    assert add.time_us == pytest.approx(bias_us) and add.calls == 1
    assert add.category == "elementwise" and add.bound == "memory"
    # The op table still holds the whole convolution, bias included.
    from gpuprof_nb.analysis.ops import top_ops

    (row,) = [r for r in top_ops(load_trace_of(raw), n=None).rows if r.name == "aten::conv2d"]
    assert row.total_device_us == pytest.approx(conv_us + bias_us)


def load_trace_of(raw):
    from gpuprof_nb.io.trace import trace_from_dict

    return trace_from_dict(raw, "vit")


def test_a_matmul_point_leaves_its_contiguous_copies_out() -> None:
    """aten::matmul made its input contiguous (aten::contiguous -> aten::clone ->
    aten::copy_, one copy kernel) and ran aten::mm (one GEMM kernel): the point is the
    GEMM's time, the copy a data movement of its own."""
    from gpuprof_nb.io.trace import trace_from_dict

    def op(name, ts, dur, ext, dims):
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": dur,
            "args": {"External id": ext, "Input Dims": dims, "Input type": ["float"] * len(dims)},
        }

    def kernel(name, ts, dur, ext):
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": ts,
            "dur": dur,
            "args": {"External id": ext, "device": 0, "stream": 7},
        }

    a, b = [512, 1024], [1024, 256]
    events = [
        op("aten::matmul", 0, 100, 1, [a, b]),
        op("aten::contiguous", 5, 40, 2, [b]),
        op("aten::clone", 6, 38, 3, [b]),
        op("aten::copy_", 8, 30, 4, [b, b]),
        op("aten::mm", 50, 40, 5, [a, b]),
        kernel("void at::native::elementwise_kernel<copy>", 20, 30.0, 4),
        kernel("ampere_sgemm_128x64_nn", 60, 10.0, 5),
    ]
    trace = trace_from_dict({"traceEvents": events}, "hand")
    roof = compute_roofline(trace, "NVIDIA H100")
    (mm,) = [p for p in roof.points if p.category == "gemm"]
    assert mm.name == "aten::matmul" and mm.time_us == pytest.approx(10.0)
    assert mm.achieved_flops_per_s == pytest.approx(2 * 512 * 1024 * 256 / 10e-6)
    moves = {d.name: d for d in roof.data_movement}
    assert sum(d.time_us for d in moves.values()) == pytest.approx(30.0)
    assert roof.coverage == pytest.approx(1.0)


def test_attention_and_memory_bound_ops_present(vit):
    roof, _ = vit
    cats = {p.category for p in roof.points}
    assert {"gemm", "conv", "attention", "norm", "elementwise"} <= cats
    ln = [p for p in roof.points if p.name == "aten::layer_norm"]
    assert ln and all(p.bound == "memory" for p in ln)
    # Nearly all kernel time lands on a formula; the rest is listed, never dropped.
    assert roof.coverage == pytest.approx(
        1 - sum(u.time_us for u in roof.unmodelled) / roof.total_time_us
    )
    assert roof.coverage > 0.95


@pytest.mark.parametrize(
    "name",
    [
        VIT,
        "mi300_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
        "a100_nccl/nccl_data.json.gz",
    ],
)
def test_grouped_costing_matches_one_op_cost_per_op(data_dir, name) -> None:
    """_Costs.have_cost groups ops by call before costing them; each op's answer (and the
    cost kept for its call) is what op_cost says of that op alone."""
    import numpy as np

    from gpuprof_nb.analysis.derived import index_of, op_columns
    from gpuprof_nb.analysis.flops import COPY_WRAPPERS, op_cost
    from gpuprof_nb.analysis.roofline import _costable, _Costs, _Tree

    ix = index_of(load_trace(data_dir / name))
    tree = _Tree(op_columns(ix))
    costable = _costable(ix, len(tree.ops))
    plain = np.array(
        [i for i in np.flatnonzero(costable).tolist() if tree.ops[i].name not in COPY_WRAPPERS],
        dtype=np.intp,
    )
    assert len(plain)
    cost = _Costs(tree)
    got = cost.have_cost(ix, plain)
    want = [op_cost(tree.ops[i]) for i in plain.tolist()]
    assert got.tolist() == [c is not None for c in want]
    # The kept costs are the ones later lookups return, equal to each op's own.
    assert [cost(i) for i in plain.tolist()] == want
    # An empty ask, and one op alone, answer the same way.
    assert cost.have_cost(ix, plain[:0]).tolist() == []
    assert cost.have_cost(ix, plain[-1:]).tolist() == [want[-1] is not None]


def test_children_by_scan_and_by_sort_agree(data_dir) -> None:
    """_Tree.children_of answers its first asks by a scan, the rest from the sorted
    children: both give the same ops in the same order, those whose parent is the op."""
    from gpuprof_nb.analysis.derived import index_of, op_columns
    from gpuprof_nb.analysis.roofline import _Tree

    ix = index_of(load_trace(data_dir / VIT))
    scanned = _Tree(op_columns(ix))
    sorted_ = _Tree(op_columns(ix))
    sorted_._scans_left = 0
    n = len(scanned.ops)
    rank = {op: r for r, op in enumerate(scanned.order)}
    kids: dict[int, list[int]] = {}
    for j, p in enumerate(scanned.parent_arr.tolist()):
        kids.setdefault(p, []).append(j)
    # Ops with several children first (their order is what is checked), then leaves.
    asked = sorted(range(n), key=lambda i: -len(kids.get(i, ())))[:200]
    assert len(kids.get(asked[0], ())) > 1
    for i in asked:
        want = sorted(kids.get(i, ()), key=rank.__getitem__)
        assert scanned.children_of(i) == want
        assert sorted_.children_of(i) == want
    assert scanned._scans_left == 0  # the later asks went to the sorted lists


def test_first_seen_and_sums_match_plain_loops() -> None:
    """_first_seen numbers values in order of first appearance; _sum_costs adds FLOPs and
    bytes per group as `+=` in item order would, for int costs (by count) and float costs
    (one by one)."""
    import numpy as np

    from gpuprof_nb.analysis.flops import OpCost
    from gpuprof_nb.analysis.roofline import _first_seen, _sum_costs

    rng = np.random.default_rng(7)
    values = rng.integers(0, 9, size=200)
    seen: dict[int, int] = {}
    for v in values.tolist():
        seen.setdefault(v, len(seen))
    firsts, codes = _first_seen(values)
    assert values[firsts].tolist() == list(seen)
    assert codes.tolist() == [seen[v] for v in values.tolist()]
    assert [x.tolist() for x in _first_seen(values[:0])] == [[], []]
    for scale in (1, 0.1):  # int costs, then float ones (where the order of the sum tells)
        call_cost = [
            OpCost(k * 10**15 * scale, k * 3 * scale, "gemm", "fp32", "formula", "io")
            for k in range(1, 6)
        ]
        groups = rng.integers(0, 4, size=300)
        calls = rng.integers(0, 5, size=300)
        want_f, want_b = [0] * 4, [0] * 4
        for g, k in zip(groups.tolist(), calls.tolist(), strict=True):
            want_f[g] += call_cost[k].flops
            want_b[g] += call_cost[k].bytes_moved
        got_f, got_b = _sum_costs(groups, calls, call_cost, 4)
        assert [repr(x) for x in got_f] == [repr(x) for x in want_f]
        assert [repr(x) for x in got_b] == [repr(x) for x in want_b]


@pytest.mark.parametrize(
    "name",
    [
        VIT,
        "mi300_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
        "gpu/host_device_copy.json.gz",
    ],
)
def test_groups_match_a_loop_over_anchors(data_dir, name) -> None:
    """_group_anchors (grouped per call with array sums) gives what one pass over the
    anchors gives: per group its calls, FLOPs, bytes, time, first cost, kernel names and
    host copies, and per (kernel, group) for anchors of one kernel; and
    _costable_below what a walk of each op's descendants finds."""
    import numpy as np

    from gpuprof_nb.analysis.derived import index_of, op_columns
    from gpuprof_nb.analysis.roofline import (
        _Acc,
        _anchors,
        _costable,
        _costable_below,
        _Costs,
        _device_times,
        _group_anchors,
        _is_host_device,
        _shapes,
        _Tree,
    )

    ix = index_of(load_trace(data_dir / name))
    tree = _Tree(op_columns(ix))
    cost = _Costs(tree)
    costable = _costable(ix, len(tree.ops))
    below = _costable_below(tree, costable)
    want_below = []
    for i in range(len(tree.ops)):
        stack, found = list(tree.children_of(i)), False
        while stack and not found:
            j = stack.pop()
            found = bool(costable[j])
            stack.extend(tree.children_of(j))
        want_below.append(found)
    assert below.tolist() == want_below
    anchor = _anchors(ix, tree, cost, costable)
    times = _device_times(ix, tree, anchor, cost, costable)
    anchors = np.fromiter(times.anchor_time, dtype=np.intp, count=len(times.anchor_time))
    g = _group_anchors(ix, tree.ops, times, cost, anchors, cost.calls_of(anchors))
    kernels_of: dict[int, list] = {}
    for k, a in zip(times.kernel_ix.tolist(), times.kernel_anchor.tolist(), strict=True):
        kernels_of.setdefault(a, []).append(ix.trace.kernels[k])
    acc: dict = {}
    first_cost: dict = {}
    names: dict = {}
    host: set = set()
    per_kernel: dict = {}
    for a in sorted(times.anchor_time):
        c, t = cost(a), times.anchor_time[a]
        if c is None or t <= 0:
            continue
        key = (tree.ops[a].name, _shapes(tree.ops[a]), c.dtype)
        x = acc.setdefault(key, _Acc())
        x.calls, x.flops, x.bytes_moved = (
            x.calls + 1,
            x.flops + c.flops,
            x.bytes_moved + c.bytes_moved,
        )
        x.time_us += t
        first_cost.setdefault(key, c)
        launched = kernels_of.get(a, [])
        kernels = [k for k in launched if k.kind == "kernel"]
        names.setdefault(key, set()).update(k.name for k in kernels)
        if any(k.kind == "memcpy" and _is_host_device(k.name) for k in launched):
            host.add(key)
        if len(launched) == 1 and len(kernels) == 1:
            y = per_kernel.setdefault((kernels[0].name, *key), _Acc())
            y.calls, y.flops = y.calls + 1, y.flops + c.flops
            y.bytes_moved += c.bytes_moved
            y.time_us += kernels[0].dur_us
    assert acc and (per_kernel or host)
    assert list(g.acc.items()) == list(acc.items())
    assert list(g.kernels.items()) == list(per_kernel.items())
    assert all(g.cost[k] is first_cost[k] for k in acc)
    assert {k: set(g.kernel_names(k)) for k in acc} == names
    assert g.host_copy == host
