"""The communication rule: collectives (NCCL kernels, or gloo on the host) and how much of
their time compute hides (`communication`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuprof_nb.analysis.classify import is_host_collective
from gpuprof_nb.analysis.derived import memo, op_names
from gpuprof_nb.analysis.intervals import (
    Interval,
    clip_intervals,
    clipped_union,
    intersect_intervals,
    merge_arrays,
    merge_intervals,
    union_length,
)
from gpuprof_nb.analysis.rules.context import Context, make_finding, spans_length
from gpuprof_nb.analysis.rules.context import overlap_us as overlap_of
from gpuprof_nb.results.diagnosis import Finding


def host_collective_spans(c: Context) -> Sequence[Interval]:
    """Return the merged host ranges of collectives (`gloo:all_reduce`, `c10d::allreduce_`)."""
    names = {name for name in op_names(c.index) if is_host_collective(name)}
    if not names:
        return ()
    return memo(
        c.index,
        ("host_collective_spans", c.lo, c.hi),
        lambda: tuple(
            merge_intervals(
                clip_intervals(
                    ((o.start_us, o.end_us) for o in c.trace.ops if o.name in names), c.lo, c.hi
                )
            )
        ),
    )


def rule_communication(c: Context) -> Finding | None:
    if not c.on_device:
        return _rule_host_communication(c)
    kc = c.kcols
    is_comm = kc.of_class("comm")  # kernels only
    if not is_comm.any():
        return None
    # The unions are apart (merge_arrays joins touching spans): their lengths, and those
    # of their overlap's pieces, sum in order as union_length sums them.
    comm_spans = clipped_union(kc.start[is_comm], kc.end[is_comm], c.lo, c.hi)
    other = kc.is_kernel & ~is_comm
    comm_us = spans_length(*comm_spans)
    overlap_us = overlap_of(comm_spans, merge_arrays(kc.start[other], kc.end[other]))
    exposed = comm_us - overlap_us
    overlap = overlap_us / comm_us if comm_us > 0 else 0.0
    return make_finding(
        "communication",
        f"Collectives take {c.frac(comm_us) * 100:.0f}% of the time; "
        f"{overlap * 100:.0f}% of it overlaps compute",
        c.frac(exposed),
        {
            "communication_time_us": comm_us,
            "communication_share_fraction": c.frac(comm_us),
            "overlap_with_compute_fraction": overlap,
            "exposed_communication_us": exposed,
            "collective_kernels_count": float(np.count_nonzero(is_comm)),
        },
    )


def _rule_host_communication(c: Context) -> Finding | None:
    """Collectives on a trace without device activity (gloo on CPU): the host ranges of the
    collectives, and how much of them torch ops on other threads overlap."""
    comm_spans = host_collective_spans(c)
    if not comm_spans:
        return None
    comm_us = union_length(comm_spans)
    compute = merge_intervals(
        (o.start_us, o.end_us) for o in c.top_ops if not is_host_collective(o.name)
    )
    overlap_us = union_length(intersect_intervals(comm_spans, compute))
    overlap = overlap_us / comm_us if comm_us > 0 else 0.0
    host_names = {n for n in op_names(c.index) if is_host_collective(n)}
    count = sum(1 for o in c.trace.ops if o.name in host_names) if host_names else 0
    return make_finding(
        "communication",
        f"Collectives on the host take {c.frac(comm_us) * 100:.0f}% of the time; "
        f"{overlap * 100:.0f}% of it overlaps torch ops",
        c.frac(comm_us - overlap_us),
        {
            "communication_time_us": comm_us,
            "communication_share_fraction": c.frac(comm_us),
            "overlap_with_compute_fraction": overlap,
            "exposed_communication_us": comm_us - overlap_us,
            "collective_calls_count": float(count),
        },
    )
