"""A GPU program whose kernels were not recorded (CUPTI range-profiler mode, or no
ProfilerActivity.CUDA) is never called healthy from host op names: the device is not judged,
and the diagnosis says what the trace holds instead and how to record kernels. CPU-only
traces are judged from the host as before."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from gpuprof_nb.analysis.diagnose import (
    CPU_FIXES,
    FIXES,
    LINE_CAUSES,
    STACK_HINT,
    diagnose,
    unrecorded_launches,
)
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.trace import DeviceInfo, Op, RuntimeCall, Trace

DATA = Path(__file__).resolve().parents[1] / "data"
RANGE = DATA / "a100_cupti_range" / "benchmark_result_924719_1679055439_trace.json.gz"
NOT_DEVICE_KINDS = {"compute_bound", "memory_bound", "precision", "host_sync", "host_device_copy"}


def raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)["traceEvents"]


def test_range_profiler_trace_is_not_called_healthy():
    events = raw_events(RANGE)
    cats = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    # What the file holds, read without the loader: range-profiler events, no kernels.
    assert cats["cuda_profiler_range"] > 0 and cats["kernel"] == 0
    queued = Counter(
        e["name"]
        for e in events
        if e.get("cat") == "cuda_runtime"
        and any(w in e["name"] for w in ("Launch", "Memcpy", "Memset"))
    )
    trace = load_trace(RANGE)
    assert len(unrecorded_launches(trace)) == sum(queued.values())
    d = diagnose(trace)
    assert "healthy" not in d.verdict.lower()
    assert d.verdict.startswith("GPU not judged")
    assert f"{sum(queued.values())} calls" in d.verdict
    assert not NOT_DEVICE_KINDS & {f.kind for f in d.considered}
    (why,) = [x for x in d.not_judged if x.startswith("compute_bound")]
    assert f"{queued['cudaLaunchKernel']} cudaLaunchKernel" in why
    assert "no kernel events" in why and "ProfilerActivity.CUDA" in why
    assert "cuda_profiler_range" in why
    # A GPU program: the host findings that remain keep their CUDA fixes (those about idle
    # time say how to get the lines behind it: the trace has no stacks).
    assert d.considered
    for f in d.considered:
        hint = STACK_HINT if f.kind in LINE_CAUSES else ""
        assert f.fix == FIXES[f.kind] + hint


def plain_trace(runtime=()) -> Trace:
    # One large host matmul: by op names alone, 100% of the op time is a matmul.
    ops = (Op("aten::mm", "op", 0.0, 900.0, 1, 1), Op("aten::add", "op", 950.0, 40.0, 1, 1))
    return Trace(
        source="hand",
        ops=ops,
        kernels=(),
        runtime=tuple(runtime),
        syncs=(),
        memory=(),
        steps=(),
        devices=(DeviceInfo(0, "GPU", compute_capability=(8, 0)),),
        distributed=None,
        bounds_us=(0.0, 1000.0),
    )


def test_planted_launches_without_kernels_leave_the_device_unjudged():
    launches = [
        RuntimeCall("cudaLaunchKernel", 10.0 + i, 0.5, 1, 1, correlation=i) for i in range(3)
    ]
    copy = RuntimeCall("cudaMemcpyAsync", 20.0, 1.0, 1, 1, correlation=9)
    d = diagnose(plain_trace(launches + [copy]))
    assert d.finding("compute_bound") is None and d.finding("memory_bound") is None
    assert d.verdict.startswith("GPU not judged: 4 calls")
    assert any("3 cudaLaunchKernel, 1 cudaMemcpyAsync" in x for x in d.not_judged)


def test_cpu_only_runs_are_still_judged_from_the_host():
    # No runtime calls (a CPU program), or only calls that queue no device work.
    for runtime in ((), (RuntimeCall("cudaGetDeviceCount", 5.0, 1.0, 1, 1),)):
        trace = plain_trace(runtime)
        assert unrecorded_launches(trace) == ()
        d = diagnose(trace)
        cb = d.finding("compute_bound")
        assert cb is not None and cb.evidence["gemm_time_us"] == pytest.approx(900.0)
        assert cb.fix == CPU_FIXES["compute_bound"]
        assert not d.verdict.startswith("GPU not judged")


# (mtia_inference was here: its mtia_ccp_events are device activity now, tests/io/test_mtia.py)
@pytest.mark.parametrize("name", ["rank_non_gpu", "cpu_only_trace"])
def test_real_traces_without_launches_keep_host_verdicts(name):
    trace = load_trace(next((DATA / name).glob("*.json*")))
    assert not trace.kernels and unrecorded_launches(trace) == ()
    d = diagnose(trace)
    assert not d.verdict.startswith("GPU not judged")
    assert any(x.startswith("host_sync, precision, host_device_copy") for x in d.not_judged)


def test_every_tab_says_the_device_ran_unrecorded_not_cpu_only():
    """The Summary, Kernels, Timeline and Roofline of the range-profiler trace say the GPU's
    work went unrecorded, never that it was a CPU run; the count is the trace's own."""
    from gpuprof_nb.analysis.report import analyze
    from gpuprof_nb.render.profile import profile_sections

    events = raw_events(RANGE)
    queued = sum(
        1
        for e in events
        if e.get("cat") == "cuda_runtime"
        and any(w in e["name"] for w in ("Launch", "Memcpy", "Memset"))
    )
    report = analyze(load_trace(RANGE))
    assert report.summary.unrecorded_launches == report.kernels.unrecorded_launches == queued
    sections = {s.title: s.text for s in profile_sections(report)}
    assert f"not judged: {queued} calls queued GPU work" in sections["Summary"]
    assert f"No kernel events, though {queued} calls queued GPU work" in sections["Kernels"]
    assert f"the GPU ran ({queued} calls queued work on it)" in sections["Timeline"]
    assert "GPU kernels not recorded" in sections["Roofline"]
    text = report.text()
    assert "CPU-only" not in text and "CPU trace" not in text
    assert "no device activity" not in text
