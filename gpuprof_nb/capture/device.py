"""Which device a cell runs on, and its ceilings: from the datasheet table, or measured
(`measure_ceilings`: large matmuls per dtype and a large copy) and cached per device by
io/ceilings.py in ~/.cache/gpuprof_nb/ceilings.json (GPUPROF_NB_CACHE_DIR overrides the
folder).

torch is imported inside the functions that measure, so reading the cache for an offline
trace stays cheap.
"""

from __future__ import annotations

import datetime as _dt
import functools
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import CaptureError
from gpuprof_nb.io.ceilings import (
    CACHE_ENV,
    cache_path,
    cached_ceilings,
    device_key,
    trace_ceilings,
    write_ceilings,
)
from gpuprof_nb.model.device import DeviceSpec, lookup_device_spec
from gpuprof_nb.model.trace import Trace

__all__ = [
    "CACHE_ENV",
    "cache_path",
    "cuda_available",
    "current_device_spec",
    "device_key",
    "device_name",
    "measure_ceilings",
    "synchronize",
    "trace_device_spec",
]


@functools.cache
def cuda_available() -> bool:
    """Whether torch sees a CUDA device (asked once per process: the answer cannot change
    once torch has looked, and each call is a cost paid by every cell: benchmarks/RESULTS.md,
    "Measurements behind design choices", M12)."""
    import torch

    return bool(torch.cuda.is_available())


def synchronize() -> None:
    """Wait for the current CUDA device's queued work."""
    import torch

    torch.cuda.synchronize()


def device_name(cuda: bool) -> str:
    """Return the current CUDA device's name, or "cpu"."""
    import torch

    return str(torch.cuda.get_device_name()) if cuda else "cpu"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cpu_identity() -> tuple[str, int]:
    """Return (CPU name, torch intra-op threads): the threads set the CPU ceilings too."""
    import torch

    return _cpu_name(), int(torch.get_num_threads())


def current_device_spec(device: Any = None) -> DeviceSpec | None:
    """Return the ceilings of `device` (default: cuda if available, else cpu): measured ones
    from the cache when present, else the datasheet row; None for a GPU without a row or a
    CPU that was never measured."""
    import torch

    dev = _torch_device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        measured = cached_ceilings("cuda", props.name, int(props.total_memory))
        return measured or lookup_device_spec(props.name, int(props.total_memory))
    name, threads = _cpu_identity()
    return cached_ceilings("cpu", name, threads)


def trace_device_spec(trace: Trace, *, this_machine: bool = False) -> DeviceSpec | None:
    """Return the ceilings for a trace: for a GPU trace, measured ones cached for its device
    (name and memory from deviceProperties) else the datasheet row; for a CPU trace, this
    machine's cached CPU ceilings when `this_machine` (a live capture), else None."""
    if trace.has_device_activity or not this_machine:
        return trace_ceilings(trace)
    name, threads = _cpu_identity()
    return cached_ceilings("cpu", name, threads)


