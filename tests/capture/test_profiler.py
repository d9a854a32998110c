"""profile_cell on CPU: a Chrome-trace dict, steps for several runs, stacks, memory events,
and no profiler left running when the cell raises."""

from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from gpuprof_nb.capture.profiler import (  # noqa: E402
    WARMUP_MARKER,
    ProfilerStoppedByCell,
    drop_warmup,
    profile_cell,
    profiler_running,
)
from gpuprof_nb.errors import CaptureError  # noqa: E402

A = torch.randn(64, 64)


def matmuls() -> None:
    for _ in range(3):
        A @ A


def exported(prof) -> dict:
    """The Chrome trace a finished torch profiler exports, as a dict."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        prof.export_chrome_trace(fh.name)
        with open(fh.name) as f:
            return json.load(f)


def events(trace: dict, cat: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == cat]


def test_cpu_trace_dict_has_the_ops_with_shapes() -> None:
    trace = profile_cell(matmuls, cuda=False)
    assert isinstance(trace["traceEvents"], list)
    mm = [e for e in events(trace, "cpu_op") if e["name"] == "aten::mm"]
    assert len(mm) == 3  # one per matmul in the cell, counted independently in the raw JSON
    assert mm[0]["args"]["Input Dims"] == [[64, 64], [64, 64]]
    # A single run gets no step annotation of ours.
    assert not [e for e in events(trace, "user_annotation") if "ProfilerStep" in e["name"]]
    assert not profiler_running()


def test_several_runs_become_steps() -> None:
    trace = profile_cell(matmuls, runs=2, cuda=False)
    names = sorted(e["name"] for e in events(trace, "user_annotation"))
    assert names == ["ProfilerStep#0", "ProfilerStep#1"]
    assert len([e for e in events(trace, "cpu_op") if e["name"] == "aten::mm"]) == 6


def test_stack_records_python_call_stacks() -> None:
    trace = profile_cell(matmuls, stack=True, cuda=False)
    stacks = [e["args"].get("Call stack", "") for e in events(trace, "cpu_op")]
    assert any("matmuls" in s for s in stacks)


def test_memory_records_allocator_events() -> None:
    def alloc() -> None:
        torch.ones(1000, 1000)

    trace = profile_cell(alloc, memory=True, cuda=False)
    mem = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    assert any(e["args"]["Bytes"] == 4_000_000 for e in mem)


@pytest.mark.parametrize("exc_type", [ValueError, KeyboardInterrupt])
def test_raising_cell_stops_the_profiler_and_propagates(exc_type: type[BaseException]) -> None:
    exc = exc_type("stop here")

    def run() -> None:
        A @ A
        raise exc

    with pytest.raises(exc_type) as info:
        profile_cell(run, cuda=False)
    assert info.value is exc
    assert not profiler_running()
    # And a new profile can start straight away.
    assert profile_cell(matmuls, cuda=False)["traceEvents"]


def test_refuses_to_nest_inside_a_running_profiler() -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(CaptureError, match="already recording"):
            profile_cell(matmuls, cuda=False)
    assert not profiler_running()


def test_a_cell_with_its_own_profiler_is_refused_not_crashed() -> None:
    # Exporting after an inner profiler ended the session segfaults torch 2.13; reaching the
    # asserts at all is part of the test.
    ran = []

    def run() -> None:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            A @ A
        ran.append(True)

    with pytest.raises(ProfilerStoppedByCell, match="profiler of its own"):
        profile_cell(run, cuda=False)
    assert ran == [True]
    assert not profiler_running()
    assert profile_cell(matmuls, cuda=False)["traceEvents"]


@pytest.fixture
def exit_raises_when_stopped(monkeypatch):
    """torch 2.11's profile.__exit__ (seen on an H100 machine): it raises "Can't disable
    Kineto profiler when it's not running" after a cell's own profiler ended the session,
    where torch 2.13 returns."""
    original = torch.profiler.profile.__exit__

    def exit_like_2_11(self, *exc):
        running = profiler_running()
        original(self, *exc)
        if not running:
            raise RuntimeError("Can't disable Kineto profiler when it's not running")

    monkeypatch.setattr(torch.profiler.profile, "__exit__", exit_like_2_11)


def test_own_profiler_is_refused_where_exit_raises_too(exit_raises_when_stopped) -> None:
    def run() -> None:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            A @ A

    with pytest.raises(ProfilerStoppedByCell, match="profiler of its own"):
        profile_cell(run, cuda=False)
    assert not profiler_running()


def test_own_profiler_then_the_cells_error_propagates_unchanged(exit_raises_when_stopped) -> None:
    mine = KeyError("the cell's own")

    def run() -> None:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            A @ A
        raise mine

    with pytest.raises(KeyError) as info:
        profile_cell(run, cuda=False)
    assert info.value is mine
    assert not profiler_running()


def test_drop_warmup_takes_out_what_ended_before_the_marker_ended() -> None:
    """The CUDA warm-up's cut, on a real CPU trace: the marker, the ops inside and before it
    go; the ops after it and an annotation spanning it stay."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("spanning"):
            A @ A  # before the warm-up
            with record_function(WARMUP_MARKER):
                A + A
            for _ in range(2):
                A @ A
    raw = exported(prof)
    names = [e.get("name") for e in raw["traceEvents"]]
    assert names.count("aten::mm") == 3 and "aten::add" in names
    meta = sum(1 for e in raw["traceEvents"] if e.get("ph") == "M")
    went = drop_warmup(raw)
    kept = [e.get("name") for e in raw["traceEvents"]]
    assert kept.count("aten::mm") == 2 and "aten::add" not in kept
    assert WARMUP_MARKER not in kept and "spanning" in kept
    # What spans the cut starts at it, so the trace's window begins after the warm-up.
    first_mm = min(e["ts"] for e in raw["traceEvents"] if e.get("name") == "aten::mm")
    timed = [e for e in raw["traceEvents"] if e.get("ph") != "M" and "ts" in e]
    assert min(e["ts"] for e in timed) <= first_mm
    spanning = next(e for e in raw["traceEvents"] if e.get("name") == "spanning")
    assert spanning["ts"] + spanning["dur"] >= first_mm
    assert sum(1 for e in raw["traceEvents"] if e.get("ph") == "M") == meta
    assert went >= 3
    # A trace without the marker is left as it was.
    assert drop_warmup(raw) == 0


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_a_failed_warm_up_is_said_to_be_the_gpus_and_stops_the_profiler(monkeypatch) -> None:
    """cuda=True on this CPU machine: the warm-up's first CUDA call fails, as a GPU with a
    sticky error would; the error says it happened before the cell, the cell never ran,
    and no profiler is left running."""
    ran = []
    real_zeros = torch.zeros

    def zeros(*args, **kwargs):
        if kwargs.get("device") == "cuda":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros)
    with pytest.raises(CaptureError, match="before the cell ran") as info:
        profile_cell(lambda: ran.append(True), cuda=True)
    assert "illegal memory access" in str(info.value)
    assert ran == [] and not profiler_running()


