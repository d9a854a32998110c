"""What every diagnosis rule shares: the Context computed once per trace, how a rule turns
a share of the profiled time into a Finding, and the helpers several rule families use."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.derived import KernelColumns, TraceIndex
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
from gpuprof_nb.analysis.timeline import median_duration_us
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

    def per_step(self, starts: Iterable[float]) -> float:
        """The things that started at `starts` per step: those inside the annotated steps
        over their number (a per-step figure over the steps its count covers; the window
        may run past the steps), or all of them per cell without steps."""
        values = list(starts)
        steps = self.trace.steps
        if not steps:
            return float(len(values))
        bounds = sorted((st.start_us, st.end_us) for st in steps)
        begins = [a for a, _ in bounds]
        inside = 0
        for t in values:
            k = bisect.bisect_right(begins, t) - 1
            inside += k >= 0 and t < bounds[k][1]
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
