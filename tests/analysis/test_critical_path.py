"""The critical path of the median step (analysis/critical_path.py) on real traces: it tiles
the step, every link between its segments is a dependency the raw JSON records (a launch's
correlation id, stream order, a sync the device released), at every kernel it follows the
dependency satisfied last, and the slack of the kernels off it matches a recursion over the
raw JSON. A sync-bound trace's path runs through its synchronisations; a launch-bound
trace's path stays on the host."""

from __future__ import annotations

import gzip
import json
import math
import statistics
from pathlib import Path

import pytest

import gpuprof_nb
from gpuprof_nb.analysis.critical_path import SYNC_RELEASE_SLACK_US, critical_path
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.results.critical_path import SEGMENT_KINDS

DATA = Path(__file__).parents[1] / "data"
HOST_SYNC = DATA / "gpu/host_sync.json.gz"
LAUNCH_BOUND = DATA / "gpu/launch_overhead.json.gz"
TRACES = [
    HOST_SYNC,
    LAUNCH_BOUND,
    DATA / "gpu/memory_bound.json.gz",
    DATA / "gpu/dataloader.json.gz",
    DATA / "a100_alexnet_sync/benchmark_result_2869224_1695835535_trace.json.gz",
    DATA / "a100_multistream_sync/event_sync_trace.json.gz",
    DATA / "a100_event_sync/event_sync_trace.json.gz",
    DATA / "a100_nccl/nccl_data.json.gz",
    DATA / "amd_mi250_toy/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    DATA / "mi300_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
    DATA / "v100_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    DATA / "kineto2021_v100/gpu_metrics_input.json",
]
DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}


def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


def _stream(e: dict) -> int:
    s = e.get("args", {}).get("stream")
    if s is not None:
        return int(s)
    tid = e["tid"]
    return int(tid[7:]) if isinstance(tid, str) and tid.startswith("stream ") else int(tid)


class Raw:
    """The raw JSON's events by position (what PathSegment.index names), the launch call of
    each device activity (last call with its correlation id) and each stream's activities."""

    def __init__(self, path: Path) -> None:
        self.events = _events(path)
        calls = sorted(
            (
                (e["ts"], i)
                for i, e in enumerate(self.events)
                if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATS
            )
        )
        self.call_of_corr: dict[int, int] = {}
        for _, i in calls:
            corr = self.events[i].get("args", {}).get("correlation")
            if corr is not None:
                self.call_of_corr[corr] = i
        self.by_stream: dict[tuple, list[int]] = {}
        for i, e in enumerate(self.events):
            if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS:
                key = (e.get("args", {}).get("device", e["pid"]), _stream(e))
                self.by_stream.setdefault(key, []).append(i)
        for members in self.by_stream.values():
            members.sort(key=lambda i: (self.events[i]["ts"], i))
        self.prev: dict[int, int] = {}
        for members in self.by_stream.values():
            for a, b in zip(members, members[1:], strict=False):
                self.prev[b] = a

    def end(self, i: int) -> float:
        e = self.events[i]
        return e["ts"] + max(e["dur"], 0)

    def launch(self, i: int) -> int | None:
        return self.call_of_corr.get(self.events[i].get("args", {}).get("correlation"))


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: f"{p.parent.name}/{p.name[:12]}")
def case(request: pytest.FixtureRequest) -> tuple:
    trace = load_trace(request.param)
    tl = device_timeline(trace)
    return trace, tl, critical_path(trace, tl), Raw(request.param)


def test_the_segments_tile_the_step(case: tuple) -> None:
    _, tl, cp, _ = case
    step = tl.representative_step
    lo, hi = (step.start_us, step.end_us) if step else (tl.start_us, tl.end_us)
    assert (cp.start_us, cp.end_us) == (lo, hi)
    assert cp.segments[0].start_us == pytest.approx(lo)
    assert cp.segments[-1].end_us == pytest.approx(hi)
    for a, b in zip(cp.segments, cp.segments[1:], strict=False):
        assert a.end_us == pytest.approx(b.start_us, abs=1e-6)
        assert b.dur_us > 0 and b.kind in SEGMENT_KINDS
    assert sum(s.dur_us for s in cp) == pytest.approx(cp.dur_us)
    assert sum(us for _, us in cp.by_category_us) == pytest.approx(cp.dur_us)
    assert len(cp) == len(cp.segments) and cp[0] is cp.segments[0] and list(cp) == list(cp[:])


