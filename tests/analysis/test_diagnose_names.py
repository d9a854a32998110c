"""The name-based matmul/convolution call (used when no roofline could classify the ops):
library names alone do not make a GEMM (cuDNN batchnorm and layout kernels, cuBLAS split-K
reductions, epilogues and gemv, fbgemm_gpu embedding kernels), small matmuls are not large
ones, and the finding says that it was judged by name, not by measured FLOPs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.diagnose import diagnose, kernel_class
from gpuprof_nb.analysis.intervals import union_length
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.trace import DeviceInfo, Kernel, Op, Trace

DATA = Path(__file__).resolve().parents[1] / "data"
ALEXNET = DATA / "a100_alexnet_sync" / "benchmark_result_2869224_1695835535_trace.json.gz"
NCCL = DATA / "a100_nccl" / "nccl_data.json.gz"
# The matmul/convolution kernels of the AlexNet trace, picked by hand from its 16 kernel names
# (cuDNN implicit-gemm and FFT convolutions, cuBLAS sgemm/gcgemm, xmma fprop). Its other cuDNN
# and cuBLAS kernels (computeOffsets, nchwToNhwc, the cublasLt epilogue) only move data.
ALEXNET_GEMM_PREFIXES = (
    "cudnn_ampere_scudnn_",
    "void fft2d_r2c_",
    "void fft2d_c2r_",
    "ampere_gcgemm_",
    "sm80_xmma_fprop_",
    "ampere_sgemm_",
)


def kernel_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [
            e
            for e in json.load(fh)["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "kernel"
        ]


def named(name: str) -> Kernel:
    return Kernel(name, "kernel", 0.0, 1.0, 0, 7)


def test_real_alexnet_matmuls_counted_by_name_and_said_so():
    events = kernel_events(ALEXNET)
    gemm = [e for e in events if e["name"].startswith(ALEXNET_GEMM_PREFIXES)]
    for e in events:
        assert kernel_class(named(e["name"])) == ("gemm" if e in gemm else "elementwise"), e["name"]
    large = [e for e in gemm if float(e["dur"]) >= th.TINY_KERNEL_US]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in large)
    f = diagnose(load_trace(ALEXNET)).finding("compute_bound")
    assert f is not None
    assert f.evidence["gemm_kernels_judged_by_name_not_flops_count"] == len(large) == 22
    assert f.evidence["gemm_time_us"] == pytest.approx(union_length(spans))
    assert "judged by kernel name, not measured FLOPs" in f.title


def test_real_cudnn_and_cublas_helpers_are_not_matmuls():
    names = {e["name"] for e in kernel_events(NCCL)}
    helpers = {
        n
        for n in names
        if n.startswith(
            (
                "void cudnn::bn_fw",
                "void cudnn::bn_bw",
                "void cudnn::ops::nchwToNhwc",
                "void splitKreduce_kernel",
                "void epilogue::impl::",
            )
        )
    }
    convs = {n for n in names if "scudnn" in n or "sgemm" in n}
    assert len(helpers) >= 5 and len(convs) >= 2  # the file holds both kinds
    for n in helpers:
        assert kernel_class(named(n)) == "elementwise", n
    for n in convs:
        assert kernel_class(named(n)) == "gemm", n


def test_named_library_kernels():
    # Real kernel names from the shared traces (V100 DDP, DLRM-style fbgemm, MI300 rocBLAS).
    assert (
        kernel_class(
            named(
                "void fbgemm_gpu::permute_2D_data_kernel<false, int, int, "
                "decltype(nullptr)>(int, int, int, int const*)"
            )
        )
        == "elementwise"
    )
    assert (
        kernel_class(
            named(
                "void gemvNSP_kernel<float, float, float, float, 1, 32, 4, 1024, "
                "cublasGemvParams<float> >(cublasGemvParams<float>)"
            )
        )
        == "elementwise"
    )
    assert (
        kernel_class(
            named("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1")
        )
        == "gemm"
    )
    assert (
        kernel_class(
            named(
                "void cudnn::cnn::im2col4d_kernel<float, long>(cudnn::cnn::"
                "im2col4d_params, cudnnConvolutionStruct)"
            )
        )
        == "elementwise"
    )
    assert (
        kernel_class(
            named(
                "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemm"
                "ConvolutionINS1_11threadblock22ImplicitGemmMultistageINS_8"
                "epilogue"
            )
        )
        == "gemm"
    )


def device_trace(kernels) -> Trace:
    ks = tuple(Kernel(n, "kernel", float(s), float(d), 0, 7) for n, s, d in kernels)
    return Trace(
        source="hand",
        ops=(),
        kernels=ks,
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(DeviceInfo(0, "GPU", compute_capability=(8, 0)),),
        distributed=None,
        bounds_us=(0.0, max(s + d for _, s, d in kernels)),
    )


def test_planted_cudnn_batchnorm_is_memory_bound_not_compute_bound():
    bn = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>(int)"
    d = diagnose(device_trace([(bn, 0, 900), ("volta_sgemm_128x64_nn", 900, 100)]))
    assert d.finding("compute_bound") is None
    assert d.finding("memory_bound").evidence["low_intensity_time_us"] == pytest.approx(900)


def test_planted_small_matmul_kernels_are_not_large():
    # 200 matmul kernels of 5 us back to back: all of the busy time, none of it large.
    small = [("ampere_sgemm_32x32_sliced1x4_tn", 10 * i, 5) for i in range(200)]
    assert diagnose(device_trace(small)).finding("compute_bound") is None
    # The same count at 50 us each is compute-bound by name.
    large = [("ampere_sgemm_128x64_nn", 60 * i, 50) for i in range(200)]
    f = diagnose(device_trace(large)).finding("compute_bound")
    assert f.evidence["gemm_time_us"] == pytest.approx(200 * 50)
    assert f.evidence["small_gemm_time_us"] == 0
    assert f.evidence["gemm_kernels_judged_by_name_not_flops_count"] == 200


def test_planted_tiny_cpu_matmuls_are_not_healthy():
    # 300 host matmuls of 8 us each (dispatch-bound) and one large one of 500 us.
    ops = [Op("aten::mm", "op", 12.0 * i, 8.0, 1, 1) for i in range(300)]
    ops.append(Op("aten::addmm", "op", 4000.0, 500.0, 1, 1))
    trace = Trace(
        source="hand",
        ops=tuple(ops),
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 4500.0),
    )
    d = diagnose(trace)
    f = d.finding("compute_bound")
    # Busy 300 x 8 + 500 = 2900 us; the large matmul alone is 17% of it.
    assert f is None
    assert "healthy" not in d.verdict.lower()


def test_planted_torch_tiny_matmuls_on_cpu_are_not_called_healthy(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(4, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(400):
            a @ a
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    d = diagnose(load_trace(path))
    assert d.finding("compute_bound") is None, d.finding("compute_bound")
    assert "healthy" not in d.verdict.lower()
