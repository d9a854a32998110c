"""Host time by Python frame and source line, and the idle time each user line kept the
device waiting (ProfileReport.hotspots).

Two sources, one method:
- the line sampler's stacks (`%%gpuprofile --stack`, capture/sampling.py), with the line of
  every frame: each sample stands for the time since the one before (signal sampling), or
  from halfway since the one before to halfway to the next (thread sampling); the first from
  the start of sampling, the last to its end;
- an offline trace's python_function events (recorded with `with_stack=True`): the
  events of the thread with the most of them, nested by time; each event's own time (its
  duration less its children's) goes to its call path. The profiler names functions, not
  lines, so these hotspots are at function granularity.
Either way, the time becomes a call tree of frames. A stretch of time is charged to the
innermost *user* frame on the stack (a notebook cell's or the user's own file: not torch, an
installed package or the standard library), and so is the idle time in it: the Timeline's
gaps, the device's idle time on GPU, the gaps between host ops on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis.derived import (
    TraceIndex,
    codes_of,
    distinct,
    index_of,
    lex_order,
    op_kinds,
    python_events,
)
from gpuprof_nb.analysis.intervals import nearest_open_at, nearest_open_before
from gpuprof_nb.analysis.sources import (
    KNOWN_PACKAGES,
    frame_kind,
    profiler_frame_parts,
    source_label,
)
from gpuprof_nb.analysis.timeline import gap_columns
from gpuprof_nb.model.frames import Frame, FrameKind
from gpuprof_nb.model.samples import StackSamples
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.hotspots import FlameNode, HotLine, Hotspots

__all__ = ["KNOWN_PACKAGES", "compute_hotspots", "frame_kind"]
from gpuprof_nb.results.timeline import IDLE_CAUSES, Timeline

_TID = attrgetter("tid")

# Lines kept in `Hotspots.lines`; icicle blocks kept, and the smallest share of the host time
# a block must hold to be kept.
MAX_LINES = 50
MAX_NODES = 400
MIN_NODE_SHARE = 0.002


@dataclass
class _Tree:
    """A call tree: node k runs `frames[frame[k]]` under node `parent[k]` (-1: a root);
    parents come before their children. Per node, its own host time and idle time (total,
    and by gap cause)."""

    frames: list[Frame]
    parent: list[int]
    frame: list[int]
    self_us: np.ndarray
    idle_us: np.ndarray
    idle_by_cause: dict[str, np.ndarray]


class _Gaps:
    """The Timeline's idle gaps (sorted, disjoint) as a measure: how much idle time, of one
    cause or all, lies before a point, so the idle time inside [a, b) is idle(b) - idle(a).
    The gap each point falls after is searched once per array of points, whatever the cause
    asked (within() is asked for each cause on the same points; within_each asks them all)."""

    def __init__(self, index: TraceIndex, timeline: Timeline) -> None:
        starts, ends, code, self.code_of = gap_columns(index, timeline)
        # By start; a stable sort keeps gaps that start together in the timeline's order.
        order = np.argsort(starts, kind="stable")
        self.lo = starts[order]
        self.hi = ends[order]
        self.length = self.hi - self.lo
        # Causes as numbers (comparing numbers, not strings, per point).
        self.cause_code = code[order]
        # One cause's time before each gap is the running sum of that cause's lengths with
        # the other gaps' as 0.0 (adding 0.0 changes no sum), which holds when gaps do not
        # overlap; overlapping ones (none in a Timeline) are measured cause by cause.
        self.disjoint = bool(np.all(self.lo[1:] >= self.hi[:-1]))
        self._cum: dict[str | None, np.ndarray] = {}
        self._after: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _gap_after(self, x: np.ndarray) -> np.ndarray:
        """Each point's last gap starting at or before it (-1: none), once per array."""
        kept = self._after.get(id(x))
        if kept is None or kept[0] is not x:
            kept = self._after[id(x)] = (x, np.searchsorted(self.lo, x, side="right") - 1)
        return kept[1]

    def before(self, x: np.ndarray, cause: str | None = None) -> np.ndarray:
        if cause is not None and not self.disjoint:
            return self._before_filtered(x, cause)
        if not len(self.lo):
            return np.zeros(len(x))
        cum = self._cumulative(cause)
        k, at, inside = self._inside(x)
        if cause is not None:
            mine = self.cause_code[at] == self.code_of.get(cause, -1)
            inside = np.where(mine, inside, 0.0)
        out: np.ndarray = np.where(k >= 0, cum[at] + inside, 0.0)
        return out

    def _cumulative(self, cause: str | None) -> np.ndarray:
        """The idle time of one cause (None: all) before each gap, and in all of them last."""
        cum = self._cum.get(cause)
        if cum is None:
            mine = (
                self.length
                if cause is None
                else np.where(self.cause_code == self.code_of.get(cause, -1), self.length, 0.0)
            )
            cum = self._cum[cause] = np.concatenate(([0.0], np.cumsum(mine)))
        return cum

    def _before_filtered(self, x: np.ndarray, cause: str) -> np.ndarray:
        keep = self.cause_code == self.code_of.get(cause, -1)
        lo, hi = self.lo[keep], self.hi[keep]
        if not len(lo):
            return np.zeros(len(x))
        cum = np.concatenate(([0.0], np.cumsum(hi - lo)))
        k = np.searchsorted(lo, x, side="right") - 1
        inside = np.clip(x - lo[np.maximum(k, 0)], 0.0, (hi - lo)[np.maximum(k, 0)])
        out: np.ndarray = np.where(k >= 0, cum[np.maximum(k, 0)] + inside, 0.0)
        return out

    def within(self, a: np.ndarray, b: np.ndarray, cause: str | None = None) -> np.ndarray:
        out: np.ndarray = self.before(b, cause) - self.before(a, cause)
        return out

    def meets_steps(self, points: np.ndarray) -> np.ndarray:
        """Mask of the spans between consecutive points (sorted) whose within() may be other
        than 0.0, of any cause: where the gaps do not overlap, a span that starts after the
        gap before it has ended and reaches no later gap measures the same before() at both
        ends, so within() is exactly 0.0 there (every span, where gaps overlap)."""
        if not self.disjoint or not len(self.lo):
            return np.ones(max(len(points) - 1, 0), dtype=bool)
        k = self._gap_after(points)
        k_a, k_b = k[:-1], k[1:]
        return (k_a != k_b) | ((k_a >= 0) & (points[:-1] < self.hi[np.maximum(k_a, 0)]))  # type: ignore[no-any-return]

    def within_steps(
        self, points: np.ndarray, spans: np.ndarray, causes: Sequence[str]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Return within(a, b) and within(a, b, c) for each cause c, the same numbers, of the
        spans between consecutive points (sorted) that `spans` (a mask) selects: before() of
        each point is found once, and what the causes share (each point's gap, its cause,
        its part inside it) once for them all; a cause no gap has measures 0.0 everywhere."""
        if not self.disjoint or not len(self.lo):
            a, b = points[:-1][spans], points[1:][spans]
            return self.within(a, b), {c: self.within(a, b, c) for c in causes}
        k, at, inside = self._inside(points)
        live = k >= 0
        of = self.cause_code[at]

        def measure(cause: str | None) -> np.ndarray:
            cum = self._cumulative(cause)
            if cause is not None:
                part = np.where(of == self.code_of[cause], inside, 0.0)
            else:
                part = inside
            before = np.where(live, cum[at] + part, 0.0)
            return before[1:][spans] - before[:-1][spans]  # type: ignore[no-any-return]

        empty = np.zeros(int(np.count_nonzero(spans)))
        return measure(None), {c: measure(c) if c in self.code_of else empty for c in causes}

    def _inside(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each point's gap (-1: none), that gap's index clamped to 0, and how far into the
        gap the point lies (what before() adds to the time before that gap)."""
        k = self._gap_after(x)
        at = np.maximum(k, 0)
        return k, at, np.clip(x - self.lo[at], 0.0, self.length[at])


def compute_hotspots(trace: Trace | TraceIndex, timeline: Timeline) -> Hotspots | None:
    """Return the trace's hotspots: at line granularity from the line sampler's stacks, else
    at function granularity from its python_function events; None when it has neither."""
    ix = index_of(trace)
    trace = ix.trace
    gaps = _Gaps(ix, timeline)
    samples = trace.samples
    notes: list[str] = []
    lost_us = 0.0
    if samples is not None and len(samples):
        tree, span, lost_us = _from_samples(samples, gaps)
        granularity, count = "line", len(samples)
        source = f"line sampler, one sample every {samples.period_us / 1000:.3g} ms"
        if samples.mode == "exact":
            hook = {"monitoring": "sys.monitoring", "settrace": "sys.settrace"}
            source = (
                "exact line events of your code"
                + (f" ({hook[samples.engine]})" if samples.engine in hook else "")
                + ", on the trace's clock"
            )
            if lost_us >= 1000:
                whole = max(samples.end_us - samples.start_us, 1e-9)
                notes.append(
                    f"{lost_us / 1e3:.3g} ms ({min(lost_us / whole, 1):.0%} of the run) the "
                    "cell's thread waited for a core while other processes ran: charged to "
                    "no line (close other work for steadier numbers)"
                )
            if samples.shared_us > 0:
                whole = max(samples.end_us - samples.start_us, 1e-9)
                notes.append(
                    f"{samples.shared_us / 1e3:.3g} ms ({min(samples.shared_us / whole, 1):.0%} "
                    "of the run) went to loops of a line every few microseconds, traced in "
                    "bursts: that time is shared among their lines as the burst before it "
                    "measured"
                )
        if samples.mode == "thread":
            notes.append(
                "sampled from a thread (no SIGALRM timer here): it waits for the GIL, "
                "and a loop of tiny torch ops can keep it waiting, so the Python "
                "between those ops may be charged to the ops' lines"
                + (f"; {samples.late} of {len(samples)} samples came late" if samples.late else "")
            )
    else:
        built = _from_python_events(ix, gaps)
        if built is None:
            return None
        tree, span, count = built
        granularity = "function"
        source = "the profiler's python_function events (with_stack=True)"
        notes.append(
            "function granularity: the profiler's Python events name functions, not "
            "lines; `%%gpuprofile --stack` samples the lines"
        )
    idle_total = float(gaps.within(np.array([span[0]]), np.array([span[1]]))[0])
    if lost_us:
        # The idle time no line can hold: the cell's share of the lost stretches' idle.
        idle_total = max(idle_total - _idle_lost(samples, gaps), 0.0)
    kinds = [_kind(f) for f in tree.frames]
    lines, charged = _lines(tree, kinds, trace, idle_total, granularity)
    return Hotspots(
        lost_us=lost_us,
        granularity=granularity,  # type: ignore[arg-type]
        source=source,
        host_us=float(tree.self_us.sum()),
        idle_us=idle_total,
        idle_charged_us=charged,
        samples=count,
        lines=lines,
        nodes=_icicle(tree, kinds, trace, granularity),
        on_device=timeline.on_device,
        notes=tuple(notes),
    )


def _idle_lost(samples: StackSamples | None, gaps: _Gaps) -> float:
    """The idle time taken out of the stretches for the time their thread waited for a
    core (in proportion, as _from_samples takes it out)."""
    if samples is None or len(samples.lost_us) != len(samples):
        return 0.0
    t = np.asarray(samples.ts_us, dtype=float)
    hi = np.append(t[1:], max(samples.end_us, t[-1]))
    lost = np.asarray(samples.lost_us, dtype=float)
    width = hi - t
    part = np.divide(np.minimum(lost, width), width, out=np.zeros_like(width), where=width > 0)
    return float((gaps.within(t, hi) * part).sum())


def _kind(frame: Frame) -> FrameKind:
    """Return whose code a frame runs; frames without a file are calls into built-ins, or
    torch's own nn.Module events."""
    if frame.file:
        return frame_kind(frame.file)
    return "torch" if frame.function.startswith("nn.Module:") else "library"


def _from_samples(samples: StackSamples, gaps: _Gaps) -> tuple[_Tree, tuple[float, float], float]:
    """Return the call tree of the sampled stacks, each sample weighted by the time it
    stands for, the span sampled, and the time left out of the cell's stretches as the
    thread's wait for a core."""
    frames = list(samples.frames)
    parent: list[int] = []
    frame: list[int] = []
    index: dict[tuple[int, int], int] = {}
    stack_node = []
    for stack in samples.stacks:
        node = -1
        for f in stack:
            key = (node, f)
            got = index.get(key)
            if got is None:
                got = index[key] = len(parent)
                parent.append(node)
                frame.append(f)
            node = got
        stack_node.append(node)
    t = np.asarray(samples.ts_us, dtype=float)
    bounds = np.empty(len(t) + 1)
    if samples.mode == "exact":
        # A line event opens a stretch that lasts until the next one (the last until the
        # end); the time before the first is outside the cell.
        bounds[:-1] = t
        bounds[-1] = max(samples.end_us, t[-1])
    else:
        bounds[0] = min(samples.start_us, t[0])
        bounds[-1] = max(samples.end_us, t[-1])
        # A signal sample stands for the time since the one before (the last one also for
        # the little left after it); a thread sample for the time halfway to its neighbours.
        bounds[1:-1] = t[:-1] if samples.mode == "signal" else (t[:-1] + t[1:]) / 2
    lo, hi = bounds[:-1], bounds[1:]
    nodes = np.asarray(stack_node, dtype=np.intp)[np.asarray(samples.stack_of, dtype=np.intp)]
    keep = nodes >= 0
    # The part of a stretch the thread waited for a core (other processes ran) is no
    # line's: each stretch keeps the rest, host and idle time alike.
    lost = (
        np.asarray(samples.lost_us, dtype=float)
        if len(samples.lost_us) == len(t)
        else np.zeros(len(t))
    )
    lo, hi, nodes, lost = lo[keep], hi[keep], nodes[keep], lost[keep]
    width = hi - lo
    lost = np.minimum(lost, width)
    kept = np.divide(width - lost, width, out=np.ones_like(width), where=width > 0)
    n = len(parent)
    tree = _Tree(
        frames,
        parent,
        frame,
        np.bincount(nodes, width - lost, minlength=n),
        np.bincount(nodes, gaps.within(lo, hi) * kept, minlength=n),
        {c: np.bincount(nodes, gaps.within(lo, hi, c) * kept, minlength=n) for c in IDLE_CAUSES},
    )
    return tree, (float(bounds[0]), float(bounds[-1])), float(lost.sum())


def _python_events(trace: Trace | TraceIndex) -> np.ndarray:
    """Return the python_function events of the thread with the most of them (ties: the
    least thread id as text), those of a duration >= 0, as positions in python_events."""
    ix = index_of(trace)
    if "python" not in op_kinds(ix):
        return np.zeros(0, dtype=np.intp)
    cols = python_events(ix)
    timed = cols.dur >= 0
    # Each event's thread id as text, as a code: distinct ids first, then their texts (ids
    # are ints or strings, and equal ones print alike).
    every = list(map(_TID, cols.ops))
    if every.count(every[0]) == len(every):  # one thread (as usual): no codes to find
        tids, tid_code = every[:1], np.zeros(len(every), dtype=np.intp)
    else:
        tids, tid_code = codes_of(every, len(every))
    texts, text_code = codes_of(map(str, tids), len(tids))
    code = np.asarray(text_code, dtype=np.intp)[tid_code] if len(tids) else tid_code
    count = np.bincount(code[timed], minlength=len(texts))
    if not count.any():
        return np.zeros(0, dtype=np.intp)
    main = min((k for k in range(len(texts)) if count[k]), key=lambda k: (-int(count[k]), texts[k]))
    return np.flatnonzero(timed & (code == main))


def _from_python_events(
    trace: Trace | TraceIndex, gaps: _Gaps
) -> tuple[_Tree, tuple[float, float], int] | None:
    """Return the call tree of the python_function events (each event's own time on its
    call path), the span they cover and their count; None without such events."""
    ix = index_of(trace)
    funcs = _python_events(ix)
    if not len(funcs):
        return None
    cols = python_events(ix)
    starts = cols.start[funcs]
    durs = cols.dur[funcs]
    # Outer events first among equal starts; nesting by time: an event's parent is the
    # nearest earlier one that ends no earlier (Python events nest on one thread).
    order = lex_order((-durs, starts), lead=1)
    starts, durs = starts[order], durs[order]
    ends = starts + durs
    n = len(funcs)
    parent_ev = nearest_open_before(ends, ends, np.zeros(n, dtype=np.intp))
    # Each event's frame: its name's, frames numbered in order of first appearance.
    name_codes, frame_ev = _first_seen(cols.name_code[funcs[order]], len(cols.names))
    frames = [_event_frame(cols.names[c]) for c in name_codes.tolist()]
    # A node per distinct (parent node, frame), numbered in order of first appearance;
    # parents come first (an event's parent is an earlier event). The pair as one number.
    width = len(frames)
    index: dict[int, int] = {}
    parent: list[int] = []
    frame: list[int] = []
    node_ev: list[int] = []
    for f, p in zip(frame_ev.tolist(), parent_ev.tolist(), strict=True):
        up = node_ev[p] if p >= 0 else -1
        key = up * width + f
        got = index.get(key)
        if got is None:
            got = index[key] = len(parent)
            parent.append(up)
            frame.append(f)
        node_ev.append(got)
    nodes = np.asarray(node_ev, dtype=np.intp)
    m = len(parent)
    # Each instant belongs to the innermost event open then (the latest started): events
    # that overlap without nesting (seen on real traces) would otherwise have their shared
    # time counted twice, and a line's idle time could pass all the idle time there is.
    points = distinct(np.concatenate((starts, ends)))
    lo_pts, hi_pts = points[:-1], points[1:]
    before = nearest_open_before(ends, starts, np.zeros(n, dtype=np.intp), strict=True)
    owner = nearest_open_at(
        ends,
        lo_pts,
        np.zeros(len(lo_pts), dtype=np.intp),
        np.searchsorted(starts, lo_pts, side="right"),
        before,
        strict=True,
    )
    held = owner >= 0
    owner_node = nodes[owner[held]]
    a, b = lo_pts[held], hi_pts[held]
    # Idle time is measured only on the pieces that meet a gap: the others' is 0.0, and
    # adding 0.0 changes no node's sum.
    idle = held & gaps.meets_steps(points)
    idle_all, idle_of = gaps.within_steps(points, idle, IDLE_CAUSES)
    idle_node = nodes[owner[idle]]

    def own(node_of: np.ndarray, per_piece: np.ndarray) -> np.ndarray:
        """An amount per piece of time, summed per node of the piece's innermost event."""
        return np.bincount(node_of, per_piece, minlength=m)

    tree = _Tree(
        frames,
        parent,
        frame,
        own(owner_node, b - a),
        own(idle_node, idle_all),
        {c: own(idle_node, v) for c, v in idle_of.items()},
    )
    return tree, (float(starts.min()), float(ends.max())), n


def _first_seen(codes: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the distinct values of `codes` (each in [0, count)) in order of first
    appearance, and each value's index into them (codes_of of the values, by arrays)."""
    first = np.full(count, len(codes), dtype=np.intp)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1, dtype=np.intp)  # the last write wins
    seen = np.flatnonzero(first < len(codes))
    seen = seen[np.argsort(first[seen], kind="stable")]
    renumber = np.empty(count, dtype=np.intp)
    renumber[seen] = np.arange(len(seen), dtype=np.intp)
    return seen, renumber[codes]


def _event_frame(name: str) -> Frame:
    """Return the frame a python_function event names (`path(line): function`); a built-in
    call (`<built-in method ...>`) is a frame without a file."""
    parts = profiler_frame_parts(name)
    return Frame(*parts) if parts else Frame("", 0, name)


# Code objects Python makes for parts of one line: their time is the line's.
_PART_OF_LINE = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>"})


def _innermost_user(tree: _Tree, kinds: Sequence[FrameKind]) -> list[int]:
    """Return, per node, the innermost user frame on its path (-1 when none is). A
    comprehension, generator expression or lambda called from a user frame of its own file
    is part of that frame's line, which gets its time."""
    user: list[int] = []
    frames = tree.frames
    for p, f in zip(tree.parent, tree.frame, strict=True):
        outer = user[p] if p >= 0 else -1
        if kinds[f] != "user":
            user.append(outer)
        elif (
            outer >= 0
            and frames[f].function.rsplit(".", 1)[-1] in _PART_OF_LINE
            and frames[outer].file == frames[f].file
        ):
            user.append(outer)
        else:
            user.append(f)
    return user


def _label(frame: Frame, trace: Trace, granularity: str) -> str:
    if not frame.file:
        return frame.function  # a built-in call or an nn.Module event: no file, no line
    return source_label(
        frame.file, frame.line, frame.function, trace.cells, first_line=granularity == "function"
    )


def _lines(
    tree: _Tree, kinds: Sequence[FrameKind], trace: Trace, idle_total: float, granularity: str
) -> tuple[tuple[HotLine, ...], float]:
    """Return the top user lines, most host time first, and the idle time charged to any."""
    user = np.asarray(_innermost_user(tree, kinds), dtype=np.intp)
    charged = user >= 0
    n = len(tree.frames)
    by = user[charged]
    host = np.bincount(by, tree.self_us[charged], minlength=n)
    idle = np.bincount(by, tree.idle_us[charged], minlength=n)
    causes = {c: np.bincount(by, v[charged], minlength=n) for c, v in tree.idle_by_cause.items()}
    total_host = float(tree.self_us.sum())
    # Labels decide ties, so the order never depends on the order frames were met.
    labels = {
        f: _label(tree.frames[f], trace, granularity) for f in set(by.tolist()) if host[f] > 0
    }
    ranked = sorted(labels, key=lambda f: (-host[f], -idle[f], labels[f]))[:MAX_LINES]
    lines = []
    for f in ranked:
        fr = tree.frames[f]
        lines.append(
            HotLine(
                label=labels[f],
                host_us=float(host[f]),
                idle_us=float(idle[f]),
                share=float(host[f]) / total_host if total_host > 0 else 0.0,
                idle_share=float(idle[f]) / idle_total if idle_total > 0 else 0.0,
                text=fr.text,
                file=fr.file,
                line=fr.line,
                function=fr.function,
                idle_by_cause_us={c: float(v[f]) for c, v in causes.items() if v[f] > 0},
            )
        )
    return tuple(lines), float(idle.sum())


def _icicle(
    tree: _Tree, kinds: Sequence[FrameKind], trace: Trace, granularity: str
) -> tuple[FlameNode, ...]:
    """Return the icicle's blocks: user frames as they are, each run of library frames below
    a user frame (or at the root) collapsed into one block named by its outermost frame.
    Blocks under MIN_NODE_SHARE of the host time are left out (at most MAX_NODES kept)."""
    block_of: list[int] = []
    run: list[int] = []  # library frames in a row ending at each node
    key_of: dict[tuple[int, int], int] = {}
    b_parent: list[int] = []
    b_frame: list[int] = []
    b_depth: list[int] = []
    b_frames: list[int] = []
    # Per block: own time by the innermost library frame it was in (for `detail`).
    inner: list[dict[int, float]] = []
    for node, (p, f) in enumerate(zip(tree.parent, tree.frame, strict=True)):
        up = block_of[p] if p >= 0 else -1
        run.append(0 if kinds[f] == "user" else (run[p] if p >= 0 else 0) + 1)
        if run[-1] > 1:
            block = up  # still inside the same run of library frames
            b_frames[block] = max(b_frames[block], run[-1])
        else:
            key = (up, f)
            block = key_of.get(key, -1)
            if block < 0:
                block = key_of[key] = len(b_parent)
                b_parent.append(up)
                b_frame.append(f)
                b_depth.append(b_depth[up] + 1 if up >= 0 else 0)
                b_frames.append(1)
                inner.append({})
        block_of.append(block)
        if kinds[f] != "user":
            inner[block][f] = inner[block].get(f, 0.0) + float(tree.self_us[node])
    nb = len(b_parent)
    own = (
        np.bincount(np.asarray(block_of, dtype=np.intp), tree.self_us, minlength=nb)
        if nb
        else np.zeros(0)
    )
    total = own.copy()
    for b in range(nb - 1, -1, -1):  # children come after their parents
        if b_parent[b] >= 0:
            total[b_parent[b]] += total[b]
    whole = float(own.sum())
    keep = [b for b in range(nb) if whole > 0 and total[b] >= MIN_NODE_SHARE * whole]
    keep = sorted(keep, key=lambda b: (-total[b], b))[:MAX_NODES]
    kept = sorted(keep)  # parents before children again
    new_index = {b: i for i, b in enumerate(kept)}
    out = []
    for b in kept:
        fr = tree.frames[b_frame[b]]
        detail = ""
        if inner[b]:
            top = min(inner[b], key=lambda f: (-inner[b][f], f))
            if top != b_frame[b]:
                detail = _label(tree.frames[top], trace, granularity)
        out.append(
            FlameNode(
                label=_label(fr, trace, granularity),
                kind=kinds[b_frame[b]],
                parent=new_index.get(b_parent[b], -1),
                depth=b_depth[b],
                total_us=float(total[b]),
                self_us=float(own[b]),
                frames=b_frames[b],
                detail=detail,
            )
        )
    return tuple(out)
