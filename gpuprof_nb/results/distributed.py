"""A distributed run: every rank's numbers side by side, the ranks the others wait for, the
collectives, and the run's diagnosis (built by analysis/distributed.py, one rank per worker)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuprof_nb.results.diagnosis import Diagnosis, FindingKind
from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.exports import Exportable

if TYPE_CHECKING:
    from gpuprof_nb.results.report import ProfileReport


@dataclass(frozen=True, slots=True)
class RankSummary:
    """What one worker sends back for one rank: compact, whatever the trace's size.

    Totals are microseconds over the profiled window. `busy_us` is device busy time (host
    time inside torch ops for a trace without device activity); `compute_us` is the busy time
    outside collectives; `comm_us` the time in collectives (NCCL/RCCL kernels on GPU, gloo/c10d
    ranges on CPU) and `exposed_comm_us` the part no compute overlaps. `step_compute_us`,
    `step_comm_us`, `step_exposed_comm_us`: those inside each step; `steps_us`: the steps'
    time in all. `collective_calls`: for each kind of collective, the microseconds of each
    call in time order (the run matches them across ranks to find who waited), and
    `collective_in_step` whether each began inside a step: per-step figures count only what
    the steps hold. `error`: why the rank could not be read (every other field then
    empty)."""

    rank: int
    source: str
    world_size: int | None = None
    device: str = ""
    on_device: bool = False
    steps: int = 0
    median_step_us: float | None = None
    window_us: float = 0.0
    busy_us: float = 0.0
    compute_us: float = 0.0
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0
    idle_us: tuple[tuple[str, float], ...] = ()
    step_compute_us: tuple[float, ...] = ()
    collective_calls: tuple[tuple[str, tuple[float, ...]], ...] = ()
    collective_bytes: tuple[tuple[str, int], ...] = ()  # (name, bytes in all) where recorded
    collective_groups: tuple[tuple[str, int], ...] = ()  # (name, ranks in its group) recorded
    top_findings: tuple[FindingKind, ...] = ()
    error: str = ""
    steps_us: float = 0.0
    step_comm_us: tuple[float, ...] = ()
    step_exposed_comm_us: tuple[float, ...] = ()
    collective_in_step: tuple[tuple[str, tuple[bool, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank in the run's table (microseconds over the profiled window unless per step).
    `wait_us`: time this rank spent in collectives beyond the fastest rank's time for the
    same calls (waiting for peers), None when only one rank has collectives. `idle_us`: the
    idle-time breakdown by category (busy, dataloader, sync, launch, host, other)."""

    rank: int
    device: str
    steps: int
    median_step_us: float | None
    busy_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    wait_us: float | None
    compute_per_step_us: float | None
    idle_us: tuple[tuple[str, float], ...]
    source: str


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    """One collective across the run: calls and time summed over ranks, per rank on
    average; bytes where the trace records them (NCCL kernel args), and the algorithm and
    bus bandwidth from them (bus: what each link carried, NCCL's convention)."""

    name: str
    calls: int
    ranks: int
    time_us: float
    bytes: int | None = None
    algbw_bytes_per_s: float | None = None
    busbw_bytes_per_s: float | None = None


@dataclass(frozen=True, slots=True, eq=False)
class RunReport(Displayable, Exportable):
    """`analyze_run(traces)`: one row per rank (`ranks`), the ranks the others wait for, most
    likely first (`stragglers`, empty when none stands out), the collectives, and the run's
    diagnosis. `rank(n)` loads and analyses that rank's trace again on demand."""

    ranks: tuple[RankRow, ...]
    stragglers: tuple[int, ...]
    collectives: tuple[CollectiveRow, ...]
    diagnosis: Diagnosis
    world_size: int | None
    failures: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    step_compute_us: tuple[tuple[int, tuple[float, ...]], ...] = ()  # per rank, per step
    _load_rank: Callable[[int], ProfileReport] | None = field(default=None, repr=False)

    def rank(self, n: int) -> ProfileReport:
        """Return rank `n`'s full ProfileReport (its trace loaded and analysed again)."""
        if self._load_rank is None:
            raise LookupError("this RunReport cannot load its ranks again (built by hand)")
        return self._load_rank(n)

    def __repr__(self) -> str:
        who = ", ".join(str(r) for r in self.stragglers) or "none"
        return (
            f"<RunReport {len(self.ranks)} ranks, stragglers: {who}, "
            f"{len(self.collectives)} collectives, {len(self.failures)} failed>"
        )
