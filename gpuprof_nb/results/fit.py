"""Will it fit: memory by category at the peak, predictions of the peak at other batch
sizes, the largest batch under a budget, and a checkpointing plan (built by
analysis/fit.py). Bytes everywhere; times in microseconds.

A BatchFit holds the fitted model itself, so predicting is arithmetic on it: the level of
memory after each history entry that could be the peak is a line in the batch size,
`fixed + scaling * (B / batch_size)`, and the predicted peak is the highest of those lines
at B (see docs/fit.md for how the lines are measured and what the interval covers).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.model.step import MAX_BATCH_SIZE
from gpuprof_nb.model.units import fmt_bytes
from gpuprof_nb.results.memory import SiteBytes

# The categories a peak is split into, in the order they are stacked.
CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer state",
    "inputs",
    "activations",
    "temporaries",
    "other",
)
OVERHEAD = "allocator overhead"
# The largest budget taken (1 EiB): more than any machine holds, and still exact in a float.
MAX_BUDGET_BYTES = 2**60
# Allowance, as a share of the peak, for allocation sizes that are not a line in the batch
# size (what two recordings cannot show), reached at twice the recorded batch and beyond.
CURVE_ALLOWANCE = 0.01


@dataclass(frozen=True, slots=True)
class CategoryBytes:
    """Bytes of one category live at the peak, in `blocks` blocks; `share` of the peak."""

    category: str
    bytes: int
    blocks: int
    share: float


@dataclass(frozen=True, slots=True)
class ModuleBytes:
    """Activations saved for backward that a module's forward allocated (its submodules'
    included only when they are not listed themselves), live at the peak."""

    path: str
    type_name: str
    bytes: int
    blocks: int
    share: float  # of all activations at the peak


@dataclass(frozen=True, slots=True)
class MemoryByCategory:
    """The peak split into CATEGORIES (they add up to `peak_bytes`), plus what the caching
    allocator held above it then (`allocator_overhead_bytes`; None on the CPU, which has no
    caching allocator), and the activations by module and by allocation site. `method` says
    how tensors were told apart."""

    peak_bytes: int
    peak_x: float
    time_unit: str
    categories: tuple[CategoryBytes, ...]
    allocator_overhead_bytes: int | None
    activations_by_module: tuple[ModuleBytes, ...]
    activations_by_site: tuple[SiteBytes, ...]
    method: str
    notes: tuple[str, ...] = ()

    def bytes_of(self, category: str) -> int:
        """Return the bytes of one category (0 when absent); raises on an unknown name."""
        if category == OVERHEAD:
            return self.allocator_overhead_bytes or 0
        if category not in CATEGORIES:
            raise GpuprofError(
                f"no memory category {category!r}; choose from {', '.join(CATEGORIES)}, {OVERHEAD}"
            )
        return next((c.bytes for c in self.categories if c.category == category), 0)

    @property
    def total_bytes(self) -> int:
        """The categories' sum: the peak itself (allocator overhead not included)."""
        return sum(c.bytes for c in self.categories)

    def as_dict(self) -> dict[str, int]:
        """Return {category: bytes}, allocator overhead last when known."""
        out = {c.category: c.bytes for c in self.categories}
        if self.allocator_overhead_bytes is not None:
            out[OVERHEAD] = self.allocator_overhead_bytes
        return out


@dataclass(frozen=True, slots=True)
class Prediction:
    """The predicted peak at `batch_size`: `peak_bytes` between `low_bytes` and
    `high_bytes` (`uncertainty` says how that interval was derived), and the reserved
    memory it needs with the allocator overhead measured at the recorded peak (CUDA)."""

    batch_size: int
    peak_bytes: int
    low_bytes: int
    high_bytes: int
    reserved_bytes: int | None
    method: str
    uncertainty: str

    @property
    def relative_uncertainty(self) -> float:
        """Half the interval's width over the predicted peak (0 when the peak is 0)."""
        if self.peak_bytes <= 0:
            return 0.0
        return (self.high_bytes - self.low_bytes) / 2 / self.peak_bytes


