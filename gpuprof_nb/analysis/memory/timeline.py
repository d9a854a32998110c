"""The memory timeline of one device: active and reserved bytes over a window of the
history, its peak, and the active bytes stacked by allocation site at sampled points."""

from __future__ import annotations

import numpy as np

from gpuprof_nb.analysis.memory.replay import (
    _before_at,
    _live_at,
    _Replay,
    _replay,
    choose_device,
)
from gpuprof_nb.analysis.memory.sites import BEFORE_LABEL, OTHER_LABEL, stack_sites
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.results.memory import MemoryTimeline, Site


def memory_timeline(
    snapshot: MemorySnapshot,
    window: tuple[float | None, float | None] | None = None,
    device: int | None = None,
) -> MemoryTimeline:
    """Return active and reserved bytes over time for one device (see analyze_snapshot)."""
    if device is None:
        device = choose_device(snapshot)
    sites, site_of_stack = stack_sites(snapshot)
    rep = _replay(snapshot, device, site_of_stack)
    lo, hi = _window_range(rep.x, window)
    return _timeline(rep, device, sites, lo, hi, window, 8, [])


def _window_range(
    x: np.ndarray, window: tuple[float | None, float | None] | None
) -> tuple[int, int]:
    """Return [lo, hi) indices of entries with window start <= x <= window end."""
    if window is None:
        return 0, len(x)
    start, end = window
    lo = 0 if start is None else int(np.searchsorted(x, start, side="left"))
    hi = len(x) if end is None else int(np.searchsorted(x, end, side="right"))
    return lo, max(lo, hi)


def _sample_points(active: np.ndarray, lo: int, hi: int, peak: int, limit: int) -> np.ndarray:
    """Indices in [lo, hi) to plot: all of them when few, else the maximum of each of
    `limit` buckets (so every spike shows) plus both ends and the peak."""
    if hi - lo <= limit:
        return np.arange(lo, hi, dtype=np.int64)
    edges = np.linspace(lo, hi, limit + 1).astype(np.int64)
    starts = edges[:-1]
    seg_max = np.maximum.reduceat(active[lo:hi], starts - lo)
    picks = []
    for k, start in enumerate(starts):
        end = edges[k + 1]
        picks.append(start + int(np.argmax(active[start:end] == seg_max[k])))
    return np.unique(np.array(picks + [lo, hi - 1, peak], dtype=np.int64))


def _timeline(
    rep: _Replay,
    device: int,
    sites: tuple[Site, ...],
    lo: int,
    hi: int,
    window: tuple[float | None, float | None] | None,
    top_n: int,
    notes: list[str],
) -> MemoryTimeline:
    """Return the timeline of entries [lo, hi) (the nearest entry when that is empty, with
    a note appended to `notes`), its peak, and the `top_n` sites stacked."""
    n_points = max(rep.n, 1)
    hi = min(hi, n_points)
    if hi <= lo:
        lo, hi = (min(lo, n_points - 1), min(lo, n_points - 1) + 1)
        notes.append("The window holds no history entries; showing the nearest one.")
    seg = rep.active[lo:hi]
    if lo > 0:
        start_bytes = int(rep.active[lo - 1])
    else:
        # Before the first entry: everything live since before recording.
        start_bytes = int(_before_at(rep, np.array([-1]))[0])
    peak = lo + int(np.argmax(seg))
    if start_bytes > rep.active[peak]:
        # The level only fell in the window: its peak is the state it started from (the
        # point before entry `lo`; -1 is before the first entry).
        peak = lo - 1
    points, labels, stacked = _stacked_sites(rep, sites, lo, hi, peak, top_n)
    reserved = rep.reserved[lo:hi] if rep.reserved is not None else None
    # The level after the last entry holds until the recording ends: one more sample at
    # the end gives it a width, so the area reaches every level it holds, a peak made by
    # the last allocation included (it had none when the curve stopped at that entry).
    end_x = _end_x(rep.x[lo:hi], rep.time_unit)
    sample_x = np.append(rep.x[points].astype(float), end_x)
    stacked = np.hstack([stacked, stacked[:, -1:]])
    return MemoryTimeline(
        device=device,
        time_unit=rep.time_unit,
        x=rep.x[lo:hi],
        active_bytes=seg,
        reserved_bytes=reserved,
        first_index=lo,
        peak_bytes=int(rep.active[peak]) if peak >= lo else start_bytes,
        peak_index=peak,
        peak_x=float(rep.x[max(peak, lo)]),
        start_bytes=start_bytes,
        end_bytes=int(rep.active[hi - 1]),
        reserved_peak_bytes=int(reserved.max()) if reserved is not None and len(reserved) else None,
        sample_x=sample_x,
        site_labels=labels,
        site_bytes=stacked,
        window=window,
        notes=tuple(notes),
        end_x=end_x,
    )


def _stacked_sites(
    rep: _Replay, sites: tuple[Site, ...], lo: int, hi: int, peak: int, top_n: int
) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    """Return the sampled entry indices, the layers' labels (the `top_n` sites by bytes
    live at the peak, then the other sites, then what was live before recording) and the
    layers' bytes at each sample (one row per label)."""
    live_at_peak = (rep.alloc_idx <= peak) & (rep.close_idx > peak)
    per_site = np.bincount(
        rep.alloc_site[live_at_peak], weights=rep.alloc_size[live_at_peak], minlength=len(sites)
    )
    ranked = [int(k) for k in np.argsort(-per_site, kind="stable") if per_site[k] > 0][:top_n]
    points = _sample_points(rep.active, lo, hi, max(peak, lo), 2000)
    rows = [_live_at(rep, points, rep.alloc_site == k) for k in ranked]
    before = _before_at(rep, points)
    total = rep.active[points]
    other = total - before - (np.sum(rows, axis=0) if rows else 0)
    labels = tuple(sites[k].label for k in ranked) + (OTHER_LABEL, BEFORE_LABEL)
    stacked = np.vstack([*rows, other, before]).astype(np.int64)
    return points, labels, stacked


def _end_x(x: np.ndarray, unit: str) -> float:
    """Where the level after the last entry ends: one entry on (history entries), else one
    typical gap between entries (the median of the positive ones; the recording's own end
    is not in a snapshot), at least a thousandth of the span shown."""
    last = float(x[-1]) if len(x) else 0.0
    if unit != "ms":
        return last + 1.0
    gaps = np.diff(np.asarray(x, dtype=float))
    gaps = gaps[gaps > 0]
    span = float(x[-1] - x[0]) if len(x) else 0.0
    step = float(np.median(gaps)) if len(gaps) else 0.0
    return last + max(step, span / 1000, 1e-3)
