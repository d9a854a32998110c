"""top_ops against a brute-force recomputation of the attribution rules on random traces.

Times are whole microseconds, so every sum is exact whatever the order. The brute force
applies the rules in the ops module's docstring literally, with quadratic searches instead
of a stack: an op's parent is, among the ops of its thread ordered by (start, longer first,
file position), the last one before it that is still open when it starts (end > its start);
a launch call belongs to the last op in that order that started at or before the call and
is still open; a kernel's owner is its call's op, else the first op with its External id.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from gpuprof_nb.analysis.ops import top_ops
from gpuprof_nb.model.trace import Kernel, Op, RuntimeCall, Trace


def random_trace(seed: int) -> Trace:
    rng = random.Random(seed)
    ops: list[Op] = []
    names = ["aten::mm", "aten::add", "aten::copy_", "aten::empty", "aten::linear"]
    for tid in (1, 2):
        t = rng.randint(0, 20)
        while t < 800:
            dur = rng.randint(0, 80)
            ops.append(
                Op(
                    rng.choice(names),
                    "op",
                    float(t),
                    float(dur),
                    7,
                    tid,
                    external_id=rng.randint(1, 400),
                )
            )
            for _ in range(rng.randint(0, 4)):  # children, some past the parent's end
                c = rng.randint(t, t + dur)
                ops.append(
                    Op(
                        rng.choice(names),
                        "op",
                        float(c),
                        float(rng.randint(0, dur + 10)),
                        7,
                        tid,
                        external_id=rng.randint(1, 400),
                    )
                )
            t += dur + rng.choice([0, 1, 5, 30])
    ops.append(Op("ProfilerStep#1", "annotation", 0.0, 900.0, 7, 1))  # never a row or parent
    ops.sort(key=lambda o: o.start_us)
    ops = [
        Op(o.name, o.kind, o.start_us, o.dur_us, o.pid, o.tid, o.external_id, index=i)
        for i, o in enumerate(ops)
    ]
    kernels: list[Kernel] = []
    runtime: list[RuntimeCall] = []
    for corr in range(1, rng.randint(20, 120)):
        start = float(rng.randint(0, 850))
        how = rng.random()
        if how < 0.75:  # launched by a call on a host thread
            runtime.append(
                RuntimeCall("cudaLaunchKernel", start, 3.0, 7, rng.choice([1, 2]), correlation=corr)
            )
            ext = rng.randint(1, 400) if rng.random() < 0.5 else None
        else:  # no call in the trace: the External id (if any) decides
            ext = rng.randint(1, 400) if how < 0.9 else None
        kind = rng.choice(["kernel", "kernel", "memcpy"])
        kernels.append(
            Kernel(
                "k",
                kind,
                start + rng.randint(1, 50),
                float(rng.randint(1, 30)),
                0,
                7,
                correlation=corr,
                external_id=ext,
            )
        )
    runtime.append(RuntimeCall("cudaGetDevice", 5.0, 1.0, 7, 1, correlation=10**6))
    spans = [(o.start_us, o.end_us) for o in ops] + [(k.start_us, k.end_us) for k in kernels]
    return Trace(
        source=f"random-{seed}",
        ops=tuple(ops),
        kernels=tuple(sorted(kernels, key=lambda k: k.start_us)),
        runtime=tuple(sorted(runtime, key=lambda r: r.start_us)),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(min(s for s, _ in spans), max(e for _, e in spans)),
    )


def brute_force(trace: Trace) -> tuple[dict[str, list[float]], float]:
    """Return {name: [calls, self_cpu, total_cpu, self_device, total_device]} and the device
    time no op owns."""
    ops = [o for o in trace.ops if o.kind == "op"]
    order = {id(o): (o.start_us, -o.end_us, o.index) for o in ops}

    def ranked_before(o: Op) -> list[Op]:  # same thread, earlier in (start, -end, index)
        return [p for p in ops if (p.pid, p.tid) == (o.pid, o.tid) and order[id(p)] < order[id(o)]]

    parent: dict[int, Op | None] = {}
    for o in ops:
        open_ = [p for p in ranked_before(o) if p.end_us > o.start_us]
        parent[id(o)] = max(open_, key=lambda p: order[id(p)]) if open_ else None
    children: dict[int, list[Op]] = defaultdict(list)
    for o in ops:
        if parent[id(o)] is not None:
            children[id(parent[id(o)])].append(o)

    launched = {k.correlation for k in trace.kernels}
    call_owner: dict[int, Op | None] = {}
    for r in trace.runtime:
        if r.correlation not in launched:
            continue
        open_ = [
            p
            for p in ops
            if (p.pid, p.tid) == (r.pid, r.tid) and p.start_us <= r.start_us < p.end_us
        ]
        call_owner[r.correlation] = max(open_, key=lambda p: order[id(p)]) if open_ else None
    first_with_ext: dict[int, Op] = {}
    for o in ops:
        if o.external_id is not None:
            first_with_ext.setdefault(o.external_id, o)

    self_dev: dict[int, float] = defaultdict(float)
    unattributed = 0.0
    for k in trace.kernels:
        owner = call_owner.get(k.correlation)
        if owner is None and k.external_id is not None:
            owner = first_with_ext.get(k.external_id)
        if owner is None:
            unattributed += k.dur_us
        else:
            self_dev[id(owner)] += k.dur_us

    def total_dev(o: Op) -> float:
        return self_dev[id(o)] + sum(total_dev(c) for c in children[id(o)])

    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for o in ops:
        overlap = sum(min(c.end_us, o.end_us) - c.start_us for c in children[id(o)])
        row = rows[o.name]
        row[0] += 1
        row[1] += max(o.dur_us - overlap, 0.0)
        row[2] += o.dur_us
        row[3] += self_dev[id(o)]
        row[4] += total_dev(o)
    return dict(rows), unattributed


@pytest.mark.parametrize("seed", range(30))
def test_top_ops_matches_brute_force(seed: int) -> None:
    trace = random_trace(seed)
    table = top_ops(trace)
    expected, unattributed = brute_force(trace)
    got = {
        r.name: [r.calls, r.self_cpu_us, r.total_cpu_us, r.self_device_us, r.total_device_us]
        for r in table.rows
    }
    assert got == expected
    assert table.unattributed_device_us == unattributed
    assert table.calls == sum(v[0] for v in expected.values())
    assert table.self_device_us + unattributed == sum(k.dur_us for k in trace.kernels)
