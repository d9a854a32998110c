"""Comparison 12: Will it fit on a snapshot of about a million history entries.

Input: the real CPU recordings of tests/data/fit (one training step of a small transformer at
batch 4 and 8, with their step records) repeated back to back until each holds about
`events` entries, as a cell that runs that many steps would record them (each repeat's
addresses moved past the last, its module calls, optimizer steps and tags shifted by the
allocations before it). Timed in this process, work only, median of `repeats`:
- the fit from the two recordings (`fit_batch_size`, what `%%memsnap --fit` adds);
- predicting the peak at 2x and 4x and the largest batch under a budget on it (what
  `report.predict` and the Will it fit tab do);
- memory by category and the fit from categories (what `analyze_memory` adds);
- a checkpointing plan under 90% of the peak.
Target (issue 37): the prediction, fit included, under 1 s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.measure import timed

REPO = Path(__file__).resolve().parent.parent
FIT = REPO / "tests" / "data" / "fit"
EVENTS = 1_000_000
QUICK_EVENTS = 20_000


def repeated(snapshot: Any, events: int) -> Any:
    """Return `snapshot` with its history (and step record) repeated until it holds about
    `events` entries; each copy's addresses are moved past the previous copy's."""
    from gpuprof_nb.model.memory import DeviceTrace
    from gpuprof_nb.model.step import ModuleCall, Tag

    trace = snapshot.traces[0]
    n = trace.n_events
    copies = max(1, -(-events // n))
    span = int(trace.addr.max()) + 1
    before = {b.address for s in snapshot.segments for b in s.blocks}
    shift = np.repeat(np.arange(copies, dtype=np.int64) * span, n)
    addr = np.tile(trace.addr, copies)
    own = ~np.isin(addr, list(before))
    addr = np.where(own, addr + shift, addr)
    time_us = None
    if trace.time_us is not None:
        width = float(trace.time_us[-1] - trace.time_us[0]) + 1.0
        time_us = np.tile(trace.time_us, copies) + np.repeat(np.arange(copies) * width, n)
    tiled = DeviceTrace(
        device=trace.device,
        action=np.tile(trace.action, copies),
        addr=addr,
        size=np.tile(trace.size, copies),
        stream=np.tile(trace.stream, copies),
        stack=np.tile(trace.stack, copies),
        time_us=time_us,
        device_free=np.tile(trace.device_free, copies),
        category=np.tile(trace.category, copies),
    )
    step = snapshot.step
    per = step.allocations
    calls, tags, backward, steps = [], [], [], []
    for k in range(copies):
        moved = k * per
        calls += [
            dataclasses.replace(
                c,
                enter=c.enter + moved,
                exit=c.exit + moved if c.exit >= 0 else -1,
                outputs=tuple((a + k * span, s) for a, s in c.outputs),
            )
            for c in step.calls
        ]
        tags += [
            Tag(
                t.address if t.address in before else t.address + k * span,
                t.size,
                t.category,
                t.at + moved,
            )
            for t in step.tags
        ]
        backward += [b + moved if b >= 0 else -1 for b in step.backward]
        steps += [(a + moved, b + moved) for a, b in step.optimizer_steps]
    assert all(isinstance(c, ModuleCall) for c in calls)
    record = dataclasses.replace(
        step,
        calls=tuple(calls),
        tags=tuple(tags),
        backward=tuple(backward),
        optimizer_steps=tuple(steps),
        allocations=per * copies,
    )
    return dataclasses.replace(snapshot, traces=(tiled,), step=record)


def measure(events: int, repeats: int) -> dict[str, Any]:
    from gpuprof_nb.analysis.fit import categories_and_fit, fit_batch_size
    from gpuprof_nb.analysis.memory import analyze_snapshot
    from gpuprof_nb.analysis.plan import plan_checkpointing
    from gpuprof_nb.io.snapshot import load_snapshot

    main = repeated(load_snapshot(FIT / "tiny_b8.pickle"), events)
    other = repeated(load_snapshot(FIT / "tiny_b4.pickle"), events)
    fit_s, fit = timed(lambda: fit_batch_size(main, 8, other, 4), repeats)
    peak = fit.predict(8).peak_bytes

    def predict() -> Any:
        return [fit.predict(16), fit.predict(32), fit.largest_batch(4 * peak)]

    predict_s, _ = timed(predict, max(repeats, 5))
    cats_s, _ = timed(lambda: categories_and_fit(main), repeats)
    plan_s, plan = timed(lambda: plan_checkpointing(main, int(peak * 0.9), fit=fit), 1)
    analyze_s, _ = timed(lambda: analyze_snapshot(main), 1)
    return {
        "events": main.n_events,
        "other_events": other.n_events,
        "fit_s": fit_s,
        "predict_s": predict_s,
        "categories_s": cats_s,
        "plan_s": plan_s,
        "analyze_s": analyze_s,
        "plan_modules": len(plan.modules),
        "peak": peak,
    }


def run(cfg: BenchConfig) -> Section:
    events = QUICK_EVENTS if cfg.quick else EVENTS
    got = measure(events, 1 if cfg.quick else 3)
    total = got["fit_s"] + got["predict_s"]
    lines = [
        f"Input: tests/data/fit's recordings at batch 8 and 4 (a small transformer's training "
        f"step, CPU fallback with its step record) repeated to {got['events']:,} and "
        f"{got['other_events']:,} history entries. In-process, work only, median of runs.",
        "",
        "| stage | seconds |",
        "|---|---|",
        f"| fit from the two recordings (`fit_batch_size`) | {got['fit_s']:.3f} |",
        f"| predict 2x, 4x and the largest batch under a budget | {got['predict_s']:.5f} |",
        f"| **prediction in all (fit + predict)** | **{total:.3f}** |",
        f"| memory by category + fit from categories (`analyze_memory` adds it) | "
        f"{got['categories_s']:.3f} |",
        f"| checkpointing plan under 90% of the peak ({got['plan_modules']} modules) | "
        f"{got['plan_s']:.3f} |",
        f"| for scale: `analyze_snapshot` of the same snapshot | {got['analyze_s']:.3f} |",
    ]
    target = Target(
        f"prediction (fit + predict) on a snapshot of {got['events']:,} entries",
        f"{total:.3f} s",
        "under 1 s",
        total < 1.0 if not cfg.quick else None,
    )
    return Section("12. Will it fit on a million-entry snapshot", "\n".join(lines), (target,))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(REPO))
    print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else EVENTS, 3))
