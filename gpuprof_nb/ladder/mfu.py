"""MFU on the ladder: the model's FLOPs per sample, counted once from one profiled baseline
step (the FLOPs analysis/flops.py counts per op), and each rung's model FLOPs utilisation
at its median step time against the peak of the precision it ran in; and the graph breaks
the compile rung met, from Dynamo's own log."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from gpuprof_nb.ladder.measure import STEP_MARKER
from gpuprof_nb.results.ladder import RungResult

T = TypeVar("T")


def count_flops(run: Callable[[], T], device: torch.device) -> tuple[T, float | None, str]:
    """Run `run` (one training step of the baseline) under torch.profiler with shapes
    recorded; return its result, the FLOPs of the ops inside the step markers (None when
    they cannot be counted) and, when None, why."""
    from gpuprof_nb.capture.profiler import profile_cell, profiler_running

    if profiler_running():
        return run(), None, "another profiler is recording (the ladder runs inside one)"
    box: list[T] = []
    artifact = profile_cell(lambda: box.append(run()), cuda=device.type == "cuda")
    return box[0], _flops_in_steps(artifact), ""


def _flops_in_steps(artifact: dict[str, Any]) -> float | None:
    from gpuprof_nb.analysis.derived import TraceIndex, op_columns
    from gpuprof_nb.analysis.roofline import compute_roofline, roofline_anchors
    from gpuprof_nb.io.trace import trace_from_dict

    trace = trace_from_dict(artifact, "ladder baseline step")
    index = TraceIndex(trace)
    compute_roofline(index)
    anchors = roofline_anchors(index)
    steps = [(o.start_us, o.end_us) for o in trace.ops if o.name == STEP_MARKER]
    if not steps:
        return None
    cols = op_columns(index)
    total = 0.0
    for a, cost, t in anchors:
        if cost is None or cost.flops <= 0 or t <= 0:
            continue
        start = float(cols.start[a])
        if any(lo <= start < hi for lo, hi in steps):
            total += cost.flops
    return total / len(steps) if total > 0 else None


def peak_for(precision: str, device: torch.device) -> tuple[float | None, str]:
    """The peak FLOP/s of `precision` on `device` (measured ceilings where cached, else
    the datasheet's), and where it came from."""
    from gpuprof_nb.capture.device import current_device_spec

    spec = current_device_spec(device)
    if spec is None:
        return None, ""
    roof = precision
    if precision == "fp32" and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        roof = "tf32"
    origin = "measured" if spec.measured else "datasheet"
    return spec.peak_flops_per_s(roof), f"{origin}: {spec.name} ({spec.source})"


def with_mfu(
    rungs: Sequence[RungResult],
    flops_per_sample: float | None,
    device: torch.device,
    precisions: dict[str, str],
) -> tuple[tuple[RungResult, ...], str]:
    """Return the rungs with their MFU (None where unmeasured or no peak is known) and
    where the peaks came from. `precisions` maps each rung to the precision it ran in."""
    if not flops_per_sample:
        return tuple(rungs), ""
    out = []
    source = ""
    for r in rungs:
        peak, where = peak_for(precisions.get(r.name, "fp32"), device)
        rate = r.samples_per_s
        mfu = None
        if peak and rate:
            value = flops_per_sample * rate / peak
            mfu = value if 0 < value <= 1 else None
            source = source or where
        out.append(dataclasses.replace(r, mfu=mfu))
    return tuple(out), source


def graph_breaks_of(entry: dict[str, Any]) -> tuple[str, ...]:
    """Each graph break in a compile recorder's entry, as "where: reason"."""
    from gpuprof_nb.analysis.compile import explain_log
    from gpuprof_nb.io.modules import compile_log_of

    log = compile_log_of({"gpuprof_nb": {"compile": entry}}, "ladder compile rung")
    if log is None:
        return ()
    breaks, _ = explain_log(log, {})
    return tuple(f"{b.where}: {b.reason}" for b in breaks)
