"""Diagnosis rules on hand-built traces (answers computed by hand), on real GPU traces (facts
recomputed from the plain JSON), and on bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from _paths import SHARED_TRACES as SHARED

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.diagnose import FIX_ORDER, Diagnosis, diagnose, op_class
from gpuprof_nb.analysis.hotspots import compute_hotspots
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import (
    DeviceInfo,
    Kernel,
    MemoryEvent,
    Op,
    RuntimeCall,
    Step,
    SyncEvent,
    Trace,
)
from gpuprof_nb.results.roofline import Roofline, RooflinePoint

KINDS = {
    "dataloader",
    "host_sync",
    "launch_overhead",
    "python_overhead",
    "memory_bound",
    "compute_bound",
    "precision",
    "dtype_cast",
    "host_device_copy",
    "communication",
    "cold_start",
    "recompilation",
    "graph_break",
    "memory_growth",
    "fragmentation",
    "oom",
    "critical_path",
    "noisy_measurement",
}


def make_trace(
    *, ops=(), kernels=(), runtime=(), syncs=(), steps=(), memory=(), window=None, cc=(8, 0)
) -> Trace:
    spans = (
        [(o.start_us, o.end_us) for o in ops]
        + [(k.start_us, k.end_us) for k in kernels]
        + [(r.start_us, r.end_us) for r in runtime]
    )
    if window is None:
        window = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0.0, 0.0)
    devices = (DeviceInfo(0, "GPU", compute_capability=cc),) if cc else ()
    return Trace(
        source="hand",
        ops=tuple(ops),
        kernels=tuple(kernels),
        runtime=tuple(runtime),
        syncs=tuple(syncs),
        memory=tuple(memory),
        steps=tuple(steps),
        devices=devices,
        distributed=None,
        bounds_us=window,
    )


def kernel(
    start,
    dur,
    name="void at::native::elementwise_kernel<128, 4>",
    stream=7,
    corr=None,
    kind="kernel",
    nbytes=None,
    ext=None,
):
    return Kernel(
        name,
        kind,
        float(start),
        float(dur),
        0,
        stream,
        correlation=corr,
        bytes=nbytes,
        external_id=ext,
    )


def op(name, start, dur, kind="op", tid=1, types=None, ext=None):
    return Op(name, kind, float(start), float(dur), 1, tid, input_types=types, external_id=ext)


def check_well_formed(d: Diagnosis) -> None:
    assert isinstance(d.findings, tuple) and isinstance(d.not_judged, tuple)
    assert d.verdict
    for f in d.considered:
        assert f.kind in KINDS
        assert f.severity in ("high", "medium", "low", "info")
        assert f.fix
        for k, v in f.evidence.items():
            assert isinstance(k, str) and isinstance(v, float | int), (k, v)
    for f in d.findings:
        assert f.kind in ("compute_bound", "critical_path") or f.share >= th.MIN_REPORT_SHARE
        if f.kind in ("compute_bound", "critical_path"):
            assert f.severity == "info"
    # What the step's length hangs on explains the others: it never comes before them.
    kinds = [f.kind for f in d.findings]
    if "critical_path" in kinds:
        assert kinds.index("critical_path") == len(kinds) - 1


class TestRules:
    def test_host_sync_counts_and_blocked_time(self):
        # Two steps; each: kernel 0-100 (launched at -5), .item() -> cudaStreamSynchronize
        # 10-101 blocks until the kernel ends; the host then works 101-400 before the next
        # kernel: the idle 100-400 follows the sync.
        kernels, runtime, ops, steps = [], [], [], []
        for i, base in enumerate((0.0, 500.0)):
            kernels.append(kernel(base, 100, corr=i))
            runtime.append(RuntimeCall("cudaLaunchKernel", base - 5, 4.0, 1, 1, correlation=i))
            ops.append(op("aten::item", base + 8, 95))
            ops.append(op("aten::_local_scalar_dense", base + 9, 93))
            runtime.append(RuntimeCall("cudaStreamSynchronize", base + 10, 91.0, 1, 1))
            steps.append(Step(i, f"ProfilerStep#{i}", base - 5, base + 495))
        d = diagnose(make_trace(ops=ops, kernels=kernels, runtime=runtime, steps=steps))
        check_well_formed(d)
        f = d.finding("host_sync")
        assert f is not None
        assert f.evidence["sync_calls_per_step"] == pytest.approx(1.0)
        assert f.evidence["item_calls_per_step"] == pytest.approx(1.0)
        assert f.evidence["host_blocked_us"] == pytest.approx(2 * 91.0)
        # Window -5..603 (the last aten::item ends at 603); idle after the first sync:
        # 100-500 (to the next kernel); after the second: 600-603 (it returns at 601).
        assert f.evidence["device_idle_after_sync_us"] == pytest.approx(403.0)
        assert f.share == pytest.approx(403.0 / 608.0)
        assert d.findings[0].kind == "host_sync"
        assert d.findings[0].severity == "high"

    def test_communication_overlap_by_hand(self):
        kernels = [
            kernel(0, 100, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=3),
            kernel(50, 100, name="ampere_bf16_s16816gemm_bf16_128x128", stream=7),
        ]
        d = diagnose(make_trace(kernels=kernels))
        f = d.finding("communication")
        assert f.evidence["communication_time_us"] == pytest.approx(100.0)
        assert f.evidence["overlap_with_compute_fraction"] == pytest.approx(0.5)
        assert f.evidence["exposed_communication_us"] == pytest.approx(50.0)
        assert f.share == pytest.approx(50.0 / 150.0)

    def test_host_collectives_without_device(self):
        # gloo all_reduce 100-600 on the main thread; an op on another thread 500-700
        # overlaps 100 us of it; Python elsewhere.
        ops = [
            op("aten::add", 0, 100),
            op("gloo:all_reduce", 100, 500, kind="annotation"),
            op("aten::mul", 500, 200, tid=2),
            op("aten::add", 900, 100),
        ]
        d = diagnose(make_trace(ops=ops, cc=None))
        f = d.finding("communication")
        assert f.evidence["communication_time_us"] == pytest.approx(500.0)
        assert f.evidence["overlap_with_compute_fraction"] == pytest.approx(0.2)
        assert f.share == pytest.approx(400.0 / 1000.0)
        # Host gaps: 100-500 (in the collective) and 700-900 (Python).
        assert d.finding("python_overhead").evidence["python_outside_ops_us"] == pytest.approx(
            200.0
        )

    def test_python_hotspot_names_the_innermost_function(self):
        ops = [
            op("cell.py(1): <module>", 0, 1000, kind="python"),
            op("train.py(10): slow_fn", 100, 500, kind="python"),
            op("aten::add", 0, 100),
            op("aten::add", 600, 100),
            op("aten::add", 990, 10),
        ]
        trace = make_trace(ops=ops, cc=None)
        hotspots = compute_hotspots(trace, device_timeline(trace))
        f = diagnose(trace, hotspots=hotspots).finding("python_overhead")
        # Python: 100-600 inside slow_fn, 700-990 in <module> only: 500 and 290 of the 790 us
        # between ops.
        assert f.evidence["python_outside_ops_us"] == pytest.approx(500 + 290)
        assert f.title.endswith(
            ". Held by `train.py, slow_fn (defined at line 10)`: 63% of the time between ops; "
            "`cell.py (line unknown: profiler events name functions only) <module>`: 37% of the "
            "time between ops"
        )
        # Without stacks, the finding says how to get them.
        plain = diagnose(trace).finding("python_overhead")
        assert "Held by" not in plain.title and "--stack" in plain.fix

    def test_precision_fp32_gemm_on_ampere_and_volta(self):
        kernels = [kernel(0, 100, name="ampere_sgemm_128x64_nn"), kernel(100, 20)]
        d = diagnose(make_trace(kernels=kernels, cc=(8, 0)))
        f = d.finding("precision")
        assert f.evidence["fp32_gemm_time_us"] == pytest.approx(100.0)
        assert f.evidence["compute_capability_version"] == pytest.approx(8.0)
        assert f.share == pytest.approx(100 / 120 * th.PRECISION_RECOVERABLE)
        assert "bfloat16" in f.fix
        volta = diagnose(make_trace(kernels=kernels, cc=(7, 0))).finding("precision")
        assert "float16" in volta.fix and "GradScaler" in volta.fix
        none = diagnose(make_trace(kernels=kernels, cc=None))
        assert none.finding("precision") is None
        assert any(x.startswith("precision") for x in none.not_judged)

    def test_precision_from_input_types(self):
        # The kernel name says nothing; the op's recorded Input type says fp32.
        kernels = [kernel(0, 100, name="sm80_xmma_gemm_nn", ext=7)]
        ops = [op("aten::mm", -10, 12, types=("float", "float"), ext=7)]
        assert diagnose(make_trace(ops=ops, kernels=kernels)).finding("precision") is not None
        ops_bf16 = [op("aten::mm", -10, 12, types=("c10::BFloat16", "c10::BFloat16"), ext=7)]
        assert diagnose(make_trace(ops=ops_bf16, kernels=kernels)).finding("precision") is None

    def test_host_device_copy_pageable_bandwidth(self):
        kernels = [
            kernel(
                0, 1000, name="Memcpy HtoD (Pageable -> Device)", kind="memcpy", nbytes=4_000_000
            ),
            kernel(1000, 1000),
        ]
        f = diagnose(make_trace(kernels=kernels)).finding("host_device_copy")
        assert f.evidence["pageable_copies_count"] == 1
        assert f.evidence["memcpy_bandwidth_bytes_per_s"] == pytest.approx(4e6 / 1e-3)
        assert f.share == pytest.approx(0.5)

    def test_cold_start_from_timing(self):
        timing = TimingStats(wall_us=(100.0, 110.0, 90.0), warmup_wall_us=(1000.0,))
        d = diagnose(make_trace(kernels=[kernel(0, 10)]), timing=timing)
        f = d.finding("cold_start")
        assert f.evidence["first_over_median_ratio"] == pytest.approx(10.0)
        assert f.evidence["timed_runs_spread_us"] == pytest.approx(20.0)
        assert f.share == pytest.approx((1000 - 100) / (1000 + 300))
        # A one-off, reported apart: info, never a finding about the steady state.
        assert f.severity == "info" and d.one_off == (f,)
        assert f not in d.findings and "cold_start" not in d.verdict
        no_timing = diagnose(make_trace(kernels=[kernel(0, 10)]))
        assert any(x.startswith("cold_start") for x in no_timing.not_judged)

    def test_cold_start_fires_only_beyond_the_spread_of_the_timed_runs(self):
        # Timed runs 90-300 us (median 100): a first run of 400 us lies 300 us above the
        # median, beyond their 210 us spread; one of 250 us (2.5x) lies within it.
        runs = (100.0, 300.0, 90.0)
        beyond = diagnose(
            make_trace(kernels=[kernel(0, 10)]),
            timing=TimingStats(wall_us=runs, warmup_wall_us=(400.0,)),
        )
        assert beyond.finding("cold_start").share == pytest.approx(300 / (400 + 490))
        assert [f.kind for f in beyond.one_off] == ["cold_start"]
        within = diagnose(
            make_trace(kernels=[kernel(0, 10)]),
            timing=TimingStats(wall_us=runs, warmup_wall_us=(250.0,)),
        )
        assert within.finding("cold_start").share == 0.0
        assert within.one_off == ()

    @staticmethod
    def _setup_trace() -> Trace:
        # The first .to() holds the host 200 ms (lazy CUDA init) while the device idles; the
        # later .to() calls take 10 us. Kernels run after it, with a 200 us gap between them
        # in which the host waits inside the third .to().
        ops = [
            op("aten::to", 0, 200_000),
            op("aten::to", 200_100, 10),
            op("aten::to", 200_200, 190),
        ]
        kernels = [kernel(200_050, 100, corr=1), kernel(200_400, 100, corr=2)]
        runtime = [
            RuntimeCall("cudaLaunchKernel", 200_020.0, 5.0, 1, 1, correlation=1),
            RuntimeCall("cudaLaunchKernel", 200_390.0, 5.0, 1, 1, correlation=2),
        ]
        return make_trace(ops=ops, kernels=kernels, runtime=runtime)

    def test_cold_start_from_a_first_call_in_a_trace_recorded_elsewhere(self):
        d = diagnose(self._setup_trace())
        f = d.finding("cold_start")
        # Idle from 0 to 200 000 us inside the first aten::to: all of it setup.
        assert f.evidence["device_idle_in_setup_ops_us"] == pytest.approx(200_000)
        assert f.evidence["longest_setup_op_us"] == pytest.approx(200_000)
        assert f.share == pytest.approx(200_000 / 200_500)
        # A one-off: reported apart, and the verdict names the steady state of the rest.
        assert f.severity == "info" and d.one_off == (f,)
        assert all(g.kind != "cold_start" for g in d.findings)
        assert d.verdict.startswith("Main bottleneck: launch_overhead")
        assert "one-off setup cost took 100% of the trace" in d.verdict
        # The rest is 500 us: the host held the device idle inside ops for part of it
        # (the gap 200 150-200 400 inside the third .to()), a share of the rest, not of 200 ms.
        lo = d.finding("launch_overhead")
        assert lo.evidence["device_idle_while_host_in_ops_us"] < 1_000
        assert lo.share == pytest.approx(
            (
                lo.evidence["device_idle_while_host_in_ops_us"]
                + lo.evidence["short_gaps_between_kernels_us"]
            )
            / 500
        )
        assert any("remaining 500 us" in n for n in d.notes)

    def test_cold_start_under_once_is_part_of_what_was_measured(self):
        once = TimingStats(wall_us=(200_500.0,), once=True, profiled=True)
        d = diagnose(self._setup_trace(), timing=once)
        assert d.findings[0].kind == "cold_start" and d.findings[0].severity == "high"
        assert "cold_start" in d.verdict and d.one_off == ()

    def test_setup_ops_in_a_run_after_the_warm_up_are_its_steady_state(self):
        # The magic profiled this run after warming up: a 200 ms op here recurs every run.
        warm = TimingStats(wall_us=(200_500.0,) * 3, warmup_wall_us=(200_600.0,))
        d = diagnose(self._setup_trace(), timing=warm)
        assert d.finding("cold_start").share == 0.0
        assert d.findings[0].kind == "launch_overhead"
        assert d.findings[0].share == pytest.approx(1.0, abs=0.01)

    def test_few_tiny_kernels_are_not_many_small_kernels(self):
        kernels = [kernel(i * 100.0, 5, corr=i) for i in range(5)]
        runtime = [
            RuntimeCall("cudaLaunchKernel", i * 100.0 - 50, 5.0, 1, 1, correlation=i)
            for i in range(5)
        ]
        ops = [op("aten::add", i * 100.0 - 60, 20) for i in range(5)]
        f = diagnose(make_trace(ops=ops, kernels=kernels, runtime=runtime)).finding(
            "launch_overhead"
        )
        assert not f.title.startswith("Many small kernels")
        many = [kernel(i * 10.0, 5, corr=i) for i in range(th.MIN_KERNELS_FOR_OVERHEAD)]
        g = diagnose(make_trace(kernels=many)).finding("launch_overhead")
        assert g.title.startswith("Many small kernels")

    def test_recompilation_markers(self):
        ops = [
            op("Torch-Compiled Region", 0, 100, kind="annotation"),
            op("_compile.compile_inner (dynamo_timed)", 100, 500, kind="annotation"),
            op("Torch-Compiled Region", 600, 100, kind="annotation"),
            op("_compile.compile_inner (dynamo_timed)", 700, 300, kind="annotation"),
            op("aten::add", 0, 1000),
        ]
        f = diagnose(make_trace(ops=ops)).finding("recompilation")
        assert f.evidence["compile_count"] == 2
        assert f.evidence["compile_time_us"] == pytest.approx(800.0)
        assert f.evidence["compiled_region_calls_count"] == 2
        assert f.evidence["recompiled_graphs_count"] == 0
        # Graphs 0/0, 0/1, 0/2 of frame 0 and 1/0 of frame 1: two recompilations, compiled
        # before the profiled run (no compile events), still reported.
        ops2 = [
            op(f"Torch-Compiled Region: {fr}/{g}", i * 100.0, 50, kind="annotation")
            for i, (fr, g) in enumerate([(0, 0), (0, 1), (0, 2), (1, 0), (0, 1)])
        ]
        g2 = diagnose(make_trace(ops=ops2)).finding("recompilation")
        assert g2.evidence["recompiled_graphs_count"] == 2
        assert g2.evidence["compile_count"] == 0
        assert g2.severity == "low"
        without = diagnose(make_trace(ops=[op("aten::add", 0, 10)]))
        assert any(x.startswith("recompilation") for x in without.not_judged)

    def test_memory_growth_per_step(self):
        steps, memory, ops = [], [], []
        for i in range(6):
            steps.append(Step(i, f"ProfilerStep#{i}", i * 100.0, i * 100.0 + 100.0))
            ops.append(op("aten::mm", i * 100.0, 90))
            # Each step allocates 8 MiB kept alive and 4 MiB freed again.
            memory.append(
                MemoryEvent(
                    i * 100.0 + 10, 8 << 20, 1, 0, total_allocated=(i + 1) * (8 << 20) + (4 << 20)
                )
            )
            memory.append(
                MemoryEvent(i * 100.0 + 20, -(4 << 20), 1, 0, total_allocated=(i + 1) * (8 << 20))
            )
        d = diagnose(make_trace(ops=ops, steps=steps, memory=memory))
        f = d.finding("memory_growth")
        assert f.evidence["growth_per_step_bytes"] == pytest.approx(8 << 20)
        assert f.evidence["growth_total_bytes"] == pytest.approx(5 * (8 << 20))
        assert f.evidence["peak_allocated_bytes"] == pytest.approx(6 * (8 << 20) + (4 << 20))
        assert d.findings[0].kind == "memory_growth"

    def test_memory_growth_names_the_allocation_site(self):
        steps, memory, ops = [], [], []
        total = 0
        for i in range(5):
            t0 = i * 100.0
            steps.append(Step(i, f"ProfilerStep#{i}", t0, t0 + 100.0))
            ops += [op("aten::mm", t0, 40), op("aten::relu", t0 + 50, 40)]
            # aten::mm keeps 2 MiB each step; aten::relu allocates 1 MiB and frees it.
            total += 2 << 20
            memory.append(
                MemoryEvent(t0 + 10, 2 << 20, 1, 0, addr=1000 + i, tid=1, total_allocated=total)
            )
            memory.append(
                MemoryEvent(
                    t0 + 60, 1 << 20, 1, 0, addr=2000 + i, tid=1, total_allocated=total + (1 << 20)
                )
            )
            memory.append(
                MemoryEvent(t0 + 70, -(1 << 20), 1, 0, addr=2000 + i, tid=1, total_allocated=total)
            )
        f = diagnose(make_trace(ops=ops, steps=steps, memory=memory)).finding("memory_growth")
        assert f.title.endswith("comes mostly from aten::mm")
        assert f.evidence["largest_site_live_bytes"] == 5 * (2 << 20)
        assert f.evidence["growth_per_step_bytes"] == pytest.approx(2 << 20)

    def test_flat_memory_is_not_growth(self):
        memory = [
            MemoryEvent(float(t), (1 << 20) * (1 if t % 20 == 0 else -1), 1, 0)
            for t in range(0, 400, 10)
        ]
        d = diagnose(make_trace(ops=[op("aten::mm", 0, 400)], memory=memory))
        f = d.finding("memory_growth")
        assert f is None or f.share == 0.0

    def test_dataloader_on_cpu(self):
        ops = [
            op(
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                0,
                600,
                kind="annotation",
            ),
            op("aten::mm", 600, 400),
        ]
        d = diagnose(make_trace(ops=ops, cc=None))
        f = d.findings[0]
        assert f.kind == "dataloader"
        assert f.evidence["dataloader_share_of_step_time_fraction"] == pytest.approx(0.6)
        # A CPU-only run: workers help, pinned memory (for host-to-GPU copies) would not.
        assert "num_workers" in f.fix and "pin_memory" not in f.fix

    def test_order_follows_share_and_compute_bound_never_severe(self):
        kernels = [kernel(0, 900, name="ampere_bf16_s16816gemm_bf16_128x128"), kernel(1000, 10)]
        d = diagnose(make_trace(kernels=kernels))
        check_well_formed(d)
        cb = d.finding("compute_bound")
        assert cb is not None and cb.severity == "info"
        shares = [f.share for f in d.findings if f.severity in ("high", "medium")]
        assert shares == sorted(shares, reverse=True)

    def test_roofline_shares_decide_on_device(self):
        def roofline(compute_us, memory_us, total_us=None, bound=True):
            def point(kind, us):
                return RooflinePoint(
                    name=kind,
                    shapes="",
                    calls=1,
                    flops=1,
                    bytes_moved=1,
                    intensity_flop_per_byte=1.0,
                    time_us=us,
                    achieved_flops_per_s=None,
                    achieved_bytes_per_s=None,
                    roof=None,
                    peak_flops_per_s=None,
                    roof_flops_per_s=None,
                    bound=kind if bound else None,
                    fraction_of_roof=None,
                    above_roof=False,
                    flop_source="",
                    bytes_model="",
                    dtype="fp32",
                    category="gemm",
                    op_name=kind,
                )

            return Roofline(
                points=(point("compute", compute_us), point("memory", memory_us)),
                data_movement=(),
                device=None,
                note="",
                time_basis="device",
                total_time_us=total_us or compute_us + memory_us,
            )

        # By kernel names this is all elementwise; the roofline says 75% compute-bound.
        kernels = [kernel(0, 100), kernel(100, 100)]
        d = diagnose(make_trace(kernels=kernels), roofline=roofline(75, 25))
        cb = d.finding("compute_bound")
        assert cb.evidence["roofline_compute_bound_share_fraction"] == pytest.approx(0.75)
        mb = d.finding("memory_bound")
        assert mb.evidence["low_intensity_time_us"] == pytest.approx(0.25 * 200)
        assert mb.share == pytest.approx(0.25 * th.MEMORY_BOUND_RECOVERABLE)
        # Shares are of the attributed time: a device roofline covering half the busy time
        # speaks for half of it.
        half = diagnose(make_trace(kernels=kernels), roofline=roofline(75, 25, total_us=200))
        assert half.finding("compute_bound") is None  # 0.75 x 0.5 < COMPUTE_BOUND_MIN_SHARE
        assert half.finding("memory_bound").evidence["low_intensity_time_us"] == pytest.approx(
            0.25 * 0.5 * 200
        )
        # A roofline that could not classify (no device ceilings) leaves names in charge.
        d2 = diagnose(make_trace(kernels=kernels), roofline=roofline(75, 25, bound=False))
        assert d2.finding("compute_bound") is None
        assert d2.finding("memory_bound").evidence["low_intensity_time_us"] == 200

    def test_op_class(self):
        assert op_class("aten::addmm") == "gemm"
        assert op_class("autograd::engine::evaluate_function: AddmmBackward0") == "gemm"
        assert op_class("aten::add_") == "elementwise"
        assert op_class("autograd::engine::evaluate_function: ReluBackward0") == "elementwise"
        assert op_class("aten::_to_copy") == "cast"
        assert op_class("aten::empty") == "other"

    def test_fix_order_covers_every_kind_we_report(self):
        assert set(FIX_ORDER) <= KINDS


class TestBadInput:
    def test_empty(self):
        d = diagnose(make_trace(cc=None))
        check_well_formed(d)
        assert d.findings == ()
        assert any("no timed events" in x for x in d.not_judged)

    def test_one_event(self):
        check_well_formed(diagnose(make_trace(kernels=[kernel(3.5, 1.25)])))
        check_well_formed(diagnose(make_trace(ops=[op("aten::add", -7.5, 2.0)], cc=None)))

    def test_no_steps_noted(self):
        d = diagnose(make_trace(kernels=[kernel(0, 10), kernel(50, 10)]))
        assert any("no ProfilerStep" in n for n in d.notes)

    def test_overlapping_streams_and_negative_float_times(self):
        kernels = [
            kernel(-100.5, 50.25, stream=1),
            kernel(-80.125, 70.5, stream=2),
            kernel(-5.0, 0.0),
            kernel(-90.0, 10.0, name="ncclKernel_AllGather"),
        ]
        syncs = [SyncEvent("Stream Sync", -20.0, 1.5, 0, -1)]
        d = diagnose(make_trace(kernels=kernels, syncs=syncs))
        check_well_formed(d)

    def test_steps_outside_window_and_zero_length(self):
        steps = [Step(1, "ProfilerStep#1", 500.0, 400.0), Step(2, "ProfilerStep#2", 0.0, 0.0)]
        d = diagnose(make_trace(kernels=[kernel(0, 10)], steps=steps))
        check_well_formed(d)

    def test_memory_events_only(self):
        memory = [MemoryEvent(0.0, 100, 0, -1), MemoryEvent(1.0, -100, 0, -1)]
        check_well_formed(diagnose(make_trace(memory=memory, cc=None)))


# --- real traces ----------------------------------------------------------------------------

DATA = Path(__file__).parent.parent / "data"


def raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def test_alexnet_sync_evidence_matches_plain_json():
    path = DATA / "a100_alexnet_sync" / "benchmark_result_2869224_1695835535_trace.json.gz"
    events = raw_events(path)
    names = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
    calls = [e for e in events if e.get("cat") == "cuda_runtime" and e.get("name") in names]
    d = diagnose(load_trace(path))
    f = d.finding("host_sync")
    assert f is not None
    # No ProfilerStep in this trace: "per step" is per window.
    assert f.evidence["sync_calls_per_step"] == len(calls)
    # Blocked time: the union of the blocking calls and the host-side cuda_sync events.
    waits = calls + [
        e
        for e in events
        if e.get("cat") == "cuda_sync"
        and e.get("name") in ("Stream Sync", "Context Sync", "Event Sync")
    ]
    blocked, end = 0.0, float("-inf")
    for a, b in sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in waits):
        blocked += max(0.0, b - max(a, end))
        end = max(end, b)
    assert f.evidence["host_blocked_us"] == pytest.approx(blocked)
    assert f.evidence["device_idle_after_sync_us"] > 0


def test_nccl_trace_gives_communication_with_plain_json_overlap():
    path = DATA / "ddp_nccl_sampled" / "sampled_rank-0.json.gz"
    events = [e for e in raw_events(path) if e.get("ph") == "X" and e.get("cat") == "kernel"]
    # Sweep over boundaries: time with a collective running, and with one running alongside
    # another kernel.
    points = []
    for e in events:
        comm = "nccl" in e["name"].lower()
        points.append((float(e["ts"]), 1, comm))
        points.append((float(e["ts"]) + float(e["dur"]), -1, comm))
    points.sort(key=lambda p: (p[0], p[1]))
    n_comm = n_other = 0
    last = points[0][0]
    comm_us = both_us = 0.0
    for t, d, comm in points:
        if n_comm:
            comm_us += t - last
            if n_other:
                both_us += t - last
        last = t
        if comm:
            n_comm += d
        else:
            n_other += d
    f = diagnose(load_trace(path)).finding("communication")
    assert f is not None
    assert f.evidence["communication_time_us"] == pytest.approx(comm_us)
    assert f.evidence["overlap_with_compute_fraction"] == pytest.approx(both_us / comm_us)
    assert f.evidence["collective_kernels_count"] == sum(
        "nccl" in e["name"].lower() for e in events
    )


def test_multistream_sync_trace_blames_python_not_the_short_syncs():
    # Its syncs block the host 4-20 us each; the 18.8 ms idle gap begins 159 us after the
    # last one returned, so the host was not waiting when the device went idle: Python was.
    d = diagnose(load_trace(DATA / "a100_multistream_sync" / "event_sync_trace.json.gz"))
    assert d.findings[0].kind == "python_overhead"
    sync = d.finding("host_sync")
    assert sync is None or (sync.severity == "info" and sync.share < 0.01)


def test_a_sync_late_in_a_gap_does_not_claim_the_gap():
    # a100_triton: the only kernel ends at 1356 us; one 16.8 us cudaDeviceSynchronize runs
    # at 1514 us, after the device went idle. The 13.3 s gap is not the sync's doing.
    trace = load_trace(next((DATA / "a100_triton").glob("*.json*")))
    timeline = device_timeline(trace)
    assert timeline.breakdown.sync_us == 0.0
    sync = diagnose(trace).finding("host_sync")
    assert sync is None or (sync.severity == "info" and sync.share < 0.01)


SHARED_TRACES = (
    sorted(p for p in SHARED.rglob("*.json*") if not p.name.endswith(".raw.gz"))
    if SHARED.is_dir()
    else []
)


@pytest.mark.skipif(not SHARED_TRACES, reason="../shared/traces is not on this machine")
@pytest.mark.parametrize("path", SHARED_TRACES, ids=lambda p: str(p.relative_to(SHARED)))
def test_no_shared_trace_crashes_the_rules(path):
    trace = load_trace(path)
    timeline = device_timeline(trace)
    bd = timeline.breakdown
    assert sum(bd.us_by_category().values()) == pytest.approx(bd.span_us, rel=1e-9, abs=1e-6)
    check_well_formed(diagnose(trace, timeline=timeline))


def _median(values):
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def test_bert_launch_overhead_evidence_matches_plain_json():
    path = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
    events = raw_events(path)
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    # Host-side step annotations only (the GPU lane repeats them as gpu_user_annotation).
    steps = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    trace = load_trace(path)
    f = diagnose(trace).finding("launch_overhead")
    # Kernels per step as the Summary counts them: those launched (their runtime call's
    # start, by correlation id) inside a step, over the steps. The one annotated step holds
    # 4.4 ms of a 4.9 ms window, and the kernels of the rest are not per-step work.
    launch = {
        e["args"]["correlation"]: float(e["ts"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e["args"]
    }
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in steps]
    inside = sum(
        any(a <= launch.get(k["args"]["correlation"], float(k["ts"])) < b for a, b in spans)
        for k in kernels
    )
    assert 0 < inside <= len(kernels)
    assert f.evidence["kernels_per_step"] == pytest.approx(inside / len(steps))
    assert f.evidence["median_kernel_us"] == pytest.approx(
        _median([float(e["dur"]) for e in kernels])
    )
    assert f.evidence["median_kernel_us"] < th.TINY_KERNEL_US


def test_compiled_trace_counts_compiled_region_calls():
    path = DATA / "mi300_compile_triton" / "trace.json.gz"
    regions = [
        e
        for e in raw_events(path)
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("Torch-Compiled Region")
    ]
    d = diagnose(load_trace(path))
    f = d.finding("recompilation")
    assert f is not None and not any(x.startswith("recompilation") for x in d.not_judged)
    assert f.evidence["compiled_region_calls_count"] == len(regions) >= 1


# The range-profiler trace is a GPU program without kernel events: it keeps CUDA fixes
# (tests/analysis/test_diagnose_unrecorded.py). The MTIA inference trace, here before, has
# device activity since its mtia_ccp_events are read (tests/io/test_mtia.py).
@pytest.mark.parametrize("name", ["rank_non_gpu", "cpu_only_trace"])
def test_runs_without_device_activity_get_no_cuda_only_fixes(name):
    trace = load_trace(next((DATA / name).glob("*.json*")))
    assert not trace.kernels
    findings = diagnose(trace).considered
    assert findings
    for f in findings:
        for cuda_only in ('autocast("cuda"', "reduce-overhead", "pin_memory", "non_blocking"):
            assert cuda_only not in f.fix, (f.kind, cuda_only)


@pytest.mark.parametrize("totals", ["all", "none", "mixed"])
@pytest.mark.parametrize("seed", range(6))
def test_memory_levels_per_device_match_a_running_loop(seed: int, totals: str) -> None:
    """The memory-growth rule's levels (arrays where the trace records totals on every event
    or on none) equal a plain running loop's, float for float, per device, in event order."""
    import random

    from gpuprof_nb.analysis.rules import _memory_series

    rng = random.Random(seed)
    events = []
    for i in range(rng.choice([1, 5, 300])):
        total = {"all": True, "none": False, "mixed": rng.random() < 0.5}[totals]
        events.append(
            MemoryEvent(
                # Sums past 2**53 round: only adding one by one, in order, gives the same floats.
                ts_us=float(i) + rng.choice([0.0, 0.25]),
                bytes=rng.choice([-1, 1, 1]) * rng.randrange(1, 2**52),
                device_type=rng.choice([0, 1]),
                device_id=rng.choice([0, 1, 2]),
                total_allocated=rng.randrange(2**45) if total else None,
            )
        )
    # Computed another way than the rule's loop: each device's events picked out on their
    # own, then folded with itertools.accumulate (a recorded total replaces the level).
    from itertools import accumulate

    def step(level: float, m: MemoryEvent) -> float:
        return float(m.total_allocated) if m.total_allocated is not None else level + m.bytes

    want = {}
    for key in dict.fromkeys((m.device_type, m.device_id) for m in events):
        mine = [m for m in events if (m.device_type, m.device_id) == key]
        levels = list(accumulate(mine, step, initial=0.0))[1:]
        want[key] = ([m.ts_us for m in mine], levels)
    got = _memory_series(events)
    assert got == want
    assert all(type(v) is float for _, levels in got.values() for v in levels)


