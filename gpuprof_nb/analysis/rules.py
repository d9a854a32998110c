"""The diagnosis rules: each measures one kind of bottleneck from the trace (and the run
timings when given) and returns a Finding with its evidence and the share of the profiled
time fixing it could recover, or None when the trace holds nothing to judge. The rules
share a Context computed once per trace; analysis/diagnose.py runs them and orders what
they find."""

from __future__ import annotations

import bisect
import dataclasses
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.classify import is_host_collective, op_class
from gpuprof_nb.analysis.derived import (
    KERNEL_KINDS,
    KernelColumns,
    TraceIndex,
    index_of,
    memo,
    op_columns,
    op_name_codes,
    op_names,
    runtime_correlations,
    runtime_names,
    runtime_starts,
    runtime_threads,
)
from gpuprof_nb.analysis.fixes import FIXES, FP16_FIX
from gpuprof_nb.analysis.intervals import (
    Interval,
    as_pairs,
    clip_intervals,
    clipped_union,
    intersect_intervals,
    merge_arrays,
    merge_intervals,
    total_length,
    union_length,
)
from gpuprof_nb.analysis.ops import summarize_trace
from gpuprof_nb.analysis.timeline import (
    SYNC_RUNTIME_NAMES,
    dataloader_ops,
    median_duration_us,
    top_level_spans,
)
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Kernel, MemoryEvent, Op, RuntimeCall, Trace
from gpuprof_nb.results.diagnosis import Finding, FindingKind, Severity
from gpuprof_nb.results.invariants import rounded_share
from gpuprof_nb.results.roofline import Roofline
from gpuprof_nb.results.timeline import Timeline

# TF32 kernels already use tensor cores: they are not "fp32 matmuls" for the precision rule.
FP32_KERNEL_MARKS = ("sgemm", "f32f32_f32f32", "_fp32_")


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


def _union_in(spans: Sequence[Interval], lo: float, hi: float) -> float:
    return union_length(clip_intervals(spans, lo, hi))


def _merged(kc: KernelColumns, mask: np.ndarray) -> list[Interval]:
    """merge_intervals of the masked kernels' (start, end) spans."""
    return as_pairs(*merge_arrays(kc.start[mask], kc.end[mask]))


