"""Per-stream idle time by cause, launch queue and launch delays (analysis/streams.py),
checked on real traces against a plain recomputation from the raw JSON: events read with
the json module, matched by correlation id and walked in loops."""

from __future__ import annotations

import gzip
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from gpuprof_nb.analysis.streams import (
    KERNEL_WAIT_MAX_US,
    launch_delays,
    stream_idle,
    stream_queues,
)
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parents[1] / "data"
TRACES = [
    DATA / "a100_alexnet_sync/benchmark_result_2869224_1695835535_trace.json.gz",
    DATA / "a100_multistream_sync/event_sync_trace.json.gz",
    DATA / "a100_nccl/nccl_data.json.gz",
    DATA / "gpu/host_sync.json.gz",
    DATA / "gpu/launch_overhead.json.gz",
    DATA / "mi300_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
    DATA / "mi210_gpu_only/gpu_only_trace.json.gz",
    DATA / "kineto2021_v100/gpu_metrics_input.json",
    DATA / "v100_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]
DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}


def _raw(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


def _stream_of(e: dict) -> int:
    s = e.get("args", {}).get("stream")
    if s is not None:
        return int(s)
    tid = e["tid"]
    return int(tid[7:]) if isinstance(tid, str) and tid.startswith("stream ") else int(tid)


def _device_of(e: dict) -> int:
    d = e.get("args", {}).get("device")
    return int(d) if d is not None else int(e["pid"])


class Raw:
    """The device's activities with their launch calls, from the raw JSON."""

    def __init__(self, path: Path, device: int) -> None:
        events = [(i, e) for i, e in enumerate(_raw(path)) if e.get("ph") == "X"]
        calls = sorted(
            ((e["ts"], i, e) for i, e in events if e.get("cat") in RUNTIME_CATS),
            key=lambda t: (t[0], t[1]),
        )
        call_of: dict[int, dict] = {}
        for _, _, e in calls:  # the last call with a correlation id wins
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                call_of[corr] = e
        acts = [
            (e["ts"], i, e)
            for i, e in events
            if e.get("cat") in DEVICE_CATS and _device_of(e) == device
        ]
        self.by_stream: dict[int, list[tuple[float, float, dict | None, dict]]] = defaultdict(list)
        for ts, _, e in sorted(acts, key=lambda t: (t[0], t[1])):
            call = call_of.get(e.get("args", {}).get("correlation"))
            self.by_stream[_stream_of(e)].append((ts, ts + max(e["dur"], 0), call, e))


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.parent.name)
def case(request: pytest.FixtureRequest) -> tuple:
    trace = load_trace(request.param)
    device = device_timeline(trace).device
    return trace, device, Raw(request.param, device)


def test_idle_per_stream_by_cause_matches_a_loop_over_the_raw_json(case: tuple) -> None:
    trace, device, raw = case
    got = {s.stream: s for s in stream_idle(trace, device)}
    assert set(got) == set(raw.by_stream)
    for stream, acts in raw.by_stream.items():
        want = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        for (_, prev_end, _, _), (start, _, call, _) in zip(acts, acts[1:], strict=False):
            gap = max(start - prev_end, 0.0)
            if call is not None and call["ts"] > prev_end:
                want["host_wait"] += gap
            elif gap < KERNEL_WAIT_MAX_US:
                want["kernel_wait"] += gap
            else:
                want["other"] += gap
        s = got[stream]
        assert s.activities == len(acts)
        assert s.busy_us == pytest.approx(sum(e - a for a, e, _, _ in acts))
        for cause, us in want.items():
            assert s.us_by_cause()[cause] == pytest.approx(us, abs=1e-6), (stream, cause)
        assert sum(s.fraction(c) for c in want) == pytest.approx(1.0 if s.idle_us > 0 else 0.0)


def test_launch_queue_matches_a_loop_over_the_raw_json(case: tuple) -> None:
    trace, device, raw = case
    got = {q.stream: q for q in stream_queues(trace, device)}
    for stream, acts in raw.by_stream.items():
        changes = sorted(
            [(call["ts"], 0, +1) for _, _, call, _ in acts if call is not None]
            + [(start, 1, -1) for start, _, call, _ in acts if call is not None]
        )
        if not changes:
            assert stream not in got
            continue
        length, lengths = 0, []
        for _, _, delta in changes:
            length += delta
            lengths.append(length)
        assert length == 0
        weighted, empty, span = 0.0, 0.0, changes[-1][0] - changes[0][0]
        for (t, _, _), (t_next, _, _), value in zip(
            changes[:-1], changes[1:], lengths[:-1], strict=True
        ):
            weighted += value * (t_next - t)
            empty += (t_next - t) if value == 0 else 0.0
        q = got[stream]
        assert q.launches == len(changes) // 2
        assert q.max_length == max(lengths)
        assert q.event_mean == pytest.approx(statistics.fmean(lengths))
        if span > 0:
            assert q.mean_length == pytest.approx(weighted / span)
            assert q.empty_fraction == pytest.approx(empty / span)
        assert 0.0 <= q.empty_fraction <= 1.0
        assert 0 <= q.median_length <= q.max_length