def test_memory_levels_by_hand() -> None:
    """A recorded total replaces the level; an event without one adds its bytes to its own
    device's level (from 0); the devices never mix."""
    from gpuprof_nb.analysis.rules import _memory_series

    def event(ts: float, size: int, device: int, total: int | None = None) -> MemoryEvent:
        return MemoryEvent(
            ts_us=ts, bytes=size, device_type=1, device_id=device, total_allocated=total
        )

    events = [
        event(1.0, 100, 0),
        event(2.0, 50, 1, total=1000),
        event(3.0, -30, 0),
        event(4.0, 5, 0, total=200),
        event(5.0, 1, 0),
        event(6.0, -400, 1),
    ]
    assert _memory_series(events) == {
        (1, 0): ([1.0, 3.0, 4.0, 5.0], [100.0, 70.0, 200.0, 201.0]),
        (1, 1): ([2.0, 6.0], [1000.0, 600.0]),
    }
    # The same events with every total recorded, and with none: the two array paths.
    assert _memory_series([event(1.0, 7, 0, total=10), event(2.0, 3, 0, total=4)]) == {
        (1, 0): ([1.0, 2.0], [10.0, 4.0])
    }
    assert _memory_series([event(1.0, 7, 0), event(2.0, -3, 0), event(3.0, 9, 2)]) == {
        (1, 0): ([1.0, 2.0], [7.0, 4.0]),
        (1, 2): ([3.0], [9.0]),
    }


