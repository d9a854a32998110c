"""device_timeline against a brute-force recomputation on random synthetic traces.

Every event sits on a whole microsecond, so the brute force can judge the trace one
microsecond cell at a time: a cell is busy when a kernel of the chosen device covers it, and
an idle cell gets its cause from the rules in the timeline module's docstring, applied to the
cell's own hole and piece. Nothing here uses the module's interval code; the answers are cell
counts, so the comparison is exact.
"""

from __future__ import annotations

import random

import pytest

from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.model.trace import Kernel, Op, RuntimeCall, Step, SyncEvent, Trace

SYNC_SLACK = 50  # thresholds.SYNC_SLACK_US
SHORT_GAP = 20  # thresholds.LAUNCH_GAP_MAX_US and CPU_DISPATCH_GAP_MAX_US
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
CAUSES = ("dataloader", "sync", "launch", "host", "other")


def _nested_ops(rng: random.Random, tid: int, lo: int, hi: int) -> list[Op]:
    """Random properly nested torch ops on one thread within [lo, hi)."""
    out: list[Op] = []
    t = lo + rng.randint(0, 30)
    while t < hi - 5:
        dur = rng.randint(1, 120)
        end = min(t + dur, hi)
        name = DATALOADER if rng.random() < 0.08 else rng.choice(["aten::mm", "aten::add"])
        out.append(Op(name, "op", float(t), float(end - t), 1, tid))
        # Children inside the parent, some starting with it (the longer op is the parent).
        c = t
        while c < end - 2 and rng.random() < 0.6:
            c_end = rng.randint(c + 1, end)
            out.append(Op("aten::empty", "op", float(c), float(c_end - c), 1, tid))
            c = c_end + rng.randint(0, 3)
        t = end + rng.choice([0, 0, 1, 3, 10, 25, 60, 200])
    return out


def random_trace(seed: int, with_device: bool = True) -> Trace:
    rng = random.Random(seed)
    ops = _nested_ops(rng, 1, 0, 1500) + _nested_ops(rng, 2, 100, 1400)
    # The profiler's own span is wider than the work and must not widen the window.
    ops.append(Op("PyTorch Profiler (0)", "annotation", -200.0, 2000.0, 1, 1))
    kernels: list[Kernel] = []
    runtime: list[RuntimeCall] = []
    corr = 0
    if with_device:
        t = rng.randint(0, 100)
        while t < 1700:
            corr += 1
            dur = rng.randint(1, 40)
            device = 0 if rng.random() < 0.9 else 1  # device 1 is lighter: 0 is chosen
            kernels.append(
                Kernel(
                    "k",
                    "kernel",
                    float(t),
                    float(dur),
                    device,
                    rng.choice([7, 8]),
                    correlation=corr,
                )
            )
            if rng.random() < 0.9:  # some kernels have no launch call in the trace
                launched = t - rng.choice([1, 5, 30, 90])
                runtime.append(
                    RuntimeCall("cudaLaunchKernel", float(launched), 2.0, 1, 1, correlation=corr)
                )
            if rng.random() < 0.2:  # another kernel starting at the same time
                corr += 1
                kernels.append(
                    Kernel(
                        "k2", "kernel", float(t), float(rng.randint(1, 9)), 0, 9, correlation=corr
                    )
                )
                runtime.append(
                    RuntimeCall(
                        "cudaLaunchKernel",
                        float(t - rng.randint(1, 60)),
                        2.0,
                        1,
                        2,
                        correlation=corr,
                    )
                )
            t += dur + rng.choice([-3, 0, 1, 5, 15, 19, 20, 21, 40, 80, 150])
        for _ in range(rng.randint(0, 6)):
            s = rng.randint(0, 1600)
            runtime.append(
                RuntimeCall("cudaStreamSynchronize", float(s), float(rng.randint(1, 80)), 1, 1)
            )
    syncs = (
        [
            SyncEvent("Event Sync", float(s), float(rng.randint(1, 40)), 0, -1)
            for s in rng.sample(range(0, 1600), rng.randint(0, 3))
        ]
        if with_device
        else []
    )
    steps = []
    t = rng.randint(-50, 200)
    for number in range(rng.randint(0, 5)):
        dur = rng.randint(50, 600)
        steps.append(Step(number, f"ProfilerStep#{number}", float(t), float(t + dur)))
        t += dur + rng.randint(0, 50)
    spans = (
        [(o.start_us, o.end_us) for o in ops]
        + [(k.start_us, k.end_us) for k in kernels]
        + [(r.start_us, r.end_us) for r in runtime]
    )
    window = (min(s for s, _ in spans), max(e for _, e in spans))
    return Trace(
        source=f"random-{seed}",
        ops=tuple(sorted(ops, key=lambda o: o.start_us)),
        kernels=tuple(sorted(kernels, key=lambda k: k.start_us)),
        runtime=tuple(sorted(runtime, key=lambda r: r.start_us)),
        syncs=tuple(sorted(syncs, key=lambda s: s.start_us)),
        memory=(),
        steps=tuple(steps),
        devices=(),
        distributed=None,
        bounds_us=window,
    )


