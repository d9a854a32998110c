"""Host time by Python frame and source line, and the idle time charged to each line (built
by analysis/hotspots.py). Microseconds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuprof_nb.model.frames import FrameKind
from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.invariants import check_share, check_within

# Lines from the line sampler (`%%gpuprofile --stack`), or functions from the profiler's
# python_function events (offline traces recorded with with_stack=True).
Granularity = Literal["line", "function"]


@dataclass(frozen=True, slots=True)
class HotLine:
    """One user line (a function, at function granularity), with the host time in which it
    was the innermost user frame running (`host_us`, calls into libraries included), the idle
    time charged to it (`idle_us`: device idle gaps on GPU, gaps between ops on CPU) and
    their shares of the sampled host time (`share`) and of all idle time (`idle_share`).
    `idle_by_cause_us` splits `idle_us` by the gap causes of the Timeline."""

    label: str
    host_us: float
    idle_us: float
    share: float
    idle_share: float
    text: str = ""
    file: str = ""
    line: int = 0
    function: str = ""
    idle_by_cause_us: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_share("HotLine", "share", self.share)
        check_share("HotLine", "idle_share", self.idle_share)
        check_within("HotLine", "idle_us", self.idle_us, self.host_us, "host_us")

    @property
    def named(self) -> str:
        """`In [7], line 4` (`loss.item()`): the label, with the line's text when known."""
        return f"`{self.label}` (`{self.text}`)" if self.text else f"`{self.label}`"


@dataclass(frozen=True, slots=True)
class FlameNode:
    """One block of the icicle chart: a user frame, or a run of library frames collapsed into
    one (`frames` of them; `detail` names the innermost one seen most). `parent` indexes
    `Hotspots.nodes` (-1 for the roots); `total_us` includes the children's time."""

    label: str
    kind: FrameKind
    parent: int
    depth: int
    total_us: float
    self_us: float
    frames: int = 1
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Hotspots(Displayable):
    """Where the host's time went, by Python frame, and which user lines kept the device
    waiting. `lines` are the top user lines, most host time first; `nodes` the icicle's
    blocks, parents before children. `host_us` is the host time the stacks cover, `idle_us`
    the idle time (Timeline gaps) within it, `idle_charged_us` the part of it charged to a
    user line. `on_device`: the idle time is the device's (else gaps between host ops)."""

    granularity: Granularity
    source: str
    host_us: float
    idle_us: float
    idle_charged_us: float
    samples: int
    lines: tuple[HotLine, ...]
    nodes: tuple[FlameNode, ...] = ()
    on_device: bool = False
    notes: tuple[str, ...] = ()
    # Time the cell's thread waited for a core while other processes ran (exact line
    # events on Linux): charged to no line, and left out of host_us and idle_us.
    lost_us: float = 0.0

    def __post_init__(self) -> None:
        check_within("Hotspots", "idle_charged_us", self.idle_charged_us, self.idle_us, "idle_us")
        held = sum(line.host_us for line in self.lines)
        check_within("Hotspots", "the lines' host_us", held, self.host_us, "host_us")

    def top_idle_lines(
        self, causes: Iterable[str] | None = None, n: int = 2, min_share: float = 0.01
    ) -> list[tuple[HotLine, float]]:
        """Return up to `n` lines with the most idle time of the given gap causes (all when
        None), as (line, share of all idle time), each at least `min_share`."""
        wanted = None if causes is None else frozenset(causes)
        scored = []
        for line in self.lines:
            us = (
                line.idle_us
                if wanted is None
                else sum(v for k, v in line.idle_by_cause_us.items() if k in wanted)
            )
            share = us / self.idle_us if self.idle_us > 0 else 0.0
            if share >= min_share:
                scored.append((line, share))
        scored.sort(key=lambda p: (-p[1], p[0].label))
        return scored[:n]