@dataclass(frozen=True, slots=True, eq=False)
class BatchFit:
    """How the peak grows with the batch size (see the module docstring).

    `fixed_bytes[i] + scaling_bytes[i] * B / batch_size` is candidate line i;
    `uncertain_bytes[i]` are the bytes on it whose growth was not measured (matched in one
    run only, or assumed from their category). `method` is "two runs" (measured at
    `batch_size` and `other_batch_size`) or "categories" (one run; activations, inputs and
    the forward and backward's temporaries assumed to grow in proportion).
    `relative_error` is the fitted model's error on the other run's own peak (two runs),
    `overhead_bytes` the allocator's reserve above the peak (CUDA; 0 on the CPU),
    `rounding_bytes` the allocator's rounding over the blocks live at the peak."""

    method: str
    batch_size: int | None
    other_batch_size: int | None
    variable: str
    fixed_bytes: np.ndarray
    scaling_bytes: np.ndarray
    uncertain_bytes: np.ndarray
    measured_peak_bytes: int
    other_measured_peak_bytes: int | None
    relative_error: float
    overhead_bytes: int
    rounding_bytes: int
    matched_share: float  # of the recorded run's allocated bytes matched in both runs
    # What a plan at another batch size replays: per recorded allocation (history order),
    # size at B = recorded size + alloc_scaling * (B / batch_size - 1); per block freed
    # during the run that was live before it, unmatched_fixed + unmatched_scaling * B / b.
    alloc_scaling: np.ndarray | None = None
    unmatched_fixed: np.ndarray | None = None
    unmatched_scaling: np.ndarray | None = None
    notes: tuple[str, ...] = ()

    def _scale(self, batch_size: int, recorded_batch_size: int | None) -> tuple[float, int]:
        batch_size = check_batch_size(batch_size, "batch_size")
        if recorded_batch_size is not None:
            recorded_batch_size = check_batch_size(recorded_batch_size, "recorded_batch_size")
        ref = self.batch_size if self.batch_size is not None else recorded_batch_size
        if ref is None:
            raise GpuprofError(
                "this report does not know the batch size it was recorded at: pass "
                "recorded_batch_size=..., or record with %%memsnap --fit VAR"
            )
        ref = check_batch_size(ref, "recorded_batch_size")
        return batch_size / ref, ref

    def _levels(self, x: float) -> np.ndarray:
        return self.fixed_bytes + self.scaling_bytes * x

    def predict(self, batch_size: int, *, recorded_batch_size: int | None = None) -> Prediction:
        """Return the predicted peak at `batch_size` (see Prediction)."""
        x, ref = self._scale(batch_size, recorded_batch_size)
        levels = self._levels(x)
        top = int(np.argmax(levels))
        peak = max(float(levels[top]), 0.0)
        spread = abs(x - 1.0)
        if self.method == "two runs":
            other = (self.other_batch_size or ref) / ref
            distance = spread / abs(other - 1.0) if other != 1.0 else spread
            model = self.relative_error * distance * peak
            unmatched = float(self.uncertain_bytes[top]) * spread
            # Two sizes cannot show a size that is not a line in B; the largest such error
            # seen on CPU runs (an LSTM's workspace) was 0.4% at 4x (docs/fit.md).
            curve = CURVE_ALLOWANCE * min(spread, 1.0) * peak
            half = model + unmatched + curve + self.rounding_bytes
            low, high = peak - half, peak + half
            words = (
                f"+-{_pct(half, peak)}: the fit's error on the {self.other_batch_size} run's "
                f"own peak ({self.relative_error * 100:.2f}%) scaled by the distance from "
                f"{ref} ({distance:.2g}x that run's); bytes seen in one run only, or left "
                "behind by the run before and counted at their steady size "
                f"({fmt_bytes(float(self.uncertain_bytes[top]))} at this peak), times |B/b - 1|; "
                f"{CURVE_ALLOWANCE * 100:.0f}% for sizes that are not a line in B"
                + (
                    f"; 512 B of rounding per live block ({fmt_bytes(self.rounding_bytes)})"
                    if self.rounding_bytes
                    else ""
                )
            )
        else:
            # Bytes whose growth was assumed: proportional (the prediction) or fixed.
            assumed = float(self.uncertain_bytes[top])
            other_way = (assumed / x) if x > 0 else assumed
            low, high = sorted((peak, peak - assumed + other_way))
            high += self.rounding_bytes
            low -= self.rounding_bytes
            words = (
                f"from one run: activations, inputs and the temporaries of forward and "
                f"backward are assumed to grow in proportion to the batch; the interval "
                f"puts the temporaries ({fmt_bytes(assumed)} at this peak) at their recorded size "
                "instead (record with %%memsnap --fit VAR to measure it)"
            )
        reserved = int(round(peak)) + self.overhead_bytes if self.overhead_bytes else None
        return Prediction(
            batch_size=int(batch_size),
            peak_bytes=int(round(peak)),
            low_bytes=int(round(max(low, 0.0))),
            high_bytes=int(round(high)),
            reserved_bytes=reserved,
            method=self.method,
            uncertainty=words,
        )

    def largest_batch(
        self,
        budget_bytes: int,
        *,
        recorded_batch_size: int | None = None,
        conservative: bool = False,
        limit: int = 2**31,
    ) -> int | None:
        """Return the largest batch size whose predicted peak plus the allocator overhead
        fits `budget_bytes` (with `conservative`, the top of its interval does); None when
        not even batch size 1 does; `limit` when the peak does not grow with the batch."""
        _, ref = self._scale(1, recorded_batch_size)
        budget_bytes = check_budget(budget_bytes)
        check_type_bool(conservative, "conservative")
        limit = check_batch_size(limit, "limit")
        room = budget_bytes - self.overhead_bytes

        def fits(b: int) -> bool:
            p = self.predict(b, recorded_batch_size=ref)
            return (p.high_bytes if conservative else p.peak_bytes) <= room

        if not fits(1):
            return None
        grow = self.scaling_bytes > 0
        if not grow.any():
            return limit
        # The predicted peak is the highest of the lines, so it stops fitting where the
        # first growing line crosses the room.
        cross = (room - self.fixed_bytes[grow]) / self.scaling_bytes[grow] * ref
        hi = int(min(max(math.floor(float(cross.min())), 1), limit))
        lo = 1
        while lo < hi:  # the predicted peak and its interval only grow with B past 1
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo


