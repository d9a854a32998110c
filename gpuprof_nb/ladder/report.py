"""What the ladder measured, the pure rules that read it, and its JSON form.

Nothing here imports torch: a saved report can be loaded, compared and rendered anywhere.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.timing import TimingStats

FORMAT = "gpuprof_nb.ladder/1"

# Every rung the ladder knows, in the order it climbs them.
RUNG_NAMES = (
    "fp32",
    "bf16",
    "compile",
    "reduce_overhead",
    "fused_adamw",
    "grad_accum",
    "dataloader",
    "checkpoint",
)

# baseline: the fp32 reference; kept/dropped: measured and judged; flagged: the loss drifted;
# failed: raised (first line of the error in `reason`); skipped: not run (why in `reason`);
# reference: measured for the three-run reading only; trial: one setting of a sweep.
STATUSES = ("baseline", "kept", "dropped", "flagged", "failed", "skipped", "reference", "trial")


@dataclass(frozen=True, slots=True)
class RungResult:
    """One rung: the full configuration it ran, what it measured, and the verdict.
    Times in microseconds per optimizer step; memory in bytes; loss is the fp32 eval-mode
    loss on the slice's first batch after the last step (the same probe for every rung)."""

    name: str
    settings: str
    status: str
    reason: str = ""
    step_times_us: tuple[float, ...] = ()
    samples_per_step: int = 0
    peak_memory_bytes: int | None = None
    compile_time_us: float | None = None
    final_loss: float | None = None
    loss_drift: float | None = None
    trials: tuple[RungResult, ...] = ()

    @property
    def measured(self) -> bool:
        return bool(self.step_times_us)

    @property
    def timing(self) -> TimingStats:
        """The step times as TimingStats (wall clock, device synchronised before each read)."""
        return TimingStats(wall_us=self.step_times_us, steps_per_run=1)

    @property
    def step_median_us(self) -> float | None:
        return statistics.median(self.step_times_us) if self.step_times_us else None

    @property
    def step_iqr_us(self) -> float | None:
        return self.timing.iqr_us if self.step_times_us else None

    @property
    def samples_per_s(self) -> float | None:
        """Samples per second at the median step time."""
        median = self.step_median_us
        if not median or median <= 0:
            return None
        return self.samples_per_step / (median / 1e6)


@dataclass(frozen=True, slots=True)
class ThreeRunReading:
    """fp32 vs low precision vs low precision + torch.compile, in samples/s, and what it means.
    Gains are fractions (0.25 = 25% more samples/s)."""

    fp32_samples_per_s: float
    amp_samples_per_s: float | None
    compile_samples_per_s: float | None
    precision_gain: float | None
    compile_gain: float | None
    precision_is_bottleneck: bool | None
    verdict: str
    next_step: str
    amp_label: str = "bf16"


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
        raise GpuprofError(
            "three-run reading: the fp32 run has no throughput; measure fp32 first"
        )
    precision_gain = (
        amp_samples_per_s / fp32_samples_per_s - 1.0 if amp_samples_per_s else None
    )
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
) -> tuple[str, str]:
    """Return (status, reason) for a rung meant to go faster: flagged when the loss drifts
    beyond `loss_tolerance`, kept when it gains at least `min_gain`, else dropped."""
    gain = candidate_samples_per_s / current_samples_per_s - 1.0
    if loss_drift is None or loss_drift > loss_tolerance:
        drift = "unknown" if loss_drift is None else f"{loss_drift * 100:.2f}%"
        return (
            "flagged",
            f"loss drifted {drift} from the baseline (tolerance "
            f"{loss_tolerance * 100:.1f}%); not kept although throughput changed "
            f"{gain * 100:+.1f}%",
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
) -> tuple[str, str]:
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