def test_drop_warmup_under_stack_starts_the_window_at_the_cut() -> None:
    """With Python stacks on (--stack), the enclosing Python calls span the warm-up: they are
    cut to start after it, so the analysis window does not begin with the warm-up's time
    (which would read as Python overhead)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpuprof_nb.analysis.timeline import device_timeline
    from gpuprof_nb.io.trace import trace_from_dict

    def warm_then_work() -> None:
        with record_function(WARMUP_MARKER):
            until = time.perf_counter() + 0.005
            while time.perf_counter() < until:
                pass
        for _ in range(3):
            A @ A

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        warm_then_work()
    raw = exported(prof)
    cut = max(e["ts"] + e["dur"] for e in raw["traceEvents"] if e.get("name") == WARMUP_MARKER)
    drop_warmup(raw)
    timed = [e for e in raw["traceEvents"] if e.get("ph") != "M" and "ts" in e]
    assert min(e["ts"] for e in timed) >= cut
    trace = trace_from_dict(raw, "stack")
    # The trace's clock against the raw one, through the first matmul.
    raw_mm = min(e["ts"] for e in raw["traceEvents"] if e.get("name") == "aten::mm")
    offset = min(o.start_us for o in trace.ops if o.name == "aten::mm") - raw_mm
    # The analysis window starts at the cut, not at the warm-up (without the clipping the
    # enclosing Python calls would start it 5 ms or more earlier).
    assert device_timeline(trace).start_us >= cut + offset - 1e-3


def test_trace_dict_loads_through_the_trace_reader() -> None:
    io_trace = pytest.importorskip("gpuprof_nb.io.trace")
    raw = profile_cell(matmuls, cuda=False)
    trace = io_trace.trace_from_dict(raw, "live")
    assert len([o for o in trace.ops if o.name == "aten::mm"]) == 3
    assert not trace.kernels


@pytest.mark.gpu
def test_cuda_trace_has_the_matmul_kernels() -> None:
    a = torch.randn(1024, 1024, device="cuda")

    def run() -> None:
        for _ in range(4):
            a @ a

    raw = profile_cell(run, cuda=True)
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) >= 4
    # The profiler warm-up's kernels and marker are out of the trace.
    assert not [e for e in raw["traceEvents"] if e.get("name") == WARMUP_MARKER]
    assert len([e for e in raw["traceEvents"] if e.get("name") == "aten::mm"]) == 4


@pytest.mark.parametrize(
    "text",
    [
        b'{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1.5, "dur": 2}], '
        b'"n": 18446744073709551617}',
        # what msgspec refuses and the standard library reads: a raw control character in a
        # name (Kineto writes them), NaN, and bytes that are not UTF-8
        b'{"traceEvents": [{"ph": "X", "name": "a\tb\x01", "ts": 1, "dur": 2}]}',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": NaN}]}',
        b'{"traceEvents": [{"ph": "X", "name": "caf\xe9", "ts": 1, "dur": 2}]}',
    ],
    ids=["plain", "control", "nan", "latin1"],
)
def test_the_exported_trace_reads_as_the_standard_library_reads_it(text: bytes) -> None:
    import json
    import math

    from gpuprof_nb.capture.profiler import _parse_export

    got = _parse_export(text)
    want = json.loads(text.decode("utf-8", errors="replace"), strict=False)
    dur = want["traceEvents"][0]["dur"]
    if isinstance(dur, float) and math.isnan(dur):
        assert math.isnan(got["traceEvents"][0]["dur"])
        got["traceEvents"][0]["dur"] = want["traceEvents"][0]["dur"] = 0
    assert got == want


# Labels Kineto writes wrongly: a quote unescaped (invalid JSON), a backslash as '/', a tab,
# a control character or any non-ASCII character as "unknown".
ODD_LABELS = ['say "hi"', "back\\slash", "tab\there", "ctl\x01", "uni é ✓", 'both \\ "q"']


def test_record_function_labels_with_quotes_and_backslashes_survive_the_export() -> None:
    """A real profiler run: Kineto's file is repaired (quotes escaped) and the labels it
    altered are put back from the profiler's own events, so the trace loads with every
    label as the cell wrote it."""
    from gpuprof_nb.io.trace import trace_from_dict

    def labelled() -> None:
        for label in ODD_LABELS:
            with torch.profiler.record_function(label):
                A @ A

    trace = profile_cell(labelled, cuda=False)
    names = [e["name"] for e in events(trace, "user_annotation")]
    assert names == ODD_LABELS
    loaded = trace_from_dict(trace, "live")
    assert [o.name for o in loaded.ops if o.kind == "annotation"] == ODD_LABELS


def test_kineto_writes_these_labels_wrongly_without_the_repair() -> None:
    """What the repair is for (if Kineto learns to escape, this test says so)."""
    import json

    from gpuprof_nb.capture.profiler import repair_names

    with torch.profiler.profile() as prof:
        with torch.profiler.record_function(ODD_LABELS[0]):
            A @ A
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        prof.export_chrome_trace(fh.name)
        raw = open(fh.name, "rb").read()
    with pytest.raises(ValueError):
        json.loads(raw)
    fixed = json.loads(repair_names(raw))
    assert ODD_LABELS[0] in [e.get("name") for e in fixed["traceEvents"]]
