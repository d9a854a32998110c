"""The profiler trace as frozen dataclasses: what io/trace/ produces and analysis consumes.

Times are microseconds on the trace's own clock (Kineto's `ts`/`dur`), as floats.
Sequences are tuples sorted by start time (ties: by position in the file), so analyses
can rely on order without sorting again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from gpuprof_nb.model.compile import CompileLog
    from gpuprof_nb.model.modules import ModuleCapture
    from gpuprof_nb.model.samples import StackSamples
    from gpuprof_nb.model.utilisation import Utilisation

OpKind = Literal["op", "annotation", "python"]
KernelKind = Literal["kernel", "memcpy", "memset"]


@dataclass(frozen=True, slots=True)
class Op:
    """A host-side range: a torch operator (`cpu_op`), a user annotation
    (`user_annotation`, e.g. `ProfilerStep#3`) or a Python function (`python_function`)."""

    name: str
    kind: OpKind
    start_us: float
    dur_us: float
    pid: int | str
    tid: int | str
    external_id: int | None = None
    # Shape information recorded with `record_shapes=True` (None when absent).
    input_dims: tuple[Any, ...] | None = None
    input_types: tuple[str, ...] | None = None
    input_strides: tuple[Any, ...] | None = None
    concrete_inputs: tuple[str, ...] | None = None
    sequence_number: int | None = None
    fwd_thread_id: int | None = None
    # Python call stack, innermost last ("Call stack" arg), when recorded with stacks.
    stack: tuple[str, ...] | None = None
    # Position of the event in the file: a stable tie-breaker.
    index: int = 0

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True, slots=True)
class Collective:
    """What a collective kernel moved, as NCCL/RCCL kernel args record it ("Collective name",
    "In msg nelems", "Out msg nelems", "Group size", "dtype"); None where absent."""

    name: str
    in_nelems: int | None = None
    out_nelems: int | None = None
    group_size: int | None = None
    dtype: str | None = None


@dataclass(frozen=True, slots=True)
class Kernel:
    """A device activity: a kernel, a memcpy or a memset, on one device and stream."""

    name: str
    kind: KernelKind
    start_us: float
    dur_us: float
    device: int
    stream: int
    correlation: int | None = None
    external_id: int | None = None
    bytes: int | None = None  # memcpy/memset payload, when the trace gives it
    grid: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None
    index: int = 0
    collective: Collective | None = None  # collective kernels whose args say what they moved

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True, slots=True)
class RuntimeCall:
    """A CUDA/HIP runtime or driver API call on a host thread (cudaLaunchKernel, cudaMemcpy,
    cudaStreamSynchronize, ...); `correlation` links it to the Kernel it launched."""

    name: str
    start_us: float
    dur_us: float
    pid: int | str
    tid: int | str
    correlation: int | None = None
    external_id: int | None = None
    index: int = 0

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True, slots=True)
class SyncEvent:
    """A `cuda_sync` event: the host or a stream waited (Stream Sync, Event Sync, Context
    Sync, Stream Wait Event). `stream` is -1 when the sync is not tied to one stream.
    `correlation` is that of the runtime call that waited (cudaStreamSynchronize, ...).
    An event wait names the stream the awaited event was recorded on (`wait_on_stream`)
    and the correlation id of the cudaEventRecord call that recorded it
    (`wait_on_event_record`); None where the trace does not say (-1 in the file)."""

    name: str
    start_us: float
    dur_us: float
    device: int
    stream: int
    correlation: int | None = None
    index: int = 0
    wait_on_stream: int | None = None
    wait_on_event_record: int | None = None

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True, slots=True)
class GpuAnnotation:
    """A `gpu_user_annotation` event: a `record_function` range as the device ran it, from
    its first kernel's start to its last kernel's end on one stream (`device`, `stream`:
    the event's pid and tid). `external_id` is the host range's External id."""

    name: str
    start_us: float
    dur_us: float
    device: int
    stream: int
    external_id: int | None = None
    index: int = 0

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """A profiler `[memory]` instant event: an allocation (bytes > 0) or free (bytes < 0).
    Older traces lack `addr` and the totals (None then). device_type: 0 CPU, 1 CUDA, 6 HIP..."""

    ts_us: float
    bytes: int
    device_type: int
    device_id: int
    addr: int | None = None
    total_allocated: int | None = None
    total_reserved: int | None = None
    pid: int | str = 0
    tid: int | str = 0


@dataclass(frozen=True, slots=True)
class Step:
    """One training step found from `ProfilerStep#N` (or `Optimizer.step#...`) annotations."""

    number: int
    name: str
    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One entry of the trace's deviceProperties (or the live device's properties)."""

    index: int
    name: str
    total_memory_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    num_sms: int | None = None


@dataclass(frozen=True, slots=True)
class DistributedInfo:
    rank: int | None
    world_size: int | None
    backend: str | None


@dataclass(frozen=True, slots=True)
class Trace:
    """A whole profiler trace. `bounds_us` is (start, end) of the profiled span: the
    earliest start and latest end over all timed events (metadata events excluded)."""

    source: str
    ops: tuple[Op, ...]
    kernels: tuple[Kernel, ...]
    runtime: tuple[RuntimeCall, ...]
    syncs: tuple[SyncEvent, ...]
    memory: tuple[MemoryEvent, ...]
    steps: tuple[Step, ...]
    devices: tuple[DeviceInfo, ...]
    distributed: DistributedInfo | None
    bounds_us: tuple[float, float]
    schema_version: int | None = None
    # Top-level keys other than traceEvents (record_shapes, with_stack, ...), as read.
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # What the loader had to repair (e.g. negative durations clamped to 0), for the report.
    load_warnings: tuple[str, ...] = ()
    # Notebook cells' file names -> their execution numbers (`In [n]`), when gpuprof_nb
    # recorded the trace in a notebook (see analysis/sources.py).
    cells: Mapping[str, int] = field(default_factory=dict)
    # The Python stacks gpuprof_nb's line sampler took during the run (`--stack`), and what
    # its utilisation sampler read beside it, when it recorded the trace.
    samples: StackSamples | None = None
    utilisation: Utilisation | None = None
    # What its module recorder and torch.compile's log kept, when gpuprof_nb recorded it.
    modules: ModuleCapture | None = None
    compile_log: CompileLog | None = None
    # (size in bytes, modification time in ns) of the file the trace was loaded from, so
    # code that reads the file again (report.save, a run's rank) can tell it is the same.
    source_stat: tuple[int, int] | None = field(default=None, compare=False)
    # The `gpu_user_annotation` events: record_function ranges as the device ran them.
    gpu_annotations: tuple[GpuAnnotation, ...] = ()

    @property
    def has_device_activity(self) -> bool:
        return bool(self.kernels)

    @property
    def recorded_gpu(self) -> DeviceInfo | None:
        """The GPU whose ceilings the trace is drawn against: its first deviceProperties
        entry when it has device activity; None for a CPU trace or one without them."""
        if not self.kernels or not self.devices:
            return None
        return self.devices[0]

    @property
    def duration_us(self) -> float:
        return self.bounds_us[1] - self.bounds_us[0]
