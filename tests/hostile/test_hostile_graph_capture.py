"""Hostile graph-capture pairs for `load_trace(replay, capture=...)`: captures of tens of
thousands of regions, regions that all overlap, and one region of 30,000 ops replayed 30,000
times (9e8 copies from two files under 10 MB). Each must be the library's own error or a
correct merge, within the harness's memory and time limits (harness.py): on main the first
ran past two minutes and the last would copy without bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import Case

PRELUDE = "from gpuprof_nb import load_trace, analyze\n"


def _x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: Any):
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


def _replays(launches: int, kernels: int = 1) -> dict[str, Any]:
    events = []
    for n in range(launches):
        base, corr = 1000 + 50 * n, 100 + n
        events.append(_x("cuda_runtime", "cudaGraphLaunch", base, 20, correlation=corr))
        for k in range(kernels):
            events.append(
                _x(
                    "kernel",
                    "k",
                    base + 30 + k,
                    0.5,
                    pid=0,
                    tid=7,
                    correlation=corr,
                    stream=7,
                    device=0,
                )
            )
    return {"traceEvents": events}


def _write(tmp_path: Path, name: str, trace: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(trace))
    return str(path)


def test_capture_pairs_are_bounded(hostile, tmp_path: Path) -> None:
    many = []
    for i in range(20_000):
        many.append(_x("cuda_runtime", "cudaStreamBeginCapture", 10 * i, 1, correlation=3 * i))
        many.append(_x("cuda_runtime", "cudaLaunchKernel", 10 * i + 2, 1, correlation=3 * i + 1))
        many.append(
            _x("cuda_runtime", "cudaStreamEndCapture", 10 * i + 5, 1, correlation=3 * i + 2)
        )
    overlapping = [
        _x("cuda_runtime", "cudaStreamBeginCapture", i * 0.001, 0.0001) for i in range(20_000)
    ]
    overlapping += [
        _x("cuda_runtime", "cudaLaunchKernel", 30 + i * 0.001, 0.0005) for i in range(20_000)
    ]
    overlapping.append(_x("cuda_runtime", "cudaStreamEndCapture", 100, 1))
    wide = [_x("cuda_runtime", "cudaStreamBeginCapture", 0, 1, correlation=1)]
    wide += [_x("cpu_op", "aten::add", 2 + i * 0.001, 0.0005) for i in range(30_000)]
    wide.append(_x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=2))
    wide.append(_x("cuda_runtime", "cudaStreamEndCapture", 100, 1, correlation=3))
    small = [
        _x("cuda_runtime", "cudaStreamBeginCapture", 100, 5, correlation=1),
        _x("cpu_op", "aten::relu", 110, 20),
        _x("cuda_runtime", "cudaLaunchKernel", 115, 8, correlation=2),
        _x("cuda_runtime", "cudaStreamEndCapture", 190, 5, correlation=3),
    ]
    pairs = {
        "many-regions": ({"traceEvents": many}, _replays(30_000)),
        "overlapping-regions": ({"traceEvents": overlapping}, _replays(2, 20_000)),
        "wide-region-many-launches": ({"traceEvents": wide}, _replays(30_000)),
    }
    cases = []
    for name, (capture, replay) in pairs.items():
        c, r = (
            _write(tmp_path, f"{name}-capture", capture),
            _write(tmp_path, f"{name}-replay", replay),
        )
        cases.append(Case(name, f"result = analyze(load_trace({r!r}, capture={c!r}))", "either"))
    c, r = (
        _write(tmp_path, "small-capture", {"traceEvents": small}),
        _write(tmp_path, "small-replay", _replays(3)),
    )
    cases.append(
        Case(
            "real-sized",
            f"result = load_trace({r!r}, capture={c!r})",
            "accept",
            check="[o.name for o in result.ops].count('aten::relu') == 3",
        )
    )
    hostile(cases, prelude=PRELUDE, memory_mb=800, seconds=90)
