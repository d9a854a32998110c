"""The synchronisation rule: the host blocking on the device (`host_sync`: `.item()`,
`.cpu()`, synchronize) while the device then idles."""

from __future__ import annotations

from gpuprof_nb.analysis.derived import op_names, runtime_names
from gpuprof_nb.analysis.intervals import merge_intervals
from gpuprof_nb.analysis.rules.context import Context, make_finding, union_in
from gpuprof_nb.analysis.timeline import SYNC_RUNTIME_NAMES
from gpuprof_nb.results.diagnosis import Finding


def rule_host_sync(c: Context) -> Finding | None:
    sync_names = SYNC_RUNTIME_NAMES & runtime_names(c.index)
    calls = [r for r in c.trace.runtime if r.name in sync_names] if sync_names else []
    events = [s for s in c.trace.syncs if s.name in ("Stream Sync", "Context Sync", "Event Sync")]
    item_names = {"aten::item", "aten::_local_scalar_dense"} & op_names(c.index)
    items = (
        [o for o in c.trace.ops if o.kind == "op" and o.name in item_names] if item_names else []
    )
    # aten::item calls aten::_local_scalar_dense: count the outer one only.
    n_item = sum(1 for o in items if o.name == "aten::item") or len(items)
    if not calls and not events and not n_item:
        return None
    if not c.on_device:
        return None
    blocked = merge_intervals(
        [(r.start_us, r.end_us) for r in calls] + [(s.start_us, s.end_us) for s in events]
    )
    bd = c.timeline.breakdown
    idle = bd.sync_us if bd is not None else 0.0
    outer_items = [o for o in items if o.name == "aten::item"] or items
    evidence = {
        "sync_calls_per_step": c.per_step(r.start_us for r in (calls or events)),
        "item_calls_per_step": c.per_step(o.start_us for o in outer_items),
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