def test_launch_delays_match_a_loop_over_the_raw_json(case: tuple) -> None:
    trace, device, raw = case
    waits = [
        (max(start - (call["ts"] + call["dur"]), 0.0), start, e)
        for acts in raw.by_stream.values()
        for start, _, call, e in acts
        if call is not None
    ]
    got = launch_delays(trace, device)
    if not waits:
        assert got is None
        return
    delays = sorted(w for w, _, _ in waits)
    assert got is not None
    assert got.count == len(delays)
    assert got.median_us == pytest.approx(statistics.median(delays))
    assert got.max_us == pytest.approx(delays[-1])
    assert got.mean_us == pytest.approx(statistics.fmean(delays))
    # p95 by linear interpolation between the two nearest ranks.
    rank = 0.95 * (len(delays) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    assert got.p95_us == pytest.approx(delays[lo] + (delays[hi] - delays[lo]) * (rank - lo))
    longest = sorted(waits, key=lambda w: (-w[0], w[1]))[: len(got.longest)]
    assert [w.delay_us for w in got.longest] == pytest.approx([w for w, _, _ in longest])
    assert [w.name for w in got.longest] == [e["name"] for _, _, e in longest]


def test_the_queue_strip_holds_the_longest_queue_of_each_bin() -> None:
    trace = load_trace(TRACES[0])
    tl = device_timeline(trace)
    q = next(q for q in tl.queues if q.stream == 7)
    assert tl.queue_span_us == (tl.start_us, tl.end_us)  # no steps: the whole window
    assert len(q.strip) == 300 and max(q.strip) == q.max_length
    # Brute force over a fine grid of instants: the length holding at each instant is never
    # above its bin's bar.
    times, length = [], []
    d = Raw(TRACES[0], tl.device).by_stream[7]
    changes = sorted(
        [(c["ts"], 0, 1) for _, _, c, _ in d if c] + [(s, 1, -1) for s, _, c, _ in d if c]
    )
    value = 0
    for t, _, delta in changes:
        value += delta
        times.append(t)
        length.append(value)
    lo, hi = tl.queue_span_us
    grid = np.linspace(lo, hi, 30001)[:-1]
    at = np.searchsorted(np.array(times), grid, side="right") - 1
    held = np.where(at >= 0, np.array(length)[np.maximum(at, 0)], 0)
    bins = ((grid - lo) / (hi - lo) * 300).astype(int)
    for b, v in zip(bins.tolist(), held.tolist(), strict=True):
        assert v <= q.strip[b]


def test_a_launch_bound_trace_keeps_its_queue_near_empty() -> None:
    # 1000 tiny elementwise ops launched one by one (tests/data/gpu/README.md): each kernel
    # starts microseconds after its launch, before the host issues the next one.
    tl = device_timeline(load_trace(DATA / "gpu/launch_overhead.json.gz"))
    (q,) = tl.queues
    assert q.max_length <= 1
    assert q.mean_length < 0.5 and q.empty_fraction > 0.5
    (s,) = tl.streams
    assert s.fraction("host_wait") > 0.95  # the stream waits for the host
    assert tl.launch_delays is not None and tl.launch_delays.p95_us < 10


def test_the_timeline_carries_them_for_its_device_only() -> None:
    trace = load_trace(DATA / "cpu_only_trace/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    tl = device_timeline(trace)
    assert not tl.on_device
    assert (tl.streams, tl.queues, tl.launch_delays) == ((), (), None)


# TraceLens's published GPU timelines (AMD-AGI/TraceLens @ 171dd74,
# tests/traces/<dir>/<name>_perf_report_csvs/gpu_timeline.csv): busy_time and idle_time in ms.
# Its idle time is the span from the first device activity's start to the last one's end less
# the busy time; on a trace with one stream that is the stream's idle time.
TRACELENS_TIMELINE = {
    "mi210_gpu_only/gpu_only_trace.json.gz": (5.3433701171875, 0.6361328125),
    "h100_bert_small/gaunernst_bert-small-uncased__1016001.json.gz": (
        0.309437744140625,
        3.59838720703125,
    ),
    "mi300_bert_small/gaunernst_bert-small-uncased__1016001.json.gz": (
        0.39074853515625,
        3.1052275390625,
    ),
    "h100_vit_inference/Falconsai_nsfw_image_detection__1016002.json.gz": (
        1.225308837890625,
        6.33453515625,
    ),
}


@pytest.mark.parametrize("name", sorted(TRACELENS_TIMELINE), ids=lambda n: n.split("/")[0])
def test_single_stream_idle_matches_tracelens_published_timeline(name: str) -> None:
    busy_ms, idle_ms = TRACELENS_TIMELINE[name]
    timeline = device_timeline(load_trace(DATA / name))
    (stream,) = timeline.streams
    assert stream.busy_us / 1e3 == pytest.approx(busy_ms, rel=0.01)
    assert stream.idle_us / 1e3 == pytest.approx(idle_ms, rel=0.01)
