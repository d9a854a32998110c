"""The Python stacks gpuprof_nb's line sampler took during a profiled run (capture/
sampling.py), on the trace's clock: what io/samples.py reads from a trace's own key and
analysis/hotspots.py turns into host time and idle time by source line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuprof_nb.model.frames import Frame

# How a line sampler took its samples (see StackSamples) and, for exact line events, the
# interpreter hook it used ("" for sampled stacks).
SampleMode = Literal["signal", "thread", "exact"]
LineEngine = Literal["monitoring", "settrace", ""]


@dataclass(frozen=True, slots=True)
class StackSamples:
    """Stacks of the thread that ran the cell, sampled about every `period_us`.

    `stacks[k]` lists indices into `frames`, outermost first (the cell's own frame first);
    sample i was taken at `ts_us[i]` (trace clock, microseconds) and its stack is
    `stacks[stack_of[i]]`. Sampling ran from `start_us` to `end_us`. `mode` says how they
    were taken: "signal" samples (capture/sampling.py) each stand for the time since the one
    before, "thread" samples for the time halfway to their neighbours; "exact" entries are
    line events (capture/linetrace.py), each the start of a stretch of its stack that lasts
    until the next entry (the last until `end_us`; an empty stack is time outside the cell).
    `late` counts thread samples taken well after they were due (the sampler waited for the
    GIL). For "exact": `engine` names the interpreter hook ("monitoring" or "settrace"),
    `events` counts the line events seen, `shared_us` is the time in tight loops, where
    the events were off, shared among lines in the proportions measured just before, and
    `lost_us` the time in each stretch the thread waited for a core (other work)."""

    frames: tuple[Frame, ...]
    stacks: tuple[tuple[int, ...], ...]
    ts_us: tuple[float, ...]
    stack_of: tuple[int, ...]
    period_us: float
    start_us: float
    end_us: float
    late: int = 0
    mode: SampleMode = "thread"
    engine: LineEngine = ""
    events: int = 0
    shared_us: float = 0.0
    # "exact" only, empty or one per entry: the part of each stretch in which the cell's
    # thread waited for a core while other processes ran (not the line's time).
    lost_us: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.ts_us)
