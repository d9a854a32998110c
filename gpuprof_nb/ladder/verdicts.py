"""The pure rules that read what the ladder measured (the three-run reading, which rungs to
keep), and loading a saved report. The results themselves are in results/ladder.py, the
file format in io/ladder.py; nothing here imports torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.ladder import read_ladder_json
from gpuprof_nb.results.compare import Verdict
from gpuprof_nb.results.ladder import (
    RUNG_NAMES,
    STATUSES,
    BatchPoint,
    BatchSweep,
    ComparisonRow,
    LadderComparison,
    LadderReport,
    RungResult,
    RungStatus,
    ThreeRunReading,
    find_plateau,
    recommend,
    report_from_dict,
)

__all__ = [
    "RUNG_NAMES",
    "STATUSES",
    "BatchPoint",
    "BatchSweep",
    "ComparisonRow",
    "LadderComparison",
    "LadderReport",
    "RungResult",
    "ThreeRunReading",
    "find_plateau",
    "judge_checkpoint_rung",
    "judge_speed_rung",
    "load",
    "read_three_runs",
    "recommend",
    "relative_drift",
    "report_from_dict",
]


def read_three_runs(
    fp32_samples_per_s: float,
    amp_samples_per_s: float | None,
    compile_samples_per_s: float | None,
    *,
    precision_threshold: float = 0.20,
    compile_threshold: float = 0.10,
    amp_label: str = "bf16",
) -> ThreeRunReading:
    """Return the three-run reading: under `precision_threshold` gain from low precision means
    the bottleneck is not precision (go to the data loader rung); under `compile_threshold`
    gain from compile means the kernels are already well fused for these shapes."""
    if not fp32_samples_per_s or fp32_samples_per_s <= 0 or math.isnan(fp32_samples_per_s):
        raise GpuprofError("three-run reading: the fp32 run has no throughput; measure fp32 first")
    precision_gain = amp_samples_per_s / fp32_samples_per_s - 1.0 if amp_samples_per_s else None
    compile_gain = (
        compile_samples_per_s / amp_samples_per_s - 1.0
        if compile_samples_per_s and amp_samples_per_s
        else None
    )
    parts: list[str] = []
    if precision_gain is None:
        bottleneck = None
        parts.append(f"{amp_label} autocast was not measured, so precision is untested.")
        next_step = "Measure low precision, or go on to the data loader rung."
    # The epsilon keeps 120/100 - 1 = 0.19999... on the 'gained 20%' side.
    elif precision_gain < precision_threshold - 1e-9:
        bottleneck = False
        parts.append(
            f"{amp_label} autocast changed throughput by {precision_gain * 100:+.1f}% "
            f"(under {precision_threshold * 100:.0f}%): the bottleneck is not precision."
        )
        next_step = (
            "Look at the data loader before the model: go to the DataLoader rung "
            "(num_workers, pin_memory, persistent_workers, prefetch_factor)."
        )
    else:
        bottleneck = True
        parts.append(
            f"{amp_label} autocast gained {precision_gain * 100:+.1f}%: the step is bound by "
            "math precision, so low precision pays."
        )
        next_step = "Keep low precision; then compile and the optimizer rungs."
    if compile_gain is None:
        parts.append("torch.compile was not measured on top of it.")
    elif compile_gain < 0:
        parts.append(
            f"torch.compile made it slower ({compile_gain * 100:+.1f}%): the kernels are "
            "already well fused for these shapes, or compiled-code overhead dominates at this "
            "size."
        )
    elif compile_gain < compile_threshold - 1e-9:
        parts.append(
            f"torch.compile added {compile_gain * 100:+.1f}% (under "
            f"{compile_threshold * 100:.0f}%): the kernels are already well fused for these "
            "shapes."
        )
    else:
        parts.append(f"torch.compile added {compile_gain * 100:+.1f}% on top.")
    return ThreeRunReading(
        fp32_samples_per_s=fp32_samples_per_s,
        amp_samples_per_s=amp_samples_per_s,
        compile_samples_per_s=compile_samples_per_s,
        precision_gain=precision_gain,
        compile_gain=compile_gain,
        precision_is_bottleneck=bottleneck,
        verdict=" ".join(parts),
        next_step=next_step,
        amp_label=amp_label,
    )


def relative_drift(loss: float | None, baseline_loss: float | None) -> float | None:
    """Return |loss - baseline| / |baseline| (a fraction), or None where either is missing or
    not finite (a NaN loss is infinitely far from the baseline)."""
    if loss is None or baseline_loss is None:
        return None
    if not math.isfinite(loss):
        return math.inf
    return abs(loss - baseline_loss) / max(abs(baseline_loss), 1e-12)


def judge_speed_rung(
    current_samples_per_s: float,
    candidate_samples_per_s: float,
    loss_drift: float | None,
    *,
    loss_tolerance: float,
    min_gain: float,
    current_us_per_sample: Sequence[float] = (),
    candidate_us_per_sample: Sequence[float] = (),
) -> tuple[RungStatus, str]:
    """Return (status, reason) for a rung meant to go faster: flagged when the loss drifts
    beyond `loss_tolerance`; else, by the noise-aware verdict on the step times per sample
    (results/compare.Verdict, the one compare() gives, with `min_gain` as its floor: the
    rungs are measured back to back in one process, and a gain is worth keeping from
    `min_gain` on): 'no clear change' when the difference is inside the noise, dropped when
    slower, kept when faster. Without two step times a side, by the medians alone."""
    gain = candidate_samples_per_s / current_samples_per_s - 1.0
    if loss_drift is None or loss_drift > loss_tolerance:
        drift = "unknown" if loss_drift is None else f"{loss_drift * 100:.2f}%"
        return (
            "flagged",
            f"loss drifted {drift} from the baseline (tolerance "
            f"{loss_tolerance * 100:.1f}%); not kept although throughput changed "
            f"{gain * 100:+.1f}%",
        )
    verdict = Verdict.from_samples(
        current_us_per_sample, candidate_us_per_sample, noise_floor=min_gain
    )
    if verdict is not None and verdict.kind == "no clear change":
        return "no clear change", (
            f"{gain * 100:+.1f}% samples/s, inside the noise (95% interval of the time "
            f"ratio {verdict.ci_low:.3g}x to {verdict.ci_high:.3g}x); not kept"
        )
    if gain >= min_gain:
        return "kept", f"{gain * 100:+.1f}% samples/s over the rungs kept so far"
    if gain < 0:
        return "dropped", f"{-gain * 100:.1f}% slower than the rungs kept so far"
    return "dropped", f"{gain * 100:+.1f}% samples/s, under the {min_gain * 100:.0f}% worth keeping"


def judge_checkpoint_rung(
    current_samples_per_s: float,
    current_peak_bytes: int | None,
    candidate_samples_per_s: float,
    candidate_peak_bytes: int | None,
    loss_drift: float | None,
    *,
    loss_tolerance: float,
    min_memory_saved: float = 0.25,
    max_time_paid: float = 0.35,
    min_measurable_bytes: int = 2**20,
) -> tuple[RungStatus, str]:
    """Return (status, reason) for activation checkpointing: kept when it saves at least
    `min_memory_saved` of peak memory for at most `max_time_paid` more time per sample."""
    time_paid = current_samples_per_s / candidate_samples_per_s - 1.0
    if loss_drift is None or loss_drift > loss_tolerance:
        drift = "unknown" if loss_drift is None else f"{loss_drift * 100:.2f}%"
        return "flagged", f"loss drifted {drift} from the baseline; not kept"
    if not current_peak_bytes or candidate_peak_bytes is None:
        return "dropped", (
            f"costs {time_paid * 100:+.1f}% time; memory saved unknown (no peak measured)"
        )
    if max(current_peak_bytes, candidate_peak_bytes) < min_measurable_bytes:
        # At this scale a saving matters to nobody and ratios of tiny numbers mislead.
        return "dropped", (
            f"costs {time_paid * 100:+.1f}% time; peak memory under "
            f"{min_measurable_bytes // 2**20} MiB either way, too small to show a saving"
        )
    saved = 1.0 - candidate_peak_bytes / current_peak_bytes
    text = f"saves {saved * 100:.1f}% peak memory for {time_paid * 100:+.1f}% time per sample"
    if saved >= min_memory_saved and time_paid <= max_time_paid:
        return "kept", text
    return "dropped", (
        f"{text}; worth it only when memory is the limit (kept at >= "
        f"{min_memory_saved * 100:.0f}% saved for <= {max_time_paid * 100:.0f}% time)"
    )


def load(path: str | Path) -> LadderReport:
    """Return the LadderReport saved at `path` by `LadderReport.save`."""
    return report_from_dict(read_ladder_json(path), where=str(path))