def _torch_device(device: Any) -> Any:
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise CaptureError(
            f"measure_ceilings: {device!r} is not a device ({exc}); pass 'cuda', 'cuda:1' or 'cpu'"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CaptureError(
            f"measure_ceilings: {device!r} asked for, but torch sees no CUDA "
            "device; pass 'cpu' or run on a GPU machine"
        )
    if dev.type not in ("cuda", "cpu"):
        raise CaptureError(
            f"measure_ceilings: {dev.type} devices are not supported; pass 'cuda' or 'cpu'"
        )
    return dev


def _best_seconds(run: Callable[[], Any], sync: Callable[[], None], repeat: int) -> float:
    """Return the fastest of `repeat` timed runs in seconds (after one warm-up run)."""
    run()
    sync()
    best = float("inf")
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter_ns()
        run()
        sync()
        best = min(best, (time.perf_counter_ns() - t0) * 1e-9)
    return best


def measure_ceilings(
    device: Any = None,
    cache: bool = True,
    *,
    refresh: bool = False,
    matmul_size: int | None = None,
    copy_bytes: int | None = None,
    repeat: int = 5,
) -> DeviceSpec:
    """Return measured ceilings of `device` (default: cuda if available, else cpu) in FLOP/s
    and bytes/s: an n x n matmul per dtype (fp32, tf32, bf16, fp16, fp64 on GPUs; fp32 on
    CPUs), best of `repeat`; and a device-to-device copy counted as read + write. With
    `cache`, ceilings measured before for this device are returned unless `refresh`, and
    new ones are stored. Sizes default to 8192 (GPU) / 2048 (CPU) and 1 GiB / 256 MiB."""
    import torch

    if repeat < 1:
        raise ValueError(f"measure_ceilings: repeat must be at least 1, got {repeat}")
    dev = _torch_device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        kind, name, size_key = "cuda", str(props.name), int(props.total_memory)
    else:
        name, size_key = _cpu_identity()
        kind = "cpu"
    key = device_key(kind, name, size_key)
    if cache and not refresh:
        hit = cached_ceilings(kind, name, size_key)
        if hit is not None:
            return hit
    try:
        if dev.type == "cuda":
            spec = _measure_cuda(
                dev, name, size_key, matmul_size or 8192, copy_bytes or 2**30, repeat
            )
        else:
            spec = _measure_cpu(name, size_key, matmul_size or 2048, copy_bytes or 2**28, repeat)
    except torch.cuda.OutOfMemoryError:
        raise CaptureError(
            f"measure_ceilings: out of memory on {name}; pass smaller "
            "matmul_size= and copy_bytes=, or free memory first"
        ) from None
    if cache:
        write_ceilings(key, spec)
    return spec


def _stamp(sizes: str, repeat: int) -> str:
    import torch

    day = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    return (
        f"measured by gpuprof_nb.measure_ceilings on {day} (torch {torch.__version__}; "
        f"{sizes}; best of {repeat})"
    )


def _measure_cuda(
    dev: Any, name: str, memory_bytes: int, n: int, copy_bytes: int, repeat: int
) -> DeviceSpec:
    import torch

    def sync() -> None:
        torch.cuda.synchronize(dev)

    cc = torch.cuda.get_device_capability(dev)
    peaks: dict[str, float | None] = {}
    plan: list[tuple[str, Any, bool, int]] = [("fp32", torch.float32, False, n)]
    if cc >= (8, 0):
        plan += [("tf32", torch.float32, True, n), ("bf16", torch.bfloat16, False, n)]
    if cc >= (7, 0):
        plan.append(("fp16", torch.float16, False, n))
    # fp64 runs at 1/2 to 1/64 of fp32; a smaller matmul keeps consumer cards quick.
    plan.append(("fp64", torch.float64, False, max(n // 2, 256)))
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for roof, dtype, tf32, size in plan:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(size, size, device=dev, dtype=dtype)
            b = torch.randn(size, size, device=dev, dtype=dtype)
            secs = _best_seconds(functools.partial(torch.mm, a, b), sync, repeat)
            peaks[roof] = 2 * size**3 / secs
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    elems = max(copy_bytes // 4, 1)
    bandwidth = _copy_bytes_per_s(dev, elems, sync, repeat)
    torch.cuda.empty_cache()  # the copy buffers are gone; hand their memory back
    return DeviceSpec(
        name=name,
        kind="cuda",
        fp32_flops_per_s=peaks.get("fp32"),
        bandwidth_bytes_per_s=bandwidth,
        tf32_flops_per_s=peaks.get("tf32"),
        fp16_flops_per_s=peaks.get("fp16"),
        bf16_flops_per_s=peaks.get("bf16"),
        fp64_flops_per_s=peaks.get("fp64"),
        memory_bytes=memory_bytes,
        source=_stamp(f"{n}x{n} matmul, {elems * 4} B copy", repeat),
        measured=True,
    )


def _copy_bytes_per_s(dev: Any, elems: int, sync: Callable[[], None], repeat: int) -> float:
    """Return the copy rate of `elems` fp32 values on `dev`, counting read + write (STREAM
    'copy'), in bytes/s."""
    import torch

    src = torch.ones(elems, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * elems * 4 / _best_seconds(functools.partial(dst.copy_, src), sync, repeat)


def _measure_cpu(name: str, threads: int, n: int, copy_bytes: int, repeat: int) -> DeviceSpec:
    import torch

    def sync() -> None:
        return None

    a = torch.randn(n, n)
    b = torch.randn(n, n)
    flops = 2 * n**3 / _best_seconds(functools.partial(torch.mm, a, b), sync, repeat)
    elems = max(copy_bytes // 4, 1)
    bandwidth = _copy_bytes_per_s("cpu", elems, sync, repeat)
    return DeviceSpec(
        name=name,
        kind="cpu",
        fp32_flops_per_s=flops,
        bandwidth_bytes_per_s=bandwidth,
        memory_bytes=None,
        source=_stamp(f"{threads} threads, {n}x{n} fp32 matmul, {elems * 4} B copy", repeat),
        measured=True,
    )
