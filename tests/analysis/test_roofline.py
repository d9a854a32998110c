"""compute_roofline on synthetic traces: time attribution through the anchor op,
classification against fixed synthetic roofs, data movement, device resolution."""

from __future__ import annotations

import dataclasses

import pytest

from gpuprof_nb.analysis.roofline import Roofline, compute_roofline
from gpuprof_nb.model.device import DeviceSpec
from gpuprof_nb.model.trace import DeviceInfo, Kernel, Op, RuntimeCall, Trace

F32, BF16 = "float", "c10::BFloat16"

# Synthetic ceilings: fp32 1 TFLOP/s, bf16 tensor 10 TFLOP/s, 100 GB/s.
# Ridges: fp32 at 10 FLOP/B, bf16 at 100 FLOP/B.
ROOFS = DeviceSpec(
    name="Synthetic GPU",
    kind="cuda",
    fp32_flops_per_s=1e12,
    bandwidth_bytes_per_s=1e11,
    bf16_flops_per_s=1e13,
    source="test",
)


def op(name, start, dur, dims=None, types=None, concrete=None, ext=None, tid=1):
    return Op(
        name=name,
        kind="op",
        start_us=start,
        dur_us=dur,
        pid=1,
        tid=tid,
        external_id=ext,
        input_dims=None if dims is None else tuple(dims),
        input_types=None if types is None else tuple(types),
        concrete_inputs=None if concrete is None else tuple(concrete),
    )


def kern(name, start, dur, ext=None, corr=None, kind="kernel"):
    return Kernel(
        name=name,
        kind=kind,
        start_us=start,
        dur_us=dur,
        device=0,
        stream=7,
        correlation=corr,
        external_id=ext,
    )


def trace_of(ops, kernels=(), runtime=(), devices=()):
    ops = tuple(sorted(ops, key=lambda o: o.start_us))
    kernels = tuple(sorted(kernels, key=lambda k: k.start_us))
    ops = tuple(
        Op(**{**{s: getattr(o, s) for s in Op.__slots__}, "index": i}) for i, o in enumerate(ops)
    )
    kernels = tuple(
        Kernel(**{**{s: getattr(k, s) for s in Kernel.__slots__}, "index": i})
        for i, k in enumerate(kernels)
    )
    ends = [o.end_us for o in ops] + [k.end_us for k in kernels] or [0.0]
    return Trace(
        source="synthetic",
        ops=ops,
        kernels=kernels,
        runtime=tuple(runtime),
        syncs=(),
        memory=(),
        steps=(),
        devices=tuple(devices),
        distributed=None,
        bounds_us=(0.0, max(ends)),
    )


MM = dict(dims=[[1024, 1024], [1024, 1024]], types=[BF16, BF16])  # I = 2n^3/(3n^2*2) = n/3
ADD = dict(dims=[[1000], [1000], []], types=[F32, F32, "Scalar"])  # I = 1/12


