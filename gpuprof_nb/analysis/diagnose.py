"""What holds a cell back: findings with evidence and fixes, most recoverable time first.

Every rule measures its evidence from the trace (and the run timings when given) and says how
much of the profiled time fixing it could recover (`Finding.share`). Findings are ordered by
that share; ties follow the order in which practitioners apply fixes (compile, mixed
precision, accumulation, DataLoader, checkpointing). `compute_bound` is the healthy verdict:
it recovers nothing by itself, so it never outranks a real problem and is never severe.
Rules that cannot be judged from what the trace holds say why in `Diagnosis.not_judged`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.classify import kernel_class, op_class
from gpuprof_nb.analysis.critical_path import critical_path as find_critical_path
from gpuprof_nb.analysis.critical_path import rule_critical_path
from gpuprof_nb.analysis.derived import TraceIndex, index_of, kernel_columns
from gpuprof_nb.analysis.fixes import CPU_FIXES, FIXES
from gpuprof_nb.analysis.model_rules import model_findings
from gpuprof_nb.analysis.noise import rule_noisy_measurement
from gpuprof_nb.analysis.rules import (
    Context,
    cold_ops_idle_us,
    compute_capability,
    duration_words,
    rule_cold_start,
    rule_communication,
    rule_compute_memory_precision,
    rule_dataloader,
    rule_dtype_cast,
    rule_host_device_copy,
    rule_host_sync,
    rule_launch_and_python,
    rule_memory_growth,
    rule_recompilation,
    unrecorded_device_words,
)
from gpuprof_nb.analysis.timeline import (
    chosen_device,
    device_kernels,
    device_timeline,
    top_level_ops,
    unrecorded_launches,
)
from gpuprof_nb.model.arguments import check_type
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import RuntimeCall, Trace
from gpuprof_nb.results.critical_path import CriticalPath
from gpuprof_nb.results.diagnosis import Diagnosis, Finding, FindingKind
from gpuprof_nb.results.hotspots import Hotspots
from gpuprof_nb.results.roofline import Roofline
from gpuprof_nb.results.timeline import Timeline

# Names other modules and users import from here (the catalogue, the classifiers and the
# results moved to their own modules).
__all__ = [
    "CPU_FIXES",
    "FIXES",
    "FIX_ORDER",
    "Diagnosis",
    "Finding",
    "diagnose",
    "kernel_class",
    "op_class",
    "unrecorded_launches",
]

# Tie-break between equal shares: the order practitioners apply fixes in (torch.compile,
# mixed precision, gradient accumulation, DataLoader tuning, activation checkpointing), each
# kind placed with the fix that addresses it.
FIX_ORDER: tuple[FindingKind, ...] = (
    "launch_overhead",
    "memory_bound",
    "recompilation",
    "graph_break",
    "python_overhead",  # compile
    "precision",
    "dtype_cast",  # mixed precision
    "communication",  # accumulation, overlap
    "dataloader",
    "host_device_copy",
    "host_sync",  # input pipeline and syncs
    "memory_growth",  # checkpointing, freeing what is kept
    "cold_start",
    "compute_bound",
    "noisy_measurement",
    "critical_path",  # explains the others; never a fix of its own
)


def _is_one_off(f: Finding, timing: TimingStats | None) -> bool:
    """Whether a finding is about a one-off cost rather than the steady state."""
    return f.kind == "cold_start" and not (timing is not None and timing.once)


# The Timeline gap causes each kind's idle time falls in: the user lines charged with most
# of it (analysis/hotspots.py) are named in its title.
LINE_CAUSES: dict[FindingKind, tuple[str, ...]] = {
    "python_overhead": ("host",),
    "host_sync": ("sync",),
    "dataloader": ("dataloader",),
    "launch_overhead": ("launch",),
}
# What those findings say without stacks to name lines from.
STACK_HINT = (
    "\nTo see which of your lines keep it waiting, profile with %%gpuprofile --stack (offline:"
    "\ntorch.profiler.profile(with_stack=True)); this finding and the Hotspots tab then name"
    "\nthem."
)


def name_lines(f: Finding, hotspots: Hotspots | None) -> Finding:
    """Return `f` with the user lines that hold most of its idle time named in its title
    (`In [7], line 4` (`loss.item()`): 31% of device idle time), or, without stacks, with
    the way to get them added to its fix. Other kinds come back unchanged."""
    causes = LINE_CAUSES.get(f.kind)
    if causes is None:
        return f
    if hotspots is None:
        return dataclasses.replace(f, fix=f"{f.fix}{STACK_HINT}")
    top = hotspots.top_idle_lines(causes)
    if not top:
        return f
    of = "device idle time" if hotspots.on_device else "the time between ops"
    named = "; ".join(f"{line.named}: {share * 100:.0f}% of {of}" for line, share in top)
    return dataclasses.replace(f, title=f"{f.title}. Held by {named}")


def diagnose(
    trace: Trace | TraceIndex,
    *,
    timeline: Timeline | None = None,
    roofline: Roofline | None = None,
    timing: TimingStats | None = None,
    hotspots: Hotspots | None = None,
    critical_path: CriticalPath | None = None,
) -> Diagnosis:
    """Return the findings for a trace, most recoverable time first, with what could not be
    judged and a one-line verdict. With `hotspots`, the findings about idle time name the
    user lines that held it. The critical_path finding (what the median step's length hangs
    on) comes last: it explains the others rather than adding time to recover; the path is
    computed here when not given."""
    ix = index_of(trace)
    trace = ix.trace
    check_type(trace, Trace, "diagnose's trace", "a Trace (from gpuprof_nb.load_trace(path))")
    tl = timeline if timeline is not None else device_timeline(ix)
    device, _ = chosen_device(ix)
    c = _context(ix, tl, device, timing)
    notes: list[str] = list(tl.notes)
    # What the loader had to repair (negative durations, ...) bounds how far to trust this.
    notes.extend(f"trace: {w}" for w in getattr(trace, "load_warnings", ()))
    if not trace.steps:
        notes.append("no ProfilerStep annotations: per-step numbers are for the whole window")
    # A GPU program whose kernels were not recorded: judge the host, never the device.
    blind = unrecorded_launches(trace)
    considered, not_judged = _judge(c, device, blind, roofline, timing, hotspots, critical_path)
    considered.sort(key=lambda f: (-f.share, FIX_ORDER.index(f.kind), f.title))
    reported = _reported(considered)
    # Numbers measured on an unsteady machine come first: every other finding rests on them.
    noisy = rule_noisy_measurement(timing, trace.utilisation, hotspots)
    # A one-off cost is reported apart: the headline and the findings are the steady state.
    one_off = [f for f in reported if _is_one_off(f, timing)]
    reported = [f for f in reported if not _is_one_off(f, timing)]
    if c.one_off_us > 0 and c.frac_of_window(c.one_off_us) >= th.MIN_REPORT_SHARE:
        notes.append(
            f"one-off setup ops kept the device idle "
            f"{c.frac_of_window(c.one_off_us) * 100:.0f}% of the window "
            f"({duration_words(c.one_off_us)}); every other share is of the "
            f"remaining {duration_words(c.span_us - c.one_off_us)}"
        )
    verdict = _verdict(reported, c, len(blind))
    if noisy is not None:
        reported.insert(0, noisy)
        considered.insert(0, noisy)
        verdict = f"{noisy.title.split('. The times')[0]}. {verdict}"
    return Diagnosis(
        findings=tuple(reported),
        not_judged=tuple(not_judged),
        verdict=verdict,
        considered=tuple(considered),
        notes=tuple(notes),
        one_off=tuple(one_off),
    )


def _context(
    ix: TraceIndex, tl: Timeline, device: int | None, timing: TimingStats | None
) -> Context:
    """Return the Context the rules share: the device's kernels, the top-level ops and,
    where they are a one-off, the setup ops left out of every other share."""
    kernels = device_kernels(ix, device) if device is not None else ()
    c = Context(
        index=ix,
        timeline=tl,
        lo=tl.start_us,
        hi=tl.end_us,
        span_us=tl.window_us,
        n_steps=len(ix.trace.steps),
        top_ops=top_level_ops(ix),
        kernels=kernels,
        on_device=device is not None,
        kernel_columns=kernel_columns(ix, kernels, ("device", device)),
    )
    # A cell profiled after its warm-up repeats whatever its profiled run did, so setup-like
    # ops there are its steady state. Elsewhere they are the first run's one-off: under
    # --once they are part of what was measured; in a trace recorded elsewhere they are left
    # out of every other share, which are then of the steady rest of the window.
    if timing is None or timing.once:
        setup_idle_us, setup_ops = cold_ops_idle_us(c)
        c = dataclasses.replace(
            c,
            setup_idle_us=setup_idle_us,
            setup_ops=setup_ops,
            one_off_us=setup_idle_us if timing is None else 0.0,
        )
    return c


def _judge(
    c: Context,
    device: int | None,
    blind: Sequence[RuntimeCall],
    roofline: Roofline | None,
    timing: TimingStats | None,
    hotspots: Hotspots | None,
    critical_path: CriticalPath | None,
) -> tuple[list[Finding], list[str]]:
    """Run every rule (in the order of rules.RULES, then the model rules and the critical
    path) and return what they found, with its user lines named, and what could not be
    judged, with why. `device`: the chosen one; `blind`: the calls that queued GPU work
    that no kernel event records."""
    trace = c.trace
    not_judged: list[str] = []
    considered: list[Finding] = []

    def add(f: Finding | None) -> None:
        if f is not None:
            # CPU fixes suit CPU programs only; a GPU program keeps its CUDA fixes.
            if not c.on_device and not blind and f.kind in CPU_FIXES:
                f = dataclasses.replace(f, fix=CPU_FIXES[f.kind])
            considered.append(name_lines(f, hotspots))

    if c.span_us <= 0:
        not_judged.append("everything: the trace has no timed events (empty window)")
    if not trace.ops:
        not_judged.append("python_overhead, dtype_cast, dataloader: the trace has no host ops")
    add(rule_dataloader(c))
    if c.on_device:
        add(rule_host_sync(c))
    elif blind:
        not_judged.append(
            "compute_bound, memory_bound, precision, host_sync, "
            "host_device_copy: " + unrecorded_device_words(blind)
        )
    else:
        not_judged.append("host_sync, precision, host_device_copy: no device activity in the trace")
    for f in rule_launch_and_python(c):
        add(f)
    # Host op time of a GPU program is launch time, not the device's math: without kernels
    # there is nothing to call compute- or memory-bound.
    if not blind:
        for f in rule_compute_memory_precision(c, roofline):
            add(f)
    if c.on_device and compute_capability(trace, device) is None:
        not_judged.append("precision: the trace has no device properties (compute capability)")
    add(rule_dtype_cast(c))
    if c.on_device:
        add(rule_host_device_copy(c))
    add(rule_communication(c))
    cold = rule_cold_start(c, timing)
    if cold is None:
        if timing is None:
            not_judged.append("cold_start: no run timings (profile with %%gpuprofile to get them)")
        elif not timing.warmup_wall_us:
            not_judged.append("cold_start: no warm-up run was timed apart from the measured runs")
    add(cold)
    rec = rule_recompilation(c)
    if rec is None:
        not_judged.append("recompilation: no torch.compile markers in the trace")
    add(rec)
    growth = rule_memory_growth(c)
    if growth is None:
        not_judged.append(
            "memory_growth: no [memory] events (profile with profile_memory=True "
            "or %%gpuprofile --memory)"
        )
    add(growth)
    # Modules named, torch.compile's reasons, CUDA graphs (analysis/model_rules.py).
    considered = model_findings(c, considered, roofline)
    if c.on_device and c.span_us > 0:
        path = critical_path if critical_path is not None else find_critical_path(trace, c.timeline)
        add(rule_critical_path(path, c.on_device))
    return considered, not_judged


def _reported(considered: Sequence[Finding]) -> list[Finding]:
    """Return the findings worth reporting (compute_bound and critical_path always), in
    report order: high and medium problems, compute_bound, low ones, then critical_path."""
    reported = [
        f
        for f in considered
        if f.kind in ("compute_bound", "critical_path") or f.share >= th.MIN_REPORT_SHARE
    ]

    # compute_bound recovers nothing itself: it goes after every high or medium problem, but
    # before low ones, so a healthy cell leads with its verdict rather than with a detail.
    def group(f: Finding) -> int:
        if f.kind == "critical_path":
            return 3  # an explanation, after every finding
        if f.kind == "compute_bound":
            return 1
        return 0 if f.severity in ("high", "medium") else 2

    reported.sort(key=lambda f: (group(f), -f.share, FIX_ORDER.index(f.kind), f.title))
    return reported


def _verdict(reported: Sequence[Finding], c: Context, unrecorded: int = 0) -> str:
    verdict = _steady_verdict(reported, c, unrecorded)
    if c.one_off_us > 0 and c.frac_of_window(c.one_off_us) >= th.MIN_REPORT_SHARE:
        longest = max(c.setup_ops, key=lambda o: (o.dur_us, -o.index))
        verdict += (
            f". A one-off setup cost took {c.frac_of_window(c.one_off_us) * 100:.0f}% "
            f"of the trace (first {longest.name} took "
            f"{duration_words(longest.dur_us)}; see cold_start): the verdict is "
            "about the rest"
        )
    return verdict


def _steady_verdict(reported: Sequence[Finding], c: Context, unrecorded: int) -> str:
    serious = [f for f in reported if f.severity in ("high", "medium")]
    if unrecorded:
        blind = (
            f"GPU not judged: {unrecorded} calls queued GPU work but the trace has no "
            "kernel events (record them with ProfilerActivity.CUDA)"
        )
        if serious:
            return f"{blind}; on the host: {serious[0].kind} - {serious[0].title}"
        return f"{blind}; on the host no rule found a problem worth 10% or more of the time"
    if serious:
        return f"Main bottleneck: {serious[0].kind} - {serious[0].title}"
    if any(f.kind == "compute_bound" for f in reported):
        return "Compute-bound (healthy): no clear bottleneck besides the math itself"
    if c.span_us <= 0:
        return "Nothing to judge: the trace has no timed events"
    return "No clear bottleneck: no rule found a problem worth 10% or more of the time"
