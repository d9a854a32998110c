"""Memory snapshot analysis: timeline, what was live at the peak, leaks, segments, findings.

All functions are pure and work on the columnar MemorySnapshot with numpy, never with one
Python object per trace entry.

How the history is replayed (the rules the tests check):
- An allocation is opened by `alloc` and closed only by `free_completed` at the same address
  (`free_requested` only marks it pending: the bytes stay in use until the stream is done).
  An `alloc` at an address that is still open closes the older one there (an entry lost
  to `skip_actions`); this is counted in the notes.
- Memory live when recording began is not in the history. What is known about it:
  blocks active at dump time that no recorded `alloc` explains were live throughout, and
  each `free_completed` without a recorded `alloc` (the ring buffer dropped it, or it predates
  recording) freed a block that was live until then. So the live bytes at entry i are
      before(i) = (those unexplained active blocks) + (sizes of unmatched frees after i)
      active(i) = before(i) + (recorded allocations opened at or before i, not closed by i).
  The curve never goes negative.
- The segments at dump time are the truth about the end, so the curve ends exactly at their
  active bytes (what torch.cuda.memory_allocated() counted then). The history records each
  allocation's requested size, the segments the block the allocator gave it (rounded up,
  sometimes with an unsplit remainder): an allocation still live at dump counts with its
  block's size from its `alloc` on. One the history leaves open but no active block holds
  (its free was not recorded) is closed at the last entry. Every earlier level is that end
  walked back through the history, so a history that starts mid-run starts at what was
  live then, and the peak is never below either end.
- Reserved memory replays segment_alloc/segment_map (+) and segment_free/segment_unmap (-)
  backwards from the segments' total at dump time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuprof_nb.analysis.diagnose import Finding
from gpuprof_nb.analysis.fixes import MEMORY_FIXES, peak_memory_advice
from gpuprof_nb.analysis.sources import source_label
from gpuprof_nb.model.memory import (
    ALLOC,
    FREE_COMPLETED,
    OOM,
    OP_FILENAME,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceTrace,
    Frame,
    MemorySnapshot,
)
from gpuprof_nb.results.memory import (
    AtPeak,
    Leaks,
    MemoryAnalysis,
    MemoryTimeline,
    OomEvent,
    PeakBlock,
    SegmentRow,
    SegmentSummary,
    Site,
    SiteBytes,
)

BEFORE_LABEL = "(allocated before recording)"
NO_STACK_LABEL = "(no stack recorded)"
OTHER_LABEL = "(other sites)"

_MIB = 2**20


# ---------------------------------------------------------------------------------------
# Sites


def _is_python(frame: Frame) -> bool:
    fn = frame.filename
    return fn.endswith(".py") or fn.startswith(("<ipython-input", "<string>", "<stdin>"))


def _is_internal(frame: Frame) -> bool:
    """True for frames of torch itself and of gpuprof_nb's own recording code."""
    return _internal_file(frame.filename)


# Cached per file name: every frame of a file shares its name (see analysis/sources.py).
@functools.lru_cache(maxsize=4096)
def _internal_file(filename: str) -> bool:
    fn = filename.replace("\\", "/")
    return (
        fn.startswith(("torch/", "gpuprof_nb/"))
        or "/torch/" in fn
        or "/gpuprof_nb/" in fn
        or "/site-packages/torch" in fn
    )


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """Return the innermost Python frame outside torch (the user's line), falling back
    to the innermost Python frame, then the innermost frame; None for an empty stack."""
    python = [f for f in frames if _is_python(f)]
    for f in python:
        if not _is_internal(f):
            return f
    if python:
        return python[0]
    return frames[0] if frames else None


def _site_of(frame: Frame | None, cells: Mapping[str, int], first_line: bool) -> Site:
    if frame is None:
        return Site(NO_STACK_LABEL)
    label = source_label(frame.filename, frame.line, frame.name, cells, first_line=first_line)
    return Site(label, frame.filename, frame.line, frame.name)


