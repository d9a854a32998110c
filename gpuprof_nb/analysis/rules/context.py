"""What every diagnosis rule shares: the Context computed once per trace, how a rule turns
a share of the profiled time into a Finding, and the helpers several rule families use."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.classify import op_class
from gpuprof_nb.analysis.derived import (
    KernelColumns,
    TraceIndex,
    memo,
    op_columns,
    op_name_codes,
    op_names,
)
from gpuprof_nb.analysis.fixes import FIXES
from gpuprof_nb.analysis.intervals import (
    Interval,
    as_pairs,
    clip_intervals,
    clipped_union,
    merge_arrays,
    total_length,
    union_length,
)
from gpuprof_nb.analysis.timeline import median_duration_us, top_level_positions
from gpuprof_nb.model.trace import Kernel, Op, RuntimeCall, Trace
from gpuprof_nb.results.diagnosis import Finding, FindingKind, Severity
from gpuprof_nb.results.invariants import rounded_share
from gpuprof_nb.results.timeline import Timeline


def unrecorded_device_words(calls: Sequence[RuntimeCall]) -> str:
    """Return what the trace holds instead of kernels, and how to record them, for users."""
    by_name: dict[str, int] = {}
    for r in calls:
        by_name[r.name] = by_name.get(r.name, 0) + 1
    names = sorted(by_name, key=lambda n: (-by_name[n], n))[:3]
    listed = ", ".join(f"{by_name[n]} {n}" for n in names)
    return (
        f"the trace holds {len(calls)} calls that queue GPU work ({listed}) but no "
        "kernel events, so the GPU's own time is unknown (a trace taken in CUPTI "
        "range-profiler mode, for one, records cuda_profiler_range counters instead). "
        "Record kernels with a normal run: torch.profiler.profile(activities="
        "[ProfilerActivity.CPU, ProfilerActivity.CUDA]) or %%gpuprofile"
    )


def severity_of(share: float) -> Severity:
    if share >= th.SEVERITY_HIGH_SHARE:
        return "high"
    if share >= th.SEVERITY_MEDIUM_SHARE:
        return "medium"
    if share >= th.MIN_REPORT_SHARE:
        return "low"
    return "info"


def make_finding(
    kind: FindingKind, title: str, share: float, evidence: Mapping[str, float]
) -> Finding:
    share = rounded_share(max(0.0, float(share)))
    evidence = {k: rounded_share(v) if k.endswith("_fraction") else v for k, v in evidence.items()}
    return Finding(kind, severity_of(share), title, evidence, FIXES[kind], share)


def union_in(spans: Sequence[Interval], lo: float, hi: float) -> float:
    return union_length(clip_intervals(spans, lo, hi))


def merged_spans(kc: KernelColumns, mask: np.ndarray) -> list[Interval]:
    """merge_intervals of the masked kernels' (start, end) spans."""
    return as_pairs(*merge_arrays(kc.start[mask], kc.end[mask]))


def union_of(kc: KernelColumns, mask: np.ndarray, lo: float, hi: float) -> float:
    """union_in(merge_intervals(masked kernels' spans), lo, hi): the same pieces, summed in
    the same order."""
    return total_length(*clipped_union(kc.start[mask], kc.end[mask], lo, hi))


@dataclass(frozen=True, slots=True)
class Context:
    """What every rule needs, computed once: the trace's index (what the analyses derive
    from it, shared), its timeline and window, the top-level ops and the device's kernels."""

    index: TraceIndex
    timeline: Timeline
    lo: float
    hi: float
    span_us: float
    n_steps: int
    top_ops: tuple[Op, ...]
    kernels: tuple[Kernel, ...]
    on_device: bool
    # One-time setup inside host ops that kept the device idle (cold start), and the ops.
    setup_idle_us: float = 0.0
    setup_ops: tuple[Op, ...] = ()
    # Of it, what is a one-off left out of every other share (see diagnose): the shares
    # are then of the steady rest of the window.
    one_off_us: float = 0.0
    # `kernels` as columns (set by diagnose; built here when a Context is made without).
    kernel_columns: KernelColumns | None = None

    @property
    def trace(self) -> Trace:
        return self.index.trace

    @property
    def kcols(self) -> KernelColumns:
        return (
            self.kernel_columns if self.kernel_columns is not None else KernelColumns(self.kernels)
        )

    def frac(self, us: float) -> float:
        rest = self.span_us - self.one_off_us
        return us / rest if rest > 0 else 0.0

    def frac_of_window(self, us: float) -> float:
        return us / self.span_us if self.span_us > 0 else 0.0

    def per_step(self, starts: Iterable[float] | np.ndarray) -> float:
        """The things that started at `starts` per step: those inside the annotated steps
        over their number (a per-step figure over the steps its count covers; the window
        may run past the steps), or all of them per cell without steps."""
        values = starts if isinstance(starts, np.ndarray) else np.fromiter(starts, dtype=float)
        steps = self.trace.steps
        if not steps:
            return float(len(values))
        # Each start against the last step (by start, then end) that begins at or before it.
        bounds = sorted((st.start_us, st.end_us) for st in steps)
        begins = np.array([a for a, _ in bounds], dtype=float)
        ends = np.array([b for _, b in bounds], dtype=float)
        k = np.searchsorted(begins, values, side="right") - 1
        inside = int(np.count_nonzero((k >= 0) & (values < ends[np.maximum(k, 0)])))
        return inside / len(steps)

    @property
    def each(self) -> str:
        """How titles say 'per step': without steps the counts are for the whole cell."""
        return "per step" if self.n_steps else "in the cell"


