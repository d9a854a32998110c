"""Hotspots (host time and idle time by user line) against brute-force references computed a
different way: time walked in small ticks, each tick given to the nearest sample (or to the
deepest open python_function event) and checked against the gaps one by one."""

from __future__ import annotations

import random

import numpy as np
import pytest
from _paths import SHARED_TRACES as SHARED

from gpuprof_nb.analysis.hotspots import compute_hotspots, frame_kind
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.frames import Frame
from gpuprof_nb.model.samples import StackSamples
from gpuprof_nb.model.trace import Op, Trace
from gpuprof_nb.results.timeline import IdleGap, Timeline

CELL = "<ipython-input-7-0a1b2c3d>"
TORCH = "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py"


def make_trace(ops=(), samples=None, cells=None) -> Trace:
    spans = [(o.start_us, o.start_us + o.dur_us) for o in ops]
    window = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (0.0, 1.0)
    return Trace(
        source="hand",
        ops=tuple(ops),
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=window,
        cells=cells or {},
        samples=samples,
    )


def timeline_of(gaps) -> Timeline:
    return Timeline(window_us=1e6, busy_us=0.0, gaps=tuple(IdleGap(a, b, c) for a, b, c in gaps))


@pytest.mark.parametrize(
    "path, kind",
    [
        (CELL, "user"),
        ("/tmp/ipykernel_123/456789.py", "user"),
        ("/home/me/train.py", "user"),
        ("train.py", "user"),
        (TORCH, "torch"),
        ("torch/nn/modules/module.py", "torch"),
        ("/usr/lib/python3.11/site-packages/numpy/core/x.py", "library"),
        ("/usr/lib/python3.11/inspect.py", "stdlib"),
        ("inspect.py", "stdlib"),
        ("json/encoder.py", "stdlib"),
        ("transformers/models/bert.py", "library"),
        ("<frozen importlib._bootstrap>", "library"),
        ("", "library"),
    ],
)
def test_frame_kind(path: str, kind: str) -> None:
    assert frame_kind(path) == kind


def random_samples(
    rng: random.Random, mode: str = "thread"
) -> tuple[StackSamples, list[tuple[float, float, str]]]:
    frames = (
        Frame(CELL, 2, "<module>", "y = f(x)"),
        Frame(CELL, 3, "<module>", "time.sleep(1)"),
        Frame(CELL, 5, "f", "return x @ x"),
        Frame(TORCH, 1751, "_call_impl"),
        Frame("/usr/lib/python3.11/threading.py", 320, "wait"),
    )
    stacks = ((0,), (1,), (0, 2), (0, 2, 3), (1, 4), (0, 3, 2, 3))
    t, ts, of = 0.0, [], []
    for _ in range(rng.randint(1, 60)):
        t += rng.randint(200, 3000)
        ts.append(t)
        of.append(rng.randrange(len(stacks)))
    # Whole microseconds: the midpoints between samples fall on half microseconds, so the
    # brute force's half-microsecond ticks measure every stretch exactly.
    start, end = rng.randint(0, int(ts[0])), ts[-1] + rng.randint(0, 2000)
    gaps, g = [], rng.randint(0, 3000)
    while g < end + 1000:
        d = rng.randint(10, 4000)
        gaps.append((g, g + d, rng.choice(("host", "sync", "launch"))))
        g += d + rng.randint(10, 4000)
    return StackSamples(frames, stacks, tuple(ts), tuple(of), 1000.0, start, end, mode=mode), gaps


def brute_samples(s: StackSamples, gaps, tick: float = 0.5):
    """Per user line: host and idle time, each tick of the sampled span given to the nearest
    sample (what the midpoints between thread samples mean), or to the next signal sample
    (the last one takes the rest), and charged to its innermost user frame; a comprehension
    is part of its line."""
    host: dict[int, float] = {}
    idle: dict[int, float] = {}
    ts = np.array(s.ts_us)
    user = [frame_kind(f.file) == "user" for f in s.frames]
    for x in np.arange(s.start_us + tick / 2, s.end_us, tick):
        if s.mode == "signal":
            i = min(int(np.searchsorted(ts, x)), len(ts) - 1)
        else:
            i = int(np.argmin(np.abs(ts - x)))
        stack = s.stacks[s.stack_of[i]]
        inner = [f for f in stack if user[f]][-1]
        host[inner] = host.get(inner, 0.0) + tick
        if any(a <= x < b for a, b, _ in gaps):
            idle[inner] = idle.get(inner, 0.0) + tick
    return host, idle


