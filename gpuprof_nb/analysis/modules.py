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
from dataclasses import dataclass
from itertools import compress, repeat
from operator import eq

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
    runtime_starts,
    runtime_threads,
)
from gpuprof_nb.analysis.timeline import activity_window
from gpuprof_nb.model.trace import MemoryEvent, Op, Trace
from gpuprof_nb.results.modules import ModuleBreakdown, ModuleGroup, ModuleRow, ModuleSource
from gpuprof_nb.results.timeline import Timeline

MODULE_EVENT_PREFIX = "nn.Module: "
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
FORWARD, BACKWARD, RECOMPUTE = 0, 1, 2
_INSTANCE = re.compile(r"^(.*?)(\d+)$")
_HOW_TO_RECORD = (
    "profile the cell with %%gpuprofile (it records them), or record with "
    "torch.profiler.profile(with_stack=True, with_modules=True)"
)

Thread = tuple[str, str]


@dataclass(slots=True)
class _Range:
    """A span on one thread charged to a module node in one phase."""

    thread: Thread
    start: float
    end: float
    node: int
    phase: int


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


def _flatten(ranges: Sequence[_Range], order: Sequence[int]) -> tuple[_Segments, list[int]]:
    """Cut one thread's ranges (indices in `order`, sorted by start, longer first) into
    disjoint pieces owned by the innermost open range; return them and each range's parent
    (-1: none). A range that outlasts its parent is cut at the parent's end."""
    starts: list[float] = []
    ends: list[float] = []
    owners: list[int] = []
    parent = {}
    stack: list[tuple[int, float]] = []  # (range, its end, clipped)
    cursor = 0.0

    def emit(lo: float, hi: float, owner: int) -> None:
        if hi > lo:
            starts.append(lo)
            ends.append(hi)
            owners.append(owner)

    for i in order:
        r = ranges[i]
        while stack and stack[-1][1] <= r.start:
            top, end = stack.pop()
            emit(cursor, end, top)
            cursor = end
        if stack:
            emit(cursor, r.start, stack[-1][0])
        cursor = r.start
        end = min(r.end, stack[-1][1]) if stack else r.end
        parent[i] = stack[-1][0] if stack else -1
        stack.append((i, end))
    while stack:
        top, end = stack.pop()
        emit(cursor, end, top)
        cursor = max(cursor, end)
    return _Segments(starts, ends, owners), [parent[i] for i in order]


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
    kinds = op_kinds(ix)
    live = [
        (o.name[cut:], _thread(o), o.start_us, o.end_us)
        for o in compress(trace.ops, map(eq, kinds, repeat("annotation")))
        if o.name.startswith(prefix) and len(o.name) > cut
    ]
    if live:
        return "hooks", live
    events = [
        o
        for o in compress(trace.ops, map(eq, kinds, repeat("python")))
        if o.name.startswith(MODULE_EVENT_PREFIX) and o.dur_us >= 0
    ]
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


