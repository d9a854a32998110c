"""The per-operator and per-kernel tables and the headline summary of a trace (built by
analysis/ops.py). Times are microseconds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuprof_nb.model.trace import KernelKind
from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.invariants import check_share, check_within

# What a top-ops table can be sorted by (analysis/ops.SORT_KEYS maps aliases to these).
SortKey = Literal["self_device_us", "total_device_us", "self_cpu_us", "total_cpu_us", "calls"]

# The denominator of `fraction` for each canonical key: self times partition the time, so
# the fraction of a total-time key is relative to the same sum (it can exceed 1 for nested ops).
_FRACTION_BASE: dict[SortKey, SortKey] = {
    "self_device_us": "self_device_us",
    "total_device_us": "self_device_us",
    "self_cpu_us": "self_cpu_us",
    "total_cpu_us": "self_cpu_us",
    "calls": "calls",
}


@dataclass(frozen=True, slots=True)
class OpRow:
    """One operator name: call count, CPU and device microseconds, and the input shapes seen."""

    name: str
    calls: int
    self_cpu_us: float
    total_cpu_us: float
    self_device_us: float
    total_device_us: float
    fraction: float  # of the table's sort key (see OpTable.fraction_of)
    input_shapes: tuple[str, ...] = ()  # most common first, at most 5
    input_shape_calls: tuple[int, ...] = ()  # calls with each of input_shapes


@dataclass(frozen=True, slots=True)
class LaunchRow:
    """Device work launched by a runtime call outside every torch op (a Triton or custom
    kernel launched directly, cuLaunchKernel, hipLaunchKernel...): grouped by the call's
    name and, when the trace has Python stacks, the user's line that made it. `calls` launch
    calls, `kernels` activities, their `device_us`, the calls' own host time `host_us`."""

    name: str
    line: str
    calls: int
    kernels: int
    device_us: float
    host_us: float


@dataclass(frozen=True, slots=True)
class OpTable(Displayable):
    """Top operators of a trace, sorted by `sort_key`, with totals over ALL ops (not only
    the rows shown). Times are microseconds."""

    rows: tuple[OpRow, ...]
    sort_key: SortKey
    distinct_ops: int  # how many distinct op names the trace holds (rows may hold fewer)
    calls: int
    self_cpu_us: float  # sum of self CPU time over all ops
    self_device_us: float  # device time attributed to some op
    unattributed_device_us: float  # device time no op launched
    has_device_time: bool
    # The part of unattributed_device_us launched by runtime calls outside every op, by call
    # (and Python line): analysis/launchers.py.
    launchers: tuple[LaunchRow, ...] = ()
    runtime_launched_us: float = 0.0

    @property
    def fraction_of(self) -> str:
        """What each row's `fraction` is a share of."""
        base = _FRACTION_BASE[self.sort_key]
        return {
            "self_device_us": "device time attributed to ops",
            "self_cpu_us": "self CPU time of all ops",
            "calls": "all op calls",
        }[base]


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One device activity name and kind: calls, microseconds, streams, bytes and GB/s."""

    name: str
    kind: KernelKind
    calls: int
    total_us: float
    mean_us: float
    max_us: float
    min_us: float
    streams: tuple[int, ...]
    fraction: float  # of all device activity time (sum of durations)
    total_bytes: int | None = None  # memcpy/memset only, when the trace gives bytes
    achieved_gbps: float | None = None  # bytes / duration over the calls that give bytes, GB/s


@dataclass(frozen=True, slots=True)
class KernelTable(Displayable):
    """Kernels, memcpys and memsets grouped by (name, kind), by total time descending.
    `total_us` is the plain sum of durations (overlapping streams counted twice)."""

    rows: tuple[KernelRow, ...]
    total_us: float
    calls: int
    kernel_us: float
    memcpy_us: float
    memset_us: float
    # Runtime calls that queued GPU work in a trace without kernel events (its device ran,
    # but was not recorded); 0 when kernels were recorded or nothing was launched.
    unrecorded_launches: int = 0


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """The headline numbers of a trace (microseconds; fractions in 0..1)."""

    source: str
    device_names: tuple[str, ...]
    window_us: float
    step_count: int
    median_step_us: float | None
    busy_us: float  # union of kernel+memcpy+memset intervals over all streams and devices
    busy_fraction: float  # busy_us / window_us (0 when the window is empty)
    op_count: int
    kernel_count: int  # kind == "kernel" only
    memcpy_count: int
    memset_count: int
    ops_per_step: float | None  # mean over steps; None without steps
    kernels_per_step: float | None
    unrecorded_launches: int = 0  # as KernelTable.unrecorded_launches

    def __post_init__(self) -> None:
        check_within("TraceSummary", "busy_us", self.busy_us, self.window_us, "window_us")
        check_share("TraceSummary", "busy_fraction", self.busy_fraction)
