"""The activity window (analysis/timeline.activity_window): from the first to the last
recorded activity (ops, device activity, runtime calls), without the profiler's own span,
within the trace's bounds. Checked against a direct reading of every event."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from _paths import DATA, SHARED_TRACES

from gpuprof_nb.analysis.derived import TraceIndex
from gpuprof_nb.analysis.timeline import activity_window, cell_span
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.frames import Frame
from gpuprof_nb.model.samples import StackSamples
from gpuprof_nb.model.trace import Op, Trace


def _direct(trace: Trace) -> tuple[float, float]:
    """Every event read one by one: earliest start and latest end of what is kept."""
    profiler = {o.name for o in trace.ops if o.name.startswith("PyTorch Profiler")}
    cell = cell_span(trace)
    ops = [o for o in trace.ops if o.name not in profiler and (cell is None or o.kind != "python")]
    seqs = [s for s in (ops, list(trace.kernels), list(trace.runtime)) if s]
    lo, hi = trace.bounds_us
    if not seqs and cell is None:
        return lo, max(hi, lo)
    firsts = [min(x.start_us for x in s) for s in seqs]
    lasts = [max(x.start_us + x.dur_us for x in s) for s in seqs]
    if cell is not None:
        firsts.append(cell[0])
        lasts.append(cell[1])
    a, b = max(min(firsts), lo), min(max(lasts), hi)
    return (a, b) if b > a else (lo, max(hi, lo))


def _trace_files() -> list[Path]:
    # Every trace file in tests/data (snapshots/ holds memory snapshots, not traces).
    folders = [d for d in sorted(DATA.iterdir()) if d.is_dir() and d.name != "snapshots"]
    found = [p for d in folders for p in sorted(d.glob("*.json*"))]
    resnet = (
        SHARED_TRACES / "tracelens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz"
    )
    return [*found, resnet] if resnet.exists() else found


@pytest.mark.parametrize("path", _trace_files(), ids=lambda p: p.parent.name + "/" + p.name)
def test_the_window_is_what_the_events_say(path: Path) -> None:
    trace = load_trace(path)
    assert activity_window(TraceIndex(trace)) == _direct(trace)


def _op(name: str, kind: str, start: float, dur: float, index: int) -> Op:
    return Op(name, kind, start, dur, 1, 1, index=index)  # type: ignore[arg-type]


def _trace(ops: tuple[Op, ...]) -> Trace:
    return Trace(
        source="t",
        ops=ops,
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 1000.0),
    )


def test_the_profilers_own_span_and_annotations_count_as_they_should() -> None:
    ops = (
        _op("PyTorch Profiler (0)", "annotation", 0.0, 900.0, 0),
        _op("aten::mm", "op", 10.0, 5.0, 1),
        _op("step", "annotation", 12.0, 40.0, 2),
        _op("f", "python", 20.0, 60.0, 3),
    )
    trace = _trace(ops)
    assert activity_window(TraceIndex(trace)) == (10.0, 80.0) == _direct(trace)


def test_a_nan_end_in_a_hand_made_trace_is_taken_as_python_max_takes_it() -> None:
    # Python's max keeps the first of values that do not compare greater: a nan after a
    # number is passed over, so the window ends where the events that compare end.
    ops = (
        _op("aten::mm", "op", 10.0, 5.0, 0),
        _op("step", "annotation", 12.0, 40.0, 1),
        _op("f", "python", 20.0, math.nan, 2),
    )
    assert activity_window(TraceIndex(_trace(ops))) == (10.0, 52.0)


def test_with_the_cells_lines_python_events_do_not_widen_the_window() -> None:
    # The cell's lines ran 30..70; a Python event of another thread spans far wider and an
    # annotation ends at 90: the window is the cell's and the kept events'.
    samples = StackSamples(
        frames=(Frame("<cell>", 1, "<module>"),),
        stacks=((), (0,)),
        ts_us=(25.0, 30.0, 50.0, 70.0),
        stack_of=(0, 1, 1, 0),
        period_us=20.0,
        start_us=25.0,
        end_us=80.0,
    )
    ops = (
        _op("f", "python", 1.0, 998.0, 0),
        _op("step", "annotation", 35.0, 55.0, 1),
        _op("aten::mm", "op", 40.0, 5.0, 2),
    )
    trace = dataclasses.replace(_trace(ops), samples=samples)
    assert cell_span(trace) == (30.0, 50.0)
    assert activity_window(TraceIndex(trace)) == (30.0, 90.0) == _direct(trace)
