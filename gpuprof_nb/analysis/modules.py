"""Time, idle time and memory per nn.Module, forward and backward. Pure functions.

Rules (they decide every number the Modules tab shows):

- Module ranges are the `nn.Module: <path>` annotations gpuprof_nb's hooks record
  (capture/modules.py), or else torch's own `nn.Module: Class_N` Python events (a trace
  recorded with `with_stack=True, with_modules=True`), whose paths are built from how they
  nest on their thread (`BertModel_0.BertEncoder_0.BertLayer_3`: class names and instance
  numbers, not attribute names).
- Backward: each top-level `autograd::engine::evaluate_function: XBackward0` op carries the
  autograd sequence number of the forward op that made its node; the latest forward op
  with that number, started before it, names the module (the innermost one open around
  that forward op). Forward ops are those outside every backward op. Module ranges inside a
  backward op are activation checkpointing's recompute.
- Every moment of a host thread belongs to the innermost range open then: a module's
  forward range, a backward op tied to a module, or a recompute range. A module's self host
  time is the time it is innermost; its host time adds its children's. Device work belongs
  to the range open when its launch call (same correlation id; else the op its External id
  names) started, so kernels launched outside any torch op (a CUDA graph replay, a Triton
  launch from compiled code) are still charged to their module. Device idle gaps (the
  Timeline's) and allocations (`[memory]` events with bytes > 0: the device's on a GPU
  trace, the CPU's on a CPU-only one) are charged to the range open when they happen.
- Shares are of `total_us`: all kernel time on a GPU trace, the activity window on a
  CPU-only one. Rows are ordered by self time (device on GPU, host on CPU), ties by path.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter, eq, is_not

import numpy as np

from gpuprof_nb.analysis.derived import (
    TraceIndex,
    index_of,
    kernel_columns,
    kernel_ids,
    last_call_of,
    lex_order,
    lookup,
    memo,
    op_columns,
    op_kinds,
    op_name_codes,
    op_names,
    python_events,
    runtime_starts,
    runtime_threads,
)
from gpuprof_nb.analysis.timeline import activity_window, gap_columns
from gpuprof_nb.model.trace import MemoryEvent, Op, Trace
from gpuprof_nb.results.modules import ModuleBreakdown, ModuleGroup, ModuleRow, ModuleSource
from gpuprof_nb.results.timeline import Timeline

MODULE_EVENT_PREFIX = "nn.Module: "
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
FORWARD, BACKWARD, RECOMPUTE = 0, 1, 2
_INSTANCE = re.compile(r"^(.*?)(\d+)$")
_NUMBERED = re.compile(r"^(.*)_\d+$")  # torch's module event names: Class_N
_SEQUENCE = attrgetter("sequence_number")
_HOW_TO_RECORD = (
    "profile the cell with %%gpuprofile (it records them), or record with "
    "torch.profiler.profile(with_stack=True, with_modules=True)"
)

Thread = tuple[str, str]


class _Ranges:
    """Spans on host threads, each charged to a module node in one phase, as columns:
    range k runs on thread[k] from start[k] to end[k], charged to node[k] in phase[k]."""

    __slots__ = ("thread", "start", "end", "node", "phase")

    def __init__(self) -> None:
        self.thread: list[Thread] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.node: list[int] = []
        self.phase: list[int] = []

    def __len__(self) -> int:
        return len(self.node)

    def add(self, thread: Thread, start: float, end: float, node: int, phase: int) -> None:
        self.thread.append(thread)
        self.start.append(start)
        self.end.append(end)
        self.node.append(node)
        self.phase.append(phase)


class _Segments:
    """One thread's time cut into disjoint pieces, each owned by the innermost range."""

    __slots__ = ("start", "end", "owner")

    def __init__(self, start: list[float], end: list[float], owner: list[int]) -> None:
        self.start = np.asarray(start, dtype=float)
        self.end = np.asarray(end, dtype=float)
        self.owner = np.asarray(owner, dtype=np.intp)

    def covered(self, lo: float, hi: float) -> float:
        """Microseconds of [lo, hi) that the pieces cover."""
        a = int(np.searchsorted(self.end, lo, side="right"))
        b = int(np.searchsorted(self.start, hi, side="left"))
        if b <= a:
            return 0.0
        part = np.minimum(self.end[a:b], hi) - np.maximum(self.start[a:b], lo)
        return float(part[part > 0].sum())

    def find(self, times: np.ndarray) -> np.ndarray:
        """The owner (a range index) of the piece holding each time, -1 where none does."""
        if not len(self.start) or not len(times):
            return np.full(len(times), -1, dtype=np.intp)
        at = np.searchsorted(self.start, times, side="right") - 1
        ok = at >= 0
        ok[ok] = times[ok] < self.end[at[ok]]
        return np.where(ok, self.owner[np.maximum(at, 0)], -1)