def brute_force(trace: Trace) -> dict:
    """Return per-cell answers: window, busy cells, each idle cell's cause, host-in-op cells."""
    ends = [(o.start_us, o.end_us) for o in trace.ops if not o.name.startswith("PyTorch Prof")]
    ends += [(k.start_us, k.end_us) for k in trace.kernels]
    ends += [(r.start_us, r.end_us) for r in trace.runtime]
    lo = int(max(min(s for s, _ in ends), trace.bounds_us[0]))
    hi = int(min(max(e for _, e in ends), trace.bounds_us[1]))
    device_time: dict[int, set[int]] = {}
    for k in trace.kernels:
        device_time.setdefault(k.device, set()).update(range(int(k.start_us), int(k.end_us)))
    on_device = bool(device_time)
    device = min(device_time, key=lambda d: (-len(device_time[d]), d)) if on_device else None
    ops = [o for o in trace.ops if o.kind == "op"]
    in_op = set()
    for o in ops:  # properly nested: the union of all ops is the union of the top-level ones
        in_op.update(range(int(o.start_us), int(o.end_us)))
    busy_cells = device_time[device] if on_device else in_op
    busy = [t in busy_cells for t in range(lo, hi)]
    dl = set()
    for o in trace.ops:
        if "DataLoader" in o.name and "__next__" in o.name:
            dl.update(range(int(o.start_us), int(o.end_us)))
    syncs = [(r.start_us, r.end_us) for r in trace.runtime if r.name == "cudaStreamSynchronize"]
    syncs += [(s.start_us, s.end_us) for s in trace.syncs]
    launch_at: dict[int, float] = {}
    for r in trace.runtime:
        if r.correlation is not None:
            launch_at.setdefault(r.correlation, r.start_us)

    cause: dict[int, str] = {}
    t = lo
    while t < hi:
        if busy[t - lo]:
            t += 1
            continue
        a = t
        while t < hi and not busy[t - lo]:
            t += 1
        b = t  # the hole [a, b)
        edge = a <= lo or b >= hi
        c = a
        while c < b:
            p = c  # a piece: a run of DataLoader cells, or of other idle cells
            in_dl = c in dl
            while c < b and (c in dl) == in_dl:
                c += 1
            if in_dl:
                what = "dataloader"
            elif on_device and any(s <= p and e >= p - SYNC_SLACK and e > s for s, e in syncs):
                what = "sync"
            elif not edge and b - a < SHORT_GAP:
                what = "launch"
            elif edge or not on_device:
                what = "host"
            else:
                times = [
                    launch_at[k.correlation]
                    for k in trace.kernels
                    if k.device == device and k.start_us == b and k.correlation in launch_at
                ]
                what = "host" if times and min(times) > a else "other"
            for x in range(p, c):
                cause[x] = what
    return {
        "lo": lo,
        "hi": hi,
        "busy": busy_cells,
        "cause": cause,
        "in_op": in_op,
        "on_device": on_device,
        "device": device,
    }


def _expected(bf: dict, a: int, b: int) -> dict[str, float]:
    cells = range(max(a, bf["lo"]), min(b, bf["hi"]))
    out = {c: float(sum(1 for t in cells if bf["cause"].get(t) == c)) for c in CAUSES}
    out["busy"] = float(sum(1 for t in cells if t in bf["busy"]))
    out["host_in_ops"] = (
        float(sum(1 for t in cells if bf["cause"].get(t) == "host" and t in bf["in_op"]))
        if bf["on_device"]
        else 0.0
    )
    return out


def _actual(bd) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out = dict(bd.us_by_category())
    out["host_in_ops"] = bd.host_in_ops_us
    return out


@pytest.mark.parametrize("seed", range(40))
def test_breakdown_matches_cell_by_cell_recomputation(seed: int) -> None:
    trace = random_trace(seed, with_device=seed % 5 != 0)
    tl = device_timeline(trace)
    bf = brute_force(trace)
    assert (tl.start_us, tl.end_us) == (bf["lo"], bf["hi"])
    assert tl.device == bf["device"]
    assert _actual(tl.breakdown) == _expected(bf, bf["lo"], bf["hi"])
    assert len(tl.steps) == len(trace.steps)
    for step, got in zip(trace.steps, tl.steps, strict=True):
        assert _actual(got.breakdown) == _expected(bf, int(step.start_us), int(step.end_us))
    # Each gap's cells carry its cause, and the gaps cover exactly the idle cells.
    covered = set()
    for g in tl.gaps:
        cells = range(int(g.start_us), int(g.end_us))
        assert {bf["cause"][t] for t in cells} == {g.cause}
        covered.update(cells)
    assert covered == set(bf["cause"])


def test_random_traces_exercise_every_cause() -> None:
    """The generator is only useful if it produces every cause somewhere."""
    seen = set()
    for seed in range(40):
        seen.update(brute_force(random_trace(seed, with_device=seed % 5 != 0))["cause"].values())
    assert seen == set(CAUSES)
