"""Model FLOPs utilisation (MFU) of a profiled step. Pure functions.

Rules:
- FLOPs are those the roofline already counts per op (analysis/flops.py, through
  analysis/roofline.py): every op with a formula and recorded shapes, forward and backward,
  each op once (its outermost costed call). Ops without a formula are listed with their
  share of the time (device time on a GPU trace, CPU time on a CPU one).
- Recompute: ops that ran inside a recompute of activation checkpointing (a module range
  inside a backward op, analysis/modules.py) are hardware FLOPs, not model FLOPs; HFU counts
  them, MFU does not.
- The step: one run of the cell per profiled run; its time is the median of the timed runs
  (without the profiler) over the steps per run where the run was timed; else the median
  profiled step (`ProfilerStep#N`); else the profiled window. FLOPs per step are the
  profiled FLOPs over the steps they cover.
- The peak is the roof each op's FLOPs run against (bf16, fp16, tf32, fp32, fp64, as the
  roofline picks it), from ceilings measured by `measure_ceilings()` where the cache has them,
  else the datasheet's; with several precisions, MFU = sum(FLOPs / its peak) / step time.
- Never an impossible value: without a peak (a CPU trace without measured ceilings, an
  unknown GPU), or above 1 (FLOPs overcounted or ceilings too low), `mfu` is None and a note
  says why.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from gpuprof_nb.analysis.derived import TraceIndex, index_of
from gpuprof_nb.analysis.modules import RECOMPUTE, modules_at
from gpuprof_nb.analysis.roofline import roofline_anchors
from gpuprof_nb.model.device import DeviceSpec, lookup_device_spec
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.mfu import Mfu, Unformulated
from gpuprof_nb.results.roofline import Roofline

# Ops without a formula listed at most.
MAX_UNFORMULATED = 8
# Integer input dtypes: a root module given these takes token ids (samples x tokens).
_TOKEN_DTYPES = frozenset({"int64", "int32", "long", "int"})


def model_flops_utilisation(
    trace: Trace | TraceIndex, roofline: Roofline, timing: TimingStats | None = None
) -> Mfu | None:
    """Return the MFU of the trace's step (see the module's rules), None when the trace
    holds no FLOPs at all (no op with a formula and recorded shapes)."""
    ix = index_of(trace)
    trace = ix.trace
    hardware = float(sum(p.flops for p in roofline.points))
    if hardware <= 0:
        return None
    on_device = roofline.time_basis == "device"
    notes: list[str] = []
    recompute = _recompute_flops(ix)
    model = max(hardware - recompute, 0.0)

    steps, step_us, source = _step(ix, timing)
    per_step = 1.0 / steps

    # The roof of most FLOPs names the dtype.
    ideal_s, by_roof, unpeaked = _flops_by_roof(roofline)
    peak = _Peak.of(
        roofline.device, min(by_roof, key=lambda r: (-by_roof[r], r)) if by_roof else None
    )

    mfu = hfu = None
    if not by_roof:
        notes.append(_no_peak_words(trace, on_device))
    elif step_us <= 0:
        notes.append("no step time: the trace's window is empty")
    else:
        if unpeaked:
            notes.append(
                f"{unpeaked / hardware:.0%} of the FLOPs have no roof to compare with; "
                "left out of MFU"
            )
        hfu_value = _hfu(roofline, ideal_s, per_step, step_us * 1e-6, peak, notes)
        mfu_value = hfu_value * (model / hardware)
        if hfu_value > 1.0:
            notes.append(
                f"the counted FLOPs would run at {hfu_value:.0%} of the peak, which cannot "
                "be: FLOPs overcounted, or ceilings below this device's (measure them with "
                "gpuprof_nb.measure_ceilings()); MFU not shown"
            )
        else:
            mfu = mfu_value
            hfu = hfu_value if recompute > 0 else None
        if not on_device:
            notes.append(
                "CPU run: MFU is against this CPU's measured peak for the dtype that ran "
                "(gpuprof_nb.measure_ceilings()); on a GPU the same cell has its own"
            )
    unformulated, unformulated_share = _unformulated(roofline)
    samples, tokens = _throughput(trace, steps, step_us)
    if recompute > 0:
        notes.append(
            f"activation checkpointing recomputed {recompute / hardware:.0%} of the FLOPs: "
            "HFU counts them, MFU does not"
        )
    return Mfu(
        model_flops_per_step=model * per_step,
        hardware_flops_per_step=hardware * per_step,
        step_us=step_us,
        step_source=source,
        on_device=on_device,
        mfu=mfu,
        hfu=hfu,
        roof=peak.roof,
        peak_flops_per_s=peak.flops_per_s,
        peak_source=peak.source,
        measured_peak=peak.measured,
        unformulated_share=unformulated_share,
        unformulated=unformulated,
        samples_per_s=samples,
        tokens_per_s=tokens,
        notes=tuple(notes),
    )


def _flops_by_roof(roofline: Roofline) -> tuple[float, dict[str, float], float]:
    """Return the seconds the FLOPs would take, each at its roof's peak; the FLOPs per roof;
    and the FLOPs with no roof or peak."""
    ideal_s = 0.0
    by_roof: dict[str, float] = defaultdict(float)
    unpeaked = 0.0
    for p in roofline.points:
        if p.roof and p.peak_flops_per_s:
            ideal_s += p.flops / p.peak_flops_per_s
            by_roof[p.roof] += p.flops
        else:
            unpeaked += p.flops
    return ideal_s, by_roof, unpeaked


@dataclass
class _Peak:
    """The peak MFU is against: the roof of most FLOPs, its FLOP/s, whether measured, and
    where it came from (empty without a device)."""

    roof: str | None
    flops_per_s: float | None
    measured: bool
    source: str

    @classmethod
    def of(cls, spec: DeviceSpec | None, roof: str | None) -> _Peak:
        peak = spec.peak_flops_per_s(roof) if spec is not None and roof else None
        measured = bool(spec is not None and spec.measured)
        if spec is None:
            return cls(roof, peak, measured, "")
        origin = "measured" if measured else "datasheet"
        return cls(roof, peak, measured, f"{origin}: {spec.name} ({spec.source})")


def _hfu(
    roofline: Roofline,
    ideal_s: float,
    per_step: float,
    step_s: float,
    peak: _Peak,
    notes: list[str],
) -> float:
    """Return the HFU of a step of `step_s` seconds whose FLOPs would take `ideal_s` seconds
    per `1 / per_step` steps at their peaks. Where that is above 1 against measured ceilings
    and not against the datasheet's, the datasheet's: `peak` becomes the datasheet's, and a
    note says why."""
    hfu_value = ideal_s * per_step / step_s
    datasheet = _datasheet_of(roofline.device) if peak.measured and hfu_value > 1.0 else None
    if datasheet is None:
        return hfu_value
    # The cell ran faster than the measured ceilings: they are too low for it (a throttled
    # or noisy measurement), so the datasheet's peaks are the honest denominator.
    sheet_s = _ideal_seconds(roofline, datasheet)
    if sheet_s is not None and sheet_s * per_step / step_s <= 1.0:
        notes.append(
            f"this step ran at {hfu_value:.0%} of the measured ceilings, so they are "
            f"too low for it: MFU is against {datasheet.name}'s datasheet peak "
            "instead; measure again with gpuprof_nb.measure_ceilings(refresh=True) "
            "on an idle GPU"
        )
        hfu_value = sheet_s * per_step / step_s
        peak.flops_per_s = datasheet.peak_flops_per_s(peak.roof) if peak.roof else None
        peak.measured = False
        peak.source = f"datasheet: {datasheet.name} ({datasheet.source})"
    return hfu_value


def _datasheet_of(spec: DeviceSpec | None) -> DeviceSpec | None:
    """The datasheet row of a measured device (GPUs only), None where there is none."""
    if spec is None or spec.kind == "cpu":
        return None
    return lookup_device_spec(spec.name, spec.memory_bytes)


def _ideal_seconds(roofline: Roofline, spec: DeviceSpec) -> float | None:
    """Seconds the roofline's FLOPs would take at `spec`'s peaks, each at its own roof;
    None when `spec` lacks a roof some FLOPs ran against."""
    total = 0.0
    for p in roofline.points:
        if not (p.roof and p.peak_flops_per_s):
            continue
        peak = spec.peak_flops_per_s(p.roof)
        if not peak:
            return None
        total += p.flops / peak
    return total


def _no_peak_words(trace: Trace, on_device: bool) -> str:
    if not on_device:
        return (
            "no MFU: this is a CPU run and no peak is known for this CPU; "
            "gpuprof_nb.measure_ceilings() measures it (MFU then compares the step with it)"
        )
    name = trace.devices[0].name if trace.devices else "this GPU"
    return (
        f"no MFU: no ceilings for {name} (no datasheet row, none measured); run "
        "gpuprof_nb.measure_ceilings() on it"
    )


def _step(trace: Trace | TraceIndex, timing: TimingStats | None) -> tuple[float, float, str]:
    """(steps the profiled FLOPs cover, microseconds per step, where that time came from)."""
    ix = index_of(trace)
    trace = ix.trace
    if timing is not None and timing.times_us and timing.median_us > 0:
        steps = timing.steps_per_run or 1
        return (
            float(steps),
            timing.median_us / steps,
            (
                f"median of the timed runs over {steps} steps per run"
                if steps > 1
                else "median of the timed runs (one run of the cell is one step)"
            ),
        )
    if trace.steps:
        median = statistics.median(s.dur_us for s in trace.steps)
        n = len(trace.steps)
        return float(n), median, f"median of {n} profiled step{'s' if n > 1 else ''}"
    from gpuprof_nb.analysis.timeline import activity_window

    lo, hi = activity_window(ix)
    return 1.0, max(hi - lo, 0.0), "the profiled window (no steps in the trace)"


def _recompute_flops(trace: Trace | TraceIndex) -> float:
    """FLOPs of the costed ops that ran inside a recompute (the roofline's anchors)."""
    ix = index_of(trace)
    anchors = roofline_anchors(ix)
    if not anchors:
        return 0.0
    flops = {a: c.flops for a, c, t in anchors if c is not None and c.flops > 0 and t > 0}
    positions = sorted(flops)
    where = modules_at(ix, positions)
    return float(
        sum(flops[a] for a, (_, phase) in zip(positions, where, strict=True) if phase == RECOMPUTE)
    )


def _unformulated(roofline: Roofline) -> tuple[tuple[Unformulated, ...], float]:
    total = roofline.total_time_us
    if total <= 0:
        return (), 0.0
    rows = [
        Unformulated(u.name, u.time_us, min(max(u.time_us / total, 0.0), 1.0))
        for u in roofline.unmodelled
        if u.time_us > 0
    ]
    share = min(sum(u.time_us for u in roofline.unmodelled) / total, 1.0)
    return tuple(rows[:MAX_UNFORMULATED]), max(share, 0.0)


def _throughput(trace: Trace, steps: float, step_us: float) -> tuple[float | None, float | None]:
    """Samples and tokens per second from the root module's first input (the one called
    most, then the first): its first dimension is the batch; an integer 2-D input is token
    ids (batch x sequence). None where unknown."""
    if trace.modules is None or not trace.modules.roots or step_us <= 0:
        return None, None
    roots = [r for r in trace.modules.roots if r.input_shape]
    if not roots:
        return None, None
    root = max(roots, key=lambda r: r.calls)
    shape = root.input_shape or ()
    if not shape:
        return None, None
    per_step_calls = root.calls / steps
    seconds = step_us * 1e-6
    samples = shape[0] * per_step_calls / seconds
    tokens = None
    if root.input_dtype in _TOKEN_DTYPES and len(shape) == 2:
        tokens = shape[0] * shape[1] * per_step_calls / seconds
    return samples, tokens