@pytest.mark.parametrize("mode", ["thread", "signal"])
@pytest.mark.parametrize("seed", range(10))
def test_sampled_lines_match_brute_force(seed: int, mode: str) -> None:
    rng = random.Random(seed)
    samples, gaps = random_samples(rng, mode)
    h = compute_hotspots(make_trace(samples=samples, cells={CELL: 7}), timeline_of(gaps))
    host, idle = brute_samples(samples, gaps)
    assert h is not None and h.granularity == "line"
    # Thread samples may be starved of the GIL: the report says so.
    assert any("sampled from a thread" in n for n in h.notes) == (mode == "thread")
    got = {(line.file, line.line, line.function): line for line in h.lines}
    assert len(got) == len(host)
    span = samples.end_us - samples.start_us
    assert h.host_us == pytest.approx(span, abs=1e-6)
    for f, us in host.items():
        fr = samples.frames[f]
        line = got[(fr.file, fr.line, fr.function)]
        assert line.host_us == pytest.approx(us, abs=1e-6)
        assert line.idle_us == pytest.approx(idle.get(f, 0.0), abs=1e-6)
        assert line.share == pytest.approx(line.host_us / h.host_us)
        assert line.text == fr.text
        assert line.label.startswith("In [7], line ")
    # Most host time first; the idle shares are of all idle time in the sampled span.
    assert [x.host_us for x in h.lines] == sorted((x.host_us for x in h.lines), reverse=True)
    in_span = sum(max(0.0, min(b, samples.end_us) - max(a, samples.start_us)) for a, b, _ in gaps)
    assert h.idle_us == pytest.approx(in_span, abs=1e-6)
    assert sum(x.idle_us for x in h.lines) == pytest.approx(h.idle_charged_us)
    for x in h.lines:
        assert sum(x.idle_by_cause_us.values()) == pytest.approx(x.idle_us)


@pytest.mark.parametrize("seed", range(10))
def test_exact_lines_match_brute_force(seed: int) -> None:
    """Line events (mode "exact"): each opens a stretch of its stack that lasts until the
    next one, the last until the end; an empty stack is time outside the cell, charged to
    no line; nothing before the first event is charged."""
    rng = random.Random(seed)
    base, gaps = random_samples(rng, "exact")
    stacks = (*base.stacks, ())
    of = tuple(rng.randrange(len(stacks)) for _ in base.ts_us)
    ends = (*base.ts_us[1:], base.end_us)
    # Some stretches lost part of their time to other processes (the thread waited for a
    # core): that part is no line's, host and idle alike.
    lost = tuple(
        (b - a) * rng.choice((0.0, 0.0, 0.25, 0.5)) for a, b in zip(base.ts_us, ends, strict=True)
    )
    samples = StackSamples(
        base.frames,
        stacks,
        base.ts_us,
        of,
        0.0,
        base.start_us,
        base.end_us,
        mode="exact",
        engine="settrace",
        lost_us=lost,
    )
    h = compute_hotspots(make_trace(samples=samples, cells={CELL: 7}), timeline_of(gaps))
    ts = np.array(samples.ts_us)
    user = [frame_kind(f.file) == "user" for f in samples.frames]
    host: dict[int, float] = {}
    idle: dict[int, float] = {}
    tick = 0.5
    for x in np.arange(ts[0] + tick / 2, samples.end_us, tick):
        i = int(np.searchsorted(ts, x, side="right")) - 1
        stack = stacks[of[i]]
        if not stack:
            continue
        inner = [f for f in stack if user[f]][-1]
        kept = 1 - lost[i] / (ends[i] - ts[i])
        host[inner] = host.get(inner, 0.0) + tick * kept
        if any(a <= x < b for a, b, _ in gaps):
            idle[inner] = idle.get(inner, 0.0) + tick * kept
    if not host:
        assert h is None or not h.lines
        return
    assert h is not None and h.granularity == "line"
    assert "exact line events" in h.source and "sys.settrace" in h.source
    got = {(line.file, line.line, line.function): line for line in h.lines}
    assert len(got) == len(host)
    for f, us in host.items():
        fr = samples.frames[f]
        line = got[(fr.file, fr.line, fr.function)]
        assert line.host_us == pytest.approx(us, abs=1e-6)
        assert line.idle_us == pytest.approx(idle.get(f, 0.0), abs=1e-6)
        assert 0.0 <= line.share <= 1.0 and 0.0 <= line.idle_share <= 1.0
    assert sum(x.host_us for x in h.lines) <= h.host_us + 1e-6
    assert sum(x.idle_us for x in h.lines) <= h.idle_us + 1e-6
    inside = sum(w for w, s in zip(lost, of, strict=True) if stacks[s])
    assert h.lost_us == pytest.approx(inside, abs=1e-6)