@pytest.mark.parametrize("seed", range(30))
def test_median_without_one_value_matches_statistics(seed: int) -> None:
    """The cold-op test's median of a name's other calls (one call taken out of the sorted
    durations in place) is statistics.median of a copy with that call removed."""
    import random
    import statistics

    from gpuprof_nb.analysis.rules import _median_without

    rng = random.Random(seed)
    durations = sorted(
        rng.choice([1.0, 2.5, 3.0, 7.25, 1e6 / 3]) + rng.randrange(3)
        for _ in range(rng.randrange(1, 12))
    )
    for value in set(durations):
        others = list(durations)
        others.remove(value)
        want = statistics.median(others) if others else None
        assert _median_without(durations, value) == want


def _gemm_ops_by_scan(trace: Trace) -> list[Op]:
    """Reference for rules._gemm_ops_with_ids: every op of trace.ops, one by one."""
    return [o for o in trace.ops if op_class(o.name) == "gemm" and o.external_id is not None]


@pytest.mark.parametrize(
    "path", [p for p in SHARED_TRACES if p.stat().st_size < 30e6], ids=lambda p: p.name
)
def test_gemm_ops_with_ids_are_those_a_scan_finds(path: Path) -> None:
    from gpuprof_nb.analysis.rules import _gemm_ops_with_ids
    from gpuprof_nb.errors import TraceFormatError

    try:
        trace = load_trace(path)
    except TraceFormatError:
        pytest.skip("not a loadable trace")
    assert _gemm_ops_with_ids(trace) == _gemm_ops_by_scan(trace)