def _flatten(start: Sequence[float], end: Sequence[float], order: Sequence[int]) -> _Segments:
    """Cut one thread's ranges (indices in `order`, sorted by start, longer first; range k
    spans start[k] to end[k]) into disjoint pieces owned by the innermost open range. A
    range that outlasts its parent is cut at the parent's end."""
    starts: list[float] = []
    ends: list[float] = []
    owners: list[int] = []
    stack: list[tuple[int, float]] = []  # (range, its end, clipped)
    cursor = 0.0
    for i in order:
        lo = start[i]
        while stack and stack[-1][1] <= lo:
            top, hi = stack.pop()
            if hi > cursor:
                starts.append(cursor)
                ends.append(hi)
                owners.append(top)
            cursor = hi
        if stack:
            if lo > cursor:
                starts.append(cursor)
                ends.append(lo)
                owners.append(stack[-1][0])
            hi = min(end[i], stack[-1][1])
        else:
            hi = end[i]
        cursor = lo
        stack.append((i, hi))
    while stack:
        top, hi = stack.pop()
        if hi > cursor:
            starts.append(cursor)
            ends.append(hi)
            owners.append(top)
        cursor = max(cursor, hi)
    return _Segments(starts, ends, owners)


def _thread(o: Op) -> Thread:
    return (str(o.pid), str(o.tid))


def _module_ranges(
    trace: Trace | TraceIndex,
) -> tuple[ModuleSource, list[tuple[str, Thread, float, float]]]:
    """Return where the module ranges come from and each (path, thread, start, end)."""
    ix = index_of(trace)
    trace = ix.trace
    names = op_names(ix)
    prefix = trace.modules.prefix if trace.modules is not None else MODULE_EVENT_PREFIX
    if not any(n.startswith(prefix) or n.startswith(MODULE_EVENT_PREFIX) for n in names):
        return "none", []
    cut = len(prefix)
    live = [
        (o.name[cut:], _thread(o), o.start_us, o.end_us)
        for o in map(trace.ops.__getitem__, _positions(op_kinds(ix), "annotation"))
        if o.name.startswith(prefix) and len(o.name) > cut
    ]
    if live:
        return "hooks", live
    py = python_events(ix)
    named = py.named(lambda name: name.startswith(MODULE_EVENT_PREFIX))
    events = [py.ops[i] for i in np.flatnonzero(named & (py.dur >= 0)).tolist()]
    if not events:
        return "none", []
    # Paths from nesting: per thread, by start, longer first, as recorded.
    events.sort(key=lambda o: (_thread(o), o.start_us, -o.dur_us, o.index))
    out: list[tuple[str, Thread, float, float]] = []
    stack: list[tuple[str, float]] = []
    thread: Thread | None = None
    cut = len(MODULE_EVENT_PREFIX)
    for o in events:
        t = _thread(o)
        if t != thread:
            stack, thread = [], t
        while stack and stack[-1][1] <= o.start_us:
            stack.pop()
        name = o.name[cut:].strip() or "module"
        path = f"{stack[-1][0]}.{name}" if stack else name
        stack.append((path, o.end_us))
        out.append((path, t, o.start_us, o.end_us))
    return "python_events", out


def _is_backward(ix: TraceIndex) -> np.ndarray:
    """Mask of op_columns' ops named as backward ops."""
    distinct, codes = op_name_codes(ix)
    named = np.array([n.startswith(BACKWARD_PREFIX) for n in distinct], dtype=bool)
    return named[codes] if len(codes) else np.zeros(0, dtype=bool)


def _positions(kinds: list[str], kind: str) -> list[int]:
    """Return where `kind` is in `kinds`, in order. Annotations are few among the ops: found
    by list.count and list.index (which compare in C and take the same object as equal at
    once) rather than a comparison per op."""
    count = kinds.count(kind)
    if count > len(kinds) // 8:
        return list(compress(range(len(kinds)), map(eq, kinds, repeat(kind))))
    out = []
    at = -1
    for _ in range(count):
        at = kinds.index(kind, at + 1)
        out.append(at)
    return out


def _top_backward_ops(trace: Trace | TraceIndex) -> list[int]:
    """Rows in op_columns of the backward ops not nested in another on their thread."""
    ix = index_of(trace)
    if not any(n.startswith(BACKWARD_PREFIX) for n in op_names(ix)):
        return []
    out = []
    open_until: dict[int, float] = {}
    # The torch ops (kind "op") so named, in trace order; threads as op_columns' codes
    # (one per thread as text).
    cols = op_columns(ix)
    rows = np.flatnonzero(_is_backward(ix))
    for k, t, start, end in zip(
        rows.tolist(),
        cols.thread[rows].tolist(),
        cols.start[rows].tolist(),
        cols.end[rows].tolist(),
        strict=True,
    ):
        if start < open_until.get(t, -np.inf):
            continue
        open_until[t] = end
        out.append(k)
    return out


def module_breakdown(
    trace: Trace | TraceIndex, timeline: Timeline | None = None
) -> ModuleBreakdown:
    """Return time, idle time and memory per nn.Module path (computed once per trace; see
    the module's rules). Without module ranges in the trace, an empty breakdown whose notes
    say what is missing and how to record it."""
    ix = index_of(trace)
    return memo(ix, "module_breakdown", lambda: _breakdown(ix, timeline))


