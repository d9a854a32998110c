"""Words agree with numbers (issue 32): a finding's title quotes the Summary's counts, its
evidence reads with its headline share, and a run without CUDA gets no CUDA-only advice."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gpuprof_nb import analyze_memory  # reads raw snapshot dicts (session/analyze.py)
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.trace import Step

DATA = Path(__file__).resolve().parents[1] / "data"
PLANTED = DATA / "planted_cpu"
# Settings that only mean something with CUDA.
CUDA_ONLY = re.compile(
    r"autocast\(\s*['\"]cuda|PYTORCH_CUDA_ALLOC_CONF|torch\.cuda\.|GradScaler\(\s*['\"]cuda"
    r"|reduce-overhead|pin_memory|non_blocking|cudnn"
)


def with_steps(trace, n: int):
    """The trace's window cut into n equal ProfilerStep annotations."""
    lo, hi = trace.bounds_us
    width = (hi - lo) / n
    steps = tuple(
        Step(k, f"ProfilerStep#{k}", lo + k * width, lo + (k + 1) * width) for k in range(n)
    )
    return dataclasses.replace(trace, steps=steps)


@pytest.mark.parametrize("steps", [0, 4])
def test_tiny_ops_title_quotes_the_summarys_count(steps: int) -> None:
    trace = load_trace(PLANTED / "launch_overhead.json.gz")
    if steps:
        trace = with_steps(trace, steps)
    r = analyze(trace)
    f = r.diagnosis.finding("launch_overhead")
    assert f is not None and f.title.startswith("Thousands of tiny ops")
    summary = r.summary
    if steps:
        shown = summary.ops_per_step
        assert f"{shown:.0f} per step" in f.title
    else:
        shown = summary.op_count
        assert f"{shown:.0f} in the cell" in f.title
    assert f.evidence["ops_per_step"] == pytest.approx(shown)
    # The Summary's text says the same number.
    assert f"{shown:,.0f}" in r.text() or f"{shown:.0f}" in r.text()
    assert f.evidence["top_level_ops_per_step"] < shown


@pytest.mark.parametrize(
    "path",
    [
        PLANTED / "python_overhead.json.gz",
        PLANTED / "launch_overhead.json.gz",
        DATA / "gloo_run" / "balanced" / "rank-0.json.gz",
        DATA / "a100_event_sync" / "event_sync_trace.json.gz",
    ],
    ids=lambda p: p.parent.name + "/" + p.name,
)
def test_python_overhead_evidence_reads_with_its_headline(path: Path) -> None:
    """The case the issue met: '5% of the time is Python outside torch ops' beside 'wall not
    in torch ops 75.0%'. The evidence now names the headline's share and the whole it is a
    part of, and every figure of the title is in it."""
    f = analyze(load_trace(path)).diagnosis.finding("python_overhead")
    assert f is not None
    head = int(re.search(r"(\d+)%", f.title).group(1))
    assert round(f.share * 100) == head
    ev = f.evidence
    if "python_outside_ops_fraction" in ev:  # CPU: Python is part of the time between ops
        assert ev["python_outside_ops_fraction"] == pytest.approx(f.share)
        assert ev["python_outside_ops_fraction"] <= ev["between_ops_fraction"] + 1e-9
        assert f"{ev['between_ops_fraction'] * 100:.0f}% of the time is between ops" in f.title
        # The dispatch gaps are a share of the whole time, like the others, and say so.
        dispatch = ev["dispatch_gaps_between_ops_fraction"]
        if dispatch >= 0.005:
            assert f"{dispatch * 100:.0f}% of the time in short dispatch gaps" in f.title
    else:  # GPU: the device idle while the host ran Python
        assert ev["device_idle_host_outside_ops_fraction"] == pytest.approx(f.share)
    assert "wall_not_in_torch_ops_fraction" not in ev
    for name, value in ev.items():
        if name.endswith("_fraction"):
            assert 0.0 <= value <= 1.0, name


CPU_TRACES = sorted(
    p
    for p in DATA.rglob("*.json.gz")
    if "golden" not in p.parts and "gpu" not in p.parts and p.name != "memory_timeline.raw.gz"
)


@pytest.mark.parametrize("path", CPU_TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_no_cuda_only_advice_without_cuda(path: Path) -> None:
    trace = load_trace(path)
    if trace.kernels or trace.runtime:
        pytest.skip("a device program")
    d = analyze(trace).diagnosis
    for f in d.considered:
        assert not CUDA_ONLY.search(f.fix), (f.kind, CUDA_ONLY.search(f.fix).group(0))


def test_cpu_memory_advice_names_no_cuda_setting() -> None:
    """The CPU fallback's snapshot (the host's memory): the peak advice suggests CPU
    autocast where it helps, and no CUDA allocator setting."""
    entries = [
        {
            "action": "alloc",
            "addr": 4096 * k,
            "size": 4096,
            "frames": [{"filename": "/home/me/train.py", "line": 3, "name": "step"}],
            "time_us": 10 * k,
        }
        for k in range(4)
    ]
    snap = {
        "segments": [],
        "device_traces": [entries],
        "gpuprof_nb": {"source": "cpu-profiler", "step_starts": [[]], "notes": []},
    }
    report = analyze_memory(snap)
    fixes = " ".join(f.fix for f in report.findings)
    assert "torch.autocast('cpu'" in fixes
    assert not CUDA_ONLY.search(fixes), CUDA_ONLY.search(fixes).group(0)
    cuda = dict(snap, gpuprof_nb={"source": "cuda", "step_starts": [[]], "notes": []})
    assert "PYTORCH_CUDA_ALLOC_CONF" in " ".join(f.fix for f in analyze_memory(cuda).findings)
