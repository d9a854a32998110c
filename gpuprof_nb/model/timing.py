"""Run timings of a cell, measured without the profiler attached."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# Slowest over fastest run above which the timing is flagged as noisy.
NOISY_RATIO = 1.5


def _quantile(values: tuple[float, ...], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method), q in [0, 1]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class TimingStats:
    """Per-run times in microseconds. `device_us` comes from CUDA events (None on CPU);
    `wall_us` from perf_counter_ns around a synchronised run. Warm-up runs are kept apart
    and never enter the statistics; `once` means the single measured run was also the first;
    `profiled` means that run had the profiler attached (so its time includes the overhead);
    `steps_per_run` is the number of training steps the profiled run held, when known.
    `number` is how many back-to-back runs each sample timed: each entry of `wall_us` and
    `device_us` is that block's time divided by `number` (1: every entry is one run).
    `calibration_runs` counts the untimed runs between the warm-up and the samples that sized
    the blocks (0 when every sample is one run)."""

    wall_us: tuple[float, ...]
    device_us: tuple[float, ...] | None = None
    warmup_wall_us: tuple[float, ...] = ()
    once: bool = False
    device_name: str = "cpu"
    steps_per_run: int | None = None
    profiled: bool = False
    number: int = 1
    calibration_runs: int = 0
    # The share of the timed samples' wall time the cell's thread spent waiting for a core
    # while ready to run (other processes had the CPU; Linux's run delay), None where the
    # OS does not say.
    waited_fraction: float | None = None

    @property
    def times_us(self) -> tuple[float, ...]:
        """The times the statistics are over: device time where measured, else wall time."""
        return self.device_us if self.device_us else self.wall_us

    @property
    def median_step_us(self) -> float | None:
        """Median time per training step: the median run time over `steps_per_run`."""
        if not self.steps_per_run or not self.times_us:
            return None
        return self.median_us / self.steps_per_run

    @property
    def runs(self) -> int:
        """The number of timed samples (each of `number` runs)."""
        return len(self.wall_us)

    @property
    def timed_runs(self) -> int:
        """The number of timed runs of the cell: samples times runs per sample."""
        return len(self.wall_us) * self.number

    @property
    def cell_runs(self) -> int:
        """Every run of the cell the timing made: warm-up, calibration and timed runs (a
        profiled run, when there is one, comes on top)."""
        return len(self.warmup_wall_us) + self.calibration_runs + self.timed_runs

    @property
    def median_us(self) -> float:
        return statistics.median(self.times_us) if self.times_us else float("nan")

    @property
    def iqr_us(self) -> float:
        t = self.times_us
        return _quantile(t, 0.75) - _quantile(t, 0.25) if t else float("nan")

    @property
    def min_us(self) -> float:
        return min(self.times_us) if self.times_us else float("nan")

    @property
    def max_us(self) -> float:
        return max(self.times_us) if self.times_us else float("nan")

    @property
    def noisy(self) -> bool:
        """True when the slowest run took over NOISY_RATIO x the fastest (results are
        unstable). Runs that measured zero (below the clock's resolution) cannot be judged."""
        return self.runs > 1 and self.min_us > 0 and self.max_us > NOISY_RATIO * self.min_us
