"""The synchronisation rule: the host blocking on the device (`host_sync`: `.item()`,
`.cpu()`, synchronize) while the device then idles."""

from __future__ import annotations

from itertools import compress
from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis.derived import op_columns, op_names, runtime_names, runtime_starts
from gpuprof_nb.analysis.intervals import merge_intervals
from gpuprof_nb.analysis.rules.context import Context, make_finding, name_rows, union_in
from gpuprof_nb.analysis.streams import runtime_durs
from gpuprof_nb.analysis.timeline import SYNC_RUNTIME_NAMES
from gpuprof_nb.results.diagnosis import Finding

_NAME = attrgetter("name")


def rule_host_sync(c: Context) -> Finding | None:
    ix = c.index
    sync_names = SYNC_RUNTIME_NAMES & runtime_names(ix)
    runtime = c.trace.runtime
    # The positions of the calls with those names, tested in C (no Python frame per call).
    calls = np.fromiter(
        compress(range(len(runtime)), map(sync_names.__contains__, map(_NAME, runtime)))
        if sync_names
        else (),
        dtype=np.intp,
    )
    events = [s for s in c.trace.syncs if s.name in ("Stream Sync", "Context Sync", "Event Sync")]
    item_names = frozenset({"aten::item", "aten::_local_scalar_dense"} & op_names(ix))
    # The torch ops (kind "op") with those names, as rows of the op columns, in trace order.
    # aten::item calls aten::_local_scalar_dense: count the outer one only.
    items = outer = np.zeros(0, dtype=np.intp)
    if item_names:
        items = name_rows(ix, item_names)
        outer = name_rows(ix, frozenset({"aten::item"}), items)
        if not len(outer):
            outer = items
    if not len(calls) and not events and not len(outer):
        return None
    if not c.on_device:
        return None
    # Each call's end as RuntimeCall.end_us finds it: start + dur.
    starts = runtime_starts(ix)[calls]
    ends = starts + runtime_durs(ix)[calls]
    blocked = merge_intervals(
        list(zip(starts.tolist(), ends.tolist(), strict=True))
        + [(s.start_us, s.end_us) for s in events]
    )
    bd = c.timeline.breakdown
    idle = bd.sync_us if bd is not None else 0.0
    evidence = {
        "sync_calls_per_step": c.per_step(
            starts if len(calls) else np.array([s.start_us for s in events], dtype=float)
        ),
        "item_calls_per_step": c.per_step(op_columns(ix).start[outer]),
        "host_blocked_us": union_in(blocked, c.lo, c.hi),
        "device_idle_after_sync_us": idle,
        "device_idle_after_sync_fraction": c.frac(idle),
    }
    share = c.frac(idle)
    title = (
        f"The host waits for the GPU at synchronisation points "
        f"({evidence['sync_calls_per_step']:.3g} {c.each}); the GPU then idles "
        f"{share * 100:.0f}% of the time"
    )
    return make_finding("host_sync", title, share, evidence)
