"""Idle-time breakdown: hand-built traces with known answers, real traces checked against a
plain-JSON recomputation, and bad input that must not crash."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.trace import (
    DeviceInfo,
    Kernel,
    Op,
    RuntimeCall,
    Step,
    SyncEvent,
    Trace,
)

CATEGORIES = ("busy", "dataloader", "sync", "launch", "host", "other")


GPU0 = (DeviceInfo(0, "GPU", compute_capability=(8, 0)),)


def make_trace(
    *, ops=(), kernels=(), runtime=(), syncs=(), steps=(), window=None, devices=GPU0
) -> Trace:
    """Return a Trace from hand-made events; the window spans them unless given."""
    spans = (
        [(o.start_us, o.end_us) for o in ops]
        + [(k.start_us, k.end_us) for k in kernels]
        + [(r.start_us, r.end_us) for r in runtime]
    )
    if window is None:
        window = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0.0, 0.0)
    return Trace(
        source="hand",
        ops=tuple(ops),
        kernels=tuple(kernels),
        runtime=tuple(runtime),
        syncs=tuple(syncs),
        memory=(),
        steps=tuple(steps),
        devices=tuple(devices),
        distributed=None,
        bounds_us=window,
    )


def kernel(
    start, dur, stream=7, corr=None, name="void elementwise_kernel<float>", device=0, kind="kernel"
):
    return Kernel(name, kind, float(start), float(dur), device, stream, correlation=corr)


def launch(start, corr, dur=4.0, name="cudaLaunchKernel"):
    return RuntimeCall(name, float(start), dur, 1, 1, correlation=corr)


def op(name, start, dur, kind="op", tid=1):
    return Op(name, kind, float(start), float(dur), 1, tid)


def assert_sums(bd):
    assert sum(bd.us_by_category().values()) == pytest.approx(bd.span_us, rel=1e-12, abs=1e-9)


class TestHandBuilt:
    def test_each_cause_by_hand(self):
        # Device busy 0-100, 105-200 (5 us launch gap), 300-400 (gap 200-300 after a
        # cudaStreamSynchronize returning at 201), 600-700 (gap 400-600: the next kernel was
        # launched at 550, after the gap began: host), 800-900 (gap 700-800: launched at
        # 650, before: other), then 900-1000 inside a DataLoader __next__ and idle.
        kernels = [
            kernel(0, 100, corr=1),
            kernel(105, 95, corr=2),
            kernel(300, 100, corr=3),
            kernel(600, 100, corr=4),
            kernel(800, 100, corr=5),
        ]
        runtime = [
            launch(-10, 1),
            launch(90, 2),
            launch(150, 3),
            launch(550, 4),
            launch(650, 5),
            RuntimeCall("cudaStreamSynchronize", 195.0, 6.0, 1, 1),
        ]
        ops = [
            op(
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                900,
                100,
                kind="annotation",
            )
        ]
        tr = make_trace(ops=ops, kernels=kernels, runtime=runtime, window=(-10.0, 1000.0))
        tl = device_timeline(tr)
        bd = tl.breakdown
        assert tl.on_device and tl.device == 0
        assert bd.span_us == pytest.approx(1010.0)
        assert bd.busy_us == pytest.approx(100 + 95 + 100 + 100 + 100)
        assert bd.launch_us == pytest.approx(5.0)
        assert bd.sync_us == pytest.approx(100.0)
        # -10..0 before the first kernel (nothing launched yet) and 400..600.
        assert bd.host_us == pytest.approx(10.0 + 200.0)
        assert bd.other_us == pytest.approx(100.0)
        assert bd.dataloader_us == pytest.approx(100.0)
        assert_sums(bd)
        assert tl.busy_fraction == pytest.approx(495 / 1010)
        causes = [(g.start_us, g.end_us, g.cause) for g in tl.gaps]
        assert causes == [
            (-10, 0, "host"),
            (100, 105, "launch"),
            (200, 300, "sync"),
            (400, 600, "host"),
            (700, 800, "other"),
            (900, 1000, "dataloader"),
        ]

    def test_multi_stream_idle_is_union(self):
        # Stream 7 busy 0-100, stream 9 busy 50-150: idle only 150-200.
        kernels = [kernel(0, 100, stream=7), kernel(50, 100, stream=9), kernel(200, 10)]
        tl = device_timeline(make_trace(kernels=kernels))
        assert tl.busy_us == pytest.approx(160.0)
        assert tl.breakdown.idle_us == pytest.approx(50.0)
        assert_sums(tl.breakdown)

    def test_per_step_breakdown_sums_to_step(self):
        kernels = [kernel(t, 30, corr=i) for i, t in enumerate(range(0, 400, 50))]
        runtime = [launch(t - 5, i) for i, t in enumerate(range(0, 400, 50))]
        steps = [Step(1, "ProfilerStep#1", 0.0, 200.0), Step(2, "ProfilerStep#2", 200.0, 380.0)]
        tl = device_timeline(make_trace(kernels=kernels, runtime=runtime, steps=steps))
        assert [s.number for s in tl.steps] == [1, 2]
        for st in tl.steps:
            assert st.breakdown.span_us == pytest.approx(st.dur_us)
            assert_sums(st.breakdown)
        # Step 1 [0, 200]: kernels at 0, 50, 100, 150, each 30 us.
        assert tl.steps[0].breakdown.busy_us == pytest.approx(120.0)
        assert tl.representative_step.number == 2  # 180 us < 200 us: the lower median

    def test_several_devices_take_the_busiest_with_a_note(self):
        kernels = [kernel(0, 10, device=0), kernel(0, 50, device=1)]
        tl = device_timeline(make_trace(kernels=kernels))
        assert tl.device == 1
        assert any("2 devices" in n for n in tl.notes)


class TestBadInput:
    def test_empty_trace(self):
        tl = device_timeline(make_trace())
        assert tl.window_us == 0 and tl.busy_fraction == 0.0
        assert_sums(tl.breakdown)

    def test_one_event(self):
        tl = device_timeline(make_trace(kernels=[kernel(5, 10)]))
        assert tl.busy_us == pytest.approx(10.0)
        assert tl.busy_fraction == pytest.approx(1.0)

    def test_without_gpu_events_describes_the_host(self):
        ops = [op("aten::add", 0, 10), op("aten::mul", 15, 10), op("aten::add", 100, 10)]
        tl = device_timeline(make_trace(ops=ops))
        bd = tl.breakdown
        assert not tl.on_device and tl.device is None
        assert bd.busy_us == pytest.approx(30.0)
        assert bd.launch_us == pytest.approx(5.0)  # 10-15: a short dispatch gap
        assert bd.host_us == pytest.approx(75.0)  # 25-100: Python between ops
        assert any("no device activity" in n for n in tl.notes)

    def test_negative_and_float_timestamps(self):
        kernels = [kernel(-1000.25, 0.5), kernel(-999.5, 2.25), kernel(-990.125, 1.0)]
        tl = device_timeline(make_trace(kernels=kernels))
        assert tl.window_us == pytest.approx(-989.125 + 1000.25)
        assert tl.busy_us == pytest.approx(0.5 + 2.25 + 1.0)
        assert_sums(tl.breakdown)

    def test_overlapping_kernels_on_one_stream(self):
        tl = device_timeline(make_trace(kernels=[kernel(0, 100), kernel(20, 30), kernel(90, 20)]))
        assert tl.busy_us == pytest.approx(110.0)

    def test_syncs_without_kernels_do_not_crash(self):
        syncs = [SyncEvent("Stream Sync", 0.0, 5.0, 0, 7)]
        tl = device_timeline(make_trace(ops=[op("aten::item", 0, 5)], syncs=syncs))
        assert_sums(tl.breakdown)


# --- real traces --------------------------------------------------------------------------

DATA = Path(__file__).parent.parent / "data"
# Every trace in tests/data (other helpers add theirs too: all must hold these facts).
REAL = sorted(p for p in DATA.glob("*/*.json.gz") if "snapshots" not in p.parts)

_ACTIVITY_CATS = {
    "cpu_op",
    "user_annotation",
    "python_function",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_runtime",
    "cuda_driver",
    "Operator",
    "Kernel",
    "Memcpy",
    "Memset",
    "Runtime",
    "mtia_ccp_events",
}
# MTIA's device events are device activity (tests/io/test_mtia.py).
_DEVICE_CATS = {
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "Kernel",
    "Memcpy",
    "Memset",
    "mtia_ccp_events",
}


def sweep_busy(spans, lo=float("-inf"), hi=float("inf")) -> float:
    """Return the covered length of the spans within [lo, hi] by a sweep over their ends."""
    points = []
    for s, t in spans:
        s, t = max(s, lo), min(t, hi)
        if t > s:
            points += [(s, 1), (t, -1)]
    points.sort()
    busy, depth, since = 0.0, 0, 0.0
    for t, d in points:
        if depth == 0 and d == 1:
            since = t
        depth += d
        if depth == 0:
            busy += t - since
    return busy


def plain_busy(path: Path) -> tuple[float, float, float, int]:
    """Recompute (window start, window end, busy us, kernel count) from the raw JSON, with a
    sweep over start/end points (a different method from the package's interval merge)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        pytest.skip(f"{path.name} is not a Chrome trace")
    events = doc["traceEvents"]
    timed = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in _ACTIVITY_CATS
        and not str(e.get("name", "")).startswith("PyTorch Profiler")
    ]
    lo = min(float(e["ts"]) for e in timed)
    hi = max(float(e["ts"]) + max(float(e.get("dur", 0)), 0.0) for e in timed)
    device = [e for e in timed if e["cat"] in _DEVICE_CATS]
    busy = sweep_busy(_spans(device))
    return lo, hi, busy, len(device)


