"""The planted bottlenecks and memory cells recorded on a real GPU (tests/data/gpu and
tests/data/gpu/gpu_*.pickle, by tools/record_gpu.py through the real %%gpuprofile and
%%memsnap; see tests/data/gpu/README.md), replayed here on CPU.

Each planted trace must get its own kind as its first finding, and the numbers the reports
show are checked against the raw JSON read independently (kernel counts and times, copy
bytes, matmul FLOPs)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuprof_nb import analyze, analyze_memory, load_snapshot, load_trace
from gpuprof_nb.model.timing import TimingStats

DATA = Path(__file__).resolve().parents[1] / "data"
GPU = DATA / "gpu"
SNAPSHOTS = GPU  # the snapshots lie beside the traces

# trace file -> the finding its cell plants (tools/record_gpu.py TRACE_CASES)
PLANTED = {
    "dataloader": "dataloader",
    "host_sync": "host_sync",
    "launch_overhead": "launch_overhead",
    "precision": "precision",
    "compute_bound": "compute_bound",
    "memory_bound": "memory_bound",
    "dtype_cast": "dtype_cast",
    "host_device_copy": "host_device_copy",
    "recompilation": "recompilation",
    "python_overhead": "python_overhead",
}


def raw_events(name: str) -> list[dict]:
    with gzip.open(GPU / f"{name}.json.gz", "rt") as fh:
        return json.load(fh)["traceEvents"]


def report(name: str, **kwargs):
    return analyze(load_trace(GPU / f"{name}.json.gz"), **kwargs)


def test_there_are_at_least_ten_gpu_traces_and_three_snapshots() -> None:
    traces = sorted(GPU.glob("*.json.gz"))
    assert len(traces) >= 10, traces
    assert all(p.stat().st_size < 2 * 2**20 for p in traces)
    snaps = sorted(SNAPSHOTS.glob("gpu_*.pickle"))
    assert len(snaps) >= 3, snaps
    readme = (GPU / "README.md").read_text()
    for p in traces + snaps:
        assert p.name in readme, f"{p.name} has no line in tests/data/gpu/README.md"


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_planted_gpu_trace_gets_its_own_kind_first(name: str) -> None:
    kind = PLANTED[name]
    d = report(name).diagnosis
    assert d.findings, d.verdict
    assert d.findings[0].kind == kind, [(f.kind, round(f.share, 3)) for f in d.findings]
    assert kind.replace("_", "-") in d.verdict.lower().replace("_", "-")
    if kind == "compute_bound":
        # bf16 matmuls on tensor cores: healthy, nothing to fix.
        assert d.findings[0].severity == "info" and "healthy" in d.verdict.lower()
        assert [f.kind for f in d.findings if f.severity in ("high", "medium")] == []
    else:
        assert d.findings[0].severity in ("high", "medium")


def test_kept_graphs_on_gpu_grow_memory_and_the_host_sets_the_pace() -> None:
    """12 steps that each keep a 512x512 result alive, under --memory. On the H100 the GPU
    idled 60% of the window while the host dispatched those small ops (with the profiler's
    memory recording on), so that is the first finding; the leak is the next, also high."""
    d = report("memory_growth").diagnosis
    kinds = [f.kind for f in d.findings]
    assert kinds[:2] == ["launch_overhead", "memory_growth"], kinds
    f = d.finding("memory_growth")
    assert f.severity == "high" and f.evidence["rising_steps_fraction"] >= 0.6
    # Each step keeps (x @ w).relu(), 1 MiB; cut into slices (the cell has no steps), the
    # growth seen is most of the 12 MiB, and no more than the raw allocator totals moved.
    totals = [
        e["args"]["Total Allocated"]
        for e in raw_events("memory_growth")
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1
    ]
    assert 8 * 2**20 <= f.evidence["growth_total_bytes"] <= max(totals) - min(totals)


@pytest.mark.parametrize("name", ["compute_bound", "memory_bound", "dtype_cast"])
def test_without_a_warm_up_the_profilers_start_up_is_a_one_off(name: str) -> None:
    """The same cells recorded before profile_cell warmed the profiler up, as a plain
    `with torch.profiler.profile()` records them: the window's first op waits ~3 ms for
    CUPTI before any kernel. That is set apart as the profiler's start-up, and the planted
    kind is still the verdict."""
    d = report(f"{name}_no_warmup").diagnosis
    assert d.findings[0].kind == name, [(f.kind, round(f.share, 3)) for f in d.findings]
    assert [f.kind for f in d.one_off] == ["cold_start"]
    assert "profiler's own start-up" in d.one_off[0].title and "first op" in d.one_off[0].title
    # From the raw JSON: the first op began before any device activity, and took over 1 ms.
    events = raw_events(f"{name}_no_warmup")
    device_start = min(
        e["ts"] for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
    )
    first = min((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    assert first["ts"] < device_start and first["dur"] > 1000


def test_fresh_model_cold_start() -> None:
    """The first run of a fresh conv net (cuDNN autotuning each convolution shape), profiled
    with --once: cold start is the finding. Read offline, without the run's timing, the
    same setup is a one-off set apart from the steady state."""
    trace = load_trace(GPU / "cold_start.json.gz")
    once = analyze(trace, timing=TimingStats(wall_us=(6.2e6,), once=True)).diagnosis
    assert once.findings[0].kind == "cold_start", [(f.kind, f.share) for f in once.findings]
    assert once.findings[0].share > 0.5
    offline = analyze(trace).diagnosis
    assert [f.kind for f in offline.one_off] == ["cold_start"]
    assert offline.one_off[0].share > 0.5
    assert "one-off" in offline.verdict.lower() or "setup" in offline.verdict.lower()


def test_kernel_table_matches_the_raw_kernel_events() -> None:
    for name in ("launch_overhead", "host_sync", "dtype_cast", "precision"):
        kernels = [e for e in raw_events(name) if e.get("cat") == "kernel"]
        table = report(name).kernels
        rows = [r for r in table.rows if r.kind == "kernel"]
        assert sum(r.calls for r in rows) == len(kernels), name
        assert sum(r.total_us for r in rows) == pytest.approx(
            sum(e["dur"] for e in kernels), rel=1e-9
        ), name


def test_launch_overhead_counts_every_tiny_kernel() -> None:
    f = report("launch_overhead").diagnosis.finding("launch_overhead")
    # x = torch.ones(8) and 1000 iterations of a mul and an add: one kernel each.
    assert f.evidence["kernels_per_step"] == 1 + 2 * 1000
    assert f.evidence["median_kernel_us"] < 10


def test_host_sync_counts_every_item() -> None:
    f = report("host_sync").diagnosis.finding("host_sync")
    assert f.evidence["item_calls_per_step"] == 200
    copies = [e for e in raw_events("host_sync") if e.get("cat") == "gpu_memcpy"]
    assert len(copies) == 200 and all("DtoH" in e["name"] for e in copies)


def test_pageable_copies_and_their_bandwidth() -> None:
    f = report("host_device_copy").diagnosis.finding("host_device_copy")
    copies = [e for e in raw_events("host_device_copy") if e.get("cat") == "gpu_memcpy"]
    assert len(copies) == 6 and all("Pageable" in e["name"] for e in copies)
    assert f.evidence["pageable_copies_count"] == 6
    assert all(e["args"]["bytes"] == 64 * 2**20 for e in copies)
    bandwidth = 6 * 64 * 2**20 / (sum(e["dur"] for e in copies) * 1e-6)
    assert f.evidence["memcpy_bandwidth_bytes_per_s"] == pytest.approx(bandwidth, rel=1e-9)


def test_dtype_casts_are_counted() -> None:
    f = report("dtype_cast").diagnosis.finding("dtype_cast")
    assert f.evidence["casts_per_step"] == 24  # 12 round trips, two casts each


def test_recompilation_counts_each_new_shape() -> None:
    f = report("recompilation").diagnosis.finding("recompilation")
    # dynamic=False after torch._dynamo.reset(): each of the 4 shapes compiles a graph.
    assert f.evidence["compile_count"] == 4
    assert f.evidence["recompiled_graphs_count"] == 3


@pytest.mark.parametrize(
    ("name", "n", "dtype"), [("precision", 4096, "fp32"), ("compute_bound", 8192, "bf16")]
)
def test_matmul_flops_and_rate_against_the_raw_trace(name: str, n: int, dtype: str) -> None:
    """The roofline's matmul point: FLOPs = 2 n^3 per call, counted here from the cell;
    its time is the GEMM kernels' time in the raw JSON; its rate stays under the H100 SXM
    datasheet peak of its dtype and above half of it (a big GEMM on an idle GPU)."""
    rep = report(name)
    roof = rep.roofline
    mm = [p for p in roof.points if p.op_name in ("aten::mm", "aten::matmul")]
    assert len(mm) == 1, [(p.name, p.op_name) for p in roof.points]
    p = mm[0]
    assert p.calls == 8 and p.flops == 8 * 2 * n**3 and p.dtype == dtype
    # The cell runs only the matmuls: every device event is theirs (the GEMM kernels, and
    # cuBLAS's workspace memsets for the bf16 ones).
    device_us = sum(
        e["dur"] for e in raw_events(name) if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
    )
    assert p.time_us == pytest.approx(device_us, rel=1e-6)
    peak = {"fp32": 67e12, "bf16": 989.5e12}[dtype]
    assert 0.5 * peak < p.achieved_flops_per_s < peak
    assert not p.above_roof


def test_gpu_snapshots_analyse_to_their_planted_findings() -> None:
    leak = analyze_memory(load_snapshot(SNAPSHOTS / "gpu_leak.pickle"))
    assert leak.findings[0].kind == "memory_growth" and leak.findings[0].severity == "high"
    # --repeat 4, 16 MiB kept per run: the runs were saved with the snapshot.
    assert len(leak.leaks.step_end_bytes) == 4
    assert leak.leaks.growth_bytes_per_step == pytest.approx(16 * 2**20, rel=0.01)
    oom = analyze_memory(load_snapshot(SNAPSHOTS / "gpu_oom.pickle"))
    f = oom.findings[0]
    assert f.kind == "oom" and f.evidence["requested_bytes"] == 2**45 * 4
    # 128 TiB asked with 78 GiB free and 69 MiB of tensors: the request, not the tensors.
    assert f.evidence["requested_bytes"] > f.evidence["device_free_bytes"]
    assert "larger than" in f.title and "filled the device" not in f.title
    frag = analyze_memory(load_snapshot(SNAPSHOTS / "gpu_fragmented.pickle"))
    assert "fragmentation" in [f.kind for f in frag.findings]
