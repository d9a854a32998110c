"""FLOPs derived from a real CPU torch.profiler trace (record_shapes=True) against
torch.utils.flop_counter.FlopCounterMode run on the same op, separately (never both at once:
under a dispatch mode the profiler would see every op twice)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gpuprof_nb.analysis.roofline import compute_roofline  # noqa: E402
from gpuprof_nb.io.trace import trace_from_dict  # noqa: E402
from gpuprof_nb.results.roofline import MATMUL_CATEGORIES  # noqa: E402


def profiled_trace(fn, tmp_path):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return trace_from_dict(json.loads(path.read_text()), source=str(path)), json.loads(
        path.read_text()
    )


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as mode:
        fn()
    return int(mode.get_total_flops())


def gemm_flops(trace) -> int:
    roof = compute_roofline(trace)
    return sum(p.flops for p in roof.points if p.category in MATMUL_CATEGORIES)


torch.manual_seed(0)
_a, _b, _bias = torch.randn(64, 32), torch.randn(32, 48), torch.randn(48)
_x, _w, _cb = torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3), torch.randn(8)
_q, _k, _v = torch.randn(2, 4, 10, 8), torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 16)
_A, _B = torch.randn(3, 5, 7), torch.randn(3, 7, 2)

CASES = {
    "mm": lambda: torch.mm(_a, _b),
    "addmm": lambda: torch.addmm(_bias, _a, _b),
    "bmm": lambda: torch.bmm(_A, _B),
    "baddbmm": lambda: torch.baddbmm(torch.zeros(3, 5, 2), _A, _B),
    "linear": lambda: F.linear(torch.randn(4, 5, 32), torch.randn(48, 32), _bias),
    "matmul": lambda: torch.matmul(torch.randn(2, 1, 5, 7), torch.randn(3, 7, 4)),
    "conv2d": lambda: F.conv2d(_x, _w, _cb, stride=2, padding=1),
    "conv1d": lambda: F.conv1d(
        torch.randn(2, 4, 20), torch.randn(6, 2, 4), None, padding=2, dilation=2, groups=2
    ),
    "conv3d": lambda: F.conv3d(torch.randn(1, 2, 6, 6, 6), torch.randn(4, 2, 3, 3, 3)),
    "conv_transpose2d": lambda: F.conv_transpose2d(
        _x, torch.randn(3, 4, 3, 3), None, stride=2, padding=1, output_padding=1
    ),
    "sdpa": lambda: F.scaled_dot_product_attention(_q, _k, _v),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_flops_match_flop_counter(name, tmp_path):
    fn = CASES[name]
    expected = counted_flops(fn)
    trace, _ = profiled_trace(fn, tmp_path)
    assert expected > 0
    assert gemm_flops(trace) == expected


def test_conv_backward_flops_match_flop_counter(tmp_path):
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    w = torch.randn(8, 3, 3, 3, requires_grad=True)

    def step():
        F.conv2d(x, w, None, stride=2, padding=1).sum().backward()

    expected = counted_flops(step)
    trace, _ = profiled_trace(step, tmp_path)
    roof = compute_roofline(trace)
    names = {p.name for p in roof.points}
    assert {"aten::conv2d", "aten::convolution_backward"} <= names
    assert gemm_flops(trace) == expected


def test_sdpa_backward_flops_match_flop_counter(tmp_path):
    q, k, v = (t.clone().requires_grad_() for t in (_q, _k, _v))

    def step():
        F.scaled_dot_product_attention(q, k, v).sum().backward()

    expected = counted_flops(step)
    trace, _ = profiled_trace(step, tmp_path)
    assert gemm_flops(trace) == expected


def test_profiled_mm_loop_counts_each_call_once(tmp_path):
    a, b = torch.randn(48, 40), torch.randn(40, 24)
    calls = 7

    def loop():
        for _ in range(calls):
            torch.mm(a, b)
            F.linear(a, b.t())  # linear -> t + mm/addmm children: one anchor per call

    trace, raw = profiled_trace(loop, tmp_path)
    roof = compute_roofline(trace)
    assert roof.time_basis == "cpu"
    by_name = {p.name: p for p in roof.points}
    assert by_name["aten::mm"].calls == calls
    assert by_name["aten::linear"].calls == calls
    assert by_name["aten::mm"].flops == calls * 2 * 48 * 40 * 24
    assert by_name["aten::linear"].flops == calls * 2 * 48 * 40 * 24
    # Independent recomputation from the plain JSON: top-level aten::mm events (those not
    # inside an aten::linear on the same thread) and their summed durations.
    evs = [e for e in raw["traceEvents"] if e.get("cat") == "cpu_op"]
    linears = [e for e in evs if e["name"] == "aten::linear"]

    def inside_linear(e):
        return any(
            lin["tid"] == e["tid"]
            and lin["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= lin["ts"] + lin["dur"]
            for lin in linears
        )

    top_mm = [e for e in evs if e["name"] == "aten::mm" and not inside_linear(e)]
    assert len(top_mm) == calls
    assert by_name["aten::mm"].time_us == pytest.approx(sum(e["dur"] for e in top_mm))
    assert by_name["aten::linear"].time_us == pytest.approx(sum(e["dur"] for e in linears))
    # Nothing counted twice: attributed time never exceeds the top-level op time.
    assert roof.attributed_time_us <= roof.total_time_us + 1e-6
