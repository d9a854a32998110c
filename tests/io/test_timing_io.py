"""Timed samples kept with a trace (io/timing.py): written by report.save(), read back by
analyze(), strict about what is malformed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.timing import timing_dict, timing_of, with_timing
from gpuprof_nb.io.trace import load_trace, trace_from_dict
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.session.analyze import analyze

STATS = TimingStats(
    wall_us=(10.0, 11.5, 9.75),
    device_us=(8.0, 8.5, 8.25),
    warmup_wall_us=(40.0,),
    device_name="NVIDIA H100",
    steps_per_run=4,
    number=16,
    calibration_runs=32,
    waited_fraction=0.0,
)
EVENTS = {
    "traceEvents": [
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 5, "pid": 1, "tid": 1}
    ]
}


def test_round_trip_through_a_saved_report(tmp_path: Path) -> None:
    assert timing_of({"gpuprof_nb": {"timing": timing_dict(STATS)}}) == STATS
    artifact = copy.deepcopy(EVENTS)
    live = ProfileReport(timing=STATS, trace=trace_from_dict(artifact), artifact=artifact)
    for name in ("t.json", "t.json.gz"):
        saved = live.save(tmp_path / name)
        again = analyze(load_trace(saved))
        assert again.timing == STATS
    assert "gpuprof_nb" not in artifact  # the live report's own dict is left alone
    assert analyze(trace_from_dict(EVENTS)).timing is None


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ([1, 2], "gpuprof_nb.timing"),
        ({"wall_us": []}, "wall_us"),
        ({"wall_us": [1.0, "x"]}, "wall_us[1]"),
        ({"wall_us": [1.0, -2.0]}, "wall_us[1]"),
        ({"wall_us": [1.0], "device_us": [1.0, 2.0]}, "device_us"),
        ({"wall_us": [1.0], "number": 0}, "number"),
        ({"wall_us": [1.0], "once": "yes"}, "once"),
        ({"wall_us": [1.0], "device_name": 3}, "device_name"),
        ({"wall_us": [1.0], "waited_fraction": 1.5}, "waited_fraction"),
        ({"wall_us": [1.0], "waited_fraction": True}, "waited_fraction"),
        ({"wall_us": [1.0], "waited_fraction": "0.1"}, "waited_fraction"),
    ],
)
def test_malformed_entries_name_the_field(entry, field) -> None:
    with pytest.raises(TraceFormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
        timing_of({"gpuprof_nb": {"timing": entry}})
    # analyze keeps the trace and says why the samples were left out.
    report = analyze(
        trace_from_dict(with_timing(EVENTS, STATS) | {"gpuprof_nb": {"timing": entry}})
    )
    assert report.timing is None
    assert any("timed samples could not be computed" in n for n in report.notes)
