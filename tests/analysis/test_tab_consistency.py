"""The Summary and Timeline tabs show one "GPU busy" figure: same window, same busy time."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprof_nb.analysis.ops import summarize_trace
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parents[1] / "data"
SINGLE_DEVICE = sorted(
    p
    for p in DATA.glob("*/*")
    if p.name.endswith((".json", ".json.gz"))
    and p.parent.name not in ("snapshots",)
    and "raw" not in p.name
)


@pytest.mark.parametrize("path", SINGLE_DEVICE, ids=lambda p: p.parent.name)
def test_summary_and_timeline_agree_on_busy(path: Path) -> None:
    trace = load_trace(path)
    devices = {k.device for k in trace.kernels}
    if len(devices) != 1:
        pytest.skip(f"{len(devices)} devices with kernels: the timeline shows one of them")
    summary, timeline = summarize_trace(trace), device_timeline(trace)
    assert summary.window_us == pytest.approx(timeline.window_us)
    assert summary.busy_us == pytest.approx(timeline.busy_us)
    assert summary.busy_fraction == pytest.approx(timeline.busy_fraction)
