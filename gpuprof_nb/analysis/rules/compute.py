"""Rules for the device's math: compute- against memory-bound time (`compute_bound`,
`memory_bound`, from the roofline or from op and kernel names), fp32 matmuls on a
tensor-core GPU (`precision`) and repeated dtype conversions (`dtype_cast`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.classify import op_class
from gpuprof_nb.analysis.derived import (
    TraceIndex,
    ids_of,
    index_of,
    kernel_ids,
    op_columns,
    runtime_correlations,
    runtime_names,
    runtime_starts,
    runtime_threads,
)
from gpuprof_nb.analysis.fixes import FIXES, FP16_FIX
from gpuprof_nb.analysis.rules.context import (
    Context,
    make_finding,
    name_rows,
    names_of_class,
    tiny_op_names,
    top_rows,
    union_of,
)
from gpuprof_nb.model.trace import Kernel, Op, Trace
from gpuprof_nb.results.diagnosis import Finding
from gpuprof_nb.results.roofline import Roofline

_NAME, _TYPES = attrgetter("name"), attrgetter("input_types")
_EXTERNAL_ID = attrgetter("external_id")
# TF32 kernels already use tensor cores: they are not "fp32 matmuls" for the precision rule.
FP32_KERNEL_MARKS = ("sgemm", "f32f32_f32f32", "_fp32_")


def _gemm_precision_fp32(op: Op) -> bool:
    return _types_fp32(op.input_types)


def _types_fp32(input_types: tuple[str, ...] | None) -> bool:
    """Whether a matmul with these input types ran in fp32 (float inputs, none half)."""
    types = [t for t in (input_types or ()) if t]
    return (
        bool(types)
        and "float" in types
        and not any(t in ("c10::BFloat16", "c10::Half", "BFloat16", "Half") for t in types)
    )


def rule_compute_memory_precision(c: Context, roofline: Roofline | None) -> list[Finding]:
    """Return the compute_bound (the healthy verdict), memory_bound and precision findings,
    in that order, each when it applies: the busy time split by op class (from kernels on a
    device trace, from top-level ops on a CPU one), the roofline's shares deciding where it
    could classify ops."""
    time = _device_math_time(c) if c.on_device else _host_math_time(c)
    if time.base_us <= 0:
        return []
    roof_memory, roof_compute, roof_evidence = _roofline_evidence(c, roofline)
    found = (
        _compute_bound(c, time, roof_compute, roof_evidence),
        _memory_bound(c, time, roof_memory, roof_evidence),
        _precision(c, time),
    )
    return [f for f in found if f is not None]


@dataclass(frozen=True, slots=True)
class _MathTime:
    """Where the busy time goes by op class (microseconds, clipped to the window), and what
    the precision rule reads on a device trace."""

    gemm_us: float  # large matmuls and convolutions
    small_us: float  # the tiny ones (latency-bound)
    low_us: float  # elementwise, norm, softmax, reduction
    base_us: float  # the busy time the shares are of
    named: float  # how many large matmuls were judged by name
    gemm: tuple[Kernel, ...] = ()  # device traces: the matmul kernels
    is_gemm: np.ndarray | None = None  # device traces: their mask over c.kcols


def _device_math_time(c: Context) -> _MathTime:
    kc = c.kcols
    busy = union_of(kc, kc.is_kernel, c.lo, c.hi)
    is_gemm = kc.of_class("gemm")  # kernels only: copies have their own class
    gemm = tuple(compress(c.kernels, is_gemm.tolist()))
    # A matmul kernel shorter than a launch is latency-bound, not compute-bound: only the
    # others count as large.
    large = is_gemm & (kc.dur >= th.TINY_KERNEL_US)
    # Tiny kernels count too: launch_overhead charges the idle gaps around them, this
    # rule their device time, which fusion would also save.
    return _MathTime(
        gemm_us=union_of(kc, large, c.lo, c.hi),
        small_us=union_of(kc, is_gemm & ~large, c.lo, c.hi),
        low_us=union_of(kc, kc.of_class("elementwise"), c.lo, c.hi),
        base_us=busy,
        named=float(np.count_nonzero(large)),
        gemm=gemm,
        is_gemm=is_gemm,
    )


def _host_math_time(c: Context) -> _MathTime:
    tiny_names = tiny_op_names(c.top_ops)
    gemm_ops = [o for o in c.top_ops if op_class(o.name) == "gemm"]
    # Ops whose calls are tiny are dispatch-bound (launch_overhead's time), not large.
    large_ops = [o for o in gemm_ops if o.name not in tiny_names]
    low_ops = [
        o for o in c.top_ops if op_class(o.name) == "elementwise" and o.name not in tiny_names
    ]
    return _MathTime(
        gemm_us=sum(o.dur_us for o in large_ops),
        small_us=sum(o.dur_us for o in gemm_ops if o.name in tiny_names),
        low_us=sum(o.dur_us for o in low_ops),
        base_us=c.timeline.busy_us,
        named=float(len(large_ops)),
    )


def _roofline_evidence(
    c: Context, roofline: Roofline | None
) -> tuple[float | None, float | None, dict[str, float]]:
    """Return the roofline's (memory-bound, compute-bound) shares of the busy time, None
    where it does not speak, and the evidence that says so."""
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
    return roof_memory, roof_compute, roof_evidence


def _compute_bound(
    c: Context,
    time: _MathTime,
    roof_compute: float | None,
    roof_evidence: Mapping[str, float],
) -> Finding | None:
    """The healthy verdict when large matmuls/convolutions hold most of the busy time."""
    gemm_share = time.gemm_us / time.base_us
    # The roofline (FLOPs and bytes from shapes against the device's roofs) decides when it
    # could classify ops; op and kernel names decide otherwise.
    compute_share = roof_compute if roof_compute is not None else gemm_share
    if compute_share < th.COMPUTE_BOUND_MIN_SHARE:
        return None
    evidence: dict[str, float] = {
        "gemm_share_of_busy_fraction": gemm_share,
        "gemm_time_us": time.gemm_us,
        "small_gemm_time_us": time.small_us,
        "busy_us": time.base_us,
        **roof_evidence,
    }
    if roof_compute is None:
        # Without shapes there are no FLOPs: the call rests on names, and says so.
        what = "kernel" if c.on_device else "op"
        evidence[f"gemm_{what}s_judged_by_name_not_flops_count"] = time.named
        how = f"judged by {what} name, not measured FLOPs"
    else:
        how = "by the roofline's FLOPs and bytes"
    return Finding(
        "compute_bound",
        "info",
        f"Healthy: {compute_share * 100:.0f}% of the "
        f"{'device' if c.on_device else 'op'} time is large matmuls/convolutions "
        f"(compute-bound; {how})",
        evidence,
        FIXES["compute_bound"],
        0.0,
    )


def _memory_bound(
    c: Context,
    time: _MathTime,
    roof_memory: float | None,
    roof_evidence: Mapping[str, float],
) -> Finding | None:
    """memory_bound: the time in low-intensity ops, by the roofline where it classified
    them, else by op and kernel names."""
    base = time.base_us
    low_us = roof_memory * base if roof_memory is not None else time.low_us
    if not low_us > 0:
        return None
    share = c.frac(low_us) * th.MEMORY_BOUND_RECOVERABLE
    return make_finding(
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


def _precision(c: Context, time: _MathTime) -> Finding | None:
    """precision: fp32 matmul kernels (by their ops' input types or the kernel's name) on a
    GPU with tensor cores."""
    # Only a GPU with tensor cores (known from the trace's device properties) is judged:
    # elsewhere the fp32 matmuls are not looked for at all.
    is_gemm, gemm = time.is_gemm, time.gemm
    cc = compute_capability(c.trace, c.timeline.device) if is_gemm is not None and gemm else None
    if is_gemm is None or cc is None or cc < th.PRECISION_MIN_CC:
        return None
    # Input types repeat: each distinct one is judged once.
    ops = _gemm_ops_with_ids(c.index)
    types = list(map(_TYPES, ops))
    fp32_types = {t for t in set(types) if _types_fp32(t)}
    fp32_ids = set(compress(map(_EXTERNAL_ID, ops), map(fp32_types.__contains__, types)))
    # Kernel names repeat: each distinct one is read once.
    names = list(map(_NAME, gemm))
    fp32_name = {name: any(m in name.lower() for m in FP32_KERNEL_MARKS) for name in set(names)}
    fp32 = is_gemm.copy()
    fp32[is_gemm] = np.fromiter(
        map(fp32_ids.__contains__, map(_EXTERNAL_ID, gemm)), dtype=bool, count=len(gemm)
    ) | np.fromiter(map(fp32_name.__getitem__, names), dtype=bool, count=len(gemm))
    fp32_us = union_of(c.kcols, fp32, c.lo, c.hi)
    if not fp32_us > 0:
        return None
    f = make_finding(
        "precision",
        f"fp32 matmuls on a tensor-core GPU (compute capability {cc[0]}.{cc[1]}): "
        f"{fp32_us / time.base_us * 100:.0f}% of device time",
        c.frac(fp32_us) * th.PRECISION_RECOVERABLE,
        {
            "fp32_gemm_time_us": fp32_us,
            "fp32_gemm_share_of_busy_fraction": fp32_us / time.base_us,
            "compute_capability_version": float(f"{cc[0]}.{cc[1]}"),
        },
    )
    if cc < th.BF16_MIN_CC:
        # No bf16 before Ampere: fp16 with loss scaling is the tensor-core path there.
        f = Finding(f.kind, f.severity, f.title, f.evidence, FP16_FIX, f.share)
    return f


def _gemm_ops_with_ids(trace: Trace | TraceIndex) -> list[Op]:
    """Return the ops of trace.ops named as matmuls or convolutions (op_class 'gemm') that
    have an External id, in trace order: the torch ops found through the shared op columns
    (names as codes), the other ops (annotations, Python functions) by name."""
    ix = index_of(trace)
    trace = ix.trace
    gemm_names = names_of_class(ix, "gemm")
    if not gemm_names:
        return []
    ops, cols = trace.ops, op_columns(ix)
    rows = name_rows(ix, gemm_names)
    torch_ops = cols.positions[rows[cols.has_external_id[rows]]]
    others = np.ones(len(ops), dtype=bool)
    others[cols.positions] = False
    other = np.flatnonzero(others).tolist()
    # The other ops named as matmuls, their names tested in C, then those with an id.
    named = compress(other, map(gemm_names.__contains__, map(_NAME, map(ops.__getitem__, other))))
    other_ops = [i for i in named if ops[i].external_id is not None]
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
    cast_names = names_of_class(c.index, "cast")
    rows = top_rows(c)
    if rows is None or not cast_names:
        return _rule_dtype_cast_ops(c, cast_names)
    # The top-level torch ops named as casts, as rows of the op columns.
    cast_rows = name_rows(c.index, cast_names, rows)
    if not len(cast_rows):
        return None
    # A cast that launched a memcpy is a device transfer (host_device_copy's business).
    cast_rows = cast_rows[~_transfers(c, cast_rows)]
    if not len(cast_rows):
        return None
    cols = op_columns(c.index)
    casts = [cols.ops[i] for i in cast_rows.tolist()]
    if c.on_device:
        cast_us = _device_time_launched_in(c, casts)
    else:
        cast_us = sum(o.dur_us for o in casts)
    return _dtype_cast_finding(c, cast_us, c.per_step(cols.start[cast_rows]))


def _rule_dtype_cast_ops(c: Context, cast_names: frozenset[str]) -> Finding | None:
    """rule_dtype_cast read op by op, for a Context whose top-level ops are not the index's
    (the columns do not hold them)."""
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
    return _dtype_cast_finding(c, cast_us, c.per_step(o.start_us for o in casts))


def _transfers(c: Context, rows: np.ndarray) -> np.ndarray:
    """Per op (rows of the op columns): whether a memcpy call on its thread (threads keyed
    by tid as text) started within it, from its start to its end."""
    ix = c.index
    out = np.zeros(len(rows), dtype=bool)
    memcpy_names = {n for n in runtime_names(ix) if "Memcpy" in n}
    if not memcpy_names:
        return out
    runtime = c.trace.runtime
    calls = np.fromiter(
        compress(range(len(runtime)), map(memcpy_names.__contains__, map(_NAME, runtime))),
        dtype=np.intp,
    )
    # The calls' and the ops' threads by tid as text, each distinct (pid, tid) converted once.
    codes, pairs = runtime_threads(ix)
    call_tid = np.array([str(t) for _, t in pairs], dtype=object)[codes[calls]]
    cols = op_columns(ix)
    op_tid = np.array([str(t) for _, t in cols.raw_threads], dtype=object)[cols.raw_thread[rows]]
    call_start = runtime_starts(ix)[calls]
    start, end = cols.start[rows], cols.end[rows]
    for tid in set(op_tid.tolist()):
        mine = op_tid == tid
        starts = np.sort(call_start[call_tid == tid])
        if not len(starts):
            continue
        # The first call at or after the op's start, when it starts by the op's end.
        i = np.searchsorted(starts, start[mine], side="left")
        out[mine] = (i < len(starts)) & (starts[np.minimum(i, len(starts) - 1)] <= end[mine])
    return out


def _dtype_cast_finding(c: Context, cast_us: float, per_step: float) -> Finding:
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
    # The kernels whose correlation id is one of them: found on the id columns (which hold
    # a present id as itself), then each confirmed on the kernel, in order.
    if c.kernels is c.trace.kernels:
        k_corr, k_has, _, _ = kernel_ids(c.index)
    else:
        k_corr, k_has = ids_of(c.kernels, "correlation")
    maybe = k_has & np.isin(k_corr, np.fromiter(launched, dtype=np.int64, count=len(launched)))
    kernels = c.kernels
    total: float = sum(
        kernels[i].dur_us
        for i in np.flatnonzero(maybe).tolist()
        if kernels[i].correlation in launched
    )
    return total
