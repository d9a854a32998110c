"""top_ops, kernel_table and summarize_trace: hand-checked on a tiny real A100 trace, on
synthetic nestings, and against independent recomputations on real traces."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from gpuprof_nb.analysis.ops import SORT_KEYS, kernel_table, summarize_trace, top_ops
from gpuprof_nb.io.trace import load_trace, trace_from_dict

DATA = Path(__file__).parents[1] / "data"
EVENT_SYNC = DATA / "a100_event_sync" / "event_sync_trace.json.gz"
REAL = [
    DATA / "a100_event_sync" / "event_sync_trace.json.gz",
    DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz",
    DATA / "mi300_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz",
    DATA / "kineto2021_v100" / "gpu_metrics_input.json",
    DATA / "amd_mi250_toy" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    DATA / "a100_triton" / "triton_example.json.gz",
    DATA / "mi300_compile_triton" / "trace.json.gz",
    DATA / "cpu_only_trace" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
]


def _plain(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _row(table, name):  # type: ignore[no-untyped-def]
    return next(r for r in table.rows if r.name == name)


# --------------------------------------------------------------------------------------------
# hand-checked attribution on a real trace


def test_event_sync_trace_by_hand() -> None:
    """Times below are read off the trace (ts - 1707417525512000 us):
    aten::ones [-2095, 150) holds aten::empty (2187 us) and aten::fill_ [99, 149);
    cudaLaunchKernel corr 1482 at 110 -> inside fill_ -> 1 us kernel.
    aten::sum [159, 198) holds aten::sum [162, 196), which holds as_strided [172, 173);
    launch 1495 at 182 -> inner sum (as_strided is closed) -> 11 us kernel.
    aten::gt [205, 238); launch 1505 at 221 -> 1 us kernel.
    aten::is_nonzero [245, 292) > item [247, 292) > _local_scalar_dense [249, 291);
    cudaMemcpyAsync 1511 at 252 -> 2 us memcpy.
    spin_kernel (36 us) launched at 362, after every op closed: nobody owns it."""
    t = top_ops(load_trace(EVENT_SYNC))
    assert t.sort_key == "self_device_us"
    ones, fill, sums = _row(t, "aten::ones"), _row(t, "aten::fill_"), _row(t, "aten::sum")
    assert ones.self_cpu_us == pytest.approx(2245 - 2187 - 50)
    assert (ones.self_device_us, ones.total_device_us) == (0, 1)
    assert (fill.self_device_us, fill.total_device_us, fill.self_cpu_us) == (1, 1, 50)
    assert sums.calls == 2
    assert sums.self_cpu_us == pytest.approx((39 - 34) + (34 - 1))
    assert sums.total_cpu_us == pytest.approx(39 + 34)
    assert (sums.self_device_us, sums.total_device_us) == (11, 22)
    assert _row(t, "aten::gt").self_device_us == 1
    lsd = _row(t, "aten::_local_scalar_dense")
    assert (lsd.self_device_us, lsd.self_cpu_us) == (2, 42)
    assert _row(t, "aten::item").self_cpu_us == 3
    assert (_row(t, "aten::item").self_device_us, _row(t, "aten::item").total_device_us) == (0, 2)
    assert _row(t, "aten::is_nonzero").total_device_us == 2
    assert t.unattributed_device_us == 36
    assert t.self_device_us == 1 + 11 + 1 + 2
    # Sorted by self device time, ties broken by name.
    assert [r.name for r in t.rows[:4]] == [
        "aten::sum",
        "aten::_local_scalar_dense",
        "aten::fill_",
        "aten::gt",
    ]
    assert t.rows[0].fraction == pytest.approx(11 / 15)
    assert "ProfilerStep#100" not in {r.name for r in t.rows}


# --------------------------------------------------------------------------------------------
# synthetic nestings


def _op(
    name: str, ts: float, dur: float, tid: int = 1, ext: int | None = None, dims: list | None = None
) -> dict:
    args: dict = {}
    if ext is not None:
        args["External id"] = ext
    if dims is not None:
        args["Input Dims"] = dims
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _launch(ts: float, corr: int, tid: int = 1) -> dict:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": 1,
        "args": {"correlation": corr},
    }


def _kernel(
    name: str,
    ts: float,
    dur: float,
    corr: int | None = None,
    ext: int | None = None,
    cat: str = "kernel",
    nbytes: int | None = None,
    stream: int = 7,
) -> dict:
    args: dict = {"device": 0, "stream": stream}
    if corr is not None:
        args["correlation"] = corr
    if ext is not None:
        args["External id"] = ext
    if nbytes is not None:
        args["bytes"] = nbytes
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_attribution_rules_on_a_synthetic_trace() -> None:
    events = [
        _op("outer", 0, 100, ext=1),
        _op("inner", 10, 30, ext=2),
        _launch(20, corr=50),  # inside inner -> inner owns kernel A
        _launch(60, corr=51),  # inside outer only -> outer owns kernel B
        _op("other_thread", 5, 10, tid=2, ext=3),
        _kernel("A", 200, 8, corr=50),
        _kernel("B", 210, 4, corr=51),
        _kernel("C", 220, 2, corr=999, ext=3),  # no runtime call: External id -> other_thread
        _kernel("D", 230, 1),  # nothing links it
        _op("same_start_parent", 300, 50),  # equal starts: the longer is the parent
        _op("same_start_child", 300, 20),
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": -1,
            "dur": 400,
        },
    ]
    t = top_ops(trace_from_dict({"traceEvents": events}))
    outer, inner = _row(t, "outer"), _row(t, "inner")
    assert (outer.self_cpu_us, outer.total_cpu_us) == (70, 100)
    assert (outer.self_device_us, outer.total_device_us) == (4, 12)
    assert (inner.self_device_us, inner.total_device_us) == (8, 8)
    assert _row(t, "other_thread").self_device_us == 2  # and not nested under outer
    assert _row(t, "other_thread").self_cpu_us == 10
    assert t.unattributed_device_us == 1
    assert _row(t, "same_start_parent").self_cpu_us == 30
    assert _row(t, "same_start_child").self_cpu_us == 20
    assert {r.name for r in t.rows} == {
        "outer",
        "inner",
        "other_thread",
        "same_start_parent",
        "same_start_child",
    }


def test_children_running_past_their_parent_are_clipped() -> None:
    t = top_ops(trace_from_dict({"traceEvents": [_op("p", 0, 10), _op("c", 8, 5)]}))
    assert _row(t, "p").self_cpu_us == 8
    assert _row(t, "c").self_cpu_us == 5


def test_sort_keys_ties_n_and_shapes() -> None:
    events = [
        _op("b", 0, 10, dims=[[2, 3], []]),
        _op("a", 20, 10, dims=[[4], [5, 6]]),
        _op("a", 40, 1, dims=[[4], [5, 6]]),
        _op("a", 50, 1, dims=[[7]]),
        _op("c", 60, 2),
    ]
    trace = trace_from_dict({"traceEvents": events})
    by_cpu = top_ops(trace)  # no kernels -> self CPU
    assert by_cpu.sort_key == "self_cpu_us"
    assert [r.name for r in by_cpu.rows] == ["a", "b", "c"]
    assert by_cpu.rows[0].fraction == pytest.approx(12 / 24)
    assert by_cpu.rows[0].input_shapes == ("[[4], [5, 6]]", "[[7]]")
    assert by_cpu.rows[0].input_shape_calls == (2, 1)
    assert by_cpu.rows[2].input_shapes == ()
    tie = top_ops(trace_from_dict({"traceEvents": [_op("z", 0, 5), _op("y", 10, 5)]}))
    assert [r.name for r in tie.rows] == ["y", "z"]
    assert [r.name for r in top_ops(trace, sort="calls").rows] == ["a", "b", "c"]
    assert top_ops(trace, sort="count").sort_key == "calls"
    assert top_ops(trace, sort="self_cuda_time_total").sort_key == "self_device_us"
    assert len(top_ops(trace, n=2).rows) == 2 and top_ops(trace, n=2).distinct_ops == 3
    assert top_ops(trace, n=0).rows == ()


def test_bad_sort_key_names_the_valid_ones() -> None:
    trace = trace_from_dict({"traceEvents": [_op("a", 0, 1)]})
    with pytest.raises(ValueError) as info:
        top_ops(trace, sort="bogus")
    for key in ("self_device_us", "self_cpu_us", "calls"):
        assert key in str(info.value)
    with pytest.raises(ValueError):
        top_ops(trace, n=-1)
    assert set(SORT_KEYS.values()) == {
        "self_device_us",
        "total_device_us",
        "self_cpu_us",
        "total_cpu_us",
        "calls",
    }


# --------------------------------------------------------------------------------------------
# invariants on real traces, against independent computations


def _reference_roots(d: dict) -> tuple[float, int]:
    """Sum of durations of top-level cpu ops per thread (brute force containment), and count.
    When ops nest properly, self times partition exactly this time."""
    ops = [
        e
        for e in d["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") in ("cpu_op", "Operator")
        and not e["name"].startswith(("ProfilerStep#", "Optimizer."))
    ]
    by_thread = defaultdict(list)
    for e in ops:
        by_thread[(e["pid"], str(e["tid"]))].append((float(e["ts"]), float(e["ts"] + e["dur"])))
    total = 0.0
    for spans in by_thread.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        reach = -1e300
        for s, e in spans:
            if s >= reach:  # not inside any earlier span
                total += e - s
                reach = e
            # a partially overlapping sibling would be clipped; real traces nest cleanly
    return total, len(ops)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name)
def test_self_times_partition_the_top_level_time(path: Path) -> None:
    d = _plain(path)
    trace = load_trace(path)
    table = top_ops(trace)
    roots_us, op_count = _reference_roots(d)
    assert table.calls == op_count
    # 1e-5: ts near 1e12 us carry ~0.2 ns of float error per value.
    assert table.self_cpu_us == pytest.approx(roots_us, rel=1e-5, abs=1e-3)
    assert sum(r.calls for r in table.rows) == op_count
    device_total = sum(
        float(e["dur"])
        for e in d["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")
    )
    assert table.self_device_us + table.unattributed_device_us == pytest.approx(
        device_total, rel=1e-9, abs=1e-6
    )
    for r in table.rows:
        assert r.total_device_us >= r.self_device_us - 1e-9
        assert r.total_cpu_us >= r.self_cpu_us - 1e-9


def test_kernel_table_against_plain_json() -> None:
    path = DATA / "kineto2021_v100" / "gpu_metrics_input.json"
    d = _plain(path)
    cats = {"Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset"}
    groups: dict = defaultdict(list)
    for e in d["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in cats:
            groups[(e["name"], cats[e["cat"]])].append(e)
    total = sum(e["dur"] for es in groups.values() for e in es)
    table = kernel_table(load_trace(path))
    assert len(table.rows) == len(groups)
    assert table.total_us == pytest.approx(total)
    for r in table.rows:
        es = groups[(r.name, r.kind)]
        assert r.calls == len(es)
        assert r.total_us == pytest.approx(sum(e["dur"] for e in es))
        assert r.max_us == max(e["dur"] for e in es)
        assert r.mean_us == pytest.approx(sum(e["dur"] for e in es) / len(es))
        assert r.streams == tuple(sorted({e["args"]["stream"] for e in es}))
        assert r.fraction == pytest.approx(sum(e["dur"] for e in es) / total)
        if r.kind == "kernel":
            assert r.total_bytes is None and r.achieved_gbps is None
        else:
            nbytes = sum(e["args"]["bytes"] for e in es)
            assert r.total_bytes == nbytes
            assert r.achieved_gbps == pytest.approx(nbytes / (sum(e["dur"] for e in es) * 1e3))
    assert [r.total_us for r in table.rows] == sorted(
        (r.total_us for r in table.rows), reverse=True
    )


def test_summary_against_plain_json() -> None:
    path = DATA / "a100_nccl" / "nccl_data.json.gz"
    d = _plain(path)
    s = summarize_trace(load_trace(path))
    steps = [
        e
        for e in d["traceEvents"]
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    assert s.step_count == len(steps)
    assert s.median_step_us == pytest.approx(statistics.median(e["dur"] for e in steps))
    ops = [e for e in d["traceEvents"] if e.get("cat") == "cpu_op"]
    in_steps = sum(1 for o in ops for st in steps if st["ts"] <= o["ts"] < st["ts"] + st["dur"])
    assert s.ops_per_step == pytest.approx(in_steps / len(steps))
    assert s.op_count == len(ops)
    assert s.kernel_count == sum(1 for e in d["traceEvents"] if e.get("cat") == "kernel")
    assert s.device_names == ("NVIDIA A100-PG509-200",)
    assert s.busy_fraction == pytest.approx(s.busy_us / s.window_us)
    assert 0 < s.busy_fraction <= 1


def test_summary_without_steps_or_kernels() -> None:
    s = summarize_trace(load_trace(DATA / "mi210_gpu_only" / "gpu_only_trace.json.gz"))
    assert s.step_count == 0 and s.median_step_us is None and s.ops_per_step is None
    assert s.device_names == ("AMD Instinct MI210",)
    cpu = summarize_trace(
        load_trace(DATA / "cpu_only_trace" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    )
    assert cpu.busy_us == 0 and cpu.kernel_count == 0 and cpu.busy_fraction == 0


# --------------------------------------------------------------------------------------------
# rendering fallback: escaped names, same numbers in text and HTML


def test_tables_render_escaped_in_text_and_html() -> None:
    trace = load_trace(EVENT_SYNC)
    for table in (top_ops(trace), kernel_table(trace)):
        bundle = table._repr_mimebundle_()
        assert "text/plain" in bundle and "text/html" in bundle
    kbundle = kernel_table(trace)._repr_mimebundle_()
    assert "vectorized_elementwise_kernel&lt;4" in kbundle["text/html"]
    assert "vectorized_elementwise_kernel<4" not in kbundle["text/html"]
    assert "vectorized_elementwise_kernel<4" in kbundle["text/plain"]
    assert kernel_table(trace)._repr_mimebundle_(include=["text/plain"]).keys() == {"text/plain"}


def _kernel_rows_by_loop(trace) -> dict:
    """kernel_table's groups the plain way: a dict of lists, sums added in kernel order."""
    groups: dict = defaultdict(list)
    for k in trace.kernels:
        groups[(k.name, k.kind)].append(k)
    out = {}
    for key, ks in groups.items():
        total = 0.0
        for k in ks:
            total += k.dur_us
        sized = [k for k in ks if k.bytes is not None]
        out[key] = (
            len(ks),
            total,
            max(k.dur_us for k in ks),
            min(k.dur_us for k in ks),
            tuple(sorted({k.stream for k in ks})),
            sum(k.bytes for k in sized) if sized else None,
        )
    return out


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for p in DATA.rglob("*.json*")
        if "trace" in p.name or p.suffix == ".gz" or p.name.endswith(".json")
    ),
    ids=lambda p: str(p.relative_to(DATA)),
)
def test_kernel_table_groups_exactly_as_a_loop_does(path) -> None:
    """The grouped columns (bincount, reduceat, unique) give the loop's numbers exactly."""
    from gpuprof_nb.errors import TraceFormatError

    try:
        trace = load_trace(path)
    except TraceFormatError:
        pytest.skip("not a trace")
    table = kernel_table(trace)
    want = _kernel_rows_by_loop(trace)
    got = {
        (r.name, r.kind): (r.calls, r.total_us, r.max_us, r.min_us, r.streams, r.total_bytes)
        for r in table.rows
    }
    assert got == want
    total = 0.0
    by_kind: dict = defaultdict(float)
    for k in trace.kernels:
        total += k.dur_us
        by_kind[k.kind] += k.dur_us
    assert (table.total_us, table.kernel_us, table.memcpy_us, table.memset_us) == (
        total,
        by_kind["kernel"],
        by_kind["memcpy"],
        by_kind["memset"],
    )


def test_shape_text_is_the_recursive_reading_of_the_dims() -> None:
    """Input shapes as text: the fast path for one input's numbers writes what the plain
    recursion writes, for any nesting and any leaf (ints, floats, bools, None, strings)."""
    import random
    from collections import namedtuple

    from gpuprof_nb.analysis.ops import _shape_text

    def plain(dims: object) -> str:
        if isinstance(dims, tuple):
            return "[" + ", ".join(plain(d) for d in dims) + "]"
        return str(dims)

    pair = namedtuple("pair", "a b")
    leaves = [0, 7, -3, 2**70, 1.5, float("nan"), True, None, "x", "", pair(1, 2)]
    rng = random.Random(5)

    def make(depth: int) -> object:
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(leaves)
        return tuple(make(depth - 1) for _ in range(rng.randrange(0, 5)))

    cases = [(), ((),), ((64, 512), (512,)), (((1, 2), 3),), pair((1,), 2)]
    cases += [make(4) for _ in range(500)]
    for dims in cases:
        assert _shape_text(dims) == plain(dims)