def duration_words(us: float) -> str:
    """Return a duration for a title: '29.9 s', '412 ms' (same digits as render's fmt_us)."""
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"


def tiny_op_names(ops: Sequence[Op]) -> frozenset[str]:
    """Return the op names whose median call is tiny on the CPU. Judging by the name's median,
    not each call, keeps a call that the OS paused mid-way (a loaded machine) a tiny op."""
    by_name: dict[str, list[float]] = {}
    for o in ops:
        by_name.setdefault(o.name, []).append(o.dur_us)
    return frozenset(n for n, d in by_name.items() if median_duration_us(d) < th.TINY_CPU_OP_US)


def top_rows(c: Context) -> np.ndarray | None:
    """Return the rows in the op columns of c.top_ops, in order, when they are the index's
    top-level ops (as diagnose makes them), else None: rules then read the top-level ops'
    names, starts and durations as columns instead of op by op."""
    ix = c.index
    if ix.peek("top_level_ops") is not c.top_ops:
        return None
    return memo(
        ix,
        "top_level_rows",
        lambda: np.searchsorted(
            op_columns(ix).positions, np.array(top_level_positions(ix), dtype=np.intp)
        ),
    )


def names_of_class(index: TraceIndex, cls: str) -> frozenset[str]:
    """Return the distinct op names (of every op kind) op_class puts in class `cls`; every
    name is classified once per trace, for all the classes."""

    def compute() -> dict[str, frozenset[str]]:
        names = list(op_names(index))
        by_class: dict[str, set[str]] = {}
        for name, found in zip(names, map(op_class, names), strict=True):
            by_class.setdefault(found, set()).add(name)
        return {k: frozenset(v) for k, v in by_class.items()}

    by_class: dict[str, frozenset[str]] = memo(index, "op_names_by_class", compute)
    return by_class.get(cls, frozenset())


def name_rows(
    index: TraceIndex, names: frozenset[str] | set[str], rows: np.ndarray | None = None
) -> np.ndarray:
    """Return the rows in the op columns (of `rows` only, when given: in their order) of
    the torch ops named one of `names`."""
    distinct, codes = op_name_codes(index)
    wanted = np.fromiter(map(names.__contains__, distinct), dtype=bool, count=len(distinct))
    if rows is None:
        return np.flatnonzero(wanted[codes])
    picked: np.ndarray = rows[wanted[codes[rows]]]
    return picked


def overlap_us(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """union_length(intersect_intervals(as_pairs(*a), as_pairs(*b))) of two unions as
    merge_arrays gives them (sorted, apart: no span touches the next): the same pieces,
    found as intersect_intervals finds them on arrays, and, as they are apart, summed in
    order as union_length sums them."""
    a_s, a_e = a
    b_s, b_e = b
    if not len(a_s) or not len(b_s):
        return 0
    # Each span of a meets the run of b's that end after it starts and start before it
    # ends; the pieces come out in order.
    first = np.searchsorted(b_e, a_s, side="right")
    last = np.searchsorted(b_s, a_e, side="left")
    counts = np.maximum(last - first, 0)
    ia = np.repeat(np.arange(len(a_s)), counts)
    ib = (
        np.arange(int(counts.sum()))
        - np.repeat(np.cumsum(counts) - counts, counts)
        + np.repeat(first, counts)
    )
    lo = np.maximum(a_s[ia], b_s[ib])
    hi = np.minimum(a_e[ia], b_e[ib])
    keep = hi > lo
    return spans_length(lo[keep], hi[keep])


def spans_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """union_length of spans that are apart (as merge_arrays gives them): their lengths
    summed in order, and the int 0 union_length gives for none."""
    return total_length(starts, ends) if len(starts) else 0