@dataclass(frozen=True, slots=True)
class BatchPoint:
    """One batch size of the sweep: status 'ok', 'oom' (did not fit) or 'failed'."""

    batch_size: int
    status: str
    step_times_us: tuple[float, ...] = ()
    peak_memory_bytes: int | None = None
    error: str = ""

    @property
    def step_median_us(self) -> float | None:
        return statistics.median(self.step_times_us) if self.step_times_us else None

    @property
    def samples_per_s(self) -> float | None:
        median = self.step_median_us
        if not median or median <= 0:
            return None
        return self.batch_size / (median / 1e6)


def find_plateau(points: Sequence[BatchPoint], *, tolerance: float = 0.10) -> int | None:
    """Return the smallest batch size from which no larger batch size that ran raises
    samples/s by more than `tolerance` (the compute-bound plateau), or None with fewer
    than two measured points or when throughput still climbs at the largest size."""
    ok = sorted((p for p in points if p.samples_per_s), key=lambda p: p.batch_size)
    if len(ok) < 2:
        return None
    for i, point in enumerate(ok[:-1]):
        rate = point.samples_per_s or 0.0
        if all((later.samples_per_s or 0.0) <= rate * (1.0 + tolerance) for later in ok[i + 1:]):
            return point.batch_size
    return None


