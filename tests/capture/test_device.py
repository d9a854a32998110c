"""Device identification from the datasheet table, and measured ceilings with their cache."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from gpuprof_nb.analysis.roofline import compute_roofline
from gpuprof_nb.capture import device as cdev
from gpuprof_nb.errors import CaptureError, GpuprofError
from gpuprof_nb.io.ceilings import write_ceilings
from gpuprof_nb.model.device import DEVICE_TABLE, DeviceSpec, lookup_device_spec

GiB = 2**30


@pytest.mark.parametrize(
    "name,memory,expected",
    [
        ("NVIDIA H100 80GB HBM3", 85018279936, "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", 85520809984, "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", 100 * GiB, "NVIDIA H100 NVL"),
        ("NVIDIA H200", 150 * 10**9, "NVIDIA H200"),
        ("NVIDIA H200 NVL", 150 * 10**9, "NVIDIA H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", 85198045184, "NVIDIA A100 80GB SXM"),
        ("NVIDIA A100-SXM4-40GB", 42505273344, "NVIDIA A100 40GB SXM"),
        ("NVIDIA A100-PG509-200", 42297524224, "NVIDIA A100 40GB SXM"),
        ("NVIDIA A100 80GB PCIe", 85899345920, "NVIDIA A100 80GB PCIe"),
        ("NVIDIA A100-PCIE-40GB", 42505273344, "NVIDIA A100 40GB PCIe"),
        ("Tesla V100-SXM2-32GB", 34089730048, "Tesla V100 SXM2"),
        ("Tesla V100-PCIE-16GB", 17069309952, "Tesla V100 PCIe"),
        ("Tesla T4", 15843721216, "Tesla T4"),
        ("NVIDIA A10G", 23836098560, "NVIDIA A10G"),
        ("NVIDIA A10", 23836098560, "NVIDIA A10"),
        ("NVIDIA L4", 23580639232, "NVIDIA L4"),
        ("NVIDIA GeForce RTX 3090", 25447170048, "NVIDIA GeForce RTX 3090"),
        ("NVIDIA GeForce RTX 4090", 25393692672, "NVIDIA GeForce RTX 4090"),
        ("NVIDIA B200", 191 * 10**9, "NVIDIA B200"),
        ("NVIDIA A100-SXM4-80GB", None, "NVIDIA A100 80GB SXM"),  # size from the name
        ("AMD Instinct MI300X", 206141652992, "AMD Instinct MI300X"),
        ("AMD Instinct MI300X VF", 206141652992, "AMD Instinct MI300X"),
        ("AMD Instinct MI210", 68702699520, "AMD Instinct MI210"),
    ],
)
def test_lookup_identifies_gpu_by_name_and_memory(name, memory, expected):
    spec = lookup_device_spec(name, memory)
    assert spec is not None
    assert spec.name == expected
    assert spec.memory_bytes == memory
    assert not spec.measured


@pytest.mark.parametrize(
    "name", ["", "AMD Radeon Graphics", "NVIDIA GeForce RTX 2080 Ti", "MTIA", "NVIDIA A1000"]
)
def test_unknown_gpu_is_not_guessed(name):
    assert lookup_device_spec(name, 16 * GiB) is None


def test_every_row_has_a_source_and_sane_peaks():
    for row in DEVICE_TABLE:
        spec = row.spec()
        assert row.source
        assert spec.fp32_flops_per_s and spec.fp32_flops_per_s > 1e12
        assert spec.bandwidth_bytes_per_s and spec.bandwidth_bytes_per_s > 1e11
        tensor = spec.fp16_flops_per_s
        assert tensor is not None and tensor > spec.fp32_flops_per_s


def test_ridge_points_match_the_domain_notes():
    # DOMAIN.md: about 153 FLOP/byte for A100 fp16 tensor cores, about 296 for H100.
    a100 = lookup_device_spec("NVIDIA A100-SXM4-80GB", 80 * GiB)
    assert a100.ridge_flop_per_byte("fp16") == pytest.approx(312e12 / 2039e9)
    assert a100.ridge_flop_per_byte("fp16") == pytest.approx(153, abs=1)
    h100 = lookup_device_spec("NVIDIA H100 80GB HBM3", 80 * GiB)
    assert h100.ridge_flop_per_byte("bf16") == pytest.approx(296, abs=2)
    t4 = lookup_device_spec("Tesla T4", 16 * GiB)
    assert t4.ridge_flop_per_byte("bf16") is None  # no bf16 tensor cores on Turing
    assert [r for r, _ in t4.roofs()] == ["fp32", "fp16"]


def test_device_spec_dict_round_trip_and_bad_dicts():
    spec = lookup_device_spec("NVIDIA L4", 24 * GiB)
    assert DeviceSpec.from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
    with pytest.raises(GpuprofError, match="cache.json"):
        DeviceSpec.from_dict({"kind": "cuda"}, where="cache.json")
    with pytest.raises(GpuprofError, match="fp32_flops_per_s"):
        DeviceSpec.from_dict({"name": "x", "fp32_flops_per_s": "fast"})
    # The kind is one of a closed set: a cache entry with another is refused, not kept.
    with pytest.raises(GpuprofError, match="kind"):
        DeviceSpec.from_dict({**spec.as_dict(), "kind": "tpu"})


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cdev.CACHE_ENV, str(tmp_path))
    return tmp_path


SMALL = dict(matmul_size=128, copy_bytes=2**20, repeat=2)


def test_measure_ceilings_on_cpu_and_cache_round_trip(cache_dir):
    spec = cdev.measure_ceilings("cpu", **SMALL)
    assert spec.kind == "cpu" and spec.measured
    assert spec.fp32_flops_per_s > 0 and math.isfinite(spec.fp32_flops_per_s)
    assert spec.bandwidth_bytes_per_s > 0 and math.isfinite(spec.bandwidth_bytes_per_s)
    assert "measured by gpuprof_nb.measure_ceilings" in spec.source
    path = cache_dir / "ceilings.json"
    assert cdev.cache_path() == path
    stored = json.loads(path.read_text())["devices"]
    assert len(stored) == 1
    assert DeviceSpec.from_dict(next(iter(stored.values()))) == spec
    # The second call is answered from the cache, not measured again, and says so.
    cached = dataclasses.replace(spec, source=f"{spec.source}; read from {path}")
    assert cdev.measure_ceilings("cpu", **SMALL) == cached
    assert cdev.current_device_spec("cpu") == cached
    # refresh measures again and overwrites; cache=False neither reads nor writes.
    again = cdev.measure_ceilings("cpu", refresh=True, **SMALL)
    assert (
        DeviceSpec.from_dict(next(iter(json.loads(path.read_text())["devices"].values()))) == again
    )
    path.unlink()
    cdev.measure_ceilings("cpu", cache=False, **SMALL)
    assert not path.exists()


def test_corrupt_cache_warns_and_is_rewritten(cache_dir):
    (cache_dir / "ceilings.json").write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable ceilings cache"):
        spec = cdev.measure_ceilings("cpu", **SMALL)
    assert json.loads((cache_dir / "ceilings.json").read_text())["devices"]
    assert spec.measured


def test_trace_device_spec_prefers_measured_ceilings(cache_dir):
    from gpuprof_nb.model.trace import DeviceInfo, Kernel, Trace

    info = DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", total_memory_bytes=85018279936)
    trace = Trace(
        source="t",
        ops=(),
        kernels=(Kernel("k", "kernel", 0, 1, 0, 7),),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(info,),
        distributed=None,
        bounds_us=(0, 1),
    )
    assert cdev.trace_device_spec(trace).name == "NVIDIA H100 SXM"
    measured = DeviceSpec(
        name=info.name,
        kind="cuda",
        fp32_flops_per_s=5e13,
        bandwidth_bytes_per_s=3e12,
        bf16_flops_per_s=7e14,
        memory_bytes=info.total_memory_bytes,
        measured=True,
        source="m",
    )
    write_ceilings(cdev.device_key("cuda", info.name, info.total_memory_bytes), measured)
    # The spec says where it was read from, so the roofline's note does too.
    read = cdev.trace_device_spec(trace)
    assert read == dataclasses.replace(measured, source=f"m; read from {cdev.cache_path()}")
    assert f"read from {cdev.cache_path()}" in compute_roofline(trace, read).note
    cpu_trace = Trace(
        source="t",
        ops=(),
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0, 1),
    )
    assert cdev.trace_device_spec(cpu_trace) is None


def test_bad_device_argument_is_a_capture_error():
    with pytest.raises(CaptureError, match="not a device"):
        cdev.measure_ceilings("warp-drive", cache=False)
    with pytest.raises(ValueError, match="repeat"):
        cdev.measure_ceilings("cpu", cache=False, repeat=0)


@pytest.mark.gpu
def test_measured_gpu_ceilings_are_near_the_datasheet(cache_dir):
    import torch

    spec = cdev.measure_ceilings("cuda", cache=False)
    props = torch.cuda.get_device_properties(0)
    sheet = lookup_device_spec(props.name, int(props.total_memory))
    assert spec.fp32_flops_per_s > 0 and spec.bandwidth_bytes_per_s > 0
    if sheet is not None:
        # Measured peaks sit below the datasheet (clocks, power) but not far below.
        assert 0.3 < spec.bandwidth_bytes_per_s / sheet.bandwidth_bytes_per_s < 1.1
        if sheet.bf16_flops_per_s and spec.bf16_flops_per_s:
            assert 0.3 < spec.bf16_flops_per_s / sheet.bf16_flops_per_s < 1.1
        # The fp64 column is the matrix rate (an H100 SXM measured 59 of 67 TFLOP/s; the
        # 34 TFLOP/s vector figure it once held was beaten by 1.7x).
        if sheet.fp64_flops_per_s and spec.fp64_flops_per_s:
            assert 0.3 < spec.fp64_flops_per_s / sheet.fp64_flops_per_s < 1.1