def conv_chain():
    """conv2d -> convolution -> _convolution -> cudnn_convolution (kernels) + add_ (kernel),
    the nesting the ViT trace shows."""
    dims = [[4, 3, 224, 224], [768, 3, 16, 16], [768], [], [], [], []]
    types = [BF16, BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    conc = ["", "", "", "[16, 16]", "[0, 0]", "[1, 1]", "1"]
    return [
        op("aten::conv2d", 0, 100, dims, types, conc, ext=1),
        op(
            "aten::convolution",
            1,
            98,
            dims + [[], []],
            types + ["Scalar", "ScalarList"],
            conc[:6] + ["False", "[0, 0]", "1"],
            ext=2,
        ),
        op("aten::_convolution", 2, 96, None, None, None, ext=3),
        op(
            "aten::cudnn_convolution",
            3,
            60,
            [[4, 3, 224, 224], [768, 3, 16, 16], [], [], [], []],
            [BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            ["", "", "[0, 0]", "[16, 16]", "[1, 1]", "1"],
            ext=4,
        ),
        op(
            "aten::add_",
            70,
            20,
            [[4, 768, 14, 14], [1, 768, 1, 1], []],
            [BF16, BF16, "Scalar"],
            ext=5,
        ),
    ]


def test_anchor_is_outermost_formula_op_and_gets_its_convolution_kernels():
    """The convolution's point holds the kernels its convolution ops launched; the bias add
    under it (aten::add_) is a memory-bound point of its own (issue 32)."""
    kernels = [
        kern("im2col<float>", 200, 5, ext=4),
        kern("cudnn::gemm<bf16>", 205, 40, ext=4),
        kern("elementwise_add", 250, 3, ext=5),
    ]
    r = compute_roofline(trace_of(conv_chain(), kernels), ROOFS)
    assert [p.name for p in r.points] == ["aten::conv2d", "aten::add_"]
    p = r.points[0]
    assert p.calls == 1
    assert p.time_us == pytest.approx(45.0)
    n_out = 4 * 768 * 14 * 14
    assert p.flops == 2 * n_out * 3 * 16 * 16
    bias = r.points[1]
    assert bias.time_us == pytest.approx(3.0) and bias.category == "elementwise"
    assert r.total_time_us == pytest.approx(48.0)
    assert r.coverage == pytest.approx(1.0)
    # Two kernels per convolution call: the FLOPs cannot be split, so no per-kernel point
    # for it; the bias add's one kernel has one.
    assert [k.op_name for k in r.kernel_points] == ["aten::add_"]


def test_classification_against_synthetic_roofs():
    # mm bf16 n=1024: I = 1024/3 = 341 > ridge 100 -> compute-bound on the bf16 roof.
    # add fp32: I = 1/12 < ridge 10 -> memory-bound on the bandwidth roof.
    ops = [op("aten::mm", 0, 10, ext=1, **MM), op("aten::add", 20, 10, ext=2, **ADD)]
    flops_mm = 2 * 1024**3
    t_mm = flops_mm / 5e12 * 1e6  # ran at 5 TFLOP/s -> 50% of the 10 TFLOP/s roof
    t_add = 12000 / 5e10 * 1e6  # 12 kB at 50 GB/s -> 50% of the 100 GB/s roof
    kernels = [kern("gemm", 100, t_mm, ext=1), kern("add", 100 + t_mm, t_add, ext=2)]
    r = compute_roofline(trace_of(ops, kernels), ROOFS)
    pts = {p.name: p for p in r.points}
    mm, add = pts["aten::mm"], pts["aten::add"]
    assert mm.intensity_flop_per_byte == pytest.approx(1024 / 3)
    assert (mm.roof, mm.bound) == ("bf16", "compute")
    assert mm.roof_flops_per_s == pytest.approx(1e13)
    assert mm.achieved_flops_per_s == pytest.approx(5e12)
    assert mm.fraction_of_roof == pytest.approx(0.5)
    assert add.intensity_flop_per_byte == pytest.approx(1 / 12)
    assert (add.roof, add.bound) == ("fp32", "memory")
    assert add.roof_flops_per_s == pytest.approx(1e11 / 12)
    assert add.achieved_bytes_per_s == pytest.approx(5e10)
    assert add.fraction_of_roof == pytest.approx(0.5)
    assert not mm.above_roof and not add.above_roof
    # single-kernel anchors also give per-kernel points with the kernel's name
    assert {k.name for k in r.kernel_points} == {"gemm", "add"}
    assert {k.op_name for k in r.kernel_points} == {"aten::mm", "aten::add"}
    total = t_mm + t_add
    assert r.time_share("compute") == pytest.approx(t_mm / total)
    assert r.time_share("memory") == pytest.approx(t_add / total)
    assert r.fp32_gemm_time_share == pytest.approx(0.0)
    # A host-to-device copy over PCIe is neither memory- nor compute-bound on this roofline.
    from gpuprof_nb.analysis.roofline import DataMovement

    copy = DataMovement(
        "aten::copy_",
        "",
        1,
        10**6,
        1000.0,
        1e9,
        None,
        "copy",
        "fp32",
        "copy",
        direction="host-device",
    )
    with_copy = dataclasses.replace(r, data_movement=r.data_movement + (copy,))
    assert with_copy.time_share("compute") == pytest.approx(t_mm / total)
    assert with_copy.time_share("memory") == pytest.approx(t_add / total)


def test_above_roof_is_flagged_and_noted():
    ops = [op("aten::add", 0, 10, ext=1, **ADD)]
    # 12 kB in 0.06 us = 200 GB/s, twice the 100 GB/s roof: cache-resident or miscounted.
    r = compute_roofline(trace_of(ops, [kern("add", 50, 0.06, ext=1)]), ROOFS)
    assert r.points[0].above_roof
    assert r.points[0].fraction_of_roof == pytest.approx(2.0)
    assert "above the roof" in r.note


def test_fp32_matmul_uses_tf32_roof_only_when_kernel_says_so():
    spec = DeviceSpec(
        name="G",
        kind="cuda",
        fp32_flops_per_s=1e12,
        bandwidth_bytes_per_s=1e11,
        tf32_flops_per_s=8e12,
        bf16_flops_per_s=1.6e13,
    )
    mm32 = dict(dims=[[256, 256], [256, 256]], types=[F32, F32])
    ops = [
        op("aten::mm", 0, 10, ext=1, **mm32),
        op("aten::bmm", 20, 10, ext=2, dims=[[2, 64, 64], [2, 64, 64]], types=[F32, F32]),
    ]
    kernels = [
        kern("ampere_sgemm_128x64_nn", 100, 10, ext=1),
        kern("sm80_xmma_gemm_f32f32_tf32f32_f32_nn", 120, 10, ext=2),
    ]
    r = compute_roofline(trace_of(ops, kernels), spec)
    roofs = {p.name: p.roof for p in r.points}
    assert roofs == {"aten::mm": "fp32", "aten::bmm": "tf32"}
    assert r.fp32_gemm_time_share == pytest.approx(1.0)


def test_kernel_linked_through_runtime_correlation_when_external_id_missing():
    ops = [
        op("aten::linear", 0, 50, [[8, 16], [4, 16], [4]], [F32] * 3),
        op(
            "aten::addmm",
            5,
            40,
            [[4], [8, 16], [16, 4], [], []],
            [F32, F32, F32, "Scalar", "Scalar"],
        ),
    ]
    rt = [RuntimeCall("cudaLaunchKernel", 10, 5, pid=1, tid=1, correlation=99)]
    r = compute_roofline(trace_of(ops, [kern("gemm", 60, 7, corr=99)], rt), ROOFS)
    assert [(p.name, p.calls) for p in r.points] == [("aten::linear", 1)]
    assert r.points[0].time_us == pytest.approx(7)
    assert r.points[0].flops == 2 * 8 * 16 * 4


def test_copies_go_to_data_movement_and_unmodelled_time_is_listed():
    ops = [
        op("aten::to", 0, 30, [[1000], [], [], [], []], [F32, "Scalar", "Scalar", "", ""], ext=1),
        op(
            "aten::_to_copy",
            1,
            28,
            [[1000], [], [], [], [], [], []],
            [F32, "Scalar", "", "", "", "Scalar", ""],
            ["", "15", "", "", "", "False", ""],
            ext=2,
        ),
        op("aten::copy_", 2, 20, [[1000], [1000], []], [BF16, F32, "Scalar"], ext=3),
        op(
            "aten::to", 40, 1, [[1000], [], [], [], []], [F32, "Scalar", "Scalar", "", ""], ext=4
        ),  # a no-op .to(): no child, no kernel, moves nothing
        op("aten::cat", 50, 10, [[[2, 3], [2, 3]], []], ["TensorList", "Scalar"], ext=5),
    ]
    kernels = [
        kern("convert<float,bf16>", 100, 2, ext=3),
        kern("cat", 110, 3, ext=5),
        kern("orphan", 120, 1),
    ]
    r = compute_roofline(trace_of(ops, kernels), ROOFS)
    assert r.points == ()
    (dm,) = r.data_movement
    assert (dm.name, dm.calls, dm.category) == ("aten::to", 1, "copy")
    assert dm.bytes_moved == 1000 * 4 + 1000 * 2  # copy_ read fp32, wrote bf16 (counted once)
    assert dm.achieved_bytes_per_s == pytest.approx(6000 / 2e-6)
    assert dm.fraction_of_bandwidth == pytest.approx(6000 / 2e-6 / 1e11)
    unmod = {u.name: u.time_us for u in r.unmodelled}
    assert unmod == {"aten::cat": pytest.approx(3.0), "(kernel without op)": pytest.approx(1.0)}
    assert r.total_time_us == pytest.approx(6.0)
    assert r.time_share("memory") is None  # nothing with FLOPs to classify


def test_cpu_trace_uses_inclusive_cpu_time_and_draws_no_roofs_without_ceilings():
    ops = [
        op("aten::linear", 0, 50, [[8, 16], [4, 16], [4]], [F32] * 3),
        op("aten::t", 1, 2, [[4, 16]], [F32]),
        op(
            "aten::addmm",
            5,
            40,
            [[4], [8, 16], [16, 4], [], []],
            [F32, F32, F32, "Scalar", "Scalar"],
        ),
        op("aten::relu", 60, 10, [[8, 4]], [F32]),
        op("aten::view", 80, 1, [[8, 4], []], [F32, "ScalarList"]),
    ]
    r = compute_roofline(trace_of(ops))
    assert r.time_basis == "cpu"
    assert r.device is None and "CPU trace" in r.note
    assert [(p.name, p.time_us) for p in r.points] == [("aten::linear", 50), ("aten::relu", 10)]
    assert all(p.bound is None and p.roof is None for p in r.points)
    assert r.total_time_us == pytest.approx(61)
    assert [u.name for u in r.unmodelled] == ["aten::view"]
    assert r.time_share("memory") is None
    cpu = DeviceSpec(
        name="cpu", kind="cpu", fp32_flops_per_s=1e11, bandwidth_bytes_per_s=1e10, measured=True
    )
    r2 = compute_roofline(trace_of(ops), cpu)
    assert {p.roof for p in r2.points} == {"fp32"}
    assert all(p.bound in ("memory", "compute") for p in r2.points)


def test_device_resolution_from_trace_name_string_and_unknown():
    ops = [op("aten::mm", 0, 10, ext=1, **MM)]
    kernels = [kern("gemm", 10, 10, ext=1)]
    h100 = DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", total_memory_bytes=85018279936)
    r = compute_roofline(trace_of(ops, kernels, devices=[h100]))
    assert r.device is not None and r.device.name == "NVIDIA H100 SXM"
    assert r.points[0].roof == "bf16"
    r2 = compute_roofline(trace_of(ops, kernels), "NVIDIA A100-SXM4-80GB")
    assert r2.device.name == "NVIDIA A100 80GB SXM"
    odd = DeviceInfo(index=0, name="Mystery Accelerator 9000", total_memory_bytes=2**34)
    r3 = compute_roofline(trace_of(ops, kernels, devices=[odd]))
    assert r3.device is None
    assert "unknown GPU 'Mystery Accelerator 9000'" in r3.note
    assert r3.points[0].bound is None and r3.points[0].flops == 2 * 1024**3
    r4 = compute_roofline(trace_of(ops, kernels), "Mystery")
    assert r4.device is None and "unknown GPU" in r4.note
    r5 = compute_roofline(trace_of(ops, kernels))
    assert r5.device is None and "no deviceProperties" in r5.note


def test_no_shapes_says_so_and_time_share_rejects_bad_bound():
    r = compute_roofline(trace_of([op("aten::mm", 0, 10, ext=1)], [kern("g", 5, 2, ext=1)]), ROOFS)
    assert r.points == ()
    assert "record_shapes=True" in r.note
    assert isinstance(r, Roofline)
    with pytest.raises(ValueError, match="memory"):
        r.time_share("fast")


def test_groups_by_shape_and_sorts_by_time():
    small = dict(dims=[[8, 8], [8, 8]], types=[BF16, BF16])
    ops = [
        op("aten::mm", 0, 1, ext=1, **small),
        op("aten::mm", 2, 1, ext=2, **MM),
        op("aten::mm", 4, 1, ext=3, **small),
    ]
    kernels = [kern("g", 10, 1, ext=1), kern("g", 20, 9, ext=2), kern("g", 30, 1, ext=3)]
    r = compute_roofline(trace_of(ops, kernels), ROOFS)
    assert [(p.shapes, p.calls) for p in r.points] == [("1024x1024, 1024x1024", 1), ("8x8, 8x8", 2)]
    assert r.points[1].flops == 2 * 2 * 8**3


def test_host_device_copy_is_not_measured_against_hbm():
    ops = [
        op("aten::copy_", 0, 20, [[1000], [1000], []], [F32, F32, "Scalar"], ext=1),
        op("aten::copy_", 30, 20, [[1000], [1000], []], [BF16, BF16, "Scalar"], ext=2),
    ]
    kernels = [
        kern("Memcpy HtoD (Pageable -> Device)", 100, 4, ext=1, kind="memcpy"),
        kern("Memcpy DtoD (Device -> Device)", 110, 0.5, ext=2, kind="memcpy"),
    ]
    r = compute_roofline(trace_of(ops, kernels), ROOFS)
    moves = {d.dtype: d for d in r.data_movement}
    h2d, d2d = moves["fp32"], moves["bf16"]
    assert h2d.direction == "host-device" and h2d.fraction_of_bandwidth is None
    assert h2d.achieved_bytes_per_s == pytest.approx(8000 / 4e-6)
    assert d2d.direction == "device"
    assert d2d.fraction_of_bandwidth == pytest.approx(4000 / 0.5e-6 / 1e11)


@pytest.mark.parametrize("name", ["H100", "NVIDIA A100-SXM4-80GB", "MI300X", "cpu", "Mystery"])
def test_device_name_on_a_cpu_trace_is_refused_with_the_kinds_named(name):
    cpu_trace = trace_of([op("aten::mm", 0, 10, **MM)])
    with pytest.raises(ValueError) as err:
        compute_roofline(cpu_trace, name)
    msg = str(err.value)
    assert f"device={name!r}" in msg and "CPU trace" in msg
    assert "Leave device= out" in msg and "measure_ceilings()" in msg
    if name in ("H100", "MI300X"):
        assert "the GPU NVIDIA H100" in msg or "the GPU AMD Instinct MI300X (rocm)" in msg
    # Without the name the same trace still gets FLOPs and bytes (no roofs).
    r = compute_roofline(cpu_trace)
    assert r.device is None and r.points[0].flops == 2 * 1024**3


@pytest.mark.parametrize(
    "name",
    [
        "cpu",
        "Intel(R) Xeon(R) Platinum 8480+",
        "AMD EPYC 7763",
        "Intel(R) Core(TM) i7-12700",
        "AWS Graviton3",
    ],
)
def test_cpu_name_on_a_gpu_trace_is_refused_with_the_kinds_named(name):
    h100 = DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", total_memory_bytes=85018279936)
    gpu_trace = trace_of(
        [op("aten::mm", 0, 10, ext=1, **MM)], [kern("gemm", 10, 10, ext=1)], devices=[h100]
    )
    with pytest.raises(ValueError) as err:
        compute_roofline(gpu_trace, name)
    msg = str(err.value)
    assert f"device={name!r} names a CPU" in msg and "GPU trace" in msg
    assert "1 device activities on NVIDIA H100 80GB HBM3" in msg
    assert "Leave device= out" in msg
    # A GPU's name on the same trace still resolves (AMD names a GPU here, not a CPU).
    assert compute_roofline(gpu_trace, "AMD Instinct MI300X").device.kind == "rocm"
    assert compute_roofline(gpu_trace, "NVIDIA H100").device.name == "NVIDIA H100 SXM"