def _union_of(kc: KernelColumns, mask: np.ndarray, lo: float, hi: float) -> float:
    """_union_in(merge_intervals(masked kernels' spans), lo, hi): the same pieces, summed in
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


def rule_dataloader(c: Context) -> Finding | None:
    loads = dataloader_ops(c.index)
    spans = merge_intervals((o.start_us, o.end_us) for o in loads)
    if not spans:
        return None
    dl_us = _union_in(spans, c.lo, c.hi)
    count = len(loads)
    steps = merge_intervals((s.start_us, s.end_us) for s in c.trace.steps)
    step_us = union_length(steps) if steps else c.span_us
    step_dl = _union_in(spans, *_bounds(steps)) if steps else dl_us
    evidence: dict[str, float] = {
        "dataloader_time_us": dl_us,
        "dataloader_share_of_step_time_fraction": step_dl / step_us if step_us > 0 else 0.0,
        "dataloader_calls_count": float(count),
    }
    bd = c.timeline.breakdown
    if c.on_device and bd is not None:
        evidence["device_idle_in_dataloader_us"] = bd.dataloader_us
        evidence["device_idle_in_dataloader_fraction"] = c.frac(bd.dataloader_us)
        share = c.frac(bd.dataloader_us)
    else:
        share = c.frac(dl_us)
    title = (
        f"The {'GPU' if c.on_device else 'step'} waits for the DataLoader: "
        f"{share * 100:.0f}% of the time goes to loading batches"
    )
    return make_finding("dataloader", title, share, evidence)


def _bounds(spans: Sequence[Interval]) -> tuple[float, float]:
    return (spans[0][0], spans[-1][1]) if spans else (0.0, 0.0)


def rule_host_sync(c: Context) -> Finding | None:
    sync_names = SYNC_RUNTIME_NAMES & runtime_names(c.index)
    calls = [r for r in c.trace.runtime if r.name in sync_names] if sync_names else []
    events = [s for s in c.trace.syncs if s.name in ("Stream Sync", "Context Sync", "Event Sync")]
    item_names = {"aten::item", "aten::_local_scalar_dense"} & op_names(c.index)
    items = (
        [o for o in c.trace.ops if o.kind == "op" and o.name in item_names] if item_names else []
    )
    # aten::item calls aten::_local_scalar_dense: count the outer one only.
    n_item = sum(1 for o in items if o.name == "aten::item") or len(items)
    if not calls and not events and not n_item:
        return None
    if not c.on_device:
        return None
    blocked = merge_intervals(
        [(r.start_us, r.end_us) for r in calls] + [(s.start_us, s.end_us) for s in events]
    )
    bd = c.timeline.breakdown
    idle = bd.sync_us if bd is not None else 0.0
    outer_items = [o for o in items if o.name == "aten::item"] or items
    evidence = {
        "sync_calls_per_step": c.per_step(r.start_us for r in (calls or events)),
        "item_calls_per_step": c.per_step(o.start_us for o in outer_items),
        "host_blocked_us": _union_in(blocked, c.lo, c.hi),
        "device_idle_after_sync_us": idle,
        "device_idle_after_sync_fraction": c.frac(idle),
    }
    share = c.frac(idle)
    title = (
        f"The host waits for the GPU at synchronisation points "
        f"({evidence['sync_calls_per_step']:.3g} {c.each}); the GPU then idles "
        f"{share * 100:.0f}% of the time"
    )
    return make_finding("host_sync", title, share, evidence)


def rule_launch_and_python(c: Context) -> list[Finding]:
    bd = c.timeline.breakdown
    out: list[Finding] = []
    if bd is None:
        return out
    if c.on_device:
        kc = c.kcols
        compute = kc.dur[kc.is_kernel].tolist()
        med = median_duration_us(compute)
        # The Summary's count: kernels launched inside the steps, per step (all of them
        # per cell without steps).
        summary = summarize_trace(c.index)
        per_step_kernels = (
            summary.kernels_per_step
            if c.n_steps and summary.kernels_per_step is not None
            else float(len(compute))
        )
        tiny = (
            bool(compute)
            and med < th.TINY_KERNEL_US
            and per_step_kernels >= th.MIN_KERNELS_FOR_OVERHEAD
        )
        # Device idle while the host is inside torch ops: dispatch and CPU-side op work set
        # the pace (overhead-bound), except one-time setup ops, which are cold start.
        # Nor is compiling (torch.compile's own finding, recompilation).
        host_ops = max(bd.host_in_ops_us - _idle_in_setup_or_compiling_us(c), 0.0)
        share = c.frac(bd.launch_us + host_ops)
        evidence = {
            "kernels_per_step": per_step_kernels,
            "median_kernel_us": med,
            "short_gaps_between_kernels_us": bd.launch_us,
            "device_idle_while_host_in_ops_us": host_ops,
        }
        if compute:
            title = (
                f"Many small kernels: {per_step_kernels:.0f} {c.each}, median {med:.3g} us;"
                " launching them sets the pace"
                if tiny
                else f"The host sets the pace: the GPU idles {share * 100:.0f}% of the time "
                "while the host dispatches torch ops"
            )
            out.append(make_finding("launch_overhead", title, share, evidence))
        python_us = max(bd.host_us - bd.host_in_ops_us, 0.0)
        covered = total_length(*clipped_union(*top_level_spans(c.index), c.lo, c.hi))
        # Shares of the whole window, the headline's among them, so the evidence reads
        # against the title: the host outside torch ops includes time the GPU was busy.
        out.append(
            make_finding(
                "python_overhead",
                f"The GPU waits for Python: {c.frac(python_us) * 100:.0f}% of the time nothing "
                "was launched and no torch op ran",
                c.frac(python_us),
                {
                    "device_idle_host_outside_ops_us": python_us,
                    "device_idle_host_outside_ops_fraction": c.frac(python_us),
                    "device_idle_waiting_on_host_us": bd.host_us,
                    "host_outside_torch_ops_fraction": max(1.0 - c.frac_of_window(covered), 0.0),
                },
            )
        )
        return out
    if not c.top_ops:
        return out
    durations = [o.dur_us for o in c.top_ops]
    med = median_duration_us(durations)
    tiny_names = _tiny_op_names(c.top_ops)
    tiny_us = sum(o.dur_us for o in c.top_ops if o.name in tiny_names)
    top_per_step = c.per_step(o.start_us for o in c.top_ops)
    many = top_per_step >= th.MIN_OPS_FOR_OVERHEAD
    tiny = many and med < th.TINY_CPU_OP_US
    share = c.frac(bd.launch_us + tiny_us) if tiny else c.frac(bd.launch_us)
    # The count in the title is the Summary's (every op, nested ones too); the rule judges
    # the top-level ones, the calls Python made, and says how many of them there are.
    summary = summarize_trace(c.index)
    shown = (
        summary.ops_per_step
        if c.n_steps and summary.ops_per_step is not None
        else float(summary.op_count)
    )
    out.append(
        make_finding(
            "launch_overhead",
            f"Thousands of tiny ops: {shown:.0f} {c.each} ({top_per_step:.0f} "
            f"of them called from Python), median {med:.3g} us each; dispatch, not math, sets "
            "the pace"
            if tiny
            else f"Short dispatch gaps between ops take {share * 100:.0f}% of the time",
            share,
            {
                "ops_per_step": shown,
                "top_level_ops_per_step": top_per_step,
                "median_op_us": med,
                "time_in_tiny_ops_us": tiny_us,
                "dispatch_gaps_between_ops_us": bd.launch_us,
            },
        )
    )
    # Time inside CPU collectives (gloo) is waiting on other ranks, not Python.
    host_gaps = merge_intervals(
        (g.start_us, g.end_us) for g in c.timeline.gaps if g.cause == "host"
    )
    in_comm = union_length(intersect_intervals(host_gaps, _host_collective_spans(c)))
    python_us = max(bd.host_us - in_comm, 0.0)
    # The time between ops splits into Python (long gaps), short dispatch gaps and the
    # rest (syncs, data loading, collectives): the title and the evidence give the parts of
    # one whole, on one denominator, so no figure reads against another.
    python_share = c.frac(python_us)
    between = min(max(c.frac(bd.span_us - bd.busy_us), python_share), 1.0)
    dispatch = min(c.frac(bd.launch_us), between)
    rest = f"{between * 100:.0f}% of the time is between ops"
    if dispatch >= 0.005:
        rest += f", {dispatch * 100:.0f}% of the time in short dispatch gaps"
    out.append(
        make_finding(
            "python_overhead",
            f"{python_share * 100:.0f}% of the time is Python outside torch ops ({rest})",
            python_share,
            {
                "python_outside_ops_us": python_us,
                "python_outside_ops_fraction": python_share,
                "between_ops_fraction": between,
                "dispatch_gaps_between_ops_fraction": dispatch,
            },
        )
    )
    return out


def _idle_in_setup_or_compiling_us(c: Context) -> float:
    """Device idle time, waiting on the host, inside setup ops or while torch.compile
    compiled, each moment counted once (a first compile is often a setup op too)."""
    compiling = compile_spans(c.index)
    if not compiling:
        return c.setup_idle_us
    spans = merge_intervals([(o.start_us, o.end_us) for o in c.setup_ops] + compiling)
    host_gaps = merge_intervals(
        (g.start_us, g.end_us) for g in c.timeline.gaps if g.cause == "host"
    )
    return _union_in(intersect_intervals(host_gaps, spans), c.lo, c.hi)


def _host_collective_spans(c: Context) -> Sequence[Interval]:
    """Return the merged host ranges of collectives (`gloo:all_reduce`, `c10d::allreduce_`)."""
    names = {name for name in op_names(c.index) if is_host_collective(name)}
    if not names:
        return ()
    return memo(
        c.index,
        ("host_collective_spans", c.lo, c.hi),
        lambda: tuple(
            merge_intervals(
                clip_intervals(
                    ((o.start_us, o.end_us) for o in c.trace.ops if o.name in names), c.lo, c.hi
                )
            )
        ),
    )


def _tiny_op_names(ops: Sequence[Op]) -> frozenset[str]:
    """Return the op names whose median call is tiny on the CPU. Judging by the name's median,
    not each call, keeps a call that the OS paused mid-way (a loaded machine) a tiny op."""
    by_name: dict[str, list[float]] = {}
    for o in ops:
        by_name.setdefault(o.name, []).append(o.dur_us)
    return frozenset(n for n, d in by_name.items() if median_duration_us(d) < th.TINY_CPU_OP_US)


def _gemm_precision_fp32(op: Op) -> bool:
    types = [t for t in (op.input_types or ()) if t]
    return (
        bool(types)
        and "float" in types
        and not any(t in ("c10::BFloat16", "c10::Half", "BFloat16", "Half") for t in types)
    )


def rule_compute_memory_precision(c: Context, roofline: Roofline | None) -> list[Finding]:
    out: list[Finding] = []
    if c.on_device:
        kc = c.kcols
        busy = _union_of(kc, kc.is_kernel, c.lo, c.hi)
        is_gemm = kc.of_class("gemm")  # kernels only: copies have their own class
        gemm = list(compress(c.kernels, is_gemm.tolist()))
        # A matmul kernel shorter than a launch is latency-bound, not compute-bound: only the
        # others count as large.
        large = is_gemm & (kc.dur >= th.TINY_KERNEL_US)
        # Tiny kernels count too: launch_overhead charges the idle gaps around them, this
        # rule their device time, which fusion would also save.
        gemm_us = _union_of(kc, large, c.lo, c.hi)
        small_us = _union_of(kc, is_gemm & ~large, c.lo, c.hi)
        low_us = _union_of(kc, kc.of_class("elementwise"), c.lo, c.hi)
        base = busy
        named = float(np.count_nonzero(large))
    else:
        tiny_names = _tiny_op_names(c.top_ops)
        gemm_ops = [o for o in c.top_ops if op_class(o.name) == "gemm"]
        # Ops whose calls are tiny are dispatch-bound (launch_overhead's time), not large.
        large_ops = [o for o in gemm_ops if o.name not in tiny_names]
        low_ops = [
            o for o in c.top_ops if op_class(o.name) == "elementwise" and o.name not in tiny_names
        ]
        gemm_us = sum(o.dur_us for o in large_ops)
        small_us = sum(o.dur_us for o in gemm_ops if o.name in tiny_names)
        low_us = sum(o.dur_us for o in low_ops)
        base = c.timeline.busy_us
        gemm = []
        named = float(len(large_ops))
    if base <= 0:
        return out
    gemm_share = gemm_us / base
    # On CPU traces tiny ops are launch_overhead's time; the roofline there would count them
    # again, so only device traces take its shares.
    roof_memory, roof_compute = _roofline_shares(roofline) if c.on_device else (None, None)
    roof_evidence: dict[str, float] = {}
    if roof_memory is not None:
        roof_evidence["roofline_memory_bound_share_fraction"] = roof_memory
    if roof_compute is not None:
        roof_evidence["roofline_compute_bound_share_fraction"] = roof_compute
    # The roofline's shares are of the time it could attribute to ops; scale them to the busy
    # time by its coverage, so a roofline that explains a tenth of the kernels does not speak
    # for all of them.
    coverage = roofline.coverage if roofline is not None else None
    if (
        coverage is not None
        and roofline is not None
        and roofline.time_basis == "device"
        and (roof_memory is not None or roof_compute is not None)
    ):
        coverage = min(max(coverage, 0.0), 1.0)
        roof_evidence["roofline_coverage_of_busy_fraction"] = coverage
        roof_memory = roof_memory * coverage if roof_memory is not None else None
        roof_compute = roof_compute * coverage if roof_compute is not None else None
    # The roofline (FLOPs and bytes from shapes against the device's roofs) decides when it
    # could classify ops; op and kernel names decide otherwise.
    compute_share = roof_compute if roof_compute is not None else gemm_share
    if compute_share >= th.COMPUTE_BOUND_MIN_SHARE:
        evidence: dict[str, float] = {
            "gemm_share_of_busy_fraction": gemm_share,
            "gemm_time_us": gemm_us,
            "small_gemm_time_us": small_us,
            "busy_us": base,
            **roof_evidence,
        }
        if roof_compute is None:
            # Without shapes there are no FLOPs: the call rests on names, and says so.
            what = "kernel" if c.on_device else "op"
            evidence[f"gemm_{what}s_judged_by_name_not_flops_count"] = named
            how = f"judged by {what} name, not measured FLOPs"
        else:
            how = "by the roofline's FLOPs and bytes"
        out.append(
            Finding(
                "compute_bound",
                "info",
                f"Healthy: {compute_share * 100:.0f}% of the "
                f"{'device' if c.on_device else 'op'} time is large matmuls/convolutions "
                f"(compute-bound; {how})",
                evidence,
                FIXES["compute_bound"],
                0.0,
            )
        )
    if roof_memory is not None:
        low_us = roof_memory * base
    if low_us > 0:
        share = c.frac(low_us) * th.MEMORY_BOUND_RECOVERABLE
        out.append(
            make_finding(
                "memory_bound",
                f"Memory-bound: {low_us / base * 100:.0f}% of the "
                f"{'device' if c.on_device else 'op'} time is "
                + (
                    "in ops under the roofline's ridge point (low arithmetic intensity)"
                    if roof_memory is not None
                    else "elementwise, norm, softmax or reduction ops (low arithmetic intensity)"
                ),
                share,
                {
                    "low_intensity_time_us": low_us,
                    "low_intensity_share_of_busy_fraction": low_us / base,
                    "low_intensity_share_of_window_fraction": c.frac(low_us),
                    **roof_evidence,
                },
            )
        )
    # Only a GPU with tensor cores (known from the trace's device properties) is judged:
    # elsewhere the fp32 matmuls are not looked for at all.
    cc = compute_capability(c.trace, c.timeline.device) if c.on_device and gemm else None
    if cc is not None and cc >= th.PRECISION_MIN_CC:
        fp32_ids = {o.external_id for o in _gemm_ops_with_ids(c.index) if _gemm_precision_fp32(o)}
        # Kernel names repeat: each distinct one is read once.
        fp32_name = {
            name: any(m in name.lower() for m in FP32_KERNEL_MARKS)
            for name in {k.name for k in gemm}
        }
        fp32 = is_gemm.copy()
        fp32[is_gemm] = [(k.external_id in fp32_ids) or fp32_name[k.name] for k in gemm]
        fp32_us = _union_of(c.kcols, fp32, c.lo, c.hi)
        if fp32_us > 0:
            share = c.frac(fp32_us) * th.PRECISION_RECOVERABLE
            low_cc = cc < th.BF16_MIN_CC
            out.append(
                make_finding(
                    "precision",
                    f"fp32 matmuls on a tensor-core GPU (compute capability {cc[0]}.{cc[1]}): "
                    f"{fp32_us / base * 100:.0f}% of device time",
                    share,
                    {
                        "fp32_gemm_time_us": fp32_us,
                        "fp32_gemm_share_of_busy_fraction": fp32_us / base,
                        "compute_capability_version": float(f"{cc[0]}.{cc[1]}"),
                    },
                )
            )
            if low_cc:
                # No bf16 before Ampere: fp16 with loss scaling is the tensor-core path there.
                f = out[-1]
                out[-1] = Finding(f.kind, f.severity, f.title, f.evidence, FP16_FIX, f.share)
    return out


def _gemm_ops_with_ids(trace: Trace | TraceIndex) -> list[Op]:
    """Return the ops of trace.ops named as matmuls or convolutions (op_class 'gemm') that
    have an External id, in trace order: the torch ops found through the shared op columns
    (names as codes), the other ops (annotations, Python functions) by name."""
    ix = index_of(trace)
    trace = ix.trace
    gemm_names = {n for n in op_names(ix) if op_class(n) == "gemm"}
    if not gemm_names:
        return []
    ops, cols = trace.ops, op_columns(ix)
    distinct, codes = op_name_codes(ix)
    is_gemm = np.array([n in gemm_names for n in distinct], dtype=bool)
    torch_ops = cols.positions[is_gemm[codes] & cols.has_external_id]
    others = np.ones(len(ops), dtype=bool)
    others[cols.positions] = False
    other_ops = [
        i
        for i in np.flatnonzero(others).tolist()
        if ops[i].name in gemm_names and ops[i].external_id is not None
    ]
    return [ops[i] for i in sorted(torch_ops.tolist() + other_ops)]


def _roofline_shares(roofline: Roofline | None) -> tuple[float | None, float | None]:
    """Return the roofline's (memory-bound, compute-bound) time shares, None where it could
    not classify (no device ceilings)."""
    if roofline is None:
        return None, None
    return roofline.time_share("memory"), roofline.time_share("compute")


def compute_capability(trace: Trace, device: int | None) -> tuple[int, int] | None:
    for d in trace.devices:
        if d.index == device and d.compute_capability:
            return d.compute_capability
    caps = [d.compute_capability for d in trace.devices if d.compute_capability]
    return caps[0] if caps else None


def rule_dtype_cast(c: Context) -> Finding | None:
    # Few distinct names: each is classified once.
    cast_names = {n for n in op_names(c.index) if op_class(n) == "cast"}
    casts = [o for o in c.top_ops if o.name in cast_names] if cast_names else []
    if not casts:
        return None
    # A cast that launched a memcpy is a device transfer (host_device_copy's business).
    memcpy_calls: dict[str, list[float]] = {}
    for r in c.trace.runtime:
        if "Memcpy" in r.name:
            memcpy_calls.setdefault(str(r.tid), []).append(r.start_us)
    for v in memcpy_calls.values():
        v.sort()

    def transfers(o: Op) -> bool:
        starts = memcpy_calls.get(str(o.tid), [])
        i = bisect.bisect_left(starts, o.start_us)
        return i < len(starts) and starts[i] <= o.end_us

    casts = [o for o in casts if not transfers(o)]
    if not casts:
        return None
    if c.on_device:
        cast_us = _device_time_launched_in(c, casts)
    else:
        cast_us = sum(o.dur_us for o in casts)
    per_step = c.per_step(o.start_us for o in casts)
    share = c.frac(cast_us) if per_step >= th.DTYPE_CAST_MIN_PER_STEP else 0.0
    return make_finding(
        "dtype_cast",
        f"Repeated dtype conversions: {per_step:.0f} casts {c.each} take "
        f"{c.frac(cast_us) * 100:.0f}% of the time",
        share,
        {
            "casts_per_step": per_step,
            "cast_time_us": cast_us,
            "cast_share_fraction": c.frac(cast_us),
        },
    )


def _device_time_launched_in(c: Context, ops: Sequence[Op]) -> float:
    """Return device microseconds of kernels launched from inside the given host ops."""
    by_thread: dict[str, list[tuple[float, float]]] = {}
    for o in ops:
        by_thread.setdefault(str(o.tid), []).append((o.start_us, o.end_us))
    r_corr, r_has = runtime_correlations(c.index)
    r_start = runtime_starts(c.index)
    # The calls' threads by their tid as text: each distinct (pid, tid) pair converted once.
    codes, pairs = runtime_threads(c.index)
    codes_of: dict[str, list[int]] = {}
    for code, (_, tid) in enumerate(pairs):
        codes_of.setdefault(str(tid), []).append(code)
    launched: set[int] = set()
    for tid, spans in by_thread.items():
        # The thread's calls with a correlation id, against the last of its ops (by start,
        # then end) that starts at or before the call.
        mine = np.flatnonzero(r_has & np.isin(codes, codes_of.get(tid, [])))
        spans.sort()
        starts = np.array([s for s, _ in spans], dtype=float)
        ends = np.array([e for _, e in spans], dtype=float)
        t = r_start[mine]
        i = np.searchsorted(starts, t, side="right") - 1
        inside = (i >= 0) & (ends[np.maximum(i, 0)] >= t)
        launched.update(r_corr[mine[inside]].tolist())
    return sum(k.dur_us for k in c.kernels if k.correlation in launched)


def rule_host_device_copy(c: Context) -> Finding | None:
    kc = c.kcols
    is_copy = kc.kind == KERNEL_KINDS.index("memcpy")
    if not is_copy.any():
        return None
    copies = list(compress(c.kernels, is_copy.tolist()))
    compute = _merged(kc, kc.is_kernel)
    copy_spans = as_pairs(*clipped_union(kc.start[is_copy], kc.end[is_copy], c.lo, c.hi))
    copy_us = union_length(copy_spans)
    overlapped = union_length(intersect_intervals(copy_spans, compute))
    exposed = copy_us - overlapped
    pageable = [k for k in copies if "pageable" in k.name.lower()]
    sized = [k for k in copies if k.bytes and k.dur_us > 0]
    evidence = {
        "memcpy_time_us": copy_us,
        "memcpy_share_fraction": c.frac(copy_us),
        "memcpy_not_overlapped_fraction": c.frac(exposed),
        "pageable_copies_count": float(len(pageable)),
    }
    if sized:
        evidence["memcpy_bandwidth_bytes_per_s"] = sum(k.bytes or 0 for k in sized) / (
            sum(k.dur_us for k in sized) * 1e-6
        )
    return make_finding(
        "host_device_copy",
        f"Host-device copies take {c.frac(copy_us) * 100:.0f}% of the time, "
        f"{c.frac(exposed) * 100:.0f}% not hidden behind compute"
        + (f" ({len(pageable)} from pageable memory)" if pageable else ""),
        c.frac(exposed),
        evidence,
    )


def rule_communication(c: Context) -> Finding | None:
    if not c.on_device:
        return _rule_host_communication(c)
    kc = c.kcols
    is_comm = kc.of_class("comm")  # kernels only
    if not is_comm.any():
        return None
    comm = list(compress(c.kernels, is_comm.tolist()))
    comm_spans = as_pairs(*clipped_union(kc.start[is_comm], kc.end[is_comm], c.lo, c.hi))
    other = _merged(kc, kc.is_kernel & ~is_comm)
    comm_us = union_length(comm_spans)
    overlap_us = union_length(intersect_intervals(comm_spans, other))
    exposed = comm_us - overlap_us
    overlap = overlap_us / comm_us if comm_us > 0 else 0.0
    return make_finding(
        "communication",
        f"Collectives take {c.frac(comm_us) * 100:.0f}% of the time; "
        f"{overlap * 100:.0f}% of it overlaps compute",
        c.frac(exposed),
        {
            "communication_time_us": comm_us,
            "communication_share_fraction": c.frac(comm_us),
            "overlap_with_compute_fraction": overlap,
            "exposed_communication_us": exposed,
            "collective_kernels_count": float(len(comm)),
        },
    )


def _rule_host_communication(c: Context) -> Finding | None:
    """Collectives on a trace without device activity (gloo on CPU): the host ranges of the
    collectives, and how much of them torch ops on other threads overlap."""
    comm_spans = _host_collective_spans(c)
    if not comm_spans:
        return None
    comm_us = union_length(comm_spans)
    compute = merge_intervals(
        (o.start_us, o.end_us) for o in c.top_ops if not is_host_collective(o.name)
    )
    overlap_us = union_length(intersect_intervals(comm_spans, compute))
    overlap = overlap_us / comm_us if comm_us > 0 else 0.0
    host_names = {n for n in op_names(c.index) if is_host_collective(n)}
    count = sum(1 for o in c.trace.ops if o.name in host_names) if host_names else 0
    return make_finding(
        "communication",
        f"Collectives on the host take {c.frac(comm_us) * 100:.0f}% of the time; "
        f"{overlap * 100:.0f}% of it overlaps torch ops",
        c.frac(comm_us - overlap_us),
        {
            "communication_time_us": comm_us,
            "communication_share_fraction": c.frac(comm_us),
            "overlap_with_compute_fraction": overlap,
            "exposed_communication_us": comm_us - overlap_us,
            "collective_calls_count": float(count),
        },
    )


def _median_without(durations: list[float], value: float) -> float | None:
    """statistics.median of the sorted `durations` with one `value` taken out (None when
    nothing is left), without copying them: the same middle element(s), the same mean."""
    m = len(durations) - 1
    if m <= 0:
        return None
    j = bisect.bisect_left(durations, value)

    def at(k: int) -> float:
        return durations[k] if k < j else durations[k + 1]

    return float(at(m // 2)) if m % 2 else float((at(m // 2 - 1) + at(m // 2)) / 2)


def cold_ops_idle_us(c: Context) -> tuple[float, tuple[Op, ...]]:
    """Return the device-idle microseconds spent inside one-time setup ops on the host, and
    those ops: calls of at least COLD_OP_MIN_US that are the only call of their name and
    input shapes or far slower than its other calls (lazy CUDA init in the first .to(),
    cuDNN autotuning in the first convolution of each shape, ...)."""
    if not c.on_device:
        return 0.0, ()
    # Only long calls can be setup (a few at most); their names' other calls are then read.
    long_calls = [o for o in c.top_ops if o.dur_us >= th.COLD_OP_MIN_US]
    start_up = _profiler_start_up_candidate(c)
    if start_up is not None:
        long_calls.append(start_up)
    if not long_calls:
        return 0.0, ()
    # Against the calls with the same inputs: cuDNN autotunes each new convolution shape (on
    # an H100 the two convolutions of a fresh model took 1.6 s and 1.0 s, the same op name
    # with different inputs). Over several steps, against the op's other calls too: a slow op
    # called with a new shape in every step is the steady state (variable-size batches).
    names = {o.name for o in long_calls}
    by_key: dict[tuple[str, str], list[float]] = {}
    for o in c.top_ops:
        if o.name in names:
            by_key.setdefault(_shape_key(o), []).append(o.dur_us)
            if c.n_steps > 1:
                by_key.setdefault((o.name, ""), []).append(o.dur_us)
    for durations in by_key.values():
        durations.sort()

    def far_slower(o: Op, key: tuple[str, str], alone: bool) -> bool:
        others = _median_without(by_key[key], o.dur_us)
        return alone if others is None else o.dur_us >= th.COLD_OP_RATIO * others

    cold: list[Op] = []
    for o in long_calls:
        # The start-up candidate is shorter than a setup call: only against later calls.
        alone = o is not start_up
        if far_slower(o, _shape_key(o), alone) and (
            c.n_steps <= 1 or far_slower(o, (o.name, ""), alone)
        ):
            cold.append(o)
    if not cold:
        return 0.0, ()
    spans = merge_intervals((o.start_us, o.end_us) for o in cold)
    # Only the host gaps that reach into the calls' stretch can overlap them.
    lo, hi = spans[0][0], spans[-1][1]
    host_gaps = [
        (g.start_us, g.end_us)
        for g in c.timeline.gaps
        if g.cause == "host" and g.start_us < hi and g.end_us > lo
    ]
    return union_length(intersect_intervals(spans, merge_intervals(host_gaps))), tuple(cold)


def _profiler_start_up_candidate(c: Context) -> Op | None:
    """The window's first top-level op when it could hold the profiler's start-up: it began
    before any kernel and took PROFILER_START_MIN_US..COLD_OP_MIN_US (longer ones are read
    as setup anyway)."""
    if not c.top_ops or not len(c.kcols.start):
        return None
    first = min(c.top_ops, key=attrgetter("start_us"))
    if not th.PROFILER_START_MIN_US <= first.dur_us < th.COLD_OP_MIN_US:
        return None
    return first if first.start_us < float(c.kcols.start.min()) else None


def is_profiler_start_up(ops: Sequence[Op]) -> bool:
    """Whether setup ops are only the profiler's start-up (one first op under COLD_OP_MIN_US:
    see _profiler_start_up_candidate)."""
    return len(ops) == 1 and ops[0].dur_us < th.COLD_OP_MIN_US


def _shape_key(o: Op) -> tuple[str, str]:
    return o.name, repr(o.input_dims)


def duration_words(us: float) -> str:
    """Return a duration for a title: '29.9 s', '412 ms' (same digits as render's fmt_us)."""
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"


def rule_cold_start(c: Context, timing: TimingStats | None) -> Finding | None:
    """The first run's one-off cost. From the run timings: the first warm-up run against the
    timed runs, only when its excess over their median lies beyond their own spread (a
    noisy machine makes every run differ; that is not a cold start). From the trace: setup
    ops (see cold_ops_idle_us). Unless the cell ran once (--once, where the first run is
    what was measured), a one-off is not the steady state users ask about: the finding is
    `info` and comes after every steady-state finding."""
    evidence: dict[str, float] = {}
    share = 0.0
    titles: list[str] = []
    if timing is not None and timing.warmup_wall_us and timing.wall_us:
        first = timing.warmup_wall_us[0]
        # Warm-up runs only have wall time: compare wall with wall.
        median = float(statistics.median(timing.wall_us))
        spread = max(timing.wall_us) - min(timing.wall_us)
        if median > 0:
            ratio = first / median
            total = first + sum(timing.wall_us) + sum(timing.warmup_wall_us[1:])
            if ratio >= th.COLD_START_RATIO and first - median > spread and total > 0:
                share = (first - median) / total
            evidence.update(
                {
                    "first_run_us": first,
                    "median_run_us": median,
                    "first_over_median_ratio": ratio,
                    "timed_runs_spread_us": spread,
                }
            )
            titles.append(f"the first run took {ratio:.3g}x the median run")
    if c.setup_ops:
        idle_us = c.setup_idle_us
        longest = max(c.setup_ops, key=lambda o: (o.dur_us, -o.index))
        evidence.update(
            {
                "device_idle_in_setup_ops_us": idle_us,
                "longest_setup_op_us": longest.dur_us,
                "setup_share_of_window_fraction": c.frac_of_window(idle_us),
            }
        )
        share = max(share, c.frac_of_window(idle_us))
        if is_profiler_start_up(c.setup_ops):
            titles.append(
                f"a start-up cost held the window's first op ({longest.name}, "
                f"{duration_words(longest.dur_us)}, {th.COLD_OP_RATIO:g}x its later "
                f"calls) while the GPU idled, "
                f"{c.frac_of_window(idle_us) * 100:.0f}% of the window: "
                "the profiler's own start-up, or a library's first call (profile "
                "after a warm-up step, or with a schedule's warmup)"
            )
        else:
            titles.append(
                f"one-time setup inside torch ops keeps the GPU idle "
                f"{c.frac_of_window(idle_us) * 100:.0f}% of the window (first "
                f"{longest.name} took {duration_words(longest.dur_us)})"
            )
    if not evidence:
        return None
    once = timing is not None and timing.once
    title = "; ".join(titles)
    if not (c.setup_ops and is_profiler_start_up(c.setup_ops)):
        title += " (allocation, initialisation, autotuning)"
    if once:
        return make_finding("cold_start", title[0].upper() + title[1:], share, evidence)
    f = make_finding("cold_start", "One-off, not the steady state: " + title, share, evidence)
    return dataclasses.replace(f, severity="info")


_COMPILE_MARKERS = (
    "Torch-Compiled Region",
    "TorchDynamo Cache Lookup",
    "CompiledFunction",
    "Compiled Function",
    "(dynamo_timed)",
    "torch._dynamo",
    "inductor",
)


_REGION_IDS = re.compile(r"Torch-Compiled Region: (\d+)/(\d+)")


def compile_spans(trace: Trace | TraceIndex) -> list[Interval]:
    """The merged spans of torch.compile's compilations (`compile_inner` annotations, which
    nest: the outermost count), or [] when the trace shows no torch.compile at all."""
    ix = index_of(trace)
    trace = ix.trace

    def compute() -> list[Interval]:
        # Traces repeat a few thousand op names: look for the markers once per name.
        names = op_names(ix)
        if not any(m in name for name in names for m in _COMPILE_MARKERS):
            return []
        if not any("compile_inner" in name for name in names):
            return []
        # torch 2.11 also marks each compile with a short "entire_frame_compile_data:
        # fn_name=_compile.compile_inner, compile_id=F/G" annotation just before it: not a
        # compile.
        return merge_intervals(
            (o.start_us, o.end_us)
            for o in trace.ops
            if "compile_inner" in o.name and not o.name.startswith("entire_frame_compile_data")
        )

    # Read by the recompilation rule and by launch overhead (which leaves compiling out).
    spans: list[Interval] = memo(ix, "compile_spans", compute)
    return spans


def rule_recompilation(c: Context) -> Finding | None:
    # Traces repeat a few thousand op names: look for the markers once per name.
    if not any(m in name for name in op_names(c.index) for m in _COMPILE_MARKERS):
        return None
    spans = compile_spans(c.index)
    compile_us = _union_in(spans, c.lo, c.hi)
    region_names = {n for n in op_names(c.index) if "Torch-Compiled Region" in n}
    regions = [o for o in c.trace.ops if o.name in region_names] if region_names else []
    # "Torch-Compiled Region: F/N" runs graph N of frame F: graphs beyond the first of a frame
    # are recompilations, even when they were compiled before the profiled run.
    graphs: dict[int, set[int]] = {}
    for o in regions:
        m = _REGION_IDS.search(o.name)
        if m:
            graphs.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    recompiles = sum(len(ids) - 1 for ids in graphs.values())
    n = len(spans)
    share = c.frac(compile_us)
    if recompiles:
        # Each new shape or guard failure compiles again; even when this run paid nothing,
        # the next new shape will: worth reporting, at least as a detail.
        share = max(share, th.MIN_REPORT_SHARE)
    elif not n:
        share = 0.0
    title = (
        f"torch.compile compiled {n} time(s) during the cell, taking "
        f"{c.frac(compile_us) * 100:.0f}% of the time"
    )
    if recompiles:
        title += f"; {recompiles} recompiled graph(s) ran (shapes or guards changed)"
    return make_finding(
        "recompilation",
        title,
        share,
        {
            "compile_count": float(n),
            "compile_time_us": compile_us,
            "recompiled_graphs_count": float(recompiles),
            "compiled_region_calls_count": float(len(regions)),
        },
    )


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
