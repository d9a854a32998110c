"""What a window of the history left allocated, and growth from one step to the next."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuprof_nb.analysis.memory.replay import _live_at, _Replay
from gpuprof_nb.analysis.memory.sites import _category_name, _group
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.results.memory import Leaks, MemoryTimeline, Site, SiteBytes


def _leaks(
    snapshot: MemorySnapshot,
    rep: _Replay,
    tl: MemoryTimeline,
    sites: tuple[Site, ...],
    step_starts: Sequence[int],
) -> Leaks:
    """Return the allocations made in `tl`'s window and still open after it, by site, and
    with two or more steps in it, the active bytes at each step's end, their least-squares
    slope and the sites whose live bytes grew at every step."""
    lo = tl.first_index
    hi = lo + tl.n_events
    left = (rep.alloc_idx >= lo) & (rep.alloc_idx < hi) & (rep.close_idx >= hi)
    cats = [_category_name(snapshot, int(c)) for c in rep.alloc_category[left]]
    left_bytes = int(rep.alloc_size[left].sum())
    left_sites = _group(
        sites,
        rep.alloc_site[left].astype(np.int64),
        rep.alloc_size[left].astype(np.int64),
        cats,
        left_bytes,
    )
    starts = sorted({int(s) for s in step_starts if lo <= s < hi})
    if len(starts) < 2 or not rep.n:
        return Leaks(left_bytes, left_sites, (), None, ())
    ends = np.array([s - 1 for s in starts[1:]] + [hi - 1], dtype=np.int64)
    ends = np.maximum(ends, starts[0])
    step_end = rep.active[ends]
    steps = np.arange(len(ends), dtype=np.float64)
    # Least-squares slope, rounded so an exactly flat series reads 0 rather than 1e-13.
    slope = round(float(np.polyfit(steps, step_end.astype(np.float64), 1)[0]), 1) + 0.0
    growing = _growing_sites(rep, sites, starts[0], ends, slope)
    return Leaks(
        left_bytes, left_sites, tuple(int(v) for v in step_end), slope, tuple(growing[:20])
    )


def _growing_sites(
    rep: _Replay, sites: tuple[Site, ...], first: int, ends: np.ndarray, slope: float
) -> list[SiteBytes]:
    """Return the sites whose allocations from entry `first` on hold more bytes at each
    step end in `ends` than at the one before (never less), with their bytes per step and
    share of `slope`; most bytes first."""
    growing = []
    first_step = rep.alloc_idx >= first
    for k in np.unique(rep.alloc_site[first_step & (rep.close_idx >= ends[0])]):
        live = _live_at(rep, ends, first_step & (rep.alloc_site == k))
        if live[-1] > live[0] and np.all(np.diff(live) >= 0):
            per_step = float(live[-1] - live[0]) / (len(ends) - 1)
            mask = first_step & (rep.alloc_site == k) & (rep.close_idx > ends[-1])
            growing.append(
                SiteBytes(
                    site=sites[int(k)],
                    bytes=int(round(per_step)),
                    blocks=int(mask.sum()),
                    share=per_step / slope if slope > 0 else 0.0,
                    largest_block_bytes=int(rep.alloc_size[mask].max()) if mask.any() else 0,
                )
            )
    growing.sort(key=lambda r: (-r.bytes, r.site.label))
    return growing