def test_every_segment_is_the_event_it_names(case: tuple) -> None:
    _, _, cp, raw = case
    for s in cp:
        if s.index < 0:
            assert s.kind in ("python", "gpu_gap", "stream_wait")
            continue
        e = raw.events[s.index]
        assert e["name"] == s.name
        if s.kind in ("cpu", "runtime", "kernel"):
            # Inside the event's span (clipped to the step).
            assert e["ts"] - 1e-6 <= s.start_us and s.end_us <= raw.end(s.index) + 1e-6
        if s.kind == "kernel":
            assert e["cat"] in DEVICE_CATS and s.where == f"stream {_stream(e)}"
        if s.kind in ("runtime", "launch", "sync"):
            assert e["cat"] in RUNTIME_CATS


def test_each_link_is_a_recorded_dependency(case: tuple) -> None:
    _, _, cp, raw = case
    segs = cp.segments
    for i, s in enumerate(segs):
        before = segs[i - 1] if i else None
        after = segs[i + 1] if i + 1 < len(segs) else None
        if s.kind == "launch":
            # From the launch call's start to the kernel it launched (same correlation id).
            assert after is not None and after.kind == "kernel"
            assert raw.launch(after.index) == s.index
            assert s.end_us == pytest.approx(raw.events[after.index]["ts"], abs=1e-6)
        if s.kind == "gpu_gap":
            # Between two activities of one stream, next to each other in stream order.
            assert before is not None and after is not None
            assert before.kind == after.kind == "kernel"
            assert raw.prev[after.index] == before.index
        if s.kind == "sync":
            # A blocking call returning after the activity before it on the path ended in it.
            assert before is not None and before.kind == "kernel"
            call = raw.events[s.index]
            end = raw.end(before.index)
            assert call["ts"] < end <= call["ts"] + call["dur"] + SYNC_RELEASE_SLACK_US
        if s.kind == "kernel" and before is not None and before.kind == "kernel":
            # Back to back on one stream, or a cross-stream wait with no gap.
            assert raw.prev.get(s.index) == before.index or before.where != s.where


def test_at_each_kernel_the_path_follows_the_dependency_satisfied_last(case: tuple) -> None:
    trace, _, cp, raw = case
    if any(x.name == "Stream Wait Event" for x in trace.syncs):
        pytest.skip("cross-stream waits: the links test covers them")
    segs = cp.segments
    for i, s in enumerate(segs):
        if s.kind != "kernel" or i == 0:
            continue
        k = raw.events[s.index]
        if k["ts"] <= cp.start_us:
            continue  # the path starts inside it
        prev = raw.prev.get(s.index)
        call = raw.launch(s.index)
        ready = {
            "stream": raw.end(prev) if prev is not None else -math.inf,
            "launch": raw.events[call]["ts"] if call is not None else -math.inf,
        }
        if ready["stream"] == ready["launch"] == -math.inf:
            continue
        binding = "launch" if ready["launch"] > ready["stream"] else "stream"
        before = segs[i - 1]
        if binding == "launch":
            if ready["launch"] < k["ts"]:
                assert before.kind == "launch" and before.index == call
        elif ready["stream"] < k["ts"]:
            assert before.kind == "gpu_gap" and segs[i - 2].index == prev
        else:
            assert before.kind == "kernel" and before.index == prev


def test_off_path_slack_is_a_recursion_over_the_raw_json() -> None:
    # One stream, no cross-stream waits: a kernel's slack is the least of the room before
    # the next kernel of its stream starts (plus that one's slack), before the sync it
    # releases returns, and before the step ends.
    trace = load_trace(HOST_SYNC)
    cp = critical_path(trace)
    raw = Raw(HOST_SYNC)
    (stream,) = raw.by_stream.values()
    lo, hi = cp.start_us, cp.end_us
    releases: dict[int, float] = {}
    syncs = [
        i
        for i, e in enumerate(raw.events)
        if e.get("ph") == "X"
        and e.get("cat") in RUNTIME_CATS
        and ("Synchronize" in e["name"] or "Memcpy" in e["name"])
    ]
    for c in syncs:
        call = raw.events[c]
        lo_c, hi_c = call["ts"], call["ts"] + call["dur"] + SYNC_RELEASE_SLACK_US
        if "Memcpy" in call["name"]:
            inside = [
                k
                for k in stream
                if raw.launch(k) == c and lo_c < raw.end(k) <= call["ts"] + call["dur"]
            ]
        else:
            inside = [k for k in stream if lo_c < raw.end(k) <= hi_c]
        if inside:
            k = max(inside, key=lambda k: (raw.end(k), stream.index(k)))
            releases[k] = min(releases.get(k, math.inf), call["ts"] + call["dur"])
    slack: dict[int, float] = {}
    for n, k in reversed(list(enumerate(stream))):
        if not (raw.end(k) > lo and raw.events[k]["ts"] < hi):
            continue
        best = max(hi - raw.end(k), 0.0)
        if n + 1 < len(stream) and raw.events[stream[n + 1]]["ts"] < hi:
            nxt = stream[n + 1]
            best = min(best, slack[nxt] + max(raw.events[nxt]["ts"] - raw.end(k), 0.0))
        if k in releases:
            best = min(best, max(releases[k] - raw.end(k), 0.0))
        slack[k] = best
    on_path = {s.index for s in cp if s.kind == "kernel"}
    off = [k for k in stream if k not in on_path and raw.events[k]["ts"] >= lo and raw.end(k) <= hi]
    assert cp.off_path_kernels == len(off)
    assert cp.off_path_kernel_us == pytest.approx(sum(raw.events[k]["dur"] for k in off))
    assert cp.median_slack_us == pytest.approx(statistics.median(slack[k] for k in off))


