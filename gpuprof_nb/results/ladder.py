"""What the optimisation ladder measured: every rung, the three-run reading, the batch-size
sweep, two reports compared, and the advice in words. Nothing here imports torch: a saved
report (io/ladder.py) can be loaded, compared and displayed anywhere."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.ladder import FORMAT, check_format, write_ladder_json
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.results.compare import Verdict
from gpuprof_nb.results.display import Displayable

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


# baseline: the fp32 reference; kept/dropped: measured and judged (dropped: slower, or faster
# by less than is worth keeping); no clear change: measured inside the noise (see
# results/compare.Verdict), so not kept; flagged: the loss drifted;
# failed: raised (first line of the error in `reason`); skipped: not run (why in `reason`);
# reference: measured for the three-run reading only; trial: one setting of a sweep.
RungStatus = Literal[
    "baseline",
    "kept",
    "dropped",
    "no clear change",
    "flagged",
    "failed",
    "skipped",
    "reference",
    "trial",
]
STATUSES: tuple[RungStatus, ...] = get_args(RungStatus)
# A batch size of the sweep: it ran, it did not fit, or it failed for another reason.
BatchStatus = Literal["ok", "oom", "failed"]
BATCH_STATUSES: tuple[BatchStatus, ...] = get_args(BatchStatus)


@dataclass(frozen=True, slots=True)
class RungResult:
    """One rung: the full configuration it ran, what it measured, and the verdict.
    Times in microseconds per optimizer step; memory in bytes; loss is the fp32 eval-mode
    loss on the slice's first batch after the last step (the same probe for every rung)."""

    name: str
    settings: str
    status: RungStatus
    reason: str = ""
    step_times_us: tuple[float, ...] = ()
    samples_per_step: int = 0
    peak_memory_bytes: int | None = None
    compile_time_us: float | None = None
    final_loss: float | None = None
    loss_drift: float | None = None
    trials: tuple[RungResult, ...] = ()
    # Model FLOPs utilisation at the median step (the baseline's FLOPs per sample, against
    # the peak of this rung's precision), and the graph breaks torch.compile met in it.
    mfu: float | None = None
    graph_breaks: tuple[str, ...] = ()

    @property
    def measured(self) -> bool:
        return bool(self.step_times_us)

    @property
    def timing(self) -> TimingStats:
        """The step times as TimingStats (wall clock, device synchronised before each read)."""
        return TimingStats(wall_us=self.step_times_us, steps_per_run=1)

    @property
    def median_step_us(self) -> float | None:
        return statistics.median(self.step_times_us) if self.step_times_us else None

    @property
    def step_iqr_us(self) -> float | None:
        return self.timing.iqr_us if self.step_times_us else None

    @property
    def us_per_sample(self) -> tuple[float, ...]:
        """Each step's time over the samples it took (what two rungs' speeds compare by)."""
        n = self.samples_per_step or 1
        return tuple(t / n for t in self.step_times_us)

    @property
    def samples_per_s(self) -> float | None:
        """Samples per second at the median step time."""
        median = self.median_step_us
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


@dataclass(frozen=True, slots=True)
class BatchPoint:
    """One batch size of the sweep: status 'ok', 'oom' (did not fit) or 'failed'."""

    batch_size: int
    status: BatchStatus
    step_times_us: tuple[float, ...] = ()
    peak_memory_bytes: int | None = None
    error: str = ""

    @property
    def median_step_us(self) -> float | None:
        return statistics.median(self.step_times_us) if self.step_times_us else None

    @property
    def samples_per_s(self) -> float | None:
        median = self.median_step_us
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
        if all((later.samples_per_s or 0.0) <= rate * (1.0 + tolerance) for later in ok[i + 1 :]):
            return point.batch_size
    return None