@dataclass(frozen=True, slots=True)
class BatchSweep:
    """Throughput against batch size for one configuration."""

    settings: str
    points: tuple[BatchPoint, ...]
    memory_method: str = ""
    plateau_tolerance: float = 0.10

    @property
    def plateau_batch_size(self) -> int | None:
        return find_plateau(self.points, tolerance=self.plateau_tolerance)

    @property
    def oom_batch_size(self) -> int | None:
        """The smallest batch size that ran out of memory, or None."""
        sizes = [p.batch_size for p in self.points if p.status == "oom"]
        return min(sizes) if sizes else None

    @property
    def best(self) -> BatchPoint | None:
        ok = [p for p in self.points if p.samples_per_s]
        return max(ok, key=lambda p: (p.samples_per_s or 0.0, -p.batch_size)) if ok else None

    def summary(self) -> str:
        """Return one paragraph: where throughput plateaus and where memory runs out."""
        parts = []
        plateau = self.plateau_batch_size
        if plateau is not None:
            parts.append(
                f"Throughput plateaus from batch size {plateau} (within "
                f"{self.plateau_tolerance * 100:.0f}%): compute bound there."
            )
        else:
            parts.append("Throughput had not plateaued at the largest batch size that ran.")
        oom = self.oom_batch_size
        if oom is not None:
            parts.append(f"Batch size {oom} ran out of memory.")
        else:
            parts.append("No batch size ran out of memory.")
        return " ".join(parts)

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> dict[str, Any]:
        from gpuprof_nb.render.ladder import batch_sweep_sections
        from gpuprof_nb.render.widgets import report_bundle

        return report_bundle("Batch-size sweep", batch_sweep_sections(self), include, exclude)


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One rung in two reports: samples/s in each and their ratio (this / other)."""

    name: str
    this_status: str
    other_status: str
    this_samples_per_s: float | None
    other_samples_per_s: float | None
    this_peak_memory_bytes: int | None
    other_peak_memory_bytes: int | None

    @property
    def speed_ratio(self) -> float | None:
        if not self.this_samples_per_s or not self.other_samples_per_s:
            return None
        return self.this_samples_per_s / self.other_samples_per_s


@dataclass(frozen=True, slots=True)
class LadderComparison:
    """Two ladder reports side by side (for example before and after a code change)."""

    this_label: str
    other_label: str
    rows: tuple[ComparisonRow, ...]
    this_speedup: float | None
    other_speedup: float | None

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> dict[str, Any]:
        from gpuprof_nb.render.ladder import comparison_sections
        from gpuprof_nb.render.widgets import report_bundle

        return report_bundle("Ladder comparison", comparison_sections(self), include, exclude)


@dataclass(frozen=True, slots=True)
class LadderReport:
    """Every rung the ladder ran on one model, the three-run reading and, if asked for, the
    batch-size sweep. `memory_method` says how peak memory was measured."""

    rungs: tuple[RungResult, ...]
    three_run: ThreeRunReading | None
    device_name: str
    memory_method: str
    steps: int
    warmup: int
    batch_size: int
    seed: int
    loss_tolerance: float
    torch_version: str = ""
    created_utc: str = ""
    label: str = ""
    notes: tuple[str, ...] = ()
    batch_sweep: BatchSweep | None = None

    @property
    def baseline(self) -> RungResult:
        for rung in self.rungs:
            if rung.status == "baseline":
                return rung
        raise GpuprofError("ladder report has no baseline rung (a damaged file?)")

    @property
    def kept(self) -> tuple[RungResult, ...]:
        return tuple(r for r in self.rungs if r.status == "kept")

    @property
    def final(self) -> RungResult:
        """The last kept rung (it ran with every kept rung combined), else the baseline."""
        kept = self.kept
        return kept[-1] if kept else self.baseline

    @property
    def speedup(self) -> float | None:
        """Combined samples/s of the final configuration over the fp32 baseline."""
        base, final = self.baseline.samples_per_s, self.final.samples_per_s
        return final / base if base and final else None

    @property
    def memory_ratio(self) -> float | None:
        """Peak memory of the final configuration over the baseline's."""
        base, final = self.baseline.peak_memory_bytes, self.final.peak_memory_bytes
        return final / base if base and final is not None else None

    def rung(self, name: str) -> RungResult:
        """Return the rung called `name`."""
        for r in self.rungs:
            if r.name == name:
                return r
        known = ", ".join(r.name for r in self.rungs)
        raise GpuprofError(f"no rung named {name!r} in this report; it has: {known}")

    @property
    def recommendation(self) -> str:
        """Return the final advice in words: which rungs to keep, combined speed-up, memory."""
        return recommend(self)

    def compare(self, other: LadderReport) -> LadderComparison:
        """Return this report and `other` side by side, rung by rung."""
        names = [r.name for r in self.rungs]
        names += [r.name for r in other.rungs if r.name not in names]
        rows = []
        for name in names:
            mine = next((r for r in self.rungs if r.name == name), None)
            theirs = next((r for r in other.rungs if r.name == name), None)
            rows.append(
                ComparisonRow(
                    name=name,
                    this_status=mine.status if mine else "absent",
                    other_status=theirs.status if theirs else "absent",
                    this_samples_per_s=mine.samples_per_s if mine else None,
                    other_samples_per_s=theirs.samples_per_s if theirs else None,
                    this_peak_memory_bytes=mine.peak_memory_bytes if mine else None,
                    other_peak_memory_bytes=theirs.peak_memory_bytes if theirs else None,
                )
            )
        return LadderComparison(
            this_label=self.label or self.created_utc or "this",
            other_label=other.label or other.created_utc or "other",
            rows=tuple(rows),
            this_speedup=self.speedup,
            other_speedup=other.speedup,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON-ready data (with a format tag)."""
        data = asdict(self)
        data["format"] = FORMAT
        return data

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON to `path` and return the path."""
        target = Path(path)
        target.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=True))
        return target

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> dict[str, Any]:
        from gpuprof_nb.render.ladder import ladder_sections
        from gpuprof_nb.render.widgets import report_bundle

        return report_bundle("Optimisation ladder", ladder_sections(self), include, exclude)


