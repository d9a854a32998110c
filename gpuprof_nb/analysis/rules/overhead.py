"""The host-side overhead rule: many tiny kernels or ops whose dispatch sets the pace
(`launch_overhead`) and time in Python outside torch ops (`python_overhead`), on device
traces and on CPU-only ones."""

from __future__ import annotations

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.derived import median
from gpuprof_nb.analysis.intervals import (
    clipped_union,
    intersect_intervals,
    merge_intervals,
    total_length,
    union_length,
)
from gpuprof_nb.analysis.ops import summarize_trace
from gpuprof_nb.analysis.rules.communication import host_collective_spans
from gpuprof_nb.analysis.rules.compilation import compile_spans
from gpuprof_nb.analysis.rules.context import Context, make_finding, tiny_op_names, union_in
from gpuprof_nb.analysis.timeline import median_duration_us, top_level_spans
from gpuprof_nb.results.diagnosis import Finding
from gpuprof_nb.results.timeline import IdleBreakdown


def rule_launch_and_python(c: Context) -> list[Finding]:
    """Return the launch_overhead and python_overhead findings: on a device trace, from the
    device's idle time while the host dispatches torch ops or runs Python; on a CPU trace,
    from the top-level ops and the gaps between them."""
    bd = c.timeline.breakdown
    if bd is None:
        return []
    if c.on_device:
        launch = _device_launch_overhead(c, bd)
        return [*([launch] if launch is not None else []), _device_python_overhead(c, bd)]
    if not c.top_ops:
        return []
    return [_host_launch_overhead(c, bd), _host_python_overhead(c, bd)]


def _device_launch_overhead(c: Context, bd: IdleBreakdown) -> Finding | None:
    """launch_overhead on a device trace: short gaps between kernels and device idle while
    the host is inside torch ops; None without kernels."""
    kc = c.kcols
    compute = kc.dur[kc.is_kernel]
    if not len(compute):
        return None
    # statistics.median's middle value (or the mean of the two), found by numpy's sort.
    med = median(compute)
    # The Summary's count: kernels launched inside the steps, per step (all of them
    # per cell without steps).
    summary = summarize_trace(c.index)
    per_step_kernels = (
        summary.kernels_per_step
        if c.n_steps and summary.kernels_per_step is not None
        else float(len(compute))
    )
    tiny = med < th.TINY_KERNEL_US and per_step_kernels >= th.MIN_KERNELS_FOR_OVERHEAD
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
    title = (
        f"Many small kernels: {per_step_kernels:.0f} {c.each}, median {med:.3g} us;"
        " launching them sets the pace"
        if tiny
        else f"The host sets the pace: the GPU idles {share * 100:.0f}% of the time "
        "while the host dispatches torch ops"
    )
    return make_finding("launch_overhead", title, share, evidence)


def _device_python_overhead(c: Context, bd: IdleBreakdown) -> Finding:
    """python_overhead on a device trace: the device idle while the host is outside torch
    ops."""
    python_us = max(bd.host_us - bd.host_in_ops_us, 0.0)
    covered = total_length(*clipped_union(*top_level_spans(c.index), c.lo, c.hi))
    # Shares of the whole window, the headline's among them, so the evidence reads
    # against the title: the host outside torch ops includes time the GPU was busy.
    return make_finding(
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


def _host_launch_overhead(c: Context, bd: IdleBreakdown) -> Finding:
    """launch_overhead on a CPU trace: many tiny top-level ops and the dispatch gaps
    between them."""
    durations = [o.dur_us for o in c.top_ops]
    med = median_duration_us(durations)
    tiny_names = tiny_op_names(c.top_ops)
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
    return make_finding(
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


def _host_python_overhead(c: Context, bd: IdleBreakdown) -> Finding:
    """python_overhead on a CPU trace: the long gaps between top-level ops, less the time
    inside CPU collectives."""
    # Time inside CPU collectives (gloo) is waiting on other ranks, not Python.
    host_gaps = merge_intervals(
        (g.start_us, g.end_us) for g in c.timeline.gaps if g.cause == "host"
    )
    in_comm = union_length(intersect_intervals(host_gaps, host_collective_spans(c)))
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
    return make_finding(
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
    return union_in(intersect_intervals(host_gaps, spans), c.lo, c.hi)