def test_a_sync_bound_trace_runs_through_its_synchronisations() -> None:
    # 200 x (a @ a).relu().sum().item() (tests/data/gpu/README.md): each .item() copies
    # the sum to the host and waits in cudaStreamSynchronize.
    trace = load_trace(HOST_SYNC)
    cp = critical_path(trace)
    raw = Raw(HOST_SYNC)
    waited = 0
    ends = [raw.end(k) for k in next(iter(raw.by_stream.values()))]
    for e in raw.events:
        if e.get("name") == "cudaStreamSynchronize":
            waited += any(
                e["ts"] < end <= e["ts"] + e["dur"] + SYNC_RELEASE_SLACK_US for end in ends
            )
    on_path = [s for s in cp.syncs if s.name == "cudaStreamSynchronize"]
    assert waited >= 190 and len(on_path) == waited
    assert all(s.context == "aten::item" for s in on_path)
    # Each hands the path to the copy it waited for, then back to the launch of that copy.
    copies = [s for s in cp if s.kind == "kernel" and s.name.startswith("Memcpy DtoH")]
    assert len(copies) >= waited
    finding = gpuprof_nb.diagnose(trace).finding("critical_path")
    assert finding is not None and finding.evidence["path_syncs_count"] == len(cp.syncs)
    # The finding names the wait the path runs through, and the GPU work it waited on.
    assert (
        f"runs through {len(cp.syncs)} synchronisations "
        f"({waited} cudaStreamSynchronize in aten::item)" in finding.title
    )
    assert sum(s.device_us for s in cp.syncs) > 0


def test_a_launch_bound_trace_keeps_its_path_on_the_host() -> None:
    # 1000 tiny elementwise ops launched one by one: the device waits for each launch.
    trace = load_trace(LAUNCH_BOUND)
    cp = critical_path(trace)
    host = sum(
        us for c, us in cp.by_category_us if c in ("host ops", "CUDA runtime calls", "Python")
    )
    assert host / cp.dur_us > 0.95
    assert not any(s.kind == "kernel" for s in cp)
    f = gpuprof_nb.diagnose(trace).finding("critical_path")
    assert f is not None and "hangs on the host" in f.title
    # The kernels it launched could each have ended much later: nothing waited on them
    # until the cell's end.
    assert cp.slack_fraction is not None and cp.slack_fraction > 0.1
    assert "speeding them up would not shorten it" in f.title


def test_a_gpu_bound_step_hangs_on_the_gpu() -> None:
    # DDP ResNet training on a V100: the launch queue is full (1,022 of 1,024), the host's
    # launches block until a kernel finishes.
    path = DATA / "v100_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    report = gpuprof_nb.analyze(load_trace(path))
    cp = report.critical_path
    assert cp is not None and cp.step_number == report.timeline.representative_step.number
    assert cp.fraction("GPU kernels") > 0.8
    f = report.diagnosis.finding("critical_path")
    assert f is not None and f in report.diagnosis.findings
    assert report.diagnosis.findings[-1] is f
    assert "hangs on the GPU: launches block on a full queue" in f.title
    html = report._repr_mimebundle_()["text/html"]
    assert 'data-lane="critical path"' in html
    assert "Critical path of step" in report.text()


def test_without_a_device_there_is_a_host_path_and_no_finding() -> None:
    trace = load_trace(DATA / "planted_cpu/python_overhead.json.gz")
    report = gpuprof_nb.analyze(trace)
    assert report.critical_path is not None
    assert {s.kind for s in report.critical_path} <= {"cpu", "runtime", "python"}
    assert report.diagnosis.finding("critical_path") is None


def test_share_words_never_round_a_part_to_zero() -> None:
    from gpuprof_nb.analysis.critical_path import _share

    assert _share(0.0, 100.0) == "0%"
    assert _share(0.3, 100.0) == "<1%"
    assert _share(0.6, 100.0) == "1%"
    assert _share(100.0, 100.0) == "100%"
    assert _share(5.0, 0.0) == "0%"