def _breakdown(trace: Trace | TraceIndex, timeline: Timeline | None) -> ModuleBreakdown:
    """Return the module breakdown (see the module's rules); module_breakdown memoises it."""
    ix = index_of(trace)
    trace = ix.trace
    source, found = _module_ranges(ix)
    on_device = bool(trace.kernels)
    lo, hi = activity_window(ix)
    steps = max(len(trace.steps), 1)
    total = float(kernel_columns(ix).dur.sum()) if on_device else max(hi - lo, 0.0)
    if source == "none":
        return _no_modules(trace, on_device, total, steps)
    notes: list[str] = []
    backward = _top_backward_ops(ix)
    spans = _BackwardSpans(ix, backward)
    phases = [
        RECOMPUTE if spans.contains(thread, start) else FORWARD for _, thread, start, _ in found
    ]
    if source == "python_events":
        found = _recompute_paths(found, phases)
    paths: dict[str, int] = {}  # each path's node
    ranges = _Ranges()
    for (path, thread, start, end), phase in zip(found, phases, strict=True):
        ranges.add(thread, start, end, paths.setdefault(path, len(paths)), phase)
    untied, with_seq = _tie_backward(ix, backward, spans, ranges)
    if backward and not with_seq:
        notes.append(
            "the backward ops carry no autograd sequence numbers (an older trace?): "
            "backward time is not charged to modules"
        )

    # Every range's pieces of host time, per thread; backward ops tied to no module hold
    # what no range inside them (a recompute) holds.
    by_thread = _segments_by_thread(ranges)
    backward_outside = _backward_outside(ix, untied, by_thread)
    n = len(paths)
    range_node = np.array(ranges.node, dtype=np.intp)
    range_phase = np.array(ranges.phase, dtype=np.intp)
    memo(ix, "module_segments", lambda: (by_thread, range_node, range_phase, list(paths)))
    host = np.zeros((3, n))
    for segs in by_thread.values():
        np.add.at(host, (range_phase[segs.owner], range_node[segs.owner]), segs.end - segs.start)
    calls = np.bincount(range_node[range_phase == FORWARD], minlength=n).astype(np.int64)
    recompute_calls = np.bincount(range_node[range_phase == RECOMPUTE], minlength=n).astype(
        np.int64
    )
    device, kernel_count = _device_by_node(ix, by_thread, range_node, range_phase, n)
    # Idle gaps, charged to the range open then (pieces of all threads, earliest first).
    idle = np.zeros(n)
    if timeline is not None and timeline.gaps:
        idle = _idle_by_node(ix, timeline, by_thread, range_node, n)
    allocated = _allocated_by_node(trace, by_thread, range_node, n, on_device)
    rows = _rows(
        trace,
        paths,
        host,
        device,
        kernel_count,
        idle,
        allocated,
        calls,
        recompute_calls,
        total,
        on_device,
    )
    outside = _outside_modules(rows, total, notes)
    notes.extend(_source_notes(ix, source, backward_outside))
    return ModuleBreakdown(
        rows=tuple(sorted(rows, key=lambda r: (-r.self_time_us, r.path))),
        groups=_groups(rows, total),
        source=source,
        on_device=on_device,
        total_us=total,
        outside_us=outside,
        backward_outside_us=backward_outside,
        steps=steps,
        notes=tuple(notes),
    )


def _no_modules(trace: Trace, on_device: bool, total: float, steps: int) -> ModuleBreakdown:
    """Return the empty breakdown of a trace without module ranges, with a note saying why
    and how to record them."""
    if trace.modules is not None and trace.modules.recorded:
        why = "no nn.Module ran in the profiled run (the cell calls no module)"
    else:
        why = f"the trace has no nn.Module ranges; {_HOW_TO_RECORD}"
    return ModuleBreakdown(
        rows=(),
        groups=(),
        source="none",
        on_device=on_device,
        total_us=total,
        outside_us=total,
        steps=steps,
        notes=(why,),
    )


