"""`load_trace(replay, capture=...)`: a CUDA graph's replayed kernels attributed to the ops
that launched them when the graph was captured (io/graph_capture.py).

No shared trace holds a graph's capture (the only replays, in HTA's
negative_queue_length_values_check trace, come without theirs): `tools/record_graph_capture.py`
records a real pair on a CUDA machine into tests/data/gpu/, and the test on it runs once they
are there. Until then the merge is checked on the smallest traces of the same shape the
profiler writes (the events and args Kineto writes for a capture and a replay), built here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprof_nb.analysis.ops import top_ops
from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parents[1] / "data"
CAPTURE = DATA / "gpu" / "graph_capture.json.gz"
REPLAY = DATA / "gpu" / "graph_replay.json.gz"


def _x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _capture_trace() -> dict:
    # Capture of linear -> relu: two ops, each with its launch call, between the capture's
    # begin and end; no kernel runs during a capture.
    return {
        "traceEvents": [
            _x("cuda_runtime", "cudaStreamBeginCapture", 100, 5, correlation=1),
            _x("cpu_op", "aten::linear", 110, 40, **{"External id": 7}),
            _x("cpu_op", "aten::addmm", 115, 30, **{"External id": 8}),
            _x("cuda_runtime", "cudaLaunchKernel", 120, 10, correlation=2),
            _x("cpu_op", "aten::relu", 160, 20, **{"External id": 9}),
            _x("cuda_runtime", "cudaLaunchKernel", 165, 8, correlation=3),
            _x("cuda_runtime", "cudaStreamEndCapture", 190, 5, correlation=4),
        ]
    }


def _replay_trace(replays: int = 2) -> dict:
    events = []
    for n in range(replays):
        base = 1000 + 500 * n
        corr = 100 + n
        events.append(_x("cuda_runtime", "cudaGraphLaunch", base, 20, correlation=corr))
        events.append(
            _x("kernel", "gemm", base + 30, 50, pid=0, tid=7, correlation=corr, stream=7, device=0)
        )
        events.append(
            _x("kernel", "relu", base + 82, 5, pid=0, tid=7, correlation=corr, stream=7, device=0)
        )
    return {"traceEvents": events}


def _files(tmp_path: Path, capture: dict, replay: dict) -> tuple[Path, Path]:
    c, r = tmp_path / "capture.json", tmp_path / "replay.json"
    c.write_text(json.dumps(capture))
    r.write_text(json.dumps(replay))
    return c, r


def test_replayed_kernels_go_to_the_captured_ops(tmp_path: Path) -> None:
    capture, replay = _files(tmp_path, _capture_trace(), _replay_trace())
    bare = top_ops(load_trace(replay))
    assert bare.unattributed_device_us == 2 * (50 + 5) and not bare.rows
    merged = load_trace(replay, capture=capture)
    table = top_ops(merged)
    assert table.unattributed_device_us == 0
    rows = {r.name: r for r in table.rows}
    # Each replay ran each captured op once: calls = replays; device time by the op that
    # launched it when captured, and the nesting the capture recorded (addmm in linear).
    assert (rows["aten::addmm"].calls, rows["aten::addmm"].self_device_us) == (2, 100)
    assert (rows["aten::linear"].self_device_us, rows["aten::linear"].total_device_us) == (0, 100)
    assert rows["aten::relu"].self_device_us == 10
    # The copies sit inside their graph launch call, in the capture's order and nesting.
    launch = next(r for r in merged.runtime if r.name == "cudaGraphLaunch")
    first = [o for o in merged.ops if launch.start_us <= o.start_us < launch.end_us]
    assert [o.name for o in first] == ["aten::linear", "aten::addmm", "aten::relu"]
    assert all(o.end_us <= launch.end_us + 1e-9 for o in first)
    assert any("graph replays: 4 kernels of 2 graph launches" in w for w in merged.load_warnings)


def test_a_capture_without_a_region_or_a_match_is_an_error(tmp_path: Path) -> None:
    no_region = {"traceEvents": _capture_trace()["traceEvents"][1:-1]}
    capture, replay = _files(tmp_path, no_region, _replay_trace())
    with pytest.raises(TraceFormatError, match="no graph capture in this trace"):
        load_trace(replay, capture=capture)
    three = _replay_trace()
    three["traceEvents"].append(
        _x("kernel", "extra", 1090, 1, pid=0, tid=7, correlation=100, stream=7, device=0)
    )
    capture, replay = _files(tmp_path, _capture_trace(), three)
    merged = load_trace(replay, capture=capture)  # the second launch still matches
    assert any("1 launches matched no captured graph" in w for w in merged.load_warnings)


@pytest.mark.skipif(
    not (CAPTURE.exists() and REPLAY.exists()),
    reason="a real graph capture/replay pair is recorded on a CUDA machine by "
    "tools/record_graph_capture.py (not recorded yet)",
)
def test_a_real_graph_replay_is_attributed_to_its_captured_ops() -> None:
    bare = top_ops(load_trace(REPLAY))
    merged = load_trace(REPLAY, capture=CAPTURE)
    table = top_ops(merged)
    assert bare.unattributed_device_us > 0
    assert table.unattributed_device_us < 0.05 * bare.unattributed_device_us
    names = {r.name for r in table.rows if r.self_device_us > 0}
    assert {"aten::addmm"} <= names or {"aten::mm"} <= names
