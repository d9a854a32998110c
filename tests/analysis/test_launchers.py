"""Device work launched outside every torch op, by its runtime call (analysis/launchers.py),
checked against loops over the raw JSON; and the user's line at a point, from the profiler's
python_function events and from a real `%%gpuprofile --stack` run's samples."""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

import gpuprof_nb
from gpuprof_nb.analysis.hotspots import frame_kind
from gpuprof_nb.analysis.launchers import lines_at
from gpuprof_nb.analysis.ops import top_ops
from gpuprof_nb.analysis.sources import profiler_frame_parts, source_label
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parents[1] / "data"
TRACES = [
    DATA / "mi210_gpu_only/gpu_only_trace.json.gz",
    DATA / "a100_event_sync/event_sync_trace.json.gz",
    DATA / "ddp_nccl_sampled/sampled_rank-0.json.gz",
    DATA / "h100_vit_inference/Falconsai_nsfw_image_detection__1016002.json.gz",
    DATA / "a100_nccl/nccl_data.json.gz",
]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name)
def test_work_launched_outside_ops_is_listed_by_its_call(path: Path) -> None:
    events = _events(path)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    op_ext = {e["args"].get("External id") for e in ops}
    calls: dict[int, dict] = {}
    for e in sorted(
        (e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")),
        key=lambda e: e["ts"],
    ):
        corr = e.get("args", {}).get("correlation")
        if corr is not None:
            calls[corr] = e
    want: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in (e for e in events if e.get("cat") in DEVICE_CATS):
        call = calls.get(k["args"].get("correlation"))
        if call is None:
            continue
        inside = any(
            (o["pid"], o["tid"]) == (call["pid"], call["tid"])
            and o["ts"] <= call["ts"] < o["ts"] + o["dur"]
            for o in ops
        )
        if inside or k["args"].get("External id") in op_ext - {None}:
            continue
        want[call["name"]][0] += 1
        want[call["name"]][1] += k["dur"]
    table = top_ops(load_trace(path))
    got: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for r in table.launchers:
        got[r.name][0] += r.kernels
        got[r.name][1] += r.device_us
    assert set(got) == set(want)
    for name, (count, us) in want.items():
        assert got[name][0] == count
        assert got[name][1] == pytest.approx(us)
    assert table.runtime_launched_us == pytest.approx(sum(us for _, us in want.values()))
    assert table.runtime_launched_us <= table.unattributed_device_us + 1e-6


def test_a_trace_without_torch_ops_shows_its_launches_in_top_ops() -> None:
    report = gpuprof_nb.analyze(load_trace(TRACES[0]))
    assert report.ops is not None and not report.ops.rows
    assert report.ops.runtime_launched_us == pytest.approx(report.ops.unattributed_device_us)
    text = report.text()
    top = text[text.index("-- Top ops --") : text.index("-- Kernels --")]
    assert "hipLaunchKernel" in top and "hipExtModuleLaunchKernel" in top
    assert "hipLaunchKernel" in report._repr_mimebundle_()["text/html"]


@pytest.mark.parametrize("path", TRACES[3:4], ids=lambda p: p.parent.name)
def test_the_line_at_a_point_is_the_innermost_user_python_event(path: Path) -> None:
    trace = load_trace(path)
    events = _events(path)
    funcs = [e for e in events if e.get("cat") == "python_function"]
    points = [((str(r.pid), str(r.tid)), r.start_us) for r in trace.runtime]
    got = lines_at(trace, points)
    named = 0
    for (thread, t), line in zip(points, got, strict=True):
        open_ = sorted(
            (
                e
                for e in funcs
                if (str(e["pid"]), str(e["tid"])) == thread and e["ts"] <= t <= e["ts"] + e["dur"]
            ),
            key=lambda e: (e["ts"], -e["dur"]),
        )
        want = ""
        for e in reversed(open_):
            parts = profiler_frame_parts(e["name"])
            if parts and frame_kind(parts[0]) == "user":
                want = source_label(*parts, trace.cells, first_line=True)
                break
        assert line == want
        named += bool(want)
    assert named > 50


torch = pytest.importorskip("torch") if os.environ.get("GPUPROF_NO_TORCH") is None else None


@pytest.mark.usefixtures("one_torch_thread")
def test_the_line_at_a_point_from_the_line_samples(ipython_shell) -> None:
    # A real --stack run on the CPU: the matmul on line 3 runs long enough for samples.
    ip = ipython_shell
    ip.execution_count = 71
    ip.run_cell("import torch")
    ip.execution_count = 71
    ip.run_cell_magic(
        "gpuprofile",
        "-o r --quiet --stack --warmup 0 --repeat 1 --number 1",
        "x = torch.randn(384, 384)\nfor _ in range(6):\n    y = x @ x @ x @ x\n",
    )
    trace = ip.user_ns["r"].trace
    assert trace.samples is not None and len(trace.samples) > 0
    mms = [o for o in trace.ops if o.kind == "op" and o.name == "aten::matmul"]
    assert mms
    lines = lines_at(trace, [((str(o.pid), str(o.tid)), o.start_us + o.dur_us / 2) for o in mms])
    # One sample every 5 ms stands for the time before it: a 1 ms matmul's point may fall
    # to the loop's other lines' samples, never outside the cell.
    assert all(line.startswith("In [71], line ") for line in lines), lines
    assert sum(line.startswith("In [71], line 3") for line in lines) >= 0.6 * len(mms), lines


DIRECT = DATA / "gpu" / "direct_launch.json.gz"


@pytest.mark.skipif(
    not DIRECT.exists(),
    reason="a Triton kernel launched directly is recorded on a CUDA machine by "
    "tools/record_graph_capture.py (not recorded yet)",
)
def test_a_directly_launched_triton_kernel_is_under_its_call_and_line() -> None:
    table = top_ops(load_trace(DIRECT))
    rows = [r for r in table.launchers if r.kernels >= 10]
    assert rows, table.launchers
    (row,) = rows
    assert row.name in ("cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernel")
    assert "record_graph_capture.py" in row.line
    assert table.runtime_launched_us == pytest.approx(table.unattributed_device_us)


# TraceLens's published kernel summaries (AMD-AGI/TraceLens @ 171dd74,
# tests/traces/<dir>/<name>_perf_report_csvs/kernel_summary.csv): the device time and count of
# the kernels whose parent op category is "runtime" (a launch call with no cpu_op around it),
# summed over the CSV's rows. Only the MI210 GPU-only trace has any.
TRACELENS_RUNTIME = {
    "mi210_gpu_only/gpu_only_trace.json.gz": (5343.422, 562),
    "h100_vit_inference/Falconsai_nsfw_image_detection__1016002.json.gz": (0.0, 0),
    "h100_bert_small/gaunernst_bert-small-uncased__1016001.json.gz": (0.0, 0),
    "mi300_bert_small/gaunernst_bert-small-uncased__1016001.json.gz": (0.0, 0),
}


@pytest.mark.parametrize("name", sorted(TRACELENS_RUNTIME), ids=lambda n: n.split("/")[0])
def test_runtime_launched_time_matches_tracelens_published_summary(name: str) -> None:
    us, count = TRACELENS_RUNTIME[name]
    table = top_ops(load_trace(DATA / name))
    assert table is not None
    assert table.runtime_launched_us == pytest.approx(us, rel=0.01, abs=1e-6)
    assert sum(row.kernels for row in table.launchers) == count
