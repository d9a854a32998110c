"""Time, idle time and memory per nn.Module along its path in the model (built by
analysis/modules.py). Microseconds and bytes, totals over the profiled window; `steps`
says how many steps (or runs) that window holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuprof_nb.results.display import Displayable

# Where the module ranges came from: gpuprof_nb's hooks (`%%gpuprofile`), torch's own
# `nn.Module:` Python events (torch.profiler with with_stack=True, with_modules=True), or
# nowhere (the trace has none: the breakdown is empty and its notes say why).
ModuleSource = Literal["hooks", "python_events", "none"]


@dataclass(frozen=True, slots=True)
class ModuleRow:
    """One module path (`model.encoder.layers.3.attn`). Times include the module's children
    (`self_*` leave them out). Host time is the time a host thread was inside the module:
    its forward calls, and the backward ops autograd tied to its forward ops (through their
    sequence numbers); `recompute_host_us` is forward work run again inside backward
    (activation checkpointing), part of neither. Device time is that of the kernels
    launched from inside it; `idle_us` the device idle time (on a CPU-only trace: the gaps
    between host ops) while the host was inside it. `bytes_allocated` sums the allocations
    made inside it (None without `--memory`). `share` is `time_us` over the breakdown's
    total time."""

    path: str
    parent: str | None
    depth: int
    module_type: str
    calls: int
    forward_host_us: float
    backward_host_us: float
    recompute_host_us: float
    forward_device_us: float
    backward_device_us: float
    recompute_device_us: float
    self_host_us: float
    self_device_us: float
    kernels: int
    idle_us: float
    bytes_allocated: int | None
    share: float
    self_share: float
    on_device: bool = False
    recompute_calls: int = 0

    @property
    def name(self) -> str:
        """The last part of the path (`attn`)."""
        return self.path.rsplit(".", 1)[-1]

    @property
    def host_us(self) -> float:
        return self.forward_host_us + self.backward_host_us + self.recompute_host_us

    @property
    def device_us(self) -> float:
        return self.forward_device_us + self.backward_device_us + self.recompute_device_us

    @property
    def time_us(self) -> float:
        """Device time on a GPU trace, host time on a CPU-only one (what shares are of)."""
        return self.device_us if self.on_device else self.host_us

    @property
    def self_time_us(self) -> float:
        return self.self_device_us if self.on_device else self.self_host_us


@dataclass(frozen=True, slots=True)
class ModuleGroup:
    """Repeated sibling blocks folded into one row (`model.layers.{0..23}`): `members`
    their paths in order; time totals and the spread of `time_us` across them."""

    pattern: str
    parent: str | None
    depth: int
    members: tuple[str, ...]
    time_us: float
    min_us: float
    max_us: float
    mean_us: float
    share: float

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def spread(self) -> float:
        """(max - min) / mean of the members' time (0 when the mean is 0)."""
        return (self.max_us - self.min_us) / self.mean_us if self.mean_us > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ModuleBreakdown(Displayable):
    """Time per nn.Module. `rows` hottest first (most `self_time_us`, ties by path);
    `tree()` gives them parent first. `total_us` is the whole profiled time on the rows'
    basis (device time of every kernel on a GPU trace, the window's host time on a CPU-only
    one) and `outside_us` the part of it in no module (the optimizer, a functional loss,
    gradient accumulation, Python between modules); the roots' `time_us` and `outside_us`
    add up to `total_us`. `backward_outside_us`: backward host time whose forward op ran in
    no module (or carried no sequence number)."""

    rows: tuple[ModuleRow, ...]
    groups: tuple[ModuleGroup, ...]
    source: ModuleSource
    on_device: bool
    total_us: float
    outside_us: float
    backward_outside_us: float = 0.0
    steps: int = 1
    notes: tuple[str, ...] = ()

    def row(self, path: str) -> ModuleRow | None:
        """Return the row of one path, None when no module ran at that path."""
        for r in self.rows:
            if r.path == path:
                return r
        return None

    def tree(self) -> tuple[ModuleRow, ...]:
        """Return the rows parent first, each row's children after it, most time first."""
        children: dict[str | None, list[ModuleRow]] = {}
        for r in self.rows:
            children.setdefault(r.parent, []).append(r)
        for kids in children.values():
            kids.sort(key=lambda r: (-r.time_us, r.path))
        out: list[ModuleRow] = []
        todo = list(reversed(children.get(None, [])))
        while todo:
            r = todo.pop()
            out.append(r)
            todo.extend(reversed(children.get(r.path, [])))
        return tuple(out)

    @property
    def roots(self) -> tuple[ModuleRow, ...]:
        return tuple(r for r in self.tree() if r.parent is None)

    def top(self, n: int = 5) -> tuple[ModuleRow, ...]:
        """Return the n rows with the most time of their own."""
        return self.rows[:n]