def test_icicle_blocks_add_up() -> None:
    samples, gaps = random_samples(random.Random(3))
    h = compute_hotspots(make_trace(samples=samples), timeline_of(gaps))
    assert h is not None
    for k, node in enumerate(h.nodes):
        children = [c for c in h.nodes if c.parent == k]
        assert node.total_us == pytest.approx(node.self_us + sum(c.total_us for c in children))
        if node.parent >= 0:
            assert h.nodes[node.parent].depth == node.depth - 1
    roots = [n for n in h.nodes if n.parent < 0]
    assert sum(n.total_us for n in roots) == pytest.approx(h.host_us)
    # Library frames under a user frame are one block; the user frame inside them is apart.
    kinds = [n.kind for n in h.nodes]
    assert "user" in kinds and "torch" in kinds


def py(name: str, start: float, dur: float, tid: int = 1) -> Op:
    return Op(name, "python", float(start), float(dur), 1, tid)


def random_events(rng: random.Random) -> list[Op]:
    names = [
        "train.py(10): step",
        "train.py(30): loss_fn",
        "torch/nn/modules/module.py(1751): _call_impl",
        "inspect.py(3346): signature",
        "<built-in method item>",
    ]
    out: list[Op] = []

    def fill(lo: float, hi: float, depth: int) -> None:
        t = lo
        while depth < 4 and t < hi - 2:
            a = rng.uniform(t, hi - 1)
            b = rng.uniform(a + 0.5, hi)
            out.append(py(rng.choice(names) if depth else "train.py(1): <module>", a, b - a))
            if rng.random() < 0.7:
                fill(a, b, depth + 1)
            t = b + rng.uniform(0, 5)
            if rng.random() < 0.3:
                break

    fill(0.0, 400.0, 0)
    # Another thread's events are left out (the thread with the most events is taken).
    out.append(py("other.py(1): worker", 0.0, 400.0, tid=2))
    return sorted(out, key=lambda o: o.start_us)


def brute_events(ops: list[Op], gaps, tick: float = 0.05):
    host: dict[str, float] = {}
    idle: dict[str, float] = {}
    main = [o for o in ops if o.tid == 1]
    lo, hi = min(o.start_us for o in main), max(o.start_us + o.dur_us for o in main)
    for x in np.arange(lo + tick / 2, hi, tick):
        open_ = [o for o in main if o.start_us <= x < o.start_us + o.dur_us]
        if not open_:
            continue
        # The open events nest: the deepest is the one that started last (longest first).
        open_.sort(key=lambda o: (o.start_us, -o.dur_us))
        users = [o.name for o in open_ if o.name.startswith("train.py")]
        if not users:
            continue
        name = users[-1]
        host[name] = host.get(name, 0.0) + tick
        if any(a <= x < b for a, b, _ in gaps):
            idle[name] = idle.get(name, 0.0) + tick
    return host, idle