def recommend(report: LadderReport) -> str:
    """Return the advice in words for `report`: what to keep, the combined speed-up and
    memory against fp32, and what was dropped, flagged or failed."""
    kept = report.kept
    lines = []
    if not kept:
        lines.append(
            "Keep the fp32 baseline: no rung beat it on this model, data and device."
        )
    else:
        lines.append("Keep: " + "; ".join(f"{r.name} ({r.reason})" for r in kept) + ".")
        speedup = report.speedup
        if speedup is not None:
            lines.append(
                f"Combined: {speedup:.2f}x the fp32 baseline's samples/s "
                f"({report.final.settings})."
            )
    ratio = report.memory_ratio
    base_peak = report.baseline.peak_memory_bytes
    if ratio is not None and base_peak is not None and base_peak < 2**20:
        lines.append(
            f"Peak memory: under 1 MiB for the baseline ({report.memory_method}), too small "
            "to compare rungs by."
        )
    elif ratio is not None:
        lines.append(f"Peak memory: {ratio:.2f}x the baseline's ({report.memory_method}).")
    for status, verb in (("flagged", "Flagged"), ("failed", "Failed"), ("dropped", "Dropped")):
        group = [r for r in report.rungs if r.status == status]
        if group:
            lines.append(f"{verb}: " + "; ".join(f"{r.name} ({r.reason})" for r in group) + ".")
    if report.three_run is not None:
        lines.append(report.three_run.next_step)
    return "\n".join(lines)


def _rung_from(data: Mapping[str, Any]) -> RungResult:
    return RungResult(
        name=str(data["name"]),
        settings=str(data["settings"]),
        status=str(data["status"]),
        reason=str(data.get("reason", "")),
        step_times_us=tuple(float(t) for t in data.get("step_times_us", ())),
        samples_per_step=int(data.get("samples_per_step", 0)),
        peak_memory_bytes=_opt_int(data.get("peak_memory_bytes")),
        compile_time_us=_opt_float(data.get("compile_time_us")),
        final_loss=_opt_float(data.get("final_loss")),
        loss_drift=_opt_float(data.get("loss_drift")),
        trials=tuple(_rung_from(t) for t in data.get("trials", ())),
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def report_from_dict(data: Mapping[str, Any], *, where: str = "ladder report") -> LadderReport:
    """Return the LadderReport stored in `data` (as written by `LadderReport.to_dict`)."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
        raise GpuprofError(
            f"{where}: not a gpuprof_nb ladder report (format {found!r}, expected {FORMAT!r}); "
            "save one with LadderReport.save(path)"
        )
    try:
        three = data.get("three_run")
        sweep = data.get("batch_sweep")
        return LadderReport(
            rungs=tuple(_rung_from(r) for r in data["rungs"]),
            three_run=ThreeRunReading(**three) if three else None,
            device_name=str(data["device_name"]),
            memory_method=str(data["memory_method"]),
            steps=int(data["steps"]),
            warmup=int(data["warmup"]),
            batch_size=int(data["batch_size"]),
            seed=int(data["seed"]),
            loss_tolerance=float(data["loss_tolerance"]),
            torch_version=str(data.get("torch_version", "")),
            created_utc=str(data.get("created_utc", "")),
            label=str(data.get("label", "")),
            notes=tuple(str(n) for n in data.get("notes", ())),
            batch_sweep=BatchSweep(
                settings=str(sweep["settings"]),
                points=tuple(
                    BatchPoint(
                        batch_size=int(p["batch_size"]),
                        status=str(p["status"]),
                        step_times_us=tuple(float(t) for t in p.get("step_times_us", ())),
                        peak_memory_bytes=_opt_int(p.get("peak_memory_bytes")),
                        error=str(p.get("error", "")),
                    )
                    for p in sweep["points"]
                ),
                memory_method=str(sweep.get("memory_method", "")),
                plateau_tolerance=float(sweep.get("plateau_tolerance", 0.10)),
            )
            if sweep
            else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GpuprofError(
            f"{where}: a field is missing or has the wrong type ({type(exc).__name__}: {exc}); "
            "the file may be damaged or from another version - re-run the ladder and save again"
        ) from None


def load(path: str | Path) -> LadderReport:
    """Return the LadderReport saved at `path` by `LadderReport.save`."""
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise GpuprofError(f"{source}: cannot read the ladder report ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuprofError(
            f"{source}: not JSON ({exc.msg} at line {exc.lineno}); expected a file written by "
            "LadderReport.save"
        ) from None
    return report_from_dict(data, where=str(source))
