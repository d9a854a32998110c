"""Findings from a memory analysis: out of memory, fragmentation, growth, the peak."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.analysis.diagnose import Finding
from gpuprof_nb.analysis.fixes import MEMORY_FIXES, peak_memory_advice
from gpuprof_nb.model.units import fmt_bytes
from gpuprof_nb.results.memory import AtPeak, Leaks, MemoryTimeline, OomEvent, SegmentSummary

_MIB = 2**20
_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}


def memory_findings(
    tl: MemoryTimeline,
    at_peak: AtPeak,
    leaks: Leaks,
    segments: SegmentSummary,
    ooms: Sequence[OomEvent],
    *,
    cpu: bool = False,
) -> tuple[Finding, ...]:
    """Return findings (oom, fragmentation, memory_growth, peak_memory), most important
    first, each with the numbers behind it. `cpu`: the host's memory (the CPU fallback),
    whose advice names no CUDA-only setting."""
    found = (
        *(_oom_finding(oom, at_peak) for oom in ooms[-1:]),
        _fragmentation_finding(segments),
        _growth_finding(tl, leaks),
        _peak_finding(tl, at_peak, cpu),
    )
    out = [f for f in found if f is not None]
    return tuple(sorted(out, key=lambda f: (_SEVERITY_ORDER.get(f.severity, 9), f.kind)))


def _oom_finding(oom: OomEvent, at_peak: AtPeak) -> Finding:
    """The out-of-memory error, and why it happened: fragmentation, live tensors, or a
    request larger than the device had free."""
    unused = (oom.reserved_bytes - oom.active_bytes) if oom.reserved_bytes is not None else None
    evidence: dict[str, float] = {
        "requested_bytes": oom.requested_bytes,
        "active_bytes": oom.active_bytes,
    }
    if oom.device_free_bytes is not None:
        evidence["device_free_bytes"] = oom.device_free_bytes
    if oom.reserved_bytes is not None and unused is not None:
        evidence["reserved_bytes"] = oom.reserved_bytes
        evidence["reserved_unused_bytes"] = unused
    top = at_peak.sites[0].site.label if at_peak.sites else "unknown"
    frag = unused is not None and unused >= oom.requested_bytes
    if frag:
        why = (
            "the allocator held enough cached memory but in pieces too small for it (fragmentation)"
        )
    elif oom.active_bytes >= oom.requested_bytes or oom.device_free_bytes is None:
        why = "live tensors filled the device"
    else:
        # A request bigger than everything this process holds: the tensors are not what
        # filled the device (a huge request on an H100: 128 TiB asked, 72 MB live).
        why = (
            f"the request is larger than the {fmt_bytes(oom.device_free_bytes)} the device "
            f"had free, while this process held {fmt_bytes(oom.active_bytes)} in tensors"
        )
    return Finding(
        kind="oom",
        severity="high",
        title=f"Out of memory: a request for {fmt_bytes(oom.requested_bytes)} at "
        f"{oom.site.label} failed; {why}. Largest holder: {top}",
        evidence=evidence,
        fix=MEMORY_FIXES["oom"] + (MEMORY_FIXES["oom_fragmented"] if frag else ""),
    )


def _fragmentation_finding(segments: SegmentSummary) -> Finding | None:
    """A quarter or more of the reserved bytes free (1 MiB at least), in pieces the
    largest of which is at most half of them; None otherwise."""
    free = segments.free_bytes
    if not (
        segments.reserved_bytes
        and free >= 0.25 * segments.reserved_bytes
        and free >= _MIB
        and segments.fragmentation_ratio >= 0.5
    ):
        return None
    return Finding(
        kind="fragmentation",
        severity="medium",
        title=f"{fmt_bytes(free)} reserved but free, split into {segments.n_free_blocks} "
        f"pieces; the largest is {fmt_bytes(segments.largest_free_block_bytes)}",
        evidence={
            "reserved_bytes": segments.reserved_bytes,
            "allocated_bytes": segments.allocated_bytes,
            "free_in_segments_bytes": free,
            "largest_free_block_bytes": segments.largest_free_block_bytes,
            "fragmentation_fraction": segments.fragmentation_ratio,
        },
        fix=MEMORY_FIXES["fragmentation"],
    )


def _growth_finding(tl: MemoryTimeline, leaks: Leaks) -> Finding | None:
    """Memory that grows from step to step (high), else bytes the window left allocated,
    5% of the peak or more (low); None when neither."""
    if (
        leaks.growth_bytes_per_step is not None
        and leaks.growth_bytes_per_step > 0
        and leaks.step_end_bytes[-1] > leaks.step_end_bytes[0]
    ):
        top = leaks.growing_sites[0].site.label if leaks.growing_sites else "unknown"
        steps = len(leaks.step_end_bytes)
        return Finding(
            kind="memory_growth",
            severity="high",
            title=f"Memory grows by {fmt_bytes(leaks.growth_bytes_per_step)} per step over "
            f"{steps} steps; most from {top}",
            evidence={
                "growth_per_step_bytes": leaks.growth_bytes_per_step,
                "steps_count": steps,
                "first_step_end_bytes": leaks.step_end_bytes[0],
                "last_step_end_bytes": leaks.step_end_bytes[-1],
                "left_allocated_bytes": leaks.left_bytes,
            },
            fix=MEMORY_FIXES["memory_growth"],
        )
    if leaks.left_bytes and tl.peak_bytes and leaks.left_bytes >= 0.05 * tl.peak_bytes:
        top = leaks.left_sites[0].site.label if leaks.left_sites else "unknown"
        return Finding(
            kind="memory_growth",
            severity="low",
            title=f"The cell left {fmt_bytes(leaks.left_bytes)} allocated that it did not free; "
            f"most from {top}",
            evidence={"left_allocated_bytes": leaks.left_bytes, "peak_bytes": tl.peak_bytes},
            fix=MEMORY_FIXES["left_allocated"],
        )
    return None


def _peak_finding(tl: MemoryTimeline, at_peak: AtPeak, cpu: bool) -> Finding | None:
    """The peak and the site that held most of it, with advice for the peak (optimizer
    state among the holders changes it); None without a peak or sites."""
    if not (tl.peak_bytes > 0 and at_peak.sites):
        return None
    holder = at_peak.sites[0]
    cats = {s.category for s in at_peak.sites if s.category}
    optimizer = "optimizer_state" in cats or "optimizer state" in cats
    return Finding(
        kind="peak_memory",
        severity="info",
        title=f"Peak {fmt_bytes(tl.peak_bytes)}; {holder.site.label} held "
        f"{holder.share * 100:.1f}% of it",
        evidence={
            "peak_bytes": tl.peak_bytes,
            "top_site_bytes": holder.bytes,
            "top_site_share_fraction": holder.share,
        },
        fix=peak_memory_advice(optimizer_state_at_peak=optimizer, cpu=cpu),
    )