@pytest.mark.parametrize("seed", range(8))
def test_python_events_match_brute_force(seed: int) -> None:
    rng = random.Random(100 + seed)
    ops = random_events(rng)
    gaps = [(a, a + rng.uniform(1, 20), "host") for a in range(0, 400, 37)]
    h = compute_hotspots(make_trace(ops=ops), timeline_of(gaps))
    assert h is not None and h.granularity == "function"
    host, idle = brute_events(ops, gaps)
    got = {f"{x.file}({x.line}): {x.function}": x for x in h.lines}
    assert set(got) == set(host)
    for name, us in host.items():
        assert got[name].host_us == pytest.approx(us, abs=0.5)
        assert got[name].idle_us == pytest.approx(idle.get(name, 0.0), abs=0.5)


def test_no_stacks_no_hotspots() -> None:
    trace = make_trace(ops=[Op("aten::add", "op", 0.0, 10.0, 1, 1)])
    assert compute_hotspots(trace, device_timeline(trace)) is None


@pytest.mark.skipif(not (SHARED / "tracelens").is_dir(), reason="shared traces not present")
def test_real_trace_with_python_events() -> None:
    """A real MI300 DDP trace recorded with with_stack=True: the user's own functions lead,
    torch and the standard library are not called the user's lines."""
    trace = load_trace(SHARED / "tracelens/tests/traces/mi300/resnet_act_checkpoint.json.gz")
    h = compute_hotspots(trace, device_timeline(trace))
    assert h is not None and h.granularity == "function" and h.on_device
    assert all(x.file == "train_ddp.py" for x in h.lines), [x.label for x in h.lines]
    assert h.lines[0].label == "train_ddp.py, train_step (defined at line 82)"
    assert h.idle_charged_us == pytest.approx(sum(x.idle_us for x in h.lines))
    assert 0 < h.idle_charged_us <= h.idle_us + 1e-6
    assert {n.kind for n in h.nodes} >= {"user", "torch"}


@pytest.mark.parametrize("seed", range(20))
def test_gaps_measured_per_step_match_within(seed: int) -> None:
    """within_steps (every cause at once, on the spans between sorted points) and meets_steps
    (the spans that can hold idle time) against within() span by span and cause by cause;
    overlapping gaps take within()'s own path."""
    from gpuprof_nb.analysis.derived import TraceIndex
    from gpuprof_nb.analysis.hotspots import _Gaps
    from gpuprof_nb.results.timeline import IDLE_CAUSES

    rng = np.random.default_rng(seed)
    lo = np.sort(rng.choice(np.arange(0, 200, 5.0), size=12, replace=False))
    width = rng.uniform(0.5, 4.0 if seed % 4 else 12.0, size=12)  # 12: gaps may overlap
    causes = rng.choice(["host", "launch", "sync"], size=12)
    timeline = timeline_of(
        list(zip(lo.tolist(), (lo + width).tolist(), causes.tolist(), strict=True))
    )
    gaps = _Gaps(TraceIndex(make_trace()), timeline)
    points = np.unique(np.round(rng.uniform(-10, 220, size=150), 1))
    spans = rng.random(len(points) - 1) < 0.7
    a, b = points[:-1], points[1:]
    meets = gaps.meets_steps(points)
    assert (gaps.within(a[~meets], b[~meets]) == 0.0).all()
    got_all, got = gaps.within_steps(points, spans, IDLE_CAUSES)
    assert got_all.tolist() == gaps.within(a[spans], b[spans]).tolist()
    for cause in IDLE_CAUSES:
        assert got[cause].tolist() == gaps.within(a[spans], b[spans], cause).tolist()


def test_first_seen_numbers_values_as_codes_of() -> None:
    from gpuprof_nb.analysis.derived import codes_of
    from gpuprof_nb.analysis.hotspots import _first_seen

    rng = np.random.default_rng(3)
    for n in (0, 1, 5, 300):
        codes = rng.integers(0, 40, size=n)
        seen, renumbered = _first_seen(codes, 40)
        distinct, expected = codes_of(codes.tolist(), n)
        assert seen.tolist() == distinct and renumbered.tolist() == expected.tolist()