def _top_backward_ops(trace: Trace | TraceIndex) -> list[int]:
    """Positions in trace.ops of the backward ops not nested in another on their thread."""
    ix = index_of(trace)
    trace = ix.trace
    if not any(n.startswith(BACKWARD_PREFIX) for n in op_names(ix)):
        return []
    out = []
    open_until: dict[Thread, float] = {}
    # The torch ops (kind "op") so named, by their names' codes, in trace order.
    cols = op_columns(ix)
    distinct, codes = op_name_codes(ix)
    named = np.array([n.startswith(BACKWARD_PREFIX) for n in distinct], dtype=bool)
    rows = np.flatnonzero(named[codes]) if len(codes) else np.zeros(0, dtype=np.intp)
    for i in cols.positions[rows].tolist():
        o = trace.ops[i]
        t = _thread(o)
        if o.start_us < open_until.get(t, -np.inf):
            continue
        open_until[t] = o.end_us
        out.append(i)
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
    spans = _BackwardSpans(trace.ops, backward)
    phases = [
        RECOMPUTE if spans.contains(thread, start) else FORWARD for _, thread, start, _ in found
    ]
    if source == "python_events":
        found = _recompute_paths(found, phases)
    paths: dict[str, int] = {}  # each path's node
    ranges = [
        _Range(thread, start, end, paths.setdefault(path, len(paths)), phase)
        for (path, thread, start, end), phase in zip(found, phases, strict=True)
    ]
    untied, with_seq = _tie_backward(trace.ops, op_columns(ix).ops, backward, spans, ranges)
    if backward and not with_seq:
        notes.append(
            "the backward ops carry no autograd sequence numbers (an older trace?): "
            "backward time is not charged to modules"
        )

    # Every range's pieces of host time, per thread; backward ops tied to no module hold
    # what no range inside them (a recompute) holds.
    by_thread = _segments_by_thread(ranges)
    backward_outside = 0.0
    for o in untied:
        segs = by_thread.get(_thread(o))
        backward_outside += o.dur_us - (segs.covered(o.start_us, o.end_us) if segs else 0.0)
    n = len(paths)
    range_node = np.array([r.node for r in ranges], dtype=np.intp)
    range_phase = np.array([r.phase for r in ranges], dtype=np.intp)
    memo(ix, "module_segments", lambda: (by_thread, range_node, range_phase, list(paths)))
    host = np.zeros((3, n))
    for segs in by_thread.values():
        np.add.at(host, (range_phase[segs.owner], range_node[segs.owner]), segs.end - segs.start)
    calls, recompute_calls = _calls_by_node(ranges, n)
    device, kernel_count = _device_by_node(ix, by_thread, range_node, range_phase, n)
    # Idle gaps, charged to the range open then (pieces of all threads, earliest first).
    idle = np.zeros(n)
    if timeline is not None and timeline.gaps:
        idle = _idle_by_node(timeline, by_thread, ranges, n)
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

    def __init__(self, ops: Sequence[Op], backward: Sequence[int]) -> None:
        by_thread: dict[Thread, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
        for i in backward:
            o = ops[i]
            s, e = by_thread[_thread(o)]
            s.append(o.start_us)
            e.append(o.end_us)
        self.by_thread = by_thread

    def contains(self, thread: Thread, t: float) -> bool:
        pair = self.by_thread.get(thread)
        if pair is None:
            return False
        k = bisect.bisect_right(pair[0], t) - 1
        return k >= 0 and t < pair[1][k]


def _tie_backward(
    ops: Sequence[Op],
    torch_ops: Sequence[Op],
    backward: Sequence[int],
    spans: _BackwardSpans,
    ranges: list[_Range],
) -> tuple[list[Op], int]:
    """Tie each top-level backward op to the module of the latest forward op with its
    sequence number started before it, appending a BACKWARD range for each tied op to
    `ranges` (whose FORWARD ranges name the forward ops' modules). `torch_ops` are the ops
    of kind "op" in trace order (op_columns), `backward` positions in `ops`. Return the backward ops
    tied to none and how many backward ops carry a sequence number."""
    fwd_ranges = [r for r in ranges if r.phase == FORWARD]
    fwd_segments = _segments_by_thread(fwd_ranges)
    seq_start: dict[int, list[float]] = defaultdict(list)
    seq_node: dict[int, list[int]] = defaultdict(list)
    forward_ops = [
        o
        for o in torch_ops
        if o.sequence_number is not None
        and not o.name.startswith(BACKWARD_PREFIX)
        and not spans.contains(_thread(o), o.start_us)
    ]
    owners = _owners_of(fwd_segments, [(_thread(o), o.start_us) for o in forward_ops])
    for o, fwd_owner in zip(forward_ops, owners, strict=True):
        seq = int(o.sequence_number)  # type: ignore[arg-type]
        seq_start[seq].append(o.start_us)
        seq_node[seq].append(fwd_ranges[fwd_owner].node if fwd_owner >= 0 else -1)
    untied: list[Op] = []
    with_seq = 0
    for i in backward:
        o = ops[i]
        node = -1
        if o.sequence_number is not None:
            with_seq += 1
            starts = seq_start.get(int(o.sequence_number))
            if starts:
                k = bisect.bisect_left(starts, o.start_us) - 1
                if k >= 0:
                    node = seq_node[int(o.sequence_number)][k]
        if node < 0:
            untied.append(o)
            continue
        ranges.append(_Range(_thread(o), o.start_us, o.end_us, node, BACKWARD))
    return untied, with_seq


def _calls_by_node(ranges: Sequence[_Range], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the forward calls and the recompute calls per node."""
    calls = np.zeros(n, dtype=np.int64)
    recompute_calls = np.zeros(n, dtype=np.int64)
    for r in ranges:
        if r.phase == FORWARD:
            calls[r.node] += 1
        elif r.phase == RECOMPUTE:
            recompute_calls[r.node] += 1
    return calls, recompute_calls


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
    ops = cols.ops
    return _at(ix, [(_thread(ops[i]), float(cols.start[i])) for i in positions])


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


def _segments_by_thread(ranges: Sequence[_Range]) -> dict[Thread, _Segments]:
    """Each thread's pieces, indexed into `ranges`."""
    per: dict[Thread, list[int]] = defaultdict(list)
    for k, r in enumerate(ranges):
        per[r.thread].append(k)
    out = {}
    for thread, idx in per.items():
        idx.sort(key=lambda k: (ranges[k].start, -ranges[k].end, k))
        segs, _ = _flatten(ranges, idx)
        out[thread] = segs
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


def _thread_code(trace: Trace | TraceIndex, thread: Thread) -> int:
    ix = index_of(trace)
    return memo(ix, ("module_thread_codes",), lambda: _thread_codes(ix)).get(thread, -2)


def _thread_codes(trace: Trace | TraceIndex) -> dict[Thread, int]:
    ix = index_of(trace)
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
    timeline: Timeline, by_thread: dict[Thread, _Segments], ranges: Sequence[_Range], n: int
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
    node = np.array([ranges[k].node for k in owner.tolist()], dtype=np.intp)
    idle = np.zeros(n)
    if not len(starts):
        return idle
    g_lo = np.fromiter((g.start_us for g in timeline.gaps), dtype=float, count=len(timeline.gaps))
    g_hi = np.fromiter((g.end_us for g in timeline.gaps), dtype=float, count=len(timeline.gaps))
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
    incl_host, incl_dev = host.copy(), device.copy()
    incl_k, incl_idle = kernel_count.astype(float), idle.copy()
    incl_mem = allocated.copy() if allocated is not None else None
    for k in sorted(range(n), key=lambda k: -depth[k]):
        up = parent[k]
        if up >= 0:
            incl_host[:, up] += incl_host[:, k]
            incl_dev[:, up] += incl_dev[:, k]
            incl_k[up] += incl_k[k]
            incl_idle[up] += incl_idle[k]
            if incl_mem is not None:
                incl_mem[up] += incl_mem[k]
    types = trace.modules.types if trace.modules is not None else {}
    rows = []
    for k, name in enumerate(names):
        own = float(device[:, k].sum()) if on_device else float(host[:, k].sum())
        whole = float(incl_dev[:, k].sum()) if on_device else float(incl_host[:, k].sum())
        module_type = types.get(name, "")
        if not module_type and not types:
            last = name.rsplit(".", 1)[-1]
            m = re.match(r"^(.*)_\d+$", last)
            module_type = m.group(1) if m else ""
        rows.append(
            ModuleRow(
                path=name,
                parent=names[parent[k]] if parent[k] >= 0 else None,
                depth=depth[k],
                module_type=module_type,
                calls=int(calls[k]),
                forward_host_us=float(incl_host[FORWARD, k]),
                backward_host_us=float(incl_host[BACKWARD, k]),
                recompute_host_us=float(incl_host[RECOMPUTE, k]),
                forward_device_us=float(incl_dev[FORWARD, k]),
                backward_device_us=float(incl_dev[BACKWARD, k]),
                recompute_device_us=float(incl_dev[RECOMPUTE, k]),
                self_host_us=float(host[:, k].sum()),
                self_device_us=float(device[:, k].sum()),
                kernels=int(incl_k[k]),
                idle_us=float(incl_idle[k]),
                bytes_allocated=int(incl_mem[k]) if incl_mem is not None else None,
                share=min(max(whole / total, 0.0), 1.0) if total > 0 else 0.0,
                self_share=min(max(own / total, 0.0), 1.0) if total > 0 else 0.0,
                on_device=on_device,
                recompute_calls=int(recompute_calls[k]),
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
