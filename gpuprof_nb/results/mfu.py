"""Model FLOPs utilisation: the FLOP/s a step achieved against the device's peak for the
precision that ran (built by analysis/mfu.py). FLOPs, seconds, shares in 0..1."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Unformulated:
    """An op (by name) whose FLOPs no formula counts, and its share of the time."""

    name: str
    time_us: float
    share: float


@dataclass(frozen=True, slots=True)
class Mfu:
    """FLOPs per step and what fraction of the device's peak they reached.

    `model_flops_per_step` counts the FLOPs of every op with a formula (analysis/flops.py),
    less activation checkpointing's recompute; `hardware_flops_per_step` keeps the
    recompute. `step_us` is the time of one step and `step_source` says where it came from
    (the timed runs without the profiler, else the profiled steps, else the profiled
    window). `mfu` = model FLOPs / step time / peak (mixed precisions: each op's FLOPs over
    its own roof's peak); `hfu` likewise with the recompute, given only where there was
    some. `peak_flops_per_s` is the roof of most FLOPs (`roof`: 'bf16', 'fp32', ...);
    `peak_source` says whether it was measured (`measure_ceilings()`) or is the datasheet's.
    `mfu` is None where it cannot be a real fraction; `notes` say why. `unformulated` lists
    the ops without a FLOP formula and `unformulated_share` their share of the time: the
    FLOPs are undercounted by at most their work."""

    model_flops_per_step: float
    hardware_flops_per_step: float
    step_us: float
    step_source: str
    on_device: bool
    mfu: float | None = None
    hfu: float | None = None
    roof: str | None = None
    peak_flops_per_s: float | None = None
    peak_source: str = ""
    measured_peak: bool = False
    unformulated_share: float = 0.0
    unformulated: tuple[Unformulated, ...] = ()
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def achieved_flops_per_s(self) -> float:
        """Model FLOPs per second of step time."""
        return self.model_flops_per_step / (self.step_us * 1e-6) if self.step_us > 0 else 0.0

    @property
    def recompute_flops_per_step(self) -> float:
        return self.hardware_flops_per_step - self.model_flops_per_step
