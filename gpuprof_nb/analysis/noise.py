"""How far the numbers of a run can be trusted: the spread of its timed samples, the other
work the utilisation sampler saw on the machine, and the time the cell's thread waited for
a core. `rule_noisy_measurement` turns them into the `noisy_measurement` finding (first in
the Diagnosis when present); `typical_spread` and `runs_to_settle` serve compare's verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.fixes import FIXES
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.utilisation import Utilisation
from gpuprof_nb.results.diagnosis import Finding, Severity
from gpuprof_nb.results.hotspots import Hotspots

# z for a two-sided 95% interval, and the standard error of a median over that of a mean
# for normal samples (sqrt(pi / 2)).
_Z95 = 1.96
_MEDIAN_SE = 1.2533


def spread_of(samples: Sequence[float]) -> float | None:
    """Slowest over fastest of the positive samples, None with fewer than two."""
    values = [v for v in samples if v > 0 and math.isfinite(v)]
    if len(values) < 2:
        return None
    return max(values) / min(values)


# The expected range of ten samples of normal noise, in standard deviations.
_RANGE_OF_TEN = 3.08


def typical_spread(samples: Sequence[float]) -> float | None:
    """How far the machine moved a side's samples, slowest over fastest, robust to a
    sample or two that a preemption or a one-off cost made slow: under five samples their
    own slowest over fastest; from five on, what ten samples of steady noise as wide as the
    middle half's would span (exp(3.08 x log_sigma)). None with fewer than two."""
    values = [v for v in samples if v > 0 and math.isfinite(v)]
    if len(values) < 5:
        return spread_of(values)
    sigma = log_sigma(values)
    return math.exp(_RANGE_OF_TEN * sigma) if sigma is not None else None


def log_sigma(samples: Sequence[float]) -> float | None:
    """A robust standard deviation of log(sample): the interquartile range of the logs over
    1.349 (a normal's), or, under four samples, their half-range; None under two."""
    logs = sorted(math.log(v) for v in samples if v > 0 and math.isfinite(v))
    n = len(logs)
    if n < 2:
        return None
    if n < 4:
        return (logs[-1] - logs[0]) / 2

    def q(p: float) -> float:
        pos = (n - 1) * p
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return logs[lo] + (logs[hi] - logs[lo]) * (pos - lo)

    return (q(0.75) - q(0.25)) / 1.349


def runs_to_settle(
    before: Sequence[float], after: Sequence[float], ratio: float, noise_floor: float
) -> int | None:
    """How many timed samples per side would put the 95% interval of the ratio of medians
    wholly beyond the noise floor, if the ratio stays what it is: n with
    z * 1.2533 * sqrt(s_b^2 + s_a^2) / sqrt(n) < |log ratio| - log(1 + floor), s the
    robust spread of each side's log samples. None when the ratio is within the floor
    (no number of runs makes it a change worth calling) or a side has no spread."""
    margin = abs(math.log(ratio)) - math.log(1 + noise_floor) if ratio > 0 else 0.0
    sb, sa = log_sigma(before), log_sigma(after)
    if margin <= 0 or sb is None or sa is None:
        return None
    need = (_Z95 * _MEDIAN_SE * math.hypot(sb, sa) / margin) ** 2
    return max(2, min(math.ceil(need), th.MAX_RUNS_TO_SETTLE))


def other_work_share(utilisation: Utilisation | None) -> float | None:
    """The share of the machine's CPU cores other processes kept busy, on average over the
    sampled intervals (each core's busy time less this process's own CPU time), or None
    without per-core and process series."""
    if utilisation is None:
        return None
    cores = utilisation.cpu_cores()
    process = utilisation.series_named("process")
    if not cores or process is None or not utilisation.ts_us:
        return None
    total = weight = 0.0
    for i in range(len(utilisation.ts_us)):
        width = utilisation.ts_us[i] - utilisation.interval_start_us(i)
        if width <= 0:
            continue
        busy = sum(s.values[i] for s in cores) / 100.0
        other = min(max(busy - process.values[i], 0.0), float(len(cores)))
        total += other * width
        weight += width
    if weight <= 0:
        return None
    return min(total / weight / len(cores), 1.0)


def rule_noisy_measurement(
    timing: TimingStats | None, utilisation: Utilisation | None, hotspots: Hotspots | None
) -> Finding | None:
    """The `noisy_measurement` finding when the timed samples spread more than
    NOISY_SAMPLE_SPREAD, other processes kept NOISY_OTHER_WORK_SHARE of the cores busy, or
    the cell's thread waited NOISY_WAITED_SHARE of its run for a core; None otherwise."""
    spread = spread_of(timing.times_us) if timing is not None else None
    other = other_work_share(utilisation)
    waited = timing.waited_fraction if timing is not None else None
    if hotspots is not None and hotspots.lost_us > 0:
        whole = hotspots.host_us + hotspots.lost_us
        profiled = hotspots.lost_us / whole if whole > 0 else None
        if profiled is not None and (waited is None or profiled > waited):
            waited = profiled
    reasons = []
    evidence: dict[str, float] = {}
    if spread is not None and timing is not None:
        evidence["timed_samples_count"] = float(timing.runs)
        evidence["sample_spread_ratio"] = spread
        if spread > th.NOISY_SAMPLE_SPREAD:
            reasons.append(
                f"the {timing.runs} timed samples spread {spread:.2f}x (slowest over fastest)"
            )
    if other is not None:
        evidence["other_work_cores_fraction"] = other
        if other >= th.NOISY_OTHER_WORK_SHARE:
            reasons.append(
                f"other processes kept {other * 100:.0f}% of the CPU cores busy while it ran"
            )
    if waited is not None:
        evidence["waited_for_a_core_fraction"] = waited
        if waited >= th.NOISY_WAITED_SHARE:
            reasons.append(
                f"the cell's thread waited for a core {waited * 100:.0f}% of the time it ran "
                "(other processes had the CPU)"
            )
    if not reasons:
        return None
    high = (spread or 0.0) >= th.NOISY_HIGH_SPREAD or (other or 0.0) >= (
        th.NOISY_HIGH_OTHER_WORK_SHARE
    )
    severity: Severity = "high" if high else "medium"
    title = (
        "Noisy measurement: "
        + "; ".join(reasons)
        + ". The times and shares below may be off by as much: read them with care"
    )
    return Finding("noisy_measurement", severity, title, evidence, FIXES["noisy_measurement"], 0.0)
