"""Utilisation sampled beside a profiled cell: CPU cores, this process and the GPU over time,
as series of values on one shared time axis (trace-clock microseconds).

Each value describes the interval that ends at its time: value i covers (ts_us[i-1],
ts_us[i]]. The first interval's start is not stored; it is taken as one sampling period
before ts_us[0] (the sampler's first interval is one period long, or shorter when the whole
cell was)."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

_CORE_NAME = re.compile(r"cpu(\d+)")


@dataclass(frozen=True, slots=True)
class UtilisationSeries:
    """One sampled quantity: `values[i]` belongs to the interval ending at the owning
    Utilisation's `ts_us[i]`. `unit` is '%', 'cores', 'bytes', 'W' or 'MHz'; `label` is
    what to call it in a report."""

    name: str
    unit: str
    label: str
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Utilisation:
    """Samples taken beside a cell: `source` says where they came from ('psutil', 'proc',
    'psutil+nvml', ...), `period_ms` is the sampling period, `ts_us` the trace-clock end of
    each interval, `notes` what could not be recorded and why. Nothing above the machine is
    built: a "%" series within 100, a "cores" series within `cores`."""

    source: str
    period_ms: float
    ts_us: tuple[float, ...]
    series: tuple[UtilisationSeries, ...]
    notes: tuple[str, ...] = ()
    # The CPU cores the process could run on (0: not recorded; the per-core series' count
    # then stands for it). No "cores" series exceeds it, nor a "%" series 100.
    cores: int = 0

    def __post_init__(self) -> None:
        most = self.cores or len(self.cpu_cores())
        for s in self.series:
            top = max(s.values, default=0.0)
            if (s.unit == "%" and top > 100 + 1e-6) or (
                s.unit == "cores" and most and top > most + 1e-6
            ):
                limit = "100%" if s.unit == "%" else f"{most} cores"
                raise ValueError(f"utilisation series {s.name!r} reaches {top!r}, above {limit}")

    @property
    def samples_per_s(self) -> float:
        """The sampling rate achieved, samples per second: from the spacing of the samples
        the thread took (the last interval, ended by stop, is shorter), else from the
        period. A Python-bound cell holds the GIL, which the sampler waits for, so the rate
        can be well under 1000 / period_ms."""
        ts = self.ts_us
        if len(ts) >= 3 and ts[-2] > ts[0]:
            return (len(ts) - 2) / (ts[-2] - ts[0]) * 1e6
        return 1e3 / self.period_ms if self.period_ms > 0 else 0.0

    def series_named(self, name: str) -> UtilisationSeries | None:
        """Return the series called `name`, or None when it was not recorded."""
        return next((s for s in self.series if s.name == name), None)

    def cpu_cores(self) -> tuple[UtilisationSeries, ...]:
        """Return the per-core series ('cpu0', 'cpu1', ...) in core order."""
        cores = [
            (int(m.group(1)), s)
            for s in self.series
            if (m := _CORE_NAME.fullmatch(s.name)) is not None
        ]
        return tuple(s for _, s in sorted(cores, key=lambda c: c[0]))

    def interval_start_us(self, i: int) -> float:
        """Return the trace-clock start of interval i (the end of interval i - 1; for the
        first, one period before its end)."""
        return self.ts_us[i - 1] if i > 0 else self.ts_us[0] - self.period_ms * 1e3

    def mean_over(self, name: str, lo_us: float, hi_us: float) -> float | None:
        """Return the time-weighted mean of series `name` over [lo_us, hi_us]: each interval
        weighted by how much of it lies inside. For lo_us == hi_us, the value of the
        interval holding that instant. None when the series is missing or no interval
        overlaps."""
        s = self.series_named(name)
        if s is None or not self.ts_us or hi_us < lo_us:
            return None
        ts = self.ts_us
        # Intervals ending before lo cannot overlap: start from the first ending at or after.
        first = bisect.bisect_left(ts, lo_us)
        if lo_us == hi_us:
            inside = first < len(ts) and self.interval_start_us(first) <= lo_us
            return s.values[first] if inside else None
        weight = total = 0.0
        for i in range(first, len(ts)):
            start = self.interval_start_us(i)
            if start >= hi_us:
                break
            overlap = min(ts[i], hi_us) - max(start, lo_us)
            if overlap > 0:
                weight += overlap
                total += overlap * s.values[i]
        return total / weight if weight > 0 else None

    def summary(self) -> dict[str, float]:
        """Return '<name>_mean' (time-weighted over every interval) and '<name>_max' for each
        series that holds values."""
        out: dict[str, float] = {}
        if not self.ts_us:
            return out
        lo, hi = self.interval_start_us(0), self.ts_us[-1]
        for s in self.series:
            if not s.values:
                continue
            mean = self.mean_over(s.name, lo, hi)
            out[f"{s.name}_mean"] = mean if mean is not None else s.values[0]
            out[f"{s.name}_max"] = max(s.values)
        return out