@dataclass(frozen=True, slots=True)
class BatchSweep(Displayable):
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


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One rung in two reports: samples/s in each and their ratio (this / other)."""

    name: str
    this_status: RungStatus | Literal["absent"]
    other_status: RungStatus | Literal["absent"]
    this_samples_per_s: float | None
    other_samples_per_s: float | None
    this_peak_memory_bytes: int | None
    other_peak_memory_bytes: int | None
    # This rung against the other report's, from their step times (None where either was
    # not measured): the same noise-aware verdict as compare() and the ladder's own rungs.
    verdict: Verdict | None = None

    @property
    def speed_ratio(self) -> float | None:
        if not self.this_samples_per_s or not self.other_samples_per_s:
            return None
        return self.this_samples_per_s / self.other_samples_per_s


@dataclass(frozen=True, slots=True)
class LadderComparison(Displayable):
    """Two ladder reports side by side (for example before and after a code change)."""

    this_label: str
    other_label: str
    rows: tuple[ComparisonRow, ...]
    this_speedup: float | None
    other_speedup: float | None


@dataclass(frozen=True, slots=True)
class LadderReport(Displayable):
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
    # Model FLOPs per sample (one baseline step profiled, analysis/flops.py), and where the
    # peaks MFU is against came from.
    model_flops_per_sample: float | None = None
    peak_source: str = ""

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
                    verdict=Verdict.from_samples(theirs.us_per_sample, mine.us_per_sample)
                    if mine and theirs
                    else None,
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
        """Return the report as plain JSON-ready data (with the format tag)."""
        return {**asdict(self), "format": FORMAT}

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON to `path` (io/ladder.py) and return the path."""
        return write_ladder_json(self.to_dict(), path)


