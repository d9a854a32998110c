"""Run timings of a cell: CUDA events around synchronised runs (perf_counter_ns on CPU),
warm-up runs kept apart, the profiler never attached."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from gpuprof_nb.model.timing import TimingStats


def time_cell(
    run: Callable[[], object],
    *,
    warmup: int = 1,
    repeat: int = 3,
    once: bool = False,
    sync: Callable[[], None] | None = None,
    use_cuda_events: bool = False,
    device_name: str = "cpu",
    clock: Callable[[], int] = time.perf_counter_ns,
    before_each: Callable[[], object] | None = None,
) -> TimingStats:
    """Return per-run wall times (and CUDA-event device times) in microseconds.

    `warmup` runs are timed by wall clock only and kept in `warmup_wall_us`, never in the
    statistics. `once` runs `run` exactly one time, measured (so it includes cold-start
    effects). `sync` (e.g. torch.cuda.synchronize) is called before each run starts and after
    it ends, so the wall time covers the device work the run queued, not just its launch.
    `clock` returns nanoseconds; tests pass a fake one. `before_each` (e.g. resetting grad
    mode) is called before every run, outside the timed span. Exceptions from `run`
    propagate as is.
    """
    # IPython leaves frames that set __tracebackhide__ out of the user's traceback, so an
    # error in a profiled cell reads as if the cell had run on its own.
    __tracebackhide__ = True  # noqa: F841
    if repeat < 1 and not once:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if warmup < 0:
        raise ValueError(f"warmup must be 0 or more, got {warmup}")
    n_warm, n_timed = (0, 1) if once else (warmup, repeat)

    warm: list[float] = []
    for _ in range(n_warm):
        if before_each is not None:
            before_each()
        warm.append(_wall_once(run, sync, clock))
    wall: list[float] = []
    device: list[float] = []
    for _ in range(n_timed):
        if before_each is not None:
            before_each()
        if use_cuda_events:
            wall_us, device_us = _cuda_once(run, sync, clock)
            device.append(device_us)
        else:
            wall_us = _wall_once(run, sync, clock)
        wall.append(wall_us)
    return TimingStats(
        wall_us=tuple(wall),
        device_us=tuple(device) if use_cuda_events else None,
        warmup_wall_us=tuple(warm),
        once=once,
        device_name=device_name,
    )


def _wall_once(
    run: Callable[[], object], sync: Callable[[], None] | None, clock: Callable[[], int]
) -> float:
    """Return the wall time of one synchronised run in microseconds."""
    __tracebackhide__ = True  # noqa: F841
    if sync is not None:
        sync()
    start = clock()
    run()
    if sync is not None:
        sync()
    return (clock() - start) / 1e3


def _cuda_once(
    run: Callable[[], object], sync: Callable[[], None] | None, clock: Callable[[], int]
) -> tuple[float, float]:
    """Return (wall_us, device_us) of one run; device time from CUDA events on the current
    stream, which elapsed_time reports in milliseconds."""
    __tracebackhide__ = True  # noqa: F841
    sync_fn = sync if sync is not None else torch.cuda.synchronize
    start_ev = torch.cuda.Event(enable_timing=True)
    end_ev = torch.cuda.Event(enable_timing=True)
    sync_fn()
    start = clock()
    start_ev.record()
    run()
    end_ev.record()
    sync_fn()
    wall_us = (clock() - start) / 1e3
    return wall_us, float(start_ev.elapsed_time(end_ev)) * 1e3
