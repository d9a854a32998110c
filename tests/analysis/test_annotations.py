"""The Annotations table (analysis/annotations.py) on real traces, against sums made with
loops over the raw JSON: host time and calls by name (what HolisticTraceAnalysis's CPU
annotation breakdown sums), device-side spans by name (its GPU breakdown), the device time
launched inside each range, and the kernels each device-side range overlaps."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import gpuprof_nb
from gpuprof_nb.analysis.annotations import annotation_table, kernel_gpu_annotations, row_name
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parents[1] / "data"
NS = DATA / "v100_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
TRACES = [
    NS,
    DATA / "a100_nccl/nccl_data.json.gz",
    DATA / "amd_mi250_toy/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    DATA / "h100_vit_inference/Falconsai_nsfw_image_detection__1016002.json.gz",
    DATA / "ddp_nccl_sampled/sampled_rank-0.json.gz",
    DATA / "planted_cpu/dataloader.json.gz",
]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.parent.name)
def case(request: pytest.FixtureRequest) -> tuple:
    return annotation_table(load_trace(request.param)), _events(request.param)


def _by_name(table, field: str) -> dict[str, float]:  # noqa: ANN001 - a test helper
    out: dict[str, float] = defaultdict(float)
    for r in table.rows:
        out[r.name] += getattr(r, field)
    return out


def test_host_time_and_calls_by_name_are_the_raw_sums(case: tuple) -> None:
    table, events = case
    ranges = [e for e in events if e.get("cat") == "user_annotation"]
    want_us: dict[str, float] = defaultdict(float)
    want_calls: Counter[str] = Counter()
    for e in ranges:
        want_us[row_name(e["name"])] += e["dur"]
        want_calls[row_name(e["name"])] += 1
    assert table.ranges == len(ranges)
    assert _by_name(table, "host_us") == pytest.approx(dict(want_us))
    assert {k: int(v) for k, v in _by_name(table, "calls").items() if v} == dict(want_calls)


def test_device_side_spans_by_name_are_the_raw_sums(case: tuple) -> None:
    table, events = case
    ranges = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    want: dict[str, float] = defaultdict(float)
    for e in ranges:
        want[row_name(e["name"])] += e["dur"]
    assert table.gpu_ranges == len(ranges)
    got = {k: v for k, v in _by_name(table, "gpu_span_us").items() if v}
    assert got == pytest.approx({k: v for k, v in want.items() if v})


def test_device_time_launched_inside_each_range_is_a_loop_over_the_raw_json(case: tuple) -> None:
    table, events = case
    calls = {}
    for e in sorted(
        (e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")),
        key=lambda e: e["ts"],
    ):
        corr = e.get("args", {}).get("correlation")
        if corr is not None:
            calls[corr] = e
    launched = []  # (pid, tid, call start, duration) of each device activity
    for k in events:
        if k.get("cat") in DEVICE_CATS:
            call = calls.get(k["args"].get("correlation"))
            if call is not None:
                launched.append((str(call["pid"]), str(call["tid"]), call["ts"], k["dur"]))
    want: dict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for r in (e for e in events if e.get("cat") == "user_annotation"):
        for pid, tid, ts, dur in launched:
            if (pid, tid) == (str(r["pid"]), str(r["tid"])) and r["ts"] <= ts < r["ts"] + r["dur"]:
                want[row_name(r["name"])] += dur
                count[row_name(r["name"])] += 1
    got = {k: v for k, v in _by_name(table, "device_us").items() if v}
    assert got == pytest.approx({k: v for k, v in want.items() if v})
    assert {k: int(v) for k, v in _by_name(table, "kernels").items() if v} == dict(count)


def test_kernels_a_device_range_spans_are_those_overlapping_it_on_its_stream(case: tuple) -> None:
    table, events = case
    kernels = [e for e in events if e.get("cat") in DEVICE_CATS]
    want: Counter[str] = Counter()
    for g in (e for e in events if e.get("cat") == "gpu_user_annotation"):
        lo, hi = g["ts"], g["ts"] + g["dur"]
        want[row_name(g["name"])] += sum(
            1
            for k in kernels
            if (k["pid"], k["tid"]) == (g["pid"], g["tid"])
            and k["ts"] < hi
            and k["ts"] + k["dur"] > lo
        )
    got = {k: int(v) for k, v in _by_name(table, "gpu_kernels").items() if v}
    assert got == {k: v for k, v in want.items() if v}


def test_rows_nest_and_a_parent_holds_its_children(case: tuple) -> None:
    table, _ = case
    for i, r in enumerate(table.rows):
        kids = [c for c in table.rows if c.parent == i]
        assert all(c.depth == r.depth + 1 for c in kids)
        # Children sit inside their parent's ranges: their time fits in it.
        assert sum(c.host_us for c in kids) <= r.host_us * (1 + 1e-9)
        assert sum(c.device_us for c in kids) <= r.device_us * (1 + 1e-9) + 1e-9
        assert r.parent < i  # pre-order: a parent comes first
        assert table.path(i)[-1] == r.name


def test_profiler_steps_share_one_row_and_sgd_spans_nine_kernels_a_step() -> None:
    table = annotation_table(load_trace(NS))
    (step,) = [r for r in table.rows if r.name.startswith("ProfilerStep")]
    assert (step.name, step.calls) == ("ProfilerStep#*", 5)
    sgd = table.row("Optimizer.step#SGD.step")
    assert sgd is not None
    assert table.path(table.rows.index(sgd)) == (
        "ProfilerStep#*",
        "## optimizer ##",
        "Optimizer.step#SGD.step",
    )
    # Five steps of nine SGD kernels each, seen from the host (launched inside the range)
    # and from the device (overlapping its device-side range): HTA counts 27 of them in the
    # three steps it keeps (tests/analysis/test_hta_parity.py).
    assert (sgd.calls, sgd.kernels, sgd.gpu_calls, sgd.gpu_kernels) == (5, 45, 5, 45)
    assert sgd.device_us == pytest.approx(sgd.gpu_kernel_us)


def test_each_kernel_gets_its_innermost_device_range() -> None:
    trace = load_trace(NS)
    owner = kernel_gpu_annotations(trace)
    counts = Counter(trace.gpu_annotations[i].name if i >= 0 else "" for i in owner.tolist())
    assert counts["Optimizer.step#SGD.step"] == 45
    assert counts["DistributedDataParallel.forward"] == 5 * 460
    for i in owner.tolist()[:500]:
        if i >= 0:
            assert trace.gpu_annotations[i].stream == 7


def test_the_report_has_an_annotations_tab_and_traces_without_ranges_do_not() -> None:
    report = gpuprof_nb.analyze(load_trace(DATA / "a100_nccl/nccl_data.json.gz"))
    assert report.annotations is not None and report.annotations.rows
    html = report._repr_mimebundle_()["text/html"]
    assert 'data-section="Annotations"' in html
    assert "\u00a0\u00a0## forward ##" in html  # indented by nesting
    assert "-- Annotations --" in report.text()
    bare = gpuprof_nb.analyze(load_trace(DATA / "mi210_gpu_only/gpu_only_trace.json.gz"))
    assert bare.annotations is not None and not bare.annotations.rows
    assert "-- Annotations --" not in bare.text()