def recommend(report: LadderReport) -> str:
    """Return the advice in words for `report`: what to keep, the combined speed-up and
    memory against fp32, and what was dropped, flagged or failed."""
    kept = report.kept
    lines = []
    if not kept:
        lines.append("Keep the fp32 baseline: no rung beat it on this model, data and device.")
    else:
        lines.append("Keep: " + "; ".join(f"{r.name} ({r.reason})" for r in kept) + ".")
        speedup = report.speedup
        if speedup is not None:
            lines.append(
                f"Combined: {speedup:.2f}x the fp32 baseline's samples/s ({report.final.settings})."
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


# Far more than any ladder holds (about 15 rungs, a few trials each, tens of steps): a file
# past these is damaged or crafted, and is refused rather than rendered for minutes.
MAX_RUNGS = 1_000
MAX_TRIALS = 100
MAX_STEP_TIMES = 100_000
MAX_POINTS = 1_000


class _Bad(Exception):
    """A field of a ladder file that is missing or not what the format holds."""


def _field(data: Any, key: str, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise _Bad(f"{path} is {describe(data)}, expected an object")
    if key not in data:
        raise _Bad(f"{path}.{key} is missing")
    return data[key]


_S = TypeVar("_S", bound=str)


def _text(value: Any, path: str) -> str:
    if type(value) is not str:
        raise _Bad(f"{path} is {describe(value)}, expected a string")
    return value


def _choice(value: Any, path: str, allowed: tuple[_S, ...]) -> _S:
    """`value` if it is one of `allowed` (a closed set of strings), else a clear error."""
    for choice in allowed:
        if type(value) is str and value == choice:
            return choice
    raise _Bad(f"{path} is {describe(value)}, expected one of {', '.join(map(repr, allowed))}")


def _whole(value: Any, path: str, low: int = 0) -> int:
    if type(value) is not int or not low <= value < 2**62:
        raise _Bad(f"{path} is {describe(value)}, expected an integer of {low} or more")
    return value


def _real(
    value: Any, path: str, *, nan: bool = False, low: float | None = 0.0, high: float | None = None
) -> float:
    """A number: finite (NaN too with `nan`: a loss that diverged), `low` or more, `high` or
    less."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"{path} is {describe(value)}, expected a number")
    number = float(value)
    if math.isnan(number) and nan:
        return number
    if not math.isfinite(number) or (low is not None and number < low):
        bound = "a finite number" if low is None else f"a finite number of {low:g} or more"
        raise _Bad(f"{path} is {describe(value)}, expected {bound}")
    if high is not None and number > high:
        raise _Bad(f"{path} is {describe(value)}, expected a number of {high:g} or less")
    return number


def _list(value: Any, path: str, most: int) -> list[Any]:
    # A tuple where the dict came from to_dict() itself rather than a JSON file.
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise _Bad(f"{path} is {describe(value)}, expected a list")
    if len(value) > most:
        raise _Bad(f"{path} holds {len(value):,} items, more than any ladder ({most:,})")
    return value


def _times(value: Any, path: str) -> tuple[float, ...]:
    """Step times in microseconds: each a finite number above 0."""
    times = _list(value, path, MAX_STEP_TIMES)
    out = tuple(_real(t, f"{path}[{i}]") for i, t in enumerate(times))
    for i, t in enumerate(out):
        if t <= 0:
            raise _Bad(f"{path}[{i}] is {t:g}: a step takes more than 0 us")
    return out


def _flag(value: Any, path: str) -> bool | None:
    if value is not None and type(value) is not bool:
        raise _Bad(f"{path} is {describe(value)}, expected true, false or null")
    return value


def _optional(value: Any, read: Any, path: str, **kw: Any) -> Any:
    return None if value is None else read(value, path, **kw)


def _rung_from(data: Any, path: str, *, trial: bool = False) -> RungResult:
    if not isinstance(data, Mapping):
        raise _Bad(f"{path} is {describe(data)}, expected an object")
    get = data.get
    trials = _list(get("trials", []), f"{path}.trials", MAX_TRIALS)
    if trials and trial:
        raise _Bad(f"{path}.trials: a trial holds no trials of its own")
    return RungResult(
        name=_text(_field(data, "name", path), f"{path}.name"),
        settings=_text(_field(data, "settings", path), f"{path}.settings"),
        status=_choice(_field(data, "status", path), f"{path}.status", STATUSES),
        reason=_text(get("reason", ""), f"{path}.reason"),
        step_times_us=_times(get("step_times_us", []), f"{path}.step_times_us"),
        samples_per_step=_whole(get("samples_per_step", 0), f"{path}.samples_per_step"),
        peak_memory_bytes=_optional(get("peak_memory_bytes"), _whole, f"{path}.peak_memory_bytes"),
        compile_time_us=_optional(get("compile_time_us"), _real, f"{path}.compile_time_us"),
        final_loss=_optional(get("final_loss"), _real, f"{path}.final_loss", nan=True, low=None),
        loss_drift=_optional(get("loss_drift"), _real, f"{path}.loss_drift", nan=True, low=None),
        trials=tuple(
            _rung_from(t, f"{path}.trials[{i}]", trial=True) for i, t in enumerate(trials)
        ),
        mfu=_optional(get("mfu"), _real, f"{path}.mfu", high=1.0),  # a share of the peak
        graph_breaks=tuple(
            _text(g, f"{path}.graph_breaks[{j}]")
            for j, g in enumerate(
                _list(get("graph_breaks", []), f"{path}.graph_breaks", MAX_TRIALS)
            )
        ),
    )


def _three_run(data: Any, path: str) -> ThreeRunReading:
    if not isinstance(data, Mapping):
        raise _Bad(f"{path} is {describe(data)}, expected an object")
    get = data.get
    opt = functools.partial(_optional, read=_real)
    return ThreeRunReading(
        fp32_samples_per_s=_real(_field(data, "fp32_samples_per_s", path), f"{path}.fp32"),
        amp_samples_per_s=opt(get("amp_samples_per_s"), path=f"{path}.amp_samples_per_s"),
        compile_samples_per_s=opt(
            get("compile_samples_per_s"), path=f"{path}.compile_samples_per_s"
        ),
        precision_gain=opt(get("precision_gain"), path=f"{path}.precision_gain", low=None),
        compile_gain=opt(get("compile_gain"), path=f"{path}.compile_gain", low=None),
        precision_is_bottleneck=_flag(
            get("precision_is_bottleneck"), f"{path}.precision_is_bottleneck"
        ),
        verdict=_text(_field(data, "verdict", path), f"{path}.verdict"),
        next_step=_text(_field(data, "next_step", path), f"{path}.next_step"),
        amp_label=_text(get("amp_label", "bf16"), f"{path}.amp_label"),
    )


def _sweep(data: Any, path: str) -> BatchSweep:
    if not isinstance(data, Mapping):
        raise _Bad(f"{path} is {describe(data)}, expected an object")
    points = _list(_field(data, "points", path), f"{path}.points", MAX_POINTS)
    out = []
    for i, p in enumerate(points):
        here = f"{path}.points[{i}]"
        if not isinstance(p, Mapping):
            raise _Bad(f"{here} is {describe(p)}, expected an object")
        out.append(
            BatchPoint(
                batch_size=_whole(_field(p, "batch_size", here), f"{here}.batch_size", low=1),
                status=_choice(_field(p, "status", here), f"{here}.status", BATCH_STATUSES),
                step_times_us=_times(p.get("step_times_us", []), f"{here}.step_times_us"),
                peak_memory_bytes=_optional(
                    p.get("peak_memory_bytes"), _whole, f"{here}.peak_memory_bytes"
                ),
                error=_text(p.get("error", ""), f"{here}.error"),
            )
        )
    return BatchSweep(
        settings=_text(_field(data, "settings", path), f"{path}.settings"),
        points=tuple(out),
        memory_method=_text(data.get("memory_method", ""), f"{path}.memory_method"),
        plateau_tolerance=_real(data.get("plateau_tolerance", 0.10), f"{path}.plateau_tolerance"),
    )


def report_from_dict(data: Mapping[str, Any], *, where: str = "ladder report") -> LadderReport:
    """Return the LadderReport stored in `data` (as written by `LadderReport.to_dict`).
    Every field is checked against what the format holds (types, finite times above 0,
    bounded counts); anything else is a GpuprofError naming the field."""
    check_format(data, where)
    try:
        three = data.get("three_run")
        sweep = data.get("batch_sweep")
        notes = _list(data.get("notes", []), "notes", MAX_RUNGS)
        rungs = _list(_field(data, "rungs", "report"), "rungs", MAX_RUNGS)
        if not rungs:
            raise _Bad("rungs is empty: a ladder has at least its fp32 baseline")
        return LadderReport(
            rungs=tuple(_rung_from(r, f"rungs[{i}]") for i, r in enumerate(rungs)),
            three_run=_three_run(three, "three_run") if three else None,
            device_name=_text(_field(data, "device_name", "report"), "device_name"),
            memory_method=_text(_field(data, "memory_method", "report"), "memory_method"),
            steps=_whole(_field(data, "steps", "report"), "steps", low=1),
            warmup=_whole(_field(data, "warmup", "report"), "warmup"),
            batch_size=_whole(_field(data, "batch_size", "report"), "batch_size", low=1),
            seed=_whole(_field(data, "seed", "report"), "seed"),
            loss_tolerance=_real(_field(data, "loss_tolerance", "report"), "loss_tolerance"),
            torch_version=_text(data.get("torch_version", ""), "torch_version"),
            created_utc=_text(data.get("created_utc", ""), "created_utc"),
            label=_text(data.get("label", ""), "label"),
            notes=tuple(_text(n, f"notes[{i}]") for i, n in enumerate(notes)),
            batch_sweep=_sweep(sweep, "batch_sweep") if sweep else None,
            model_flops_per_sample=_optional(
                data.get("model_flops_per_sample"), _real, "model_flops_per_sample"
            ),
            peak_source=_text(data.get("peak_source", ""), "peak_source"),
        )
    except _Bad as exc:
        raise GpuprofError(
            f"{where}: a field is missing or has the wrong type: {exc}; the file is damaged "
            "or from another version - re-run the ladder and save it again"
        ) from None
