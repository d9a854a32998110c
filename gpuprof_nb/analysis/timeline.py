"""PLACEHOLDER (owned by the diagnosis work): device idle-time breakdown per window and step."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof_nb.analysis.intervals import device_busy_us
from gpuprof_nb.model.trace import Trace


@dataclass(frozen=True, slots=True)
class Timeline:
    window_us: float
    busy_us: float

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0


def device_timeline(trace: Trace) -> Timeline:
    """Return the device's busy/idle time over the trace window (placeholder)."""
    return Timeline(window_us=trace.duration_us, busy_us=device_busy_us(trace))
