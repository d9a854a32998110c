"""Two profiles side by side (built by analysis/compare.py): the verdict on the time per step
(or per run), what changed most, the idle-time breakdown and the findings, before and after."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpuprof_nb.results.diagnosis import Finding
from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.exports import Exportable

# A change in time is called real only when its whole 95% confidence interval lies beyond
# this fraction from no change. Two runs of the same cell, each with samples that agree to
# 1-3%, can sit further apart than that: the machine's state drifts between runs (clock
# frequency, caches, the allocator, other work on a shared host), and neither run's samples
# show it. Measured on this project's 2-core VM: the same cell run twice read a few percent
# apart when the machine was quiet (benchmarks/RESULTS.md, section 7, from
# benchmarks/compare_noise.py) and further apart in a noisy spell, and the quickstart's step,
# re-run in a notebook after a change that does nothing on the CPU, once read over a third
# slower with a confidence interval clear of 1 (benchmarks/RESULTS.md, "Measurements behind
# design choices", M19). So the floor is the field's own rule of thumb: a change under 20%
# is not decisive (a precision change gaining less says the bottleneck is elsewhere). On a
# quiet, dedicated machine pass a lower floor to compare(..., noise_floor=...).
COMPARE_NOISE_FLOOR = 0.20

# Bootstrap rounds for the ratio of medians: enough that the 2.5% and 97.5% percentiles are
# stable to a fraction of a percent; a fixed seed makes the verdict the same on every call.
COMPARE_BOOTSTRAP_ROUNDS = 4000

VerdictKind = Literal["faster", "slower", "no clear change"]
# What `before_us`/`after_us` and the step medians are per: a training step (both sides have
# steps), one run of the cell (reports from %%gpuprofile without steps), or the whole
# profiled window (traces without steps).
Per = Literal["step", "run", "window"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether `after` is really faster or slower than `before`, from the timed samples.

    `ratio` is after's median time over before's (below 1: faster); `ci_low`..`ci_high` is
    its 95% bootstrap confidence interval; a change is called only when the whole interval
    lies beyond `noise_floor` (a fraction) on one side of 1, and beyond what either side's
    own noise could make of no change (docs/compare.md)."""

    kind: VerdictKind
    ratio: float
    ci_low: float
    ci_high: float
    noise_floor: float
    before_samples: int
    after_samples: int
    # Slowest over fastest sample of each side; the timed samples per side that would
    # settle the question if the ratio stays what it is (None: no number would, the change
    # is within the floor); and, for "no clear change", why in words.
    spread_before: float | None = None
    spread_after: float | None = None
    runs_to_settle: int | None = None
    why: str = ""

    @property
    def speedup(self) -> float:
        """Before's median time over after's (above 1: after is faster)."""
        return 1.0 / self.ratio if self.ratio > 0 else float("inf")

    @classmethod
    def from_samples(
        cls,
        before: Sequence[float],
        after: Sequence[float],
        *,
        noise_floor: float = COMPARE_NOISE_FLOOR,
        rounds: int = COMPARE_BOOTSTRAP_ROUNDS,
        seed: int = 0,
    ) -> Verdict | None:
        """Return the verdict on two sets of timed samples (any time unit, the same on both
        sides): the ratio of medians after/before, its 95% percentile-bootstrap interval
        (`rounds` resamples of each side, seeded so the answer is the same every time), and
        faster / slower only when the whole interval lies beyond `noise_floor` from 1. None
        with fewer than two positive samples on a side (no spread to judge by)."""
        b = np.asarray([t for t in before if t > 0 and np.isfinite(t)], dtype=float)
        a = np.asarray([t for t in after if t > 0 and np.isfinite(t)], dtype=float)
        if len(b) < 2 or len(a) < 2:
            return None
        rng = np.random.default_rng(seed)
        b_medians = np.median(b[rng.integers(0, len(b), (rounds, len(b)))], axis=1)
        a_medians = np.median(a[rng.integers(0, len(a), (rounds, len(a)))], axis=1)
        low, high = np.percentile(a_medians / b_medians, [2.5, 97.5])
        kind: VerdictKind = "no clear change"
        if low > 1.0 + noise_floor:
            kind = "slower"
        elif high < 1.0 / (1.0 + noise_floor):
            kind = "faster"
        return cls(
            kind=kind,
            ratio=float(np.median(a) / np.median(b)),
            ci_low=float(low),
            ci_high=float(high),
            noise_floor=noise_floor,
            before_samples=len(b),
            after_samples=len(a),
        )


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """One thing that ran before and/or after, its time and calls per step (or run, or
    window: Comparison.per). `category` is op, kernel, DataLoader, communication, memcpy or
    memset; kernels differing only in tile or template parameters are one row (a family).
    `replaced_by` says what took its place when it ran before only and compiled code ran
    after."""

    name: str
    category: str
    before_us: float
    after_us: float
    calls_before: float
    calls_after: float
    replaced_by: str = ""

    @property
    def delta_us(self) -> float:
        return self.after_us - self.before_us


@dataclass(frozen=True, slots=True)
class IdleDelta:
    """One category of the idle-time breakdown (busy, dataloader, sync, launch, host,
    other), before and after, in microseconds per step (or run, or window)."""

    category: str
    before_us: float
    after_us: float

    @property
    def delta_us(self) -> float:
        return self.after_us - self.before_us


@dataclass(frozen=True, slots=True, eq=False)
class Comparison(Displayable, Exportable):
    """`compare(before, after)`: the step medians (or per-run medians, see `per`), the
    verdict when both sides carry timed samples (None otherwise, with `verdict_note` saying
    why), the changes most important first (by the change in time per step), the idle
    breakdown and memory peaks before and after, and the findings resolved, new and still
    there."""

    before_label: str
    after_label: str
    per: Per
    median_step_us: tuple[float | None, float | None]
    verdict: Verdict | None
    verdict_note: str
    changes: tuple[ChangeRow, ...]
    idle: tuple[IdleDelta, ...]
    memory_peak_bytes: tuple[int | None, int | None]
    findings_resolved: tuple[Finding, ...]
    findings_new: tuple[Finding, ...]
    findings_still: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    # Whose time the idle breakdown splits: the device's, the host's (traces without device
    # activity), or one of each ("mixed").
    idle_of: Literal["device", "host", "mixed"] = "device"
    # What the verdict's samples are: the timed runs of %%gpuprofile reports, or the
    # profiled steps of two traces without them ("" without a verdict).
    samples_from: Literal["timed runs", "profiled steps", ""] = ""

    @property
    def speedup(self) -> float | None:
        """Before's step median over after's (above 1: after is faster), None when either
        side has none."""
        before, after = self.median_step_us
        if not before or not after:
            return None
        return before / after

    def __repr__(self) -> str:
        what = self.verdict.kind if self.verdict is not None else "no verdict"
        speed = f"{self.speedup:.3g}x" if self.speedup is not None else "n/a"
        return (
            f"<Comparison {self.before_label} -> {self.after_label}: {what}, speedup "
            f"{speed}, {len(self.changes)} changes>"
        )
