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


StreamIdleCause = Literal["host_wait", "kernel_wait", "other"]
STREAM_IDLE_CAUSES: tuple[StreamIdleCause, ...] = ("host_wait", "kernel_wait", "other")


@dataclass(frozen=True, slots=True)
class StreamIdle:
    """Idle time between consecutive activities (kernels, memcpys, memsets) of one stream,
    by HolisticTraceAnalysis's three causes (microseconds): `host_wait`, the next one's
    launch call started after the previous one ended (the host had not issued it yet);
    `kernel_wait`, a shorter gap than analysis/streams.KERNEL_WAIT_MAX_US otherwise (the
    launch path itself); `other`, the rest (work was queued but the stream still waited:
    on another stream, an event, a copy engine). `busy_us` is the activities' summed time."""

    device: int
    stream: int
    activities: int
    busy_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_us: float

    @property
    def idle_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us

    def us_by_cause(self) -> dict[str, float]:
        return {
            "host_wait": self.host_wait_us,
            "kernel_wait": self.kernel_wait_us,
            "other": self.other_us,
        }

    def fraction(self, cause: str) -> float:
        """Return one cause's share (0..1) of the stream's idle time (0 without idle time)."""
        idle = self.idle_us
        return self.us_by_cause()[cause] / idle if idle > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StreamQueue:
    """The launch queue of one stream: how many of its activities had been launched (their
    runtime call had started) but not yet started on the device. Over the stream's span, from
    its first launch to its last activity's start: the largest length, the time-weighted mean
    and median, and the share of the time it was empty; `event_mean` is the mean over the
    points where the length changes (what HolisticTraceAnalysis's summary reports).
    `strip` holds the largest length in each of equal bins of the drawn span
    (Timeline.queue_span_us)."""

    device: int
    stream: int
    launches: int
    max_length: int
    mean_length: float
    median_length: float
    empty_fraction: float
    event_mean: float
    strip: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LaunchWait:
    """One device activity and how long it waited after its launch call returned."""

    name: str
    stream: int
    start_us: float
    delay_us: float
    launch_name: str
    launch_dur_us: float


@dataclass(frozen=True, slots=True)
class LaunchDelays:
    """From a launch call's return to its activity's start on the device (microseconds,
    clipped at 0: an activity may start before its call returns), over every activity of the
    timeline's device that has a launch call; `longest` are those that waited longest."""

    count: int
    median_us: float
    p95_us: float
    max_us: float
    mean_us: float
    longest: tuple[LaunchWait, ...] = ()


# What a lane's bar is: a top-level torch op ("op"), or a device activity by its class.
BarKind = Literal["op", "gemm", "elementwise", "comm", "copy"]
# One bar: (start_us, end_us, kind, name).
Bar = tuple[float, float, BarKind, str]


@dataclass(frozen=True, slots=True)
class TimelineLane:
    """One lane of a timeline drawing: `label` (`CPU thread 7`, `GPU 0 stream 13`), what its
    bars are ("ops", "kernels") and the bars, by (start, end)."""

    label: str
    what: str
    bars: tuple[Bar, ...]


@dataclass(frozen=True, slots=True)
class TimelineLanes:
    """What a drawing of [start_us, end_us] shows of the trace (analysis/lanes.py): the
    busiest CPU threads' top-level ops, then the device's streams; empty when the trace has
    neither there."""

    start_us: float
    end_us: float
    lanes: tuple[TimelineLane, ...] = ()


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
    # Per stream of the device (analysis/streams.py): idle time by cause, the launch queue,
    # and the delays from launch calls to activities; the queue strips cover queue_span_us.
    streams: tuple[StreamIdle, ...] = ()
    queues: tuple[StreamQueue, ...] = ()
    queue_span_us: tuple[float, float] | None = None
    launch_delays: LaunchDelays | None = None

    def __post_init__(self) -> None:
        check_within("Timeline", "busy_us", self.busy_us, self.window_us, "window_us")

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0

    def drawn_span(
        self, step: StepTimeline | int | None = None
    ) -> tuple[StepTimeline | None, float, float]:
        """Return what a drawing of `step` (a StepTimeline, a step number, or None: the
        whole window) covers: the step (None when not found or not asked) and its start and
        end in microseconds, at least a nanosecond apart."""
        if isinstance(step, int):
            step = next((s for s in self.steps if s.number == step), None)
        lo, hi = (step.start_us, step.end_us) if step is not None else (self.start_us, self.end_us)
        return step, lo, max(hi, lo + 1e-3)

    @property
    def representative_step(self) -> StepTimeline | None:
        """The step of median duration (the shorter of the two middle ones; ties: lower
        number), or None without steps."""
        if not self.steps:
            return None
        ordered = sorted(self.steps, key=lambda s: (s.dur_us, s.number))
        return ordered[(len(ordered) - 1) // 2]