def stack_sites(snapshot: MemorySnapshot) -> tuple[tuple[Site, ...], np.ndarray]:
    """Return the distinct sites and, per stack index, its site index (int32 array).
    Site 0 is always 'no stack recorded'; index a stack of -1 with position 0 too. A site
    in a notebook cell is named `In [n], line L` (see analysis/sources.py)."""
    sites: list[Site] = [Site(NO_STACK_LABEL)]
    index: dict[Site, int] = {sites[0]: 0}
    of_stack = np.zeros(len(snapshot.stacks) + 1, dtype=np.int32)
    for i, stack in enumerate(snapshot.stacks):
        frames = [snapshot.frames[j] for j in stack]
        # Profiler-made stacks (the CPU fallback) carry each Python function's first line,
        # not the calling line, unless exact line events gave it; the allocating op tells
        # sites on one line apart.
        profiler_made = bool(frames) and frames[0].filename == OP_FILENAME
        site = _site_of(
            user_frame(frames), snapshot.cells, profiler_made and not snapshot.exact_lines
        )
        if profiler_made and site.label != NO_STACK_LABEL:
            site = Site(f"{site.label} [{frames[0].name}]", site.filename, site.line, site.function)
        k = index.setdefault(site, len(sites))
        if k == len(sites):
            sites.append(site)
        of_stack[i + 1] = k
    return tuple(sites), of_stack


# ---------------------------------------------------------------------------------------
# Replay


@dataclass(frozen=True, slots=True, eq=False)
class _Replay:
    """Allocation lifetimes of one device: per recorded alloc its entry index, size, site
    and closing entry index (n: still open at the end); unmatched frees; the pre-recording
    blocks still active at dump time."""

    n: int
    alloc_idx: np.ndarray
    alloc_size: np.ndarray
    alloc_site: np.ndarray
    alloc_addr: np.ndarray
    alloc_category: np.ndarray
    close_idx: np.ndarray
    unmatched_idx: np.ndarray
    unmatched_size: np.ndarray
    unmatched_addr: np.ndarray
    before_end_blocks: tuple[tuple[int, int, int], ...]  # (address, size, site)
    before_end_bytes: int
    implicit_closes: int
    resized_opens: int  # allocations live at dump that count with their block's size
    rounding_bytes: int  # what those blocks hold above the requested sizes
    lost_frees: int  # allocations left open by the history, absent from the segments
    time_problem: str  # why time_us could not be the x axis ("" when it is, or is absent)
    active: np.ndarray
    reserved: np.ndarray | None
    x: np.ndarray
    time_unit: str


def _empty_trace(device: int) -> DeviceTrace:
    z = np.zeros(0, dtype=np.int64)
    return DeviceTrace(
        device=device,
        action=np.zeros(0, dtype=np.int8),
        addr=z,
        size=z,
        stream=z,
        stack=np.zeros(0, dtype=np.int32),
        time_us=None,
        device_free=z,
        category=np.zeros(0, dtype=np.int16),
    )