def test_gemm_ops_with_ids_include_other_kinds_of_op_by_name() -> None:
    """An annotation or Python function named like a matmul counts, as the scan counts it;
    ops without an External id do not; the order is trace order."""
    from gpuprof_nb.analysis.rules import _gemm_ops_with_ids

    ops = (
        Op("aten::mm", "op", 0.0, 5.0, 1, 1, external_id=7, index=0),
        Op("aten::mm", "annotation", 1.0, 1.0, 1, 1, external_id=8, index=1),
        Op("aten::addmm", "op", 2.0, 1.0, 1, 1, index=2),
        Op("aten::relu", "op", 3.0, 1.0, 1, 1, external_id=9, index=3),
        Op("aten::conv2d", "python", 4.0, 1.0, 1, 1, external_id=10, index=4),
        Op("aten::bmm", "op", 5.0, 1.0, 1, 2, external_id=11, index=5),
    )
    trace = Trace(
        source="t",
        ops=ops,
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 6.0),
    )
    assert _gemm_ops_with_ids(trace) == _gemm_ops_by_scan(trace)
    assert [o.index for o in _gemm_ops_with_ids(trace)] == [0, 1, 4, 5]


def test_per_step_counts_are_of_what_the_steps_hold() -> None:
    """One 1 ms step in a 2 ms window: 4 syncs and 12 casts inside it, as many after it. The
    per-step figures count what the step holds (4 and 12), not the window's over the one
    step (8 and 24: the issue's "128% of a step" pattern in counts)."""
    runtime, ops, kernels = [], [], []
    for k in range(8):
        t = 50.0 + 250.0 * k
        runtime.append(RuntimeCall("cudaDeviceSynchronize", t, 20.0, 1, 1))
        kernels.append(kernel(t - 40, 30))
        for j in range(3):
            ops.append(op("aten::_to_copy", t + 30 + 10 * j, 5))
    trace = make_trace(
        ops=ops,
        kernels=kernels,
        runtime=runtime,
        steps=(Step(0, "ProfilerStep#0", 0.0, 1000.0),),
        window=(0.0, 2000.0),
    )
    d = diagnose(trace)
    assert d.finding("host_sync").evidence["sync_calls_per_step"] == 4
    assert d.finding("dtype_cast").evidence["casts_per_step"] == 12