def _pct(part: float, whole: float) -> str:
    return f"{part / whole * 100:.1f}%" if whole > 0 else "0%"


@dataclass(frozen=True, slots=True)
class PlanModule:
    """A module the plan checkpoints: activations it stops keeping (bytes, per call summed
    over its calls in the step) and the forward time it adds back in backward (us)."""

    path: str
    type_name: str
    saved_bytes: int
    recompute_us: float
    calls: int


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """Which modules to checkpoint so the step's peak fits `budget_bytes` with the least
    recompute time. `predicted_peak_bytes` is the peak with the plan applied (replayed on the
    recorded history, see docs/fit.md), `baseline_peak_bytes` without it; `fits` says whether
    it reaches the budget; `code` is what to paste; `measured_peak_bytes` is filled when the
    plan was applied and the cell measured again."""

    budget_bytes: int
    batch_size: int | None
    baseline_peak_bytes: int
    predicted_peak_bytes: int
    modules: tuple[PlanModule, ...]
    recompute_us: float
    forward_us: float
    fits: bool
    solver: str
    code: str
    candidates: int
    notes: tuple[str, ...] = ()
    measured_peak_bytes: int | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(m.path for m in self.modules)


Planner = Callable[..., CheckpointPlan]
_planner: Planner | None = None


def use_planner(planner: Planner) -> None:
    """Set what builds checkpoint plans for reports (the package root does, once: results
    never import analysis)."""
    global _planner
    _planner = planner


def plan_with(*args: Any, **kwargs: Any) -> CheckpointPlan:
    if _planner is None:  # pragma: no cover - the package root always sets one
        raise RuntimeError("gpuprof_nb's planner is not set; import gpuprof_nb first")
    return _planner(*args, **kwargs)


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str | int) -> int:
    """Return a byte count from `8GiB`, `512 MiB`, `8e9`, `8GB` (10**9) or an int, more
    than 0 and at most MAX_BUDGET_BYTES (1 EiB). Raises ValueError saying what it expected."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        value = int(text)
    elif isinstance(text, float) and math.isfinite(text):
        value = int(text) if text <= MAX_BUDGET_BYTES else MAX_BUDGET_BYTES + 1
    elif isinstance(text, str) and len(text) <= 100:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"{describe(text)} is not a size; write e.g. 8GiB, 512MiB, 8GB (10**9) or bytes"
            )
        number = float(m.group(1)) * _UNITS[unit]
        # Past the cap (an exponent of 400 is inf), said below without converting it.
        value = int(number) if number <= MAX_BUDGET_BYTES else MAX_BUDGET_BYTES + 1
    else:
        raise ValueError(
            f"{describe(text)} is not a size; pass bytes (an int) or a string such as '8GiB'"
        )
    if value <= 0:
        raise ValueError(f"{describe(text)}: a budget must be more than 0 bytes")
    if value > MAX_BUDGET_BYTES:
        raise ValueError(
            f"{describe(text)}: a budget must be at most 1 EiB ({MAX_BUDGET_BYTES:,} bytes)"
        )
    return value


def budget_bytes(value: int | str) -> int:
    """Return a budget in bytes from an int or a size like '8GiB'; GpuprofError if not."""
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise GpuprofError(f"budget: {e}") from None


# What largest_batch checks its budget with (its parameter is named budget_bytes too).
check_budget = budget_bytes


def check_batch_size(value: Any, name: str) -> int:
    """Return `value` as an int batch size from 1 to MAX_BATCH_SIZE (2**31; a numpy integer
    is one); GpuprofError naming `name` otherwise (a bool, a float, NaN, 0, 10**30)."""
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GpuprofError(f"{name} must be a whole number of samples, got {describe(value)}")
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise GpuprofError(
            f"{name} must be a whole number of at least 1 and at most {MAX_BATCH_SIZE:,}, "
            f"got {describe(value)}"
        )
    return value


def check_type_bool(value: Any, name: str) -> bool:
    """Return `value` when it is True or False; GpuprofError naming `name` otherwise."""
    if not isinstance(value, bool):
        raise GpuprofError(f"{name} must be True or False, got {describe(value)}")
    return value
