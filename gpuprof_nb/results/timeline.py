"""The device's busy and idle time over a profiled window, per step and per gap, with the
cause of each idle stretch (built by analysis/timeline.py). Microseconds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.invariants import check_sum, check_within

IdleCause = Literal["dataloader", "sync", "launch", "host", "other"]


IDLE_CAUSES: tuple[IdleCause, ...] = ("dataloader", "sync", "launch", "host", "other")


@dataclass(frozen=True, slots=True)
class IdleGap:
    """One stretch of device idle time (microseconds) and its cause."""

    start_us: float
    end_us: float
    cause: IdleCause

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class IdleBreakdown:
    """Microseconds of a span by category; the six categories sum to `span_us`."""

    span_us: float
    busy_us: float
    dataloader_us: float
    sync_us: float
    launch_us: float
    host_us: float
    other_us: float
    # Part of host_us in which a host thread was inside a torch op (dispatch, not Python).
    host_in_ops_us: float = 0.0

    def __post_init__(self) -> None:
        check_sum("IdleBreakdown", self.us_by_category(), self.span_us, "span_us")
        check_within(
            "IdleBreakdown", "host_in_ops_us", self.host_in_ops_us, self.host_us, "host_us"
        )

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us

    def us_by_category(self) -> dict[str, float]:
        """Return {category: microseconds}, busy first, then the idle causes."""
        return {
            "busy": self.busy_us,
            "dataloader": self.dataloader_us,
            "sync": self.sync_us,
            "launch": self.launch_us,
            "host": self.host_us,
            "other": self.other_us,
        }

    def fraction(self, category: str) -> float:
        """Return the share (0..1) of the span in one category (0 for an empty span)."""
        return self.us_by_category()[category] / self.span_us if self.span_us > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """The breakdown of one training step (`ProfilerStep#N`)."""

    number: int
    name: str
    start_us: float
    end_us: float
    breakdown: IdleBreakdown

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class Timeline(Displayable):
    """The device's busy and idle time over the profiled window (microseconds): overall,
    per step, and the gaps with their causes. `window_us` is the window's length."""

    window_us: float
    busy_us: float
    start_us: float = 0.0
    end_us: float = 0.0
    device: int | None = None
    on_device: bool = False
    breakdown: IdleBreakdown | None = None
    steps: tuple[StepTimeline, ...] = ()
    gaps: tuple[IdleGap, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_within("Timeline", "busy_us", self.busy_us, self.window_us, "window_us")

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0

    @property
    def representative_step(self) -> StepTimeline | None:
        """The step of median duration (the shorter of the two middle ones; ties: lower
        number), or None without steps."""
        if not self.steps:
            return None
        ordered = sorted(self.steps, key=lambda s: (s.dur_us, s.number))
        return ordered[(len(ordered) - 1) // 2]