def _replay(snapshot: MemorySnapshot, device: int, site_of_stack: np.ndarray) -> _Replay:
    trace = snapshot.trace(device) or _empty_trace(device)
    n = trace.n_events
    action = trace.action
    idx = np.flatnonzero((action == ALLOC) | (action == FREE_COMPLETED))
    # A stable sort by address keeps each address's entries in time order, so an alloc's
    # closing entry is simply the next entry at the same address.
    order = np.argsort(trace.addr[idx], kind="stable")
    s = idx[order]
    addr_s = trace.addr[s]
    act_s = action[s]
    same_next = np.zeros(len(s), dtype=bool)
    if len(s) > 1:
        same_next[:-1] = addr_s[1:] == addr_s[:-1]
    is_alloc = act_s == ALLOC
    alloc_pos = np.flatnonzero(is_alloc)
    close = np.full(len(alloc_pos), n, dtype=np.int64)
    closed = same_next[alloc_pos]
    close[closed] = s[alloc_pos[closed] + 1]
    implicit = int(np.count_nonzero(closed & is_alloc[np.minimum(alloc_pos + 1, len(s) - 1)]))
    free_pos = np.flatnonzero(~is_alloc)
    prev_alloc = np.zeros(len(free_pos), dtype=bool)
    has_prev = free_pos > 0
    prev_alloc[has_prev] = same_next[free_pos[has_prev] - 1] & is_alloc[free_pos[has_prev] - 1]
    unmatched = s[free_pos[~prev_alloc]]

    a_idx = s[alloc_pos]
    a_order = np.argsort(a_idx, kind="stable")
    alloc_idx = a_idx[a_order]
    close_idx = close[a_order]
    alloc_size = trace.size[alloc_idx]
    alloc_addr = trace.addr[alloc_idx]
    stack = trace.stack[alloc_idx]
    alloc_site = site_of_stack[stack + 1]
    unmatched_idx = np.sort(unmatched)
    unmatched_size = trace.size[unmatched_idx]
    segs = snapshot.segments_of(device)
    resized = rounding = lost = 0
    if snapshot.segments and n:
        # The dump says what was live at the end (see the module docstring).
        live_block = {b.address: b.size for seg in segs for b in seg.blocks if b.is_active}
        open_pos = np.flatnonzero(close_idx == n)
        block = np.array(
            [live_block.get(a, -1) for a in alloc_addr[open_pos].tolist()], dtype=np.int64
        )
        gone = block < 0
        close_idx[open_pos[gone]] = n - 1
        lost = int(np.count_nonzero(gone))
        held = open_pos[~gone]
        extra = block[~gone] - alloc_size[held]
        resized = int(np.count_nonzero(extra))
        rounding = int(extra.sum())
        alloc_size[held] = block[~gone]

    # Active blocks at dump time that no still-open recorded alloc explains were live
    # before recording began.
    open_addrs = set(alloc_addr[close_idx == n].tolist())
    before_blocks = tuple(
        (b.address, b.size, int(site_of_stack[b.stack + 1]))
        for seg in segs
        for b in seg.blocks
        if b.is_active and b.address not in open_addrs
    )
    before_end = sum(b[1] for b in before_blocks)
    baseline = before_end + int(unmatched_size.sum())

    if n:
        # Bytes per entry, summed in integers (the last entry may close several blocks).
        delta = np.zeros(n, dtype=np.int64)
        delta[alloc_idx] += alloc_size
        closed_mask = close_idx < n
        np.subtract.at(delta, close_idx[closed_mask], alloc_size[closed_mask])
        delta[unmatched_idx] -= unmatched_size
        active = baseline + np.cumsum(delta)
    else:
        active = np.array([before_end], dtype=np.int64)

    reserved: np.ndarray | None = None
    seg_kind = np.isin(action, (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP))
    # The CPU fallback has no allocator segments to replay: no reserved curve there.
    if snapshot.source != "cpu-profiler" and (segs or seg_kind.any()):
        sign = np.zeros(n, dtype=np.int64)
        sign[(action == SEGMENT_ALLOC) | (action == SEGMENT_MAP)] = 1
        sign[(action == SEGMENT_FREE) | (action == SEGMENT_UNMAP)] = -1
        cum = np.cumsum(sign * trace.size) if n else np.zeros(1, dtype=np.int64)
        end_total = sum(seg.total_size for seg in segs)
        start = end_total - int(cum[-1]) if segs else 0
        # History without matching segments (or a truncated one) could dip below zero.
        start = max(start, -int(cum.min()) if len(cum) else 0)
        reserved = start + cum

    time_unit = "event"
    x = np.arange(max(n, 1), dtype=np.float64)
    time_problem = ""
    if n and trace.time_us is not None and not np.isnan(trace.time_us).any():
        steps = np.diff(trace.time_us)
        if not np.isfinite(trace.time_us).all() or (steps < 0).any():
            bad = np.flatnonzero(~np.isfinite(trace.time_us[1:]) | ~(steps >= 0))
            time_problem = (
                f"time_us is not a clock reading from entry {int(bad[0]) + 1} on "
                "(it is not finite, or goes back): the timeline is drawn by "
                "history entry instead of time."
            )
        else:
            time_unit = "ms"
            x = (trace.time_us - trace.time_us[0]) / 1000.0
    return _Replay(
        n=n,
        alloc_idx=alloc_idx,
        alloc_size=alloc_size,
        alloc_site=alloc_site,
        alloc_addr=alloc_addr,
        alloc_category=trace.category[alloc_idx],
        close_idx=close_idx,
        unmatched_idx=unmatched_idx,
        unmatched_size=unmatched_size,
        unmatched_addr=trace.addr[unmatched_idx],
        before_end_blocks=before_blocks,
        before_end_bytes=before_end,
        implicit_closes=implicit,
        resized_opens=resized,
        rounding_bytes=rounding,
        lost_frees=lost,
        time_problem=time_problem,
        active=active,
        reserved=reserved,
        x=x,
        time_unit=time_unit,
    )


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


