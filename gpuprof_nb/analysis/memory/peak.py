"""What was live at the timeline's peak: bytes per allocation site and the largest blocks."""

from __future__ import annotations

import numpy as np

from gpuprof_nb.analysis.memory.replay import _Replay
from gpuprof_nb.analysis.memory.sites import BEFORE_LABEL, _category_name, _group
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.results.memory import AtPeak, MemoryTimeline, PeakBlock, Site


def _at_peak(
    snapshot: MemorySnapshot, rep: _Replay, tl: MemoryTimeline, sites: tuple[Site, ...]
) -> AtPeak:
    """Return the blocks live at `tl`'s peak grouped by site, and the 20 largest: recorded
    allocations open then, blocks live since before recording (those without a stack of
    their own under the 'before recording' label)."""
    peak = tl.peak_index
    live = (rep.alloc_idx <= peak) & (rep.close_idx > peak) if rep.n else np.zeros(0, bool)
    before_site = len(sites)
    all_sites = sites + (Site(BEFORE_LABEL),)
    unfreed = rep.unmatched_idx > peak
    site_idx = np.concatenate(
        [
            rep.alloc_site[live],
            np.array([b[2] for b in rep.before_end_blocks], dtype=np.int64),
            np.full(int(unfreed.sum()), before_site, dtype=np.int64),
        ]
    ).astype(np.int64)
    sizes = np.concatenate(
        [
            rep.alloc_size[live],
            np.array([b[1] for b in rep.before_end_blocks], dtype=np.int64),
            rep.unmatched_size[unfreed],
        ]
    ).astype(np.int64)
    cats = [_category_name(snapshot, int(c)) for c in rep.alloc_category[live]]
    cats += [""] * (len(sizes) - len(cats))
    # Blocks live since before recording that still exist at dump time carry their own
    # allocation stacks; pool those without one under the 'before recording' label.
    n_live = int(live.sum())
    n_before = len(rep.before_end_blocks)
    no_stack = site_idx[n_live : n_live + n_before] == 0
    site_idx[n_live : n_live + n_before][no_stack] = before_site
    rows = _group(all_sites, site_idx, sizes, cats, tl.peak_bytes)
    addrs = np.concatenate(
        [
            rep.alloc_addr[live],
            np.array([b[0] for b in rep.before_end_blocks], dtype=np.int64),
            rep.unmatched_addr[unfreed],
        ]
    ).astype(np.int64)
    xs = list(rep.x[rep.alloc_idx[live]].tolist()) if rep.n else []
    top = np.lexsort((addrs, -sizes))[:20]
    blocks = tuple(
        PeakBlock(
            address=int(addrs[i]),
            size=int(sizes[i]),
            site=all_sites[int(site_idx[i])],
            allocated_x=float(xs[i]) if i < len(xs) else None,
            category=cats[i],
        )
        for i in top
    )
    return AtPeak(
        peak_bytes=tl.peak_bytes,
        peak_x=tl.peak_x,
        time_unit=tl.time_unit,
        sites=rows,
        largest_blocks=blocks,
    )