class _BackwardSpans:
    """The top-level backward ops' spans per thread (sorted by start): whether a moment of
    a thread lies inside one."""

    def __init__(self, ix: TraceIndex, backward: Sequence[int]) -> None:
        cols = op_columns(ix)
        by_thread: dict[Thread, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
        for t, start, end in zip(
            cols.thread[backward].tolist(),
            cols.start[backward].tolist(),
            cols.end[backward].tolist(),
            strict=True,
        ):
            s, e = by_thread[cols.thread_keys[t]]
            s.append(start)
            e.append(end)
        self.by_thread = by_thread

    def contains(self, thread: Thread, t: float) -> bool:
        pair = self.by_thread.get(thread)
        if pair is None:
            return False
        k = bisect.bisect_right(pair[0], t) - 1
        return k >= 0 and t < pair[1][k]

    def holds(self, ix: TraceIndex) -> np.ndarray:
        """Mask of op_columns' ops that start inside a span on their thread: contains() of
        each, found per thread by one search where the spans' starts are sorted (as the
        bisection finds them there)."""
        cols = op_columns(ix)
        out = np.zeros(len(cols.ops), dtype=bool)
        code_of = {key: k for k, key in enumerate(cols.thread_keys)}
        for thread, (s, e) in self.by_thread.items():
            rows = np.flatnonzero(cols.thread == code_of[thread])
            starts, ends = np.array(s, dtype=float), np.array(e, dtype=float)
            if np.all(starts[1:] >= starts[:-1]):
                t = cols.start[rows]
                k = np.searchsorted(starts, t, side="right") - 1
                out[rows] = (k >= 0) & (t < ends[np.maximum(k, 0)])
            else:
                out[rows] = [self.contains(thread, t) for t in cols.start[rows].tolist()]
        return out


def _tie_backward(
    ix: TraceIndex, backward: Sequence[int], spans: _BackwardSpans, ranges: _Ranges
) -> tuple[list[int], int]:
    """Tie each top-level backward op (rows in op_columns) to the module of the latest
    forward op with its sequence number started before it, adding a BACKWARD range for each
    tied op to `ranges` (whose FORWARD ranges name the forward ops' modules). Forward ops are
    the torch ops with a sequence number, not named as backward ops, outside every backward
    op. Return the backward ops tied to none and how many backward ops carry a sequence
    number."""
    cols = op_columns(ix)
    ops = cols.ops
    # Forward ops: of the ops outside backward ones (by name and by time), those with a
    # sequence number (read only for them).
    outside = np.flatnonzero(~_is_backward(ix) & ~spans.holds(ix)).tolist()
    seqs = list(map(_SEQUENCE, map(ops.__getitem__, outside)))
    numbered = np.fromiter(map(is_not, seqs, repeat(None)), dtype=bool, count=len(seqs))
    fwd = np.asarray(outside, dtype=np.intp)[numbered]
    # The module of each forward op: the FORWARD range innermost where it starts.
    fwd_ranges = [k for k, phase in enumerate(ranges.phase) if phase == FORWARD]
    owners = _owners_at(ix, _segments_by_thread(ranges, fwd_ranges), fwd)
    node_of = np.array(ranges.node, dtype=np.intp)
    fwd_node = np.where(owners >= 0, node_of[np.maximum(owners, 0)], -1) if len(owners) else owners
    bwd_seqs = list(map(_SEQUENCE, map(ops.__getitem__, backward)))
    rows = np.asarray(backward, dtype=np.intp)
    nodes = _tie_by_sequence(
        list(compress(seqs, numbered)), cols.start[fwd], fwd_node, bwd_seqs, cols.start[rows]
    )
    tied = nodes >= 0
    untied: list[int] = rows[~tied].tolist()
    keys = cols.thread_keys
    at = rows[tied]
    ranges.thread.extend([keys[t] for t in cols.thread[at].tolist()])
    ranges.start.extend(cols.start[at].tolist())
    ranges.end.extend(cols.end[at].tolist())
    ranges.node.extend(nodes[tied].tolist())
    ranges.phase.extend([BACKWARD] * len(at))
    with_seq = len(bwd_seqs) - bwd_seqs.count(None)
    return untied, with_seq


def _tie_by_sequence(
    fwd_seq: Sequence[int],
    fwd_start: np.ndarray,
    fwd_node: np.ndarray,
    bwd_seq: Sequence[int | None],
    bwd_start: np.ndarray,
) -> np.ndarray:
    """Return, for each backward op (its sequence number, None where it has none, and its
    start), the node of the latest forward op with that number started before it, -1 where
    none is: _tie_by_sequence_loop's answer, found by one sort of both sets of ops by
    (number, start) where the forward ops' starts are in order (as ops are in a trace) and
    the numbers fit int64, else by that loop."""
    has = np.fromiter(map(is_not, bwd_seq, repeat(None)), dtype=bool, count=len(bwd_seq))
    fwd_start = np.asarray(fwd_start, dtype=float)
    bwd_start = np.asarray(bwd_start, dtype=float)
    if not np.all(fwd_start[1:] >= fwd_start[:-1]):
        return _tie_by_sequence_loop(fwd_seq, fwd_start, fwd_node, bwd_seq, bwd_start)
    try:
        f_seq = np.fromiter(map(int, fwd_seq), dtype=np.int64, count=len(fwd_seq))
        b_seq = np.fromiter(map(int, compress(bwd_seq, has)), dtype=np.int64)  # type: ignore[arg-type]
    except OverflowError:
        return _tie_by_sequence_loop(fwd_seq, fwd_start, fwd_node, bwd_seq, bwd_start)
    out = np.full(len(bwd_seq), -1, dtype=np.intp)
    if not len(f_seq) or not len(b_seq):
        return out
    # Forward ops and the backward ops' queries in one order by (number, start), a query
    # before a forward op of its start (bisect_left: only those started strictly before
    # count); forward ops of one number and start stay in their order (a stable sort).
    n_f = len(f_seq)
    seq = np.concatenate((f_seq, b_seq))
    start = np.concatenate((fwd_start, bwd_start[has]))
    is_fwd = np.concatenate((np.ones(n_f, dtype=bool), np.zeros(len(b_seq), dtype=bool)))
    order = np.lexsort((is_fwd, start, seq))
    sorted_fwd = is_fwd[order]
    # The forward ops before each query: the last of them is the one asked for when it has
    # the query's number.
    before = np.cumsum(sorted_fwd)[~sorted_fwd] - 1
    fwd_order = order[sorted_fwd]
    query = order[~sorted_fwd] - n_f
    last = fwd_order[np.maximum(before, 0)]
    ok = (before >= 0) & (f_seq[last] == b_seq[query])
    found = np.full(len(b_seq), -1, dtype=np.intp)
    found[query[ok]] = np.asarray(fwd_node, dtype=np.intp)[last[ok]]
    out[has] = found
    return out


def _tie_by_sequence_loop(
    fwd_seq: Sequence[int],
    fwd_start: np.ndarray,
    fwd_node: np.ndarray,
    bwd_seq: Sequence[int | None],
    bwd_start: np.ndarray,
) -> np.ndarray:
    """_tie_by_sequence, one op at a time: each number's forward starts and nodes in their
    order, and a bisection of its starts per backward op."""
    seq_start: dict[int, list[float]] = defaultdict(list)
    seq_node: dict[int, list[int]] = defaultdict(list)
    for seq, start, node in zip(fwd_seq, fwd_start.tolist(), fwd_node.tolist(), strict=True):
        seq_start[int(seq)].append(start)
        seq_node[int(seq)].append(node)
    out = np.full(len(bwd_seq), -1, dtype=np.intp)
    for k, (number, start) in enumerate(zip(bwd_seq, bwd_start.tolist(), strict=True)):
        if number is None:
            continue
        starts = seq_start.get(int(number))
        if starts:
            before = bisect.bisect_left(starts, start) - 1
            if before >= 0:
                out[k] = seq_node[int(number)][before]
    return out


def _backward_outside(
    ix: TraceIndex, untied: Sequence[int], by_thread: dict[Thread, _Segments]
) -> float:
    """Return the host time of the backward ops tied to no module (rows in op_columns) that
    no range inside them holds. The pieces each op meets are found per thread at once; an
    op that meets none has none of its time covered."""
    cols = op_columns(ix)
    rows = np.asarray(untied, dtype=np.intp)
    lo, hi = cols.start[rows], cols.end[rows]
    covered = [0.0] * len(rows)
    code_of = {key: k for k, key in enumerate(cols.thread_keys)}
    threads = cols.thread[rows]
    for thread, segs in by_thread.items():
        code = code_of.get(thread)
        at = np.flatnonzero(threads == code) if code is not None else ()
        if not len(at):
            continue
        a = np.searchsorted(segs.end, lo[at], side="right")
        b = np.searchsorted(segs.start, hi[at], side="left")
        for j in at[b > a].tolist():
            covered[j] = segs.covered(float(lo[j]), float(hi[j]))
    outside = 0.0
    for dur, cov in zip(cols.dur[rows].tolist(), covered, strict=True):
        outside += dur - cov
    return outside


def _outside_modules(rows: Sequence[ModuleRow], total: float, notes: list[str]) -> float:
    """Return the time outside every root module; 0 where the roots add up to more than
    the whole (module time on several threads overlapping), noted in `notes`."""
    roots_us = sum(r.time_us for r in rows if r.parent is None)
    outside = total - roots_us
    if outside < -1e-6 * max(total, 1.0):
        notes.append(
            "module time on several threads overlaps in time: the roots add up to "
            f"{roots_us / total:.0%} of the window"
            if total > 0
            else "no time in the window"
        )
        outside = 0.0
    return outside


def _device_by_node(
    ix: TraceIndex,
    by_thread: dict[Thread, _Segments],
    range_node: np.ndarray,
    range_phase: np.ndarray,
    n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Return device time per (phase, node) and kernel count per node: each kernel goes to
    the range open at its launch."""
    device = np.zeros((3, n))
    kernel_count = np.zeros(n, dtype=np.int64)
    if not ix.trace.kernels:
        return device, kernel_count
    k_thread, k_time = _launch_points(ix)
    owner = np.full(len(ix.trace.kernels), -1, dtype=np.intp)
    for thread, segs in by_thread.items():
        launched = np.flatnonzero(k_thread == _thread_code(ix, thread))
        if len(launched):
            owner[launched] = segs.find(k_time[launched])
    durs = kernel_columns(ix).dur
    hit = np.flatnonzero(owner >= 0)
    np.add.at(device, (range_phase[owner[hit]], range_node[owner[hit]]), durs[hit])
    np.add.at(kernel_count, range_node[owner[hit]], 1)
    return device, kernel_count


def _allocated_by_node(
    trace: Trace,
    by_thread: dict[Thread, _Segments],
    range_node: np.ndarray,
    n: int,
    on_device: bool,
) -> np.ndarray | None:
    """Return bytes allocated per node (the device's on a GPU trace, the CPU's on a CPU-only
    one), each allocation charged to the range open then; None without allocations."""
    mem = [m for m in trace.memory if m.bytes > 0 and ((m.device_type != 0) == on_device)]
    if not mem:
        return None
    allocated = np.zeros(n)
    mem_of: dict[Thread, list[MemoryEvent]] = defaultdict(list)
    for m in mem:
        mem_of[(str(m.pid), str(m.tid))].append(m)
    for thread, segs in by_thread.items():
        here = mem_of.get(thread)
        if not here:
            continue
        got = segs.find(np.array([m.ts_us for m in here], dtype=float))
        ok = got >= 0
        sizes = np.array([m.bytes for m in here], dtype=float)
        np.add.at(allocated, range_node[got[ok]], sizes[ok])
    return allocated


def _source_notes(ix: TraceIndex, source: ModuleSource, backward_outside: float) -> list[str]:
    """Return the notes on what the module ranges' source and backward ops leave out."""
    notes = []
    if source == "python_events":
        notes.append(
            "paths from torch's nn.Module events name each module by its class and instance "
            "number (BertLayer_3), not by its attribute name; %%gpuprofile records paths "
            "such as model.encoder.layers.3"
        )
    if backward_outside > 0:
        notes.append(
            f"{backward_outside:.6g} us of backward host time (gradient accumulation, or "
            "ops that ran outside every module) is charged to no module"
        )
    if (
        ix.trace.compile_log is not None
        or any("Torch-Compiled Region" in name for name in op_names(ix))
    ) and source == "hooks":
        notes.append(
            "a torch.compile'd module shows as one range around its compiled call: its "
            "submodules run inside the compiled graph"
        )
    return notes


def _recompute_paths(
    found: list[tuple[str, Thread, float, float]], phases: Sequence[int]
) -> list[tuple[str, Thread, float, float]]:
    """Torch's module events of a recompute run inside backward, with no module around them:
    their paths start at the recomputed module's own name (`Sequential_5`). Where one forward
    path ends in that name (`...CheckpointWrapper_3.Sequential_5`), they take its path."""
    tails: dict[str, set[str]] = defaultdict(set)
    for (path, _, _, _), phase in zip(found, phases, strict=True):
        if phase == FORWARD:
            tails[path.rsplit(".", 1)[-1]].add(path)
    out = []
    for (path, thread, start, end), phase in zip(found, phases, strict=True):
        if phase == RECOMPUTE:
            head, _, rest = path.partition(".")
            full = tails.get(head, set())
            if len(full) == 1:
                (where,) = full
                path = f"{where}.{rest}" if rest else where
        out.append((path, thread, start, end))
    return out


def modules_at(trace: Trace | TraceIndex, positions: Sequence[int]) -> list[tuple[str | None, int]]:
    """For torch ops (positions in the op columns), the module path innermost where each
    started and the phase (FORWARD, BACKWARD, RECOMPUTE); (None, -1) outside every module."""
    ix = index_of(trace)
    cols = op_columns(ix)
    rows = np.asarray(positions, dtype=np.intp)
    keys = cols.thread_keys
    threads = [keys[t] for t in cols.thread[rows].tolist()]
    return _at(ix, list(zip(threads, cols.start[rows].tolist(), strict=True)))


def module_path_at(
    trace: Trace | TraceIndex, points: Sequence[tuple[Thread, float]]
) -> list[str | None]:
    """For (thread, time) points, the path of the innermost module then (None: none)."""
    ix = index_of(trace)
    return [path for path, _ in _at(ix, points)]


def _at(
    trace: Trace | TraceIndex, points: Sequence[tuple[Thread, float]]
) -> list[tuple[str | None, int]]:
    ix = index_of(trace)
    module_breakdown(ix)  # leaves the module segments in the index
    state = ix.peek("module_segments")
    if state is None or not len(points):
        return [(None, -1)] * len(points)
    by_thread, range_node, range_phase, names = state
    owners = _owners_of(by_thread, points)
    return [(names[range_node[k]], int(range_phase[k])) if k >= 0 else (None, -1) for k in owners]


def _segments_by_thread(
    ranges: _Ranges, rows: Sequence[int] | None = None
) -> dict[Thread, _Segments]:
    """Each thread's pieces of the ranges (those at `rows`, default all), indexed into
    `ranges`."""
    per: dict[Thread, list[int]] = defaultdict(list)
    thread = ranges.thread
    for k in range(len(ranges)) if rows is None else rows:
        per[thread[k]].append(k)
    start, end = ranges.start, ranges.end
    out = {}
    for t, idx in per.items():
        idx.sort(key=lambda k: (start[k], -end[k], k))
        out[t] = _flatten(start, end, idx)
    return out


def _owners_of(
    segments: dict[Thread, _Segments], points: Sequence[tuple[Thread, float]]
) -> list[int]:
    """The owning range of each (thread, time) point, -1 where none."""
    out = np.full(len(points), -1, dtype=np.intp)
    per: dict[Thread, list[int]] = defaultdict(list)
    for k, (thread, _) in enumerate(points):
        per[thread].append(k)
    for thread, idx in per.items():
        segs = segments.get(thread)
        if segs is None:
            continue
        times = np.array([points[k][1] for k in idx], dtype=float)
        out[idx] = segs.find(times)
    return out.tolist()  # type: ignore[no-any-return]


def _owners_at(ix: TraceIndex, segments: dict[Thread, _Segments], rows: np.ndarray) -> np.ndarray:
    """The owning range where each of op_columns' ops at `rows` starts, -1 where none:
    _owners_of of their (thread, start) points, found per thread code."""
    cols = op_columns(ix)
    out = np.full(len(rows), -1, dtype=np.intp)
    code_of = {key: k for k, key in enumerate(cols.thread_keys)}
    threads = cols.thread[rows]
    for thread, segs in segments.items():
        code = code_of.get(thread)
        at = np.flatnonzero(threads == code) if code is not None else ()
        if len(at):
            out[at] = segs.find(cols.start[rows[at]])
    return out


def _thread_code(trace: Trace | TraceIndex, thread: Thread) -> int:
    return _thread_codes(trace).get(thread, -2)


def _thread_codes(trace: Trace | TraceIndex) -> dict[Thread, int]:
    """Each thread (ids as text) of the runtime calls and the torch ops, as a code (once)."""
    ix = index_of(trace)
    return memo(ix, ("module_thread_codes",), lambda: _find_thread_codes(ix))


def _find_thread_codes(ix: TraceIndex) -> dict[Thread, int]:
    codes: dict[Thread, int] = {}
    _, pairs = runtime_threads(ix)
    for p, t in pairs:
        codes.setdefault((str(p), str(t)), len(codes))
    for p, t in op_columns(ix).raw_threads:
        codes.setdefault((str(p), str(t)), len(codes))
    return codes


def _launch_points(trace: Trace | TraceIndex) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's launch (thread code, host time): its launch call's (last call with its
    correlation id), else the op its External id names, else (-1, nan)."""
    ix = index_of(trace)
    trace = ix.trace
    n = len(trace.kernels)
    thread = np.full(n, -1, dtype=np.intp)
    time = np.full(n, np.nan)
    codes = _thread_codes(ix)
    k_corr, k_has_corr, k_ext, k_has_ext = kernel_ids(ix)
    keys, pos = last_call_of(ix)
    call = np.where(k_has_corr, lookup(keys, pos, k_corr), -1)
    hit = np.flatnonzero(call >= 0)
    if len(hit):
        r_codes, pairs = runtime_threads(ix)
        pair_code = np.array([codes[(str(p), str(t))] for p, t in pairs], dtype=np.intp)
        thread[hit] = pair_code[r_codes[call[hit]]]
        time[hit] = runtime_starts(ix)[call[hit]]
    need = np.flatnonzero((thread < 0) & k_has_ext)
    if len(need):
        cols = op_columns(ix)
        with_ext = np.flatnonzero(cols.has_external_id)
        ext_keys, first = np.unique(cols.external_id[with_ext], return_index=True)
        op_at = lookup(ext_keys, with_ext[first], k_ext[need])
        ok = op_at >= 0
        raw_code = np.array([codes[(str(p), str(t))] for p, t in cols.raw_threads], dtype=np.intp)
        thread[need[ok]] = raw_code[cols.raw_thread[op_at[ok]]]
        time[need[ok]] = cols.start[op_at[ok]]
    return thread, time


def _idle_by_node(
    ix: TraceIndex,
    timeline: Timeline,
    by_thread: dict[Thread, _Segments],
    range_node: np.ndarray,
    n: int,
) -> np.ndarray:
    """Idle microseconds per module node: each gap's overlap with the pieces (all threads,
    each moment charged once, to the piece that started first)."""
    starts = np.concatenate([s.start for s in by_thread.values()] or [np.zeros(0)])
    ends = np.concatenate([s.end for s in by_thread.values()] or [np.zeros(0)])
    owner = np.concatenate(
        [s.owner for s in by_thread.values()] or [np.zeros(0, dtype=np.intp)]
    ).astype(np.intp)
    order = lex_order((ends, starts), lead=1)
    starts, ends, owner = starts[order], ends[order], owner[order]
    # Disjoint across threads: a piece starts no earlier than the ends before it.
    if len(ends):
        reach = np.maximum.accumulate(ends)
        starts = np.maximum(starts, np.concatenate(([-np.inf], reach[:-1])))
    keep = ends > starts
    starts, ends, owner = starts[keep], ends[keep], owner[keep]
    node = range_node[owner]
    idle = np.zeros(n)
    if not len(starts):
        return idle
    g_lo, g_hi, _, _ = gap_columns(ix, timeline)
    # Each gap meets the pieces a..b-1 (pieces are sorted and disjoint); all pairs at once.
    a = np.searchsorted(ends, g_lo, side="right")
    b = np.searchsorted(starts, g_hi, side="left")
    counts = np.maximum(b - a, 0)
    if not counts.sum():
        return idle
    gap = np.repeat(np.arange(len(g_lo)), counts)
    piece = np.repeat(a, counts) + (
        np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    )
    overlap = np.minimum(ends[piece], g_hi[gap]) - np.maximum(starts[piece], g_lo[gap])
    hit = overlap > 0
    np.add.at(idle, node[piece[hit]], overlap[hit])
    return idle


def _parent_of(path: str, known: dict[str, int]) -> str | None:
    """The nearest enclosing path that is itself a module (None for a root)."""
    head = path
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in known:
            return head
    return None


def _rows(
    trace: Trace,
    paths: dict[str, int],
    host: np.ndarray,
    device: np.ndarray,
    kernel_count: np.ndarray,
    idle: np.ndarray,
    allocated: np.ndarray | None,
    calls: np.ndarray,
    recompute_calls: np.ndarray,
    total: float,
    on_device: bool,
) -> list[ModuleRow]:
    names = list(paths)
    n = len(names)
    parent = []
    for name in names:
        up_path = _parent_of(name, paths)
        parent.append(paths[up_path] if up_path is not None else -1)
    depth = [0] * n
    for k in range(n):
        d, up = 0, parent[k]
        while up >= 0:
            d += 1
            up = parent[up]
        depth[k] = d
    # Inclusive amounts, children added into parents deepest first, as Python floats (the
    # same additions as on the arrays, without a NumPy call per node).
    incl_host, incl_dev = host.tolist(), device.tolist()
    incl_k, incl_idle = kernel_count.astype(float).tolist(), idle.tolist()
    incl_mem = allocated.tolist() if allocated is not None else None
    for k in sorted(range(n), key=lambda k: -depth[k]):
        up = parent[k]
        if up >= 0:
            for phase in (FORWARD, BACKWARD, RECOMPUTE):
                incl_host[phase][up] += incl_host[phase][k]
                incl_dev[phase][up] += incl_dev[phase][k]
            incl_k[up] += incl_k[k]
            incl_idle[up] += incl_idle[k]
            if incl_mem is not None:
                incl_mem[up] += incl_mem[k]
    types = trace.modules.types if trace.modules is not None else {}
    # Per node, as Python floats: the sums over the three phases are the same as each
    # column's own sum (three values added in order).
    self_host = host.sum(axis=0).tolist()
    self_dev = device.sum(axis=0).tolist()
    own = self_dev if on_device else self_host
    whole = np.array(incl_dev if on_device else incl_host).sum(axis=0).tolist()
    host_of, dev_of = incl_host, incl_dev
    kernels, idles, mem = incl_k, incl_idle, incl_mem
    n_calls = calls.tolist()
    n_recompute = recompute_calls.tolist()
    rows = []
    for k, name in enumerate(names):
        module_type = types.get(name, "")
        if not module_type and not types:
            m = _NUMBERED.match(name.rsplit(".", 1)[-1])
            module_type = m.group(1) if m else ""
        rows.append(
            ModuleRow(
                path=name,
                parent=names[parent[k]] if parent[k] >= 0 else None,
                depth=depth[k],
                module_type=module_type,
                calls=int(n_calls[k]),
                forward_host_us=host_of[FORWARD][k],
                backward_host_us=host_of[BACKWARD][k],
                recompute_host_us=host_of[RECOMPUTE][k],
                forward_device_us=dev_of[FORWARD][k],
                backward_device_us=dev_of[BACKWARD][k],
                recompute_device_us=dev_of[RECOMPUTE][k],
                self_host_us=self_host[k],
                self_device_us=self_dev[k],
                kernels=int(kernels[k]),
                idle_us=idles[k],
                bytes_allocated=int(mem[k]) if mem is not None else None,
                share=min(max(whole[k] / total, 0.0), 1.0) if total > 0 else 0.0,
                self_share=min(max(own[k] / total, 0.0), 1.0) if total > 0 else 0.0,
                on_device=on_device,
                recompute_calls=int(n_recompute[k]),
            )
        )
    return rows


def _groups(rows: Sequence[ModuleRow], total: float) -> tuple[ModuleGroup, ...]:
    """Repeated siblings folded into one group each, in pattern order: two or more rows
    under one parent whose paths differ only in a trailing number after `.` or `_`
    (`layers.0`..`layers.23`, `BertLayer_0`..`BertLayer_3`), when every sibling of that
    stem is of one class."""
    by_stem: dict[tuple[str | None, str], list[tuple[int, ModuleRow]]] = defaultdict(list)
    for r in rows:
        rel = r.path[len(r.parent) + 1 :] if r.parent else r.path
        m = _INSTANCE.match(rel)
        if m and (not m.group(1) or m.group(1)[-1] in "._"):
            by_stem[(r.parent, m.group(1))].append((int(m.group(2)), r))
    out = []
    for (parent, stem), members in by_stem.items():
        if len(members) < 2 or len({p[1].module_type for p in members}) != 1:
            continue
        members.sort(key=lambda p: p[0])
        numbers = [p[0] for p in members]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            span = f"{{{numbers[0]}..{numbers[-1]}}}"
        else:
            span = "{" + ",".join(map(str, numbers)) + "}"
        times = [p[1].time_us for p in members]
        head = f"{parent}." if parent else ""
        whole = float(sum(times))
        out.append(
            ModuleGroup(
                pattern=f"{head}{stem}{span}",
                parent=parent,
                depth=members[0][1].depth,
                members=tuple(p[1].path for p in members),
                time_us=whole,
                min_us=float(min(times)),
                max_us=float(max(times)),
                mean_us=whole / len(times),
                share=min(max(whole / total, 0.0), 1.0) if total > 0 else 0.0,
            )
        )
    out.sort(key=lambda g: g.pattern)
    return tuple(out)
