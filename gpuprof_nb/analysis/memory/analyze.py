"""One device's memory analysis end to end: replay, timeline, at peak, leaks, segments,
OOMs and findings."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.analysis.memory.findings import memory_findings
from gpuprof_nb.analysis.memory.leaks import _leaks
from gpuprof_nb.analysis.memory.ooms import _ooms
from gpuprof_nb.analysis.memory.peak import _at_peak
from gpuprof_nb.analysis.memory.replay import _Replay, _replay, choose_device
from gpuprof_nb.analysis.memory.segments import segment_summary
from gpuprof_nb.analysis.memory.sites import BEFORE_LABEL, stack_sites
from gpuprof_nb.analysis.memory.timeline import _timeline, _window_range
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.results.memory import MemoryAnalysis


def analyze_snapshot(
    snapshot: MemorySnapshot,
    *,
    device: int | None = None,
    window: tuple[float | None, float | None] | None = None,
    step_starts: Sequence[int] | None = None,
    top_sites: int = 8,
) -> MemoryAnalysis:
    """Return the timeline, at-peak, leaks, segments, OOMs and findings of one device
    (default: the one with the most history). `window` = (start, end) in the timeline's
    unit (ms with time_us, else entry index); `step_starts` = trace indices where repeats
    began (default: the snapshot's own)."""
    if device is None:
        device = choose_device(snapshot)
    sites, site_of_stack = stack_sites(snapshot)
    rep = _replay(snapshot, device, site_of_stack)
    lo, hi = _window_range(rep.x, window)
    tl = _timeline(rep, device, sites, lo, hi, window, top_sites, _replay_notes(rep))
    peak = _at_peak(snapshot, rep, tl, sites)
    if step_starts is None:
        step_starts = snapshot.step_starts[device] if device < len(snapshot.step_starts) else ()
    leaks = _leaks(snapshot, rep, tl, sites, step_starts)
    segs = segment_summary(snapshot, device)
    ooms = tuple(
        o
        for o in _ooms(snapshot, rep, device, sites, site_of_stack)
        if tl.first_index <= o.index < tl.first_index + tl.n_events
    )
    findings = memory_findings(tl, peak, leaks, segs, ooms, cpu=snapshot.source == "cpu-profiler")
    return MemoryAnalysis(
        device=device,
        timeline=tl,
        at_peak=peak,
        leaks=leaks,
        segments=segs,
        ooms=ooms,
        findings=findings,
        sites=sites,
    )


def _replay_notes(rep: _Replay) -> list[str]:
    """Return what the replay had to assume or correct, one note each."""
    notes: list[str] = []
    if rep.time_problem:
        notes.append(rep.time_problem)
    if rep.resized_opens:
        notes.append(
            f"{rep.resized_opens} allocation(s) still live at the end count with the "
            "size of their block in the segments, "
            f"{rep.rounding_bytes:+,} B over the requested sizes the history "
            "records (the allocator rounds blocks up), so the curve ends at the "
            "active bytes the segments hold."
        )
    if rep.lost_frees:
        notes.append(
            f"{rep.lost_frees} allocation(s) the history leaves open are not live "
            "in the segments at dump time (their free was not recorded); counted "
            "as freed at the last entry."
        )
    if rep.implicit_closes:
        notes.append(
            f"{rep.implicit_closes} allocation(s) were reused without a recorded "
            "free_completed (entries skipped); treated as freed at the reuse."
        )
    if len(rep.unmatched_idx):
        notes.append(
            f"{len(rep.unmatched_idx)} free(s) of blocks allocated before recording "
            "(or dropped from a full history buffer); counted as "
            f"'{BEFORE_LABEL}'."
        )
    if rep.n == 0:
        notes.append("No history recorded (segments only): the numbers are the state at dump time.")
    return notes
