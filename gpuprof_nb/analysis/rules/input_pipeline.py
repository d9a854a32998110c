"""Rules for the input pipeline: the step waiting on the DataLoader (`dataloader`) and
host-device copies that are slow or not hidden behind compute (`host_device_copy`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis.derived import KERNEL_KINDS
from gpuprof_nb.analysis.intervals import (
    Interval,
    clipped_union,
    merge_arrays,
    merge_intervals,
    union_length,
)
from gpuprof_nb.analysis.rules.context import (
    Context,
    make_finding,
    overlap_us,
    spans_length,
    union_in,
)
from gpuprof_nb.analysis.timeline import dataloader_ops
from gpuprof_nb.results.diagnosis import Finding

_NAME, _BYTES = attrgetter("name"), attrgetter("bytes")


def rule_dataloader(c: Context) -> Finding | None:
    loads = dataloader_ops(c.index)
    spans = merge_intervals((o.start_us, o.end_us) for o in loads)
    if not spans:
        return None
    dl_us = union_in(spans, c.lo, c.hi)
    count = len(loads)
    steps = merge_intervals((s.start_us, s.end_us) for s in c.trace.steps)
    step_us = union_length(steps) if steps else c.span_us
    step_dl = union_in(spans, *_bounds(steps)) if steps else dl_us
    evidence: dict[str, float] = {
        "dataloader_time_us": dl_us,
        "dataloader_share_of_step_time_fraction": step_dl / step_us if step_us > 0 else 0.0,
        "dataloader_calls_count": float(count),
    }
    bd = c.timeline.breakdown
    if c.on_device and bd is not None:
        evidence["device_idle_in_dataloader_us"] = bd.dataloader_us
        evidence["device_idle_in_dataloader_fraction"] = c.frac(bd.dataloader_us)
        share = c.frac(bd.dataloader_us)
    else:
        share = c.frac(dl_us)
    title = (
        f"The {'GPU' if c.on_device else 'step'} waits for the DataLoader: "
        f"{share * 100:.0f}% of the time goes to loading batches"
    )
    return make_finding("dataloader", title, share, evidence)


def _bounds(spans: Sequence[Interval]) -> tuple[float, float]:
    return (spans[0][0], spans[-1][1]) if spans else (0.0, 0.0)


def rule_host_device_copy(c: Context) -> Finding | None:
    kc = c.kcols
    is_copy = kc.kind == KERNEL_KINDS.index("memcpy")
    if not is_copy.any():
        return None
    copies = list(compress(c.kernels, is_copy.tolist()))
    # The unions are apart (merge_arrays joins touching spans): their overlap's pieces are
    # apart too, and the union of the copies is its own merge, so lengths sum in order.
    copy_spans = clipped_union(kc.start[is_copy], kc.end[is_copy], c.lo, c.hi)
    copy_us = spans_length(*copy_spans)
    overlapped = overlap_us(copy_spans, merge_arrays(kc.start[kc.is_kernel], kc.end[kc.is_kernel]))
    exposed = copy_us - overlapped
    # Copy names repeat: each distinct one is read once.
    by_name = Counter(map(_NAME, copies))
    pageable = sum(n for name, n in by_name.items() if "pageable" in name.lower())
    # The copies with a payload and a positive duration, in order.
    payload = list(map(_BYTES, copies))
    durations = kc.dur[is_copy]
    sized = np.fromiter(map(bool, payload), dtype=bool, count=len(payload)) & (durations > 0)
    evidence = {
        "memcpy_time_us": copy_us,
        "memcpy_share_fraction": c.frac(copy_us),
        "memcpy_not_overlapped_fraction": c.frac(exposed),
        "pageable_copies_count": float(pageable),
    }
    if sized.any():
        evidence["memcpy_bandwidth_bytes_per_s"] = sum(compress(payload, sized.tolist())) / (
            sum(durations[sized].tolist()) * 1e-6
        )
    return make_finding(
        "host_device_copy",
        f"Host-device copies take {c.frac(copy_us) * 100:.0f}% of the time, "
        f"{c.frac(exposed) * 100:.0f}% not hidden behind compute"
        + (f" ({pageable} from pageable memory)" if pageable else ""),
        c.frac(exposed),
        evidence,
    )