def _spans(events):
    return [(float(e["ts"]), float(e["ts"]) + max(float(e.get("dur", 0)), 0.0)) for e in events]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name)
def test_real_trace_breakdown_matches_plain_json(path):
    tl = device_timeline(load_trace(path))
    lo, hi, busy, n_device = plain_busy(path)
    assert tl.start_us == pytest.approx(lo) and tl.end_us == pytest.approx(hi)
    assert tl.window_us == pytest.approx(hi - lo)
    if n_device:
        assert tl.busy_us == pytest.approx(busy, rel=1e-9)
    assert_sums(tl.breakdown)
    for st in tl.steps:
        assert_sums(st.breakdown)
    total_gaps = sum(g.dur_us for g in tl.gaps)
    assert total_gaps == pytest.approx(tl.window_us - tl.busy_us, rel=1e-9, abs=1e-6)


def test_per_step_busy_matches_plain_json():
    path = DATA / "ddp_nccl_sampled" / "sampled_rank-0.json.gz"
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in _DEVICE_CATS]
    steps = sorted(
        (
            e
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") == "user_annotation"
            and str(e.get("name", "")).startswith("ProfilerStep#")
        ),
        key=lambda e: e["ts"],
    )
    tl = device_timeline(load_trace(path))
    assert [s.name for s in tl.steps] == [e["name"] for e in steps]
    for st, e in zip(tl.steps, steps, strict=True):
        lo, hi = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        assert st.breakdown.span_us == pytest.approx(hi - lo)
        assert st.breakdown.busy_us == pytest.approx(sweep_busy(_spans(device), lo, hi))


