"""The roofline of a trace: op groups placed by arithmetic intensity and achieved FLOP/s
against the device's roofs (built by analysis/roofline.py)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof_nb.model.device import DeviceSpec
from gpuprof_nb.results.display import Displayable

# Op categories that run on tensor cores when their dtype allows (analysis/flops.py assigns
# categories); fp32 time in them is what mixed precision would speed up.
MATMUL_CATEGORIES = frozenset({"gemm", "conv", "attention"})

Bound = str  # "memory" | "compute"


@dataclass(frozen=True, slots=True)
class RooflinePoint:
    """One op group (same op, input shapes and dtype), or one kernel within such a group.
    Totals over `calls`; rates from measured time. `roof` names the compute roof that applies
    ('bf16', 'tf32', 'fp32', ...); `roof_flops_per_s` is the attainable FLOP/s at this
    intensity (min(peak, intensity x bandwidth)); `fraction_of_roof` = achieved / attainable.
    Roof fields are None without device ceilings."""

    name: str
    shapes: str
    calls: int
    flops: int
    bytes_moved: int
    intensity_flop_per_byte: float | None
    time_us: float
    achieved_flops_per_s: float | None
    achieved_bytes_per_s: float | None
    roof: str | None
    peak_flops_per_s: float | None
    roof_flops_per_s: float | None
    bound: Bound | None
    fraction_of_roof: float | None
    above_roof: bool
    flop_source: str
    bytes_model: str
    dtype: str
    category: str
    op_name: str  # the anchor op (equal to `name` for op points)


@dataclass(frozen=True, slots=True)
class DataMovement:
    """An op group that moves bytes without FLOPs (copies, casts, embedding gathers)."""

    name: str
    shapes: str
    calls: int
    bytes_moved: int
    time_us: float
    achieved_bytes_per_s: float | None
    fraction_of_bandwidth: float | None
    bytes_model: str
    dtype: str
    category: str
    # "host-device" when its device time is a host<->device memcpy (PCIe/NVLink-C2C, not
    # HBM: fraction_of_bandwidth is then None), else "device".
    direction: str = "device"


@dataclass(frozen=True, slots=True)
class Unmodelled:
    """Device (or CPU) time of ops without a formula or without recorded shapes, by the
    name of the op that launched the kernels (CPU: the top-level op): not on the plot."""

    name: str
    calls: int
    time_us: float


@dataclass(frozen=True, slots=True)
class Roofline(Displayable):
    """The roofline of one trace. Points sorted by time (largest first, then name).
    `time_basis` is 'device' (kernel time) or 'cpu' (inclusive CPU time of the anchor);
    `total_time_us` is all the time on that basis, attributed or not."""

    points: tuple[RooflinePoint, ...]
    data_movement: tuple[DataMovement, ...]
    device: DeviceSpec | None
    note: str
    kernel_points: tuple[RooflinePoint, ...] = ()
    unmodelled: tuple[Unmodelled, ...] = ()
    time_basis: str = "device"
    total_time_us: float = 0.0

    @property
    def attributed_time_us(self) -> float:
        """Microseconds attributed to points and data movement together."""
        return sum(p.time_us for p in self.points) + sum(d.time_us for d in self.data_movement)

    @property
    def coverage(self) -> float | None:
        """Fraction of `total_time_us` that the points and data movement explain."""
        return self.attributed_time_us / self.total_time_us if self.total_time_us else None

    def time_share(self, bound: Bound) -> float | None:
        """Return the fraction of attributed time in `bound` ('memory' or 'compute') ops.
        Device-side data movement (no FLOPs, intensity 0) counts as memory-bound; host-device
        copies are left out. None when no point
        could be classified (no device ceilings)."""
        if bound not in ("memory", "compute"):
            raise ValueError(f"time_share: bound must be 'memory' or 'compute', not {bound!r}")
        # Host-device copies run over PCIe/NVLink, not HBM: the roofline says nothing about
        # them (host_device_copy judges them), so they are in neither part of the share.
        on_device = sum(d.time_us for d in self.data_movement if d.direction != "host-device")
        total = sum(p.time_us for p in self.points) + on_device
        if not total or not any(p.bound for p in self.points):
            return None
        t = sum(p.time_us for p in self.points if p.bound == bound)
        if bound == "memory" and self.device is not None:
            t += on_device
        return t / total

    @property
    def fp32_gemm_time_us(self) -> float:
        """Microseconds in fp32 GEMMs, convolutions and attention (tensor-core candidates)."""
        return sum(
            p.time_us for p in self.points if p.category in MATMUL_CATEGORIES and p.dtype == "fp32"
        )

    @property
    def fp32_gemm_time_share(self) -> float | None:
        """Fraction of attributed time in fp32 GEMM-class ops; None when nothing attributed."""
        total = self.attributed_time_us
        return self.fp32_gemm_time_us / total if total else None

    def top_points(self, n: int = 10) -> tuple[RooflinePoint, ...]:
        """Return the n points with the most time."""
        return self.points[:n]
