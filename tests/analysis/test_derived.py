"""What several tabs and rules need is derived once per trace (analysis/derived.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprof_nb.analysis import derived, timeline
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.mark.parametrize("name", ["a100_nccl", "cpu_only_trace"])
def test_a_report_derives_shared_work_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = next(p for p in sorted((DATA / name).iterdir()) if ".json" in p.name)
    trace = load_trace(path)
    built: list[object] = []
    tops: list[object] = []
    real_columns, real_top = derived.OpColumns, timeline._top_level_positions

    def columns(t):  # type: ignore[no-untyped-def]
        built.append(t)
        return real_columns(t)

    def top(t):  # type: ignore[no-untyped-def]
        tops.append(t)
        return real_top(t)

    monkeypatch.setattr(derived, "OpColumns", columns)
    monkeypatch.setattr(timeline, "_top_level_positions", top)
    report = analyze(trace)
    report._repr_mimebundle_()
    # The Timeline tab nests a window's ops on its own small trace; the report's trace is
    # derived once, however many tabs and rules read it.
    assert sum(t is trace for t in built) == 1
    assert sum(t is trace for t in tops) == 1
    assert trace.derived, "the shared results live on the trace"
    # Not part of the trace's value.
    assert trace == load_trace(path)