@pytest.mark.parametrize("seed", range(12))
def test_random_traces_never_crash_and_always_sum(seed):
    """Seeded random traces (negative and float times, overlapping streams, zero-length and
    out-of-window steps, stray syncs and launches) keep every invariant."""
    import random

    from gpuprof_nb.analysis.diagnose import diagnose

    rng = random.Random(seed)
    base = rng.choice([-5e5, 0.0, 1.7e15])

    def t():
        return base + rng.uniform(-1e3, 1e4)

    kernels = [
        kernel(
            t(),
            rng.choice([0.0, rng.uniform(0, 300)]),
            stream=rng.choice([7, 9, 11]),
            corr=rng.randrange(60),
            device=rng.choice([0, 0, 1]),
            name=rng.choice(
                [
                    "ampere_sgemm_64x64",
                    "ncclKernel_AllReduce",
                    "void elementwise_kernel",
                    "Memcpy HtoD (Pageable)",
                ]
            ),
            kind=rng.choice(["kernel", "kernel", "memcpy", "memset"]),
        )
        for _ in range(rng.randrange(0, 40))
    ]
    runtime = [
        launch(
            t(),
            rng.randrange(60),
            name=rng.choice(
                ["cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpy", "cudaGraphLaunch"]
            ),
        )
        for _ in range(rng.randrange(0, 40))
    ]
    ops = [
        op(
            rng.choice(
                [
                    "aten::add",
                    "aten::mm",
                    "aten::to",
                    "aten::item",
                    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                    "Torch-Compiled Region: 0/1",
                    "gloo:all_reduce",
                ]
            ),
            t(),
            rng.uniform(0, 500),
            kind=rng.choice(["op", "op", "annotation", "python"]),
            tid=rng.choice([1, 2]),
        )
        for _ in range(rng.randrange(0, 40))
    ]
    syncs = [
        SyncEvent(
            rng.choice(["Stream Sync", "Context Sync", "Stream Wait Event"]),
            t(),
            rng.uniform(0, 50),
            rng.choice([0, 1]),
            rng.choice([-1, 7]),
        )
        for _ in range(rng.randrange(0, 5))
    ]
    steps = []
    for n in range(rng.randrange(0, 4)):
        a = t()
        steps.append(Step(n, f"ProfilerStep#{n}", a, a + rng.choice([0.0, -5.0, 2e3])))
    trace = make_trace(ops=ops, kernels=kernels, runtime=runtime, syncs=syncs, steps=steps)
    tl = device_timeline(trace)
    assert_sums(tl.breakdown)
    for st in tl.steps:
        assert_sums(st.breakdown)
        assert all(v >= 0 for v in st.breakdown.us_by_category().values())
    assert all(v >= -1e-9 for v in tl.breakdown.us_by_category().values())
    d = diagnose(trace, timeline=tl)
    assert d.verdict
    for f in d.considered:
        assert 0.0 <= f.share
