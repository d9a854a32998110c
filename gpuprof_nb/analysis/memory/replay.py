"""Replaying one device's allocator history: each allocation's lifetime, the active and
reserved bytes after every entry, and the x axis the timeline is drawn on.

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

from dataclasses import dataclass

import numpy as np

from gpuprof_nb.model.memory import (
    ALLOC,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceTrace,
    MemorySnapshot,
    Segment,
)


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


def choose_device(snapshot: MemorySnapshot) -> int:
    """Return the device with the most history entries, else the first with segments."""
    best = max(snapshot.traces, key=lambda t: (t.n_events, -t.device), default=None)
    if best is not None and best.n_events:
        return best.device
    return snapshot.devices[0] if snapshot.devices else 0


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
    """Return the replay of `device`'s history (see the module docstring): lifetimes,
    corrected by the segments at dump time, then the curves and their x axis."""
    trace = snapshot.trace(device) or _empty_trace(device)
    n = trace.n_events
    alloc_idx, close_idx, unmatched_idx, implicit = _lifetimes(trace)
    alloc_size = trace.size[alloc_idx]
    alloc_addr = trace.addr[alloc_idx]
    alloc_site = site_of_stack[trace.stack[alloc_idx] + 1]
    unmatched_size = trace.size[unmatched_idx]
    segs = snapshot.segments_of(device)
    resized = rounding = lost = 0
    if snapshot.segments and n:
        resized, rounding, lost = _fit_to_segments(segs, alloc_addr, alloc_size, close_idx, n)
    before_blocks = _before_blocks(segs, set(alloc_addr[close_idx == n].tolist()), site_of_stack)
    before_end = sum(b[1] for b in before_blocks)
    active = _active_curve(
        n, alloc_idx, alloc_size, close_idx, unmatched_idx, unmatched_size, before_end
    )
    x, time_unit, time_problem = _x_axis(trace)
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
        reserved=_reserved_curve(snapshot, trace, segs),
        x=x,
        time_unit=time_unit,
    )


def _lifetimes(trace: DeviceTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Return, in entry order, each alloc's entry index and its closing entry's (the
    number of entries when still open), the entry indices of frees with no recorded alloc,
    and how many allocs were closed by a later alloc at their address, not by a free."""
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
    return a_idx[a_order], close[a_order], np.sort(unmatched), implicit


def _fit_to_segments(
    segs: tuple[Segment, ...],
    alloc_addr: np.ndarray,
    alloc_size: np.ndarray,
    close_idx: np.ndarray,
    n: int,
) -> tuple[int, int, int]:
    """Make the allocations left open agree with the active blocks at dump time, in place:
    one a block holds takes the block's size, one no block holds closes at the last entry.
    Return (allocations resized, bytes they gained, allocations closed)."""
    live_block = {b.address: b.size for seg in segs for b in seg.blocks if b.is_active}
    open_pos = np.flatnonzero(close_idx == n)
    block = np.array([live_block.get(a, -1) for a in alloc_addr[open_pos].tolist()], dtype=np.int64)
    gone = block < 0
    close_idx[open_pos[gone]] = n - 1
    lost = int(np.count_nonzero(gone))
    held = open_pos[~gone]
    extra = block[~gone] - alloc_size[held]
    resized = int(np.count_nonzero(extra))
    rounding = int(extra.sum())
    alloc_size[held] = block[~gone]
    return resized, rounding, lost


def _before_blocks(
    segs: tuple[Segment, ...], open_addrs: set[int], site_of_stack: np.ndarray
) -> tuple[tuple[int, int, int], ...]:
    """Return (address, size, site) of the active blocks at dump time that no still-open
    recorded alloc explains: they were live before recording began."""
    return tuple(
        (b.address, b.size, int(site_of_stack[b.stack + 1]))
        for seg in segs
        for b in seg.blocks
        if b.is_active and b.address not in open_addrs
    )


def _active_curve(
    n: int,
    alloc_idx: np.ndarray,
    alloc_size: np.ndarray,
    close_idx: np.ndarray,
    unmatched_idx: np.ndarray,
    unmatched_size: np.ndarray,
    before_end: int,
) -> np.ndarray:
    """Return the active bytes after each entry (one value, `before_end`, without any)."""
    if not n:
        return np.array([before_end], dtype=np.int64)
    baseline = before_end + int(unmatched_size.sum())
    # Bytes per entry, summed in integers (the last entry may close several blocks).
    delta = np.zeros(n, dtype=np.int64)
    delta[alloc_idx] += alloc_size
    closed_mask = close_idx < n
    np.subtract.at(delta, close_idx[closed_mask], alloc_size[closed_mask])
    delta[unmatched_idx] -= unmatched_size
    return baseline + np.cumsum(delta)


def _reserved_curve(
    snapshot: MemorySnapshot, trace: DeviceTrace, segs: tuple[Segment, ...]
) -> np.ndarray | None:
    """Return the reserved bytes after each entry, replayed back from the segments' total;
    None without allocator segments (the CPU fallback, or no segment data at all)."""
    n = trace.n_events
    action = trace.action
    seg_kind = np.isin(action, (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP))
    # The CPU fallback has no allocator segments to replay: no reserved curve there.
    if snapshot.source == "cpu-profiler" or not (segs or seg_kind.any()):
        return None
    sign = np.zeros(n, dtype=np.int64)
    sign[(action == SEGMENT_ALLOC) | (action == SEGMENT_MAP)] = 1
    sign[(action == SEGMENT_FREE) | (action == SEGMENT_UNMAP)] = -1
    cum = np.cumsum(sign * trace.size) if n else np.zeros(1, dtype=np.int64)
    end_total = sum(seg.total_size for seg in segs)
    start = end_total - int(cum[-1]) if segs else 0
    # History without matching segments (or a truncated one) could dip below zero.
    start = max(start, -int(cum.min()) if len(cum) else 0)
    reserved: np.ndarray = start + cum
    return reserved


def _x_axis(trace: DeviceTrace) -> tuple[np.ndarray, str, str]:
    """Return the timeline's x per entry, its unit ("ms" from time_us, else "event"), and
    why time_us could not be used ("" when it could, or is absent)."""
    n = trace.n_events
    x = np.arange(max(n, 1), dtype=np.float64)
    if not n or trace.time_us is None or np.isnan(trace.time_us).any():
        return x, "event", ""
    steps = np.diff(trace.time_us)
    if not np.isfinite(trace.time_us).all() or (steps < 0).any():
        bad = np.flatnonzero(~np.isfinite(trace.time_us[1:]) | ~(steps >= 0))
        problem = (
            f"time_us is not a clock reading from entry {int(bad[0]) + 1} on "
            "(it is not finite, or goes back): the timeline is drawn by "
            "history entry instead of time."
        )
        return x, "event", problem
    return (trace.time_us - trace.time_us[0]) / 1000.0, "ms", ""


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