def _live_at(rep: _Replay, points: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Bytes of recorded allocations selected by `mask` live after each entry in `points`."""
    a_idx = rep.alloc_idx[mask]
    c_idx = rep.close_idx[mask]
    size = rep.alloc_size[mask]
    a_order = np.argsort(a_idx, kind="stable")
    c_order = np.argsort(c_idx, kind="stable")
    cum_a = np.concatenate(([0], np.cumsum(size[a_order])))
    cum_c = np.concatenate(([0], np.cumsum(size[c_order])))
    opened = cum_a[np.searchsorted(a_idx[a_order], points, side="right")]
    closed = cum_c[np.searchsorted(c_idx[c_order], points, side="right")]
    return opened - closed


def _before_at(rep: _Replay, points: np.ndarray) -> np.ndarray:
    """Bytes live since before recording, after each entry in `points`."""
    cum = np.concatenate(([0], np.cumsum(rep.unmatched_size)))
    freed = cum[np.searchsorted(rep.unmatched_idx, points, side="right")]
    return rep.before_end_bytes + int(cum[-1]) - freed


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


def choose_device(snapshot: MemorySnapshot) -> int:
    """Return the device with the most history entries, else the first with segments."""
    best = max(snapshot.traces, key=lambda t: (t.n_events, -t.device), default=None)
    if best is not None and best.n_events:
        return best.device
    return snapshot.devices[0] if snapshot.devices else 0


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
    # Top sites by bytes live at the peak.
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


def _category_name(snapshot: MemorySnapshot, code: int) -> str:
    return snapshot.categories[code] if 0 <= code < len(snapshot.categories) else ""


def _group(
    sites: tuple[Site, ...],
    site_idx: np.ndarray,
    sizes: np.ndarray,
    categories: Sequence[str],
    total: int,
    limit: int = 20,
) -> tuple[SiteBytes, ...]:
    """Group blocks by site: bytes, count, largest block, main category; largest first."""
    if len(site_idx) == 0:
        return ()
    per = np.bincount(site_idx, weights=sizes, minlength=len(sites))
    count = np.bincount(site_idx, minlength=len(sites))
    largest = np.zeros(len(sites), dtype=np.int64)
    np.maximum.at(largest, site_idx, sizes)
    cat_bytes: dict[int, dict[str, int]] = {}
    for k, c, b in zip(site_idx.tolist(), categories, sizes.tolist(), strict=True):
        if c:
            d = cat_bytes.setdefault(k, {})
            d[c] = d.get(c, 0) + b
    order = sorted(
        (k for k in range(len(sites)) if count[k]), key=lambda k: (-per[k], sites[k].label)
    )
    out = []
    for k in order[:limit]:
        cats = cat_bytes.get(k, {})
        main = min(cats, key=lambda c: (-cats[c], c)) if cats else ""
        out.append(
            SiteBytes(
                site=sites[k],
                bytes=int(per[k]),
                blocks=int(count[k]),
                share=float(per[k]) / total if total else 0.0,
                largest_block_bytes=int(largest[k]),
                category=main,
            )
        )
    return tuple(out)


def _at_peak(
    snapshot: MemorySnapshot, rep: _Replay, tl: MemoryTimeline, sites: tuple[Site, ...]
) -> AtPeak:
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


def _leaks(
    snapshot: MemorySnapshot,
    rep: _Replay,
    tl: MemoryTimeline,
    sites: tuple[Site, ...],
    step_starts: Sequence[int],
) -> Leaks:
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
    growing = []
    first_step = rep.alloc_idx >= starts[0]
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
    return Leaks(
        left_bytes, left_sites, tuple(int(v) for v in step_end), slope, tuple(growing[:20])
    )


def segment_summary(snapshot: MemorySnapshot, device: int) -> SegmentSummary:
    """Return reserved vs allocated bytes, free pieces and fragmentation at dump time."""
    segs = snapshot.segments_of(device)
    free_sizes = [b.size for s in segs for b in s.blocks if not b.is_active]
    free = sum(free_sizes)
    largest_free = max(free_sizes, default=0)
    rows = sorted(
        (
            SegmentRow(
                address=s.address,
                segment_type=s.segment_type,
                total_bytes=s.total_size,
                active_bytes=s.active_size,
                largest_free_bytes=max((b.size for b in s.blocks if not b.is_active), default=0),
            )
            for s in segs
        ),
        key=lambda r: (-r.total_bytes, r.address),
    )
    return SegmentSummary(
        device=device,
        n_segments=len(segs),
        reserved_bytes=sum(s.total_size for s in segs),
        allocated_bytes=sum(s.allocated_size for s in segs),
        active_bytes=sum(s.active_size for s in segs),
        free_bytes=free,
        largest_free_block_bytes=largest_free,
        n_free_blocks=len(free_sizes),
        fragmentation_ratio=1.0 - largest_free / free if free else 0.0,
        largest_segments=tuple(rows[:20]),
    )


def _ooms(
    snapshot: MemorySnapshot,
    rep: _Replay,
    device: int,
    sites: tuple[Site, ...],
    site_of_stack: np.ndarray,
) -> tuple[OomEvent, ...]:
    trace = snapshot.trace(device)
    if trace is None:
        return ()
    out = []
    for i in np.flatnonzero(trace.action == OOM).tolist():
        free = int(trace.device_free[i])
        out.append(
            OomEvent(
                index=i,
                x=float(rep.x[i]),
                requested_bytes=int(trace.size[i]),
                device_free_bytes=free if free >= 0 else None,
                active_bytes=int(rep.active[i]),
                reserved_bytes=int(rep.reserved[i]) if rep.reserved is not None else None,
                site=sites[int(site_of_stack[int(trace.stack[i]) + 1])],
            )
        )
    return tuple(out)


_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}


def _size(n: float) -> str:
    """Bytes for a finding title, in the binary units the report tables use."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


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
    out: list[Finding] = []
    for oom in ooms[-1:]:
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
                "the allocator held enough cached memory but in pieces too small for it "
                "(fragmentation)"
            )
        elif oom.active_bytes >= oom.requested_bytes or oom.device_free_bytes is None:
            why = "live tensors filled the device"
        else:
            # A request bigger than everything this process holds: the tensors are not what
            # filled the device (a huge request on an H100: 128 TiB asked, 72 MB live).
            why = (
                f"the request is larger than the {_size(oom.device_free_bytes)} the device "
                f"had free, while this process held {_size(oom.active_bytes)} in tensors"
            )
        out.append(
            Finding(
                kind="oom",
                severity="high",
                title=f"Out of memory: a request for {_size(oom.requested_bytes)} at "
                f"{oom.site.label} failed; {why}. Largest holder: {top}",
                evidence=evidence,
                fix=MEMORY_FIXES["oom"] + (MEMORY_FIXES["oom_fragmented"] if frag else ""),
            )
        )
    free = segments.free_bytes
    if (
        segments.reserved_bytes
        and free >= 0.25 * segments.reserved_bytes
        and free >= _MIB
        and segments.fragmentation_ratio >= 0.5
    ):
        out.append(
            Finding(
                kind="fragmentation",
                severity="medium",
                title=f"{_size(free)} reserved but free, split into {segments.n_free_blocks} "
                f"pieces; the largest is {_size(segments.largest_free_block_bytes)}",
                evidence={
                    "reserved_bytes": segments.reserved_bytes,
                    "allocated_bytes": segments.allocated_bytes,
                    "free_in_segments_bytes": free,
                    "largest_free_block_bytes": segments.largest_free_block_bytes,
                    "fragmentation_fraction": segments.fragmentation_ratio,
                },
                fix=MEMORY_FIXES["fragmentation"],
            )
        )
    if (
        leaks.growth_bytes_per_step is not None
        and leaks.growth_bytes_per_step > 0
        and leaks.step_end_bytes[-1] > leaks.step_end_bytes[0]
    ):
        top = leaks.growing_sites[0].site.label if leaks.growing_sites else "unknown"
        steps = len(leaks.step_end_bytes)
        out.append(
            Finding(
                kind="memory_growth",
                severity="high",
                title=f"Memory grows by {_size(leaks.growth_bytes_per_step)} per step over "
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
        )
    elif leaks.left_bytes and tl.peak_bytes and leaks.left_bytes >= 0.05 * tl.peak_bytes:
        top = leaks.left_sites[0].site.label if leaks.left_sites else "unknown"
        out.append(
            Finding(
                kind="memory_growth",
                severity="low",
                title=f"The cell left {_size(leaks.left_bytes)} allocated that it did not free; "
                f"most from {top}",
                evidence={"left_allocated_bytes": leaks.left_bytes, "peak_bytes": tl.peak_bytes},
                fix=MEMORY_FIXES["left_allocated"],
            )
        )
    if tl.peak_bytes > 0 and at_peak.sites:
        holder = at_peak.sites[0]
        cats = {s.category for s in at_peak.sites if s.category}
        optimizer = "optimizer_state" in cats or "optimizer state" in cats
        advice = peak_memory_advice(optimizer_state_at_peak=optimizer, cpu=cpu)
        out.append(
            Finding(
                kind="peak_memory",
                severity="info",
                title=f"Peak {_size(tl.peak_bytes)}; {holder.site.label} held "
                f"{holder.share * 100:.1f}% of it",
                evidence={
                    "peak_bytes": tl.peak_bytes,
                    "top_site_bytes": holder.bytes,
                    "top_site_share_fraction": holder.share,
                },
                fix=advice,
            )
        )
    return tuple(sorted(out, key=lambda f: (_SEVERITY_ORDER.get(f.severity, 9), f.kind)))


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
    lo, hi = _window_range(rep.x, window)
    tl = _timeline(rep, device, sites, lo, hi, window, top_sites, notes)
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


def parse_window(text: str) -> tuple[float | None, float | None]:
    """Return (start, end) from 'START:END' (either side may be empty). Raises ValueError."""
    if ":" not in text:
        raise ValueError(f"window {text!r} is not START:END (e.g. 120:480, :300, 50:)")
    a, b = text.split(":", 1)
    try:
        start = float(a) if a.strip() else None
        end = float(b) if b.strip() else None
    except ValueError:
        raise ValueError(
            f"window {text!r}: START and END must be numbers "
            "(ms, or history entries when the snapshot has no times)"
        ) from None
    for v in (start, end):
        if v is not None and not math.isfinite(v):
            raise ValueError(f"window {text!r}: bounds must be finite numbers")
    if start is not None and end is not None and end < start:
        raise ValueError(f"window {text!r}: END is before START")
    return start, end


__all__ = [
    "AtPeak",
    "Leaks",
    "MemoryAnalysis",
    "MemoryTimeline",
    "OomEvent",
    "PeakBlock",
    "Site",
    "SiteBytes",
    "SegmentRow",
    "SegmentSummary",
    "analyze_snapshot",
    "choose_device",
    "memory_findings",
    "memory_timeline",
    "parse_window",
    "segment_summary",
    "stack_sites",
    "user_frame",
]
