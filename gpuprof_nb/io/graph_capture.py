"""A CUDA/HIP graph's replay trace merged with the trace of its capture, so the kernels a
graph launch replays are attributed to the ops that launched them when it was captured
(`load_trace(replay, capture=...)`).

What each trace records:
- the capture trace, between a cudaStreamBeginCapture (hipStreamBeginCapture) call and the
  cudaStreamEndCapture after it on the same thread: the torch ops the captured code ran,
  and inside them the launch calls (cudaLaunchKernel, cuLaunchKernel, cudaMemcpyAsync,
  cudaMemsetAsync...) the graph recorded; no kernel ran then;
- the replay trace: one cudaGraphLaunch (hipGraphLaunch) call per replay, and the kernels it
  ran, all with that call's correlation id; no op says which part of the model each is.

A graph launch is matched with the capture whose launch calls are as many as the kernels it
ran (the first such capture, in capture order); its kernels, by start, are paired with those
calls in the order they were made. Single-stream graphs replay in that order; a graph
spread over several streams may interleave its streams differently, and then kernels of
one capture step can be paired with a neighbour's ops (the note says how many launches were
multi-stream).

The merged trace is the replay trace plus, inside each matched graph launch call's span on
its thread, a copy of the capture's ops and launch calls, their times mapped linearly from
the capture's span onto the launch call's (so they nest as they did, and their host time is
the graph launch's, shared out), each copied call with a fresh correlation id that its
paired kernel now carries. Every analysis then finds each replayed kernel's op through its
launch call, as for a kernel launched eagerly. `Trace.load_warnings` says what was merged.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import TypeVar

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.model.trace import Kernel, Op, RuntimeCall, Trace

T = TypeVar("T", Op, RuntimeCall)

__all__ = ["merge_capture"]

_LAUNCH_MARKS = ("launch", "memcpy", "memset")
# The most events copied into the replay, per event the replay holds (plus a floor for small
# traces): a real graph's capture holds a few ops per launch call, each replayed kernel gets
# one call and its ops, so a real merge stays well under it. A crafted pair (30,000 ops
# captured around one launch, replayed 30,000 times from two 5 MB files) would copy 9e8.
MAX_COPIES_PER_EVENT = 8
MIN_COPIES = 100_000


def _is_graph_launch(name: str) -> bool:
    return "GraphLaunch" in name


def _is_launch(name: str) -> bool:
    low = name.lower()
    return any(m in low for m in _LAUNCH_MARKS) and not _is_graph_launch(name)


@dataclasses.dataclass
class _Capture:
    """One captured region: its span and thread, its launch calls in the order they were
    made, and the torch ops around them."""

    start_us: float
    end_us: float
    thread: tuple[object, object]
    calls: list[RuntimeCall]
    ops: list[Op]


def _captures(capture: Trace) -> list[_Capture]:
    """The captured regions of a capture trace, in capture order. Each region's calls and
    ops are found by bisection in its thread's events (sorted by start), and the events
    scanned over all regions are bounded by the trace's size: overlapping regions (no real
    capture nests) are refused rather than scanned again and again."""
    begins = [r for r in capture.runtime if "BeginCapture" in r.name]
    if not begins:
        return []
    ends: dict[tuple[object, object], list[RuntimeCall]] = defaultdict(list)
    calls_of: dict[tuple[object, object], list[RuntimeCall]] = defaultdict(list)
    for r in capture.runtime:  # sorted by start already (io/trace/build.py)
        if "EndCapture" in r.name:
            ends[(r.pid, r.tid)].append(r)
        calls_of[(r.pid, r.tid)].append(r)
    ops_of: dict[tuple[object, object], list[Op]] = defaultdict(list)
    for o in capture.ops:
        if o.kind == "op":
            ops_of[(o.pid, o.tid)].append(o)
    end_starts = {t: [e.start_us for e in es] for t, es in ends.items()}
    call_starts = {t: [c.start_us for c in cs] for t, cs in calls_of.items()}
    op_starts = {t: [o.start_us for o in os_] for t, os_ in ops_of.items()}
    budget = 2 * (len(capture.runtime) + len(capture.ops)) + MIN_COPIES
    out = []
    for b in begins:
        thread = (b.pid, b.tid)
        at = bisect.bisect_left(end_starts.get(thread, []), b.end_us)
        if at == len(end_starts.get(thread, [])):
            continue
        lo, hi = b.end_us, ends[thread][at].start_us
        first_call = bisect.bisect_left(call_starts[thread], lo)
        last_call = bisect.bisect_right(call_starts[thread], hi)
        first_op = bisect.bisect_left(op_starts.get(thread, []), lo)
        last_op = bisect.bisect_right(op_starts.get(thread, []), hi)
        budget -= (last_call - first_call) + (last_op - first_op)
        if budget < 0:
            raise TraceFormatError(
                f"{capture.source}: its graph capture regions overlap again and again "
                f"({len(begins):,} BeginCapture calls; no real capture nests), so reading "
                "them would scan the trace once per region. Refused; pass the trace of the "
                "torch.cuda.graph(...) capture itself."
            )
        calls = [
            r
            for r in calls_of[thread][first_call:last_call]
            if r.end_us <= hi and _is_launch(r.name)
        ]
        ops = [o for o in ops_of.get(thread, [])[first_op:last_op] if o.end_us <= hi]
        out.append(_Capture(lo, hi, thread, calls, ops))
    return out


def merge_capture(replay: Trace, capture: Trace) -> Trace:
    """Return `replay` with its graph launches' kernels attributed to the ops of `capture`
    (see the module's docstring). Raises TraceFormatError when `capture` holds no captured
    region with launch calls, when no graph launch of `replay` replays one of them, or when
    the merge would copy more events than MAX_COPIES_PER_EVENT allows."""
    regions = [c for c in _captures(capture) if c.calls]
    if not regions:
        raise TraceFormatError(
            f"{capture.source}: no graph capture in this trace (no cudaStreamBeginCapture / "
            "cudaStreamEndCapture pair with launch calls between them); profile the "
            "torch.cuda.graph(...) capture itself and pass that trace as capture=."
        )
    by_corr: dict[int, list[int]] = {}
    for i, k in enumerate(replay.kernels):
        if k.correlation is not None:
            by_corr.setdefault(k.correlation, []).append(i)
    launches = [r for r in replay.runtime if _is_graph_launch(r.name) and r.correlation is not None]
    pairs, unmatched = _pair_launches(replay, launches, by_corr, regions)
    _check_copies(replay, capture, pairs)
    kernels, new_ops, new_calls, multi_stream = _copy_regions(replay, pairs)
    if not pairs:
        counts = sorted({len(c.calls) for c in regions})
        raise TraceFormatError(
            f"{capture.source}: no graph launch of {replay.source} replays a graph captured "
            f"there (captured graphs launch {counts} kernels; the replays ran "
            f"{sorted({len(by_corr.get(r.correlation or -1, [])) for r in launches}) or 'none'}); "
            "pass the capture trace of the same graph."
        )
    paired = sum(len(mine) for _, mine, _ in pairs)
    note = (
        f"graph replays: {paired} kernels of {len(pairs)} graph launches attributed to the ops "
        f"of {capture.source} (copied into each launch call's span)"
    )
    if unmatched:
        note += f"; {unmatched} launches matched no captured graph and stay unattributed"
    if multi_stream:
        note += (
            f"; {multi_stream} launches ran on several streams: their kernels were paired with "
            "the captured launches by start time, which may swap neighbours across streams"
        )
    return dataclasses.replace(
        replay,
        ops=_by_start(list(replay.ops) + new_ops),
        runtime=_by_start(list(replay.runtime) + new_calls),
        kernels=tuple(kernels),
        load_warnings=(*replay.load_warnings, note),
    )


# A graph launch call, the positions in replay.kernels of the kernels it ran (by start), and
# the captured region they are paired with.
_Pair = tuple[RuntimeCall, list[int], _Capture]


def _pair_launches(
    replay: Trace,
    launches: list[RuntimeCall],
    by_corr: dict[int, list[int]],
    regions: list[_Capture],
) -> tuple[list[_Pair], int]:
    """Each graph launch that ran kernels, with the first region (in capture order) holding
    as many launch calls as it ran kernels; and how many launches no region matched."""
    by_count: dict[int, _Capture] = {}
    for c in regions:
        by_count.setdefault(len(c.calls), c)
    pairs: list[_Pair] = []
    unmatched = 0
    for launch in launches:
        mine = sorted(
            by_corr.get(launch.correlation or -1, []),
            key=lambda i: (replay.kernels[i].start_us, i),
        )
        if not mine:
            continue
        region = by_count.get(len(mine))
        if region is None:
            unmatched += 1
            continue
        pairs.append((launch, mine, region))
    return pairs, unmatched


def _check_copies(replay: Trace, capture: Trace, pairs: list[_Pair]) -> None:
    """Raise TraceFormatError when the merge would copy more ops and calls than
    MAX_COPIES_PER_EVENT per replay event (plus MIN_COPIES)."""
    copies = sum(len(region.ops) + len(region.calls) for _, _, region in pairs)
    limit = (
        MAX_COPIES_PER_EVENT * (len(replay.ops) + len(replay.runtime) + len(replay.kernels))
        + MIN_COPIES
    )
    if copies > limit:
        raise TraceFormatError(
            f"{capture.source}: merging it into {replay.source} would copy {copies:,} ops and "
            f"launch calls into {len(pairs):,} graph launches, more than {limit:,} (a "
            f"real capture holds a few ops per replayed kernel; this one holds "
            f"{max(len(r.ops) for _, _, r in pairs):,} ops in a region). Refused; pass the "
            "capture trace of the same graph."
        )


def _copy_regions(
    replay: Trace, pairs: list[_Pair]
) -> tuple[list[Kernel], list[Op], list[RuntimeCall], int]:
    """Copy each pair's captured ops and launch calls into its launch call's span (times
    mapped linearly, on the launch's thread, fresh ids and indices after the replay's), each
    copied call's correlation id given to its paired kernel. Return the replay's kernels so
    updated, the copied ops, the copied calls, and how many launches ran on several
    streams."""
    kernels = list(replay.kernels)
    new_ops: list[Op] = []
    new_calls: list[RuntimeCall] = []
    next_id = 1 + max(
        [0]
        + [k.correlation or 0 for k in replay.kernels]
        + [r.correlation or 0 for r in replay.runtime]
        + [o.external_id or 0 for o in replay.ops]
        + [r.external_id or 0 for r in replay.runtime]
    )
    next_index = 1 + max(
        [0] + [x.index for seq in (replay.ops, replay.runtime, replay.kernels) for x in seq]
    )
    multi_stream = 0
    for launch, mine, region in pairs:
        if len({kernels[i].stream for i in mine}) > 1:
            multi_stream += 1
        span = max(region.end_us - region.start_us, 1e-9)
        scale = launch.dur_us / span

        origin, base = region.start_us, launch.start_us

        for o in region.ops:
            new_ops.append(
                dataclasses.replace(
                    o,
                    start_us=base + (o.start_us - origin) * scale,
                    dur_us=o.dur_us * scale,
                    pid=launch.pid,
                    tid=launch.tid,
                    external_id=next_id,
                    index=next_index,
                )
            )
            next_id += 1
            next_index += 1
        for call, pos in zip(region.calls, mine, strict=True):
            new_calls.append(
                dataclasses.replace(
                    call,
                    start_us=base + (call.start_us - origin) * scale,
                    dur_us=call.dur_us * scale,
                    pid=launch.pid,
                    tid=launch.tid,
                    correlation=next_id,
                    external_id=None,
                    index=next_index,
                )
            )
            kernels[pos] = dataclasses.replace(kernels[pos], correlation=next_id, external_id=None)
            next_id += 1
            next_index += 1
    return kernels, new_ops, new_calls, multi_stream


def _by_start(items: Sequence[T]) -> tuple[T, ...]:
    """By start, ties by position in the file (the copies come after the recorded events)."""
    return tuple(sorted(items, key=lambda x: (x.start_us, x.index)))
