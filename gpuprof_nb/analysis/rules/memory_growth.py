"""The memory rule: memory rising from step to step, and where what stays allocated came
from (`memory_growth`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.rules.context import Context, make_finding
from gpuprof_nb.model.trace import MemoryEvent, Op
from gpuprof_nb.results.diagnosis import Finding

_TS = attrgetter("ts_us")
_BYTES, _TOTAL = attrgetter("bytes"), attrgetter("total_allocated")
_DEVICE_PAIR = attrgetter("device_type", "device_id")


def _memory_series(
    events: Sequence[MemoryEvent],
) -> dict[tuple[int, int], tuple[list[float], list[float]]]:
    """Per (device type, device id), in event order: the events' times and the allocated level
    after each: its total_allocated where recorded, else the level before (from 0) plus its
    bytes. Traces record the totals on every event or on none: each case is an array
    operation (a running sum per device adds one by one, like `+=` in a loop); a mix takes
    the loop."""
    n = len(events)
    # The usual case, every event with its total, in one pass (numpy reads a None as NaN;
    # the totals are ints, never NaN).
    values = np.fromiter(map(_TOTAL, events), dtype=float, count=n)
    missing = list(map(_TOTAL, events)).count(None) if np.isnan(values).any() else 0
    if 0 < missing < n:
        found: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        running: dict[tuple[int, int], float] = {}
        for m in events:
            key = (m.device_type, m.device_id)
            level = (
                float(m.total_allocated)
                if m.total_allocated is not None
                else running.get(key, 0.0) + m.bytes
            )
            running[key] = level
            times, levels = found.setdefault(key, ([], []))
            times.append(m.ts_us)
            levels.append(level)
        return found
    pairs = list(map(_DEVICE_PAIR, events))
    # The devices in order of first appearance (a trace holds a few).
    code_of = {key: c for c, key in enumerate(dict.fromkeys(pairs))}
    codes = (
        np.fromiter(map(code_of.__getitem__, pairs), dtype=np.intp, count=n)
        if len(code_of) > 1
        else np.zeros(n, dtype=np.intp)
    )
    ts = np.fromiter(map(_TS, events), dtype=float, count=n)
    if missing:
        values = np.fromiter(map(_BYTES, events), dtype=float, count=n)
    out: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
    for key, code in code_of.items():
        mine = np.flatnonzero(codes == code)
        after = values[mine] if not missing else np.cumsum(values[mine])
        out[key] = (ts[mine].tolist(), after.tolist())
    return out


def rule_memory_growth(c: Context) -> Finding | None:
    events = sorted(c.trace.memory, key=_TS)
    if not events:
        return None
    by_dev = _memory_series(events)
    cuts = [s.end_us for s in c.trace.steps]
    best: Finding | None = None
    best_rank: tuple[float, float, float] = (0.0, 0.0, 0.0)
    for key in sorted(by_dev):
        times, series = by_dev[key]
        levels: list[float] = []
        if cuts:
            for cut in cuts:
                i = bisect.bisect_right(times, cut) - 1
                levels.append(series[i] if i >= 0 else 0.0)
        else:
            # Without steps, cut the event sequence into slices of equal event counts (not
            # equal time, which a stalled process would leave empty) and watch the level.
            n = len(series)
            ends = sorted({n * (i + 1) // th.GROWTH_SLICES - 1 for i in range(th.GROWTH_SLICES)})
            levels = [series[i] for i in ends if i >= 0]
        if len(levels) < 3:
            continue
        moves = [b - a for a, b in zip(levels, levels[1:], strict=False)]
        rising = sum(1 for m in moves if m > 0) / len(moves)
        growth = levels[-1] - levels[0]
        peak = max(series)
        # The share is of what the window itself held at its peak, above its lowest level:
        # memory held before the window (a loaded model) is not the window's, and on CPU
        # the profiler's running total also drifts up across profiling sessions (frees of
        # blocks allocated before the session are not subtracted), so only differences
        # within the window mean anything.
        held = peak - min(series)
        steady = rising >= th.GROWTH_RISING_SHARE and growth >= th.MIN_GROWTH_BYTES
        share = min(growth / held, 1.0) if steady and held > 0 else 0.0
        where = "per step" if c.trace.steps else "per slice of the window"
        evidence = {
            "growth_per_step_bytes": growth / len(moves),
            "growth_total_bytes": growth,
            "rising_steps_fraction": rising,
            "peak_allocated_bytes": peak,
            "peak_above_window_low_bytes": held,
        }
        site = ""
        if steady:
            live = _live_bytes_by_site(
                c, [m for m in events if (m.device_type, m.device_id) == key]
            )
            if live:
                name = min(live, key=lambda n: (-live[n], n))
                evidence["largest_site_live_bytes"] = live[name]
                site = f"; what stays allocated comes mostly from {name}"
        f = make_finding(
            "memory_growth",
            (
                f"Memory grows {where}: +{growth / len(moves) / 2**20:.3g} MiB each, "
                f"{growth / 2**20:.3g} MiB over the cell"
                if steady
                else f"Memory does not grow steadily {where}"
            )
            + f" ({'GPU' if key[0] else 'CPU'} memory){site}",
            share,
            evidence,
        )
        # Of several devices, show the one that grows most, else the one with most memory.
        rank = (f.share, growth, peak)
        if best is None or rank > best_rank:
            best, best_rank = f, rank
    return best


def _live_bytes_by_site(c: Context, events: Sequence[MemoryEvent]) -> dict[str, float]:
    """Return the bytes still allocated at the last event, by the top-level op that allocated
    them (the allocation site users recognise: aten::mm, a backward node, ...). Needs the
    events' addresses to pair frees with allocations; empty without them."""
    if not events or any(m.addr is None for m in events):
        return {}
    by_thread: dict[str, list[Op]] = {}
    for o in c.top_ops:
        by_thread.setdefault(str(o.tid), []).append(o)
    starts = {t: [o.start_us for o in ops] for t, ops in by_thread.items()}
    live: dict[int, tuple[str, int]] = {}
    for m in events:
        if m.bytes > 0:
            ops = by_thread.get(str(m.tid), [])
            i = bisect.bisect_right(starts.get(str(m.tid), []), m.ts_us) - 1
            site = ops[i].name if i >= 0 and ops[i].end_us >= m.ts_us else "outside torch ops"
            live[m.addr or 0] = (site, m.bytes)
        elif m.bytes < 0:
            live.pop(m.addr or 0, None)
    out: dict[str, float] = {}
    for site, nbytes in live.values():
        out[site] = out.get(site, 0.0) + nbytes
    return out
