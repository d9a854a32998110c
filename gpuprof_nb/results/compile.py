"""What torch.compile did in a cell and why it did not pay off: the graphs it made, every
graph break (where, why, what to change), every recompile (the guard that failed) and the
compile time per frame (built by analysis/compile.py). Seconds and microseconds."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof_nb.results.display import Displayable


@dataclass(frozen=True, slots=True)
class GraphBreak:
    """One place Dynamo stopped tracing: `where` names the user's line (`In [4], line 2`,
    `train.py:88 step`), `source` is its text, `reason` Dynamo's one-line reason,
    `explanation` its longer words, `fix` what to change; `count` the compiles that met it."""

    where: str
    file: str
    line: int
    source: str
    reason: str
    explanation: str
    fix: str
    count: int


@dataclass(frozen=True, slots=True)
class Recompile:
    """A frame compiled again: `function` (where it starts) and the guards that failed, each
    "F/G: reason" as Dynamo wrote it; `fix` what keeps it from happening."""

    compile_id: str
    function: str
    where: str
    reasons: tuple[str, ...]
    fix: str


@dataclass(frozen=True, slots=True)
class FrameCompile:
    """One compile of one frame: compile time (seconds), ops in the graph it made (0: none),
    and `earlier` when it was compiled before this cell ran."""

    compile_id: str
    function: str
    where: str
    compile_time_s: float | None
    graph_ops: int | None
    earlier: bool


@dataclass(frozen=True, slots=True)
class CompileReport(Displayable):
    """torch.compile in one cell. `graphs` graphs were made in it (frames compiled with at
    least one op); `regions` calls of compiled graphs ran in the profiled run, and
    `between_regions_us` of host time went by between one compiled region and the next
    one a graph break resumed in (eager code the break left out of the graph), over `steps`
    steps. `compile_time_s` sums the frames compiled in this cell."""

    graphs: int
    breaks: tuple[GraphBreak, ...]
    recompiles: tuple[Recompile, ...]
    frames: tuple[FrameCompile, ...]
    compile_time_s: float
    regions: int
    between_regions_us: float
    steps: int = 1
    logged: bool = True
    notes: tuple[str, ...] = ()
    # Distinct compiled graphs ("F/G") the profiled run called.
    graphs_ran: int = 0


@dataclass(frozen=True, slots=True)
class GraphReplay:
    """Kernels replayed from CUDA graphs, grouped by where the graph launch
    (`cudaGraphLaunch`) was called: `launched_from` is the innermost torch op around the
    launch (else the innermost annotation, else "(no op)"), `module` the innermost module."""

    launched_from: str
    module: str | None
    launches: int
    kernels: int
    device_us: float


@dataclass(frozen=True, slots=True)
class GraphReplays(Displayable):
    """Every CUDA graph launch of a trace and the kernels it replayed (same correlation id).
    `outside_ops_us`: replayed device time whose launch ran in no torch op (the op tables
    leave it unattributed; `rows` say where it came from)."""

    rows: tuple[GraphReplay, ...]
    launches: int
    kernels: int
    device_us: float
    outside_ops_us: float
