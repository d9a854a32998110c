"""What a benchmark run is told (BenchConfig) and what each comparison hands back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Inputs and sizes of one benchmark run. `quick` shrinks everything to seconds
    (the smoke tests use it); sizes are in MiB; `cap_bytes` bounds any child process tree."""

    traces_dir: Path
    cache_dir: Path
    hta_python: str | None
    repeats: int = 5
    big_repeats: int = 1
    big_trace_mb: int = 1024
    big_snapshot_mb: int = 1024
    cap_bytes: int = 12 * 2**30
    quick: bool = False
    # torch intra-op threads in the measured shell (both sides of every comparison alike):
    # on a shared machine a multi-threaded matmul waits for its slowest, preempted thread,
    # which swamps the differences being measured.
    threads: int = 1
    # where the training cell of comparison 10 runs ("cpu", or "cuda" on a GPU machine,
    # `--device cuda`); the other comparisons are CPU measurements.
    device: str = "cpu"


@dataclass(frozen=True, slots=True)
class Target:
    """One target of the issue: what was measured, the goal, and whether it was met
    (None when it could not be judged)."""

    name: str
    measured: str
    goal: str
    met: bool | None


@dataclass(frozen=True, slots=True)
class Section:
    """One comparison's part of RESULTS.md (markdown body) and the targets it judged."""

    title: str
    markdown: str
    targets: tuple[Target, ...] = ()
