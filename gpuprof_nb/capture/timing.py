"""Run timings of a cell: CUDA events around synchronised runs (perf_counter_ns on CPU),
warm-up runs kept apart, the profiler never attached. Short cells are timed in blocks of
back-to-back runs (what timeit and torch.utils.benchmark do), so the clock reads and the
call into the cell are paid once per block, not once per run."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import torch

from gpuprof_nb.model.timing import TimingStats

# A sample of a short cell is a block of back-to-back runs lasting about this long; a cell
# slower than half of it runs once per sample. Chosen on measurements (issue 7): per sample,
# the clock reads and the call into the cell cost a small fraction of a 1 ms block, more with
# a CUDA sync and two events (benchmarks/RESULTS.md, "Measurements behind design choices",
# M7), and a cell of 0.5 ms or more per run still runs exactly --warmup + --repeat times
# (timing a 1 ms cell costs what running it 4 times does).
BLOCK_TARGET_US = 1_000.0
# Most runs in one block: a cell measuring 0 us (clock resolution) must not loop forever.
MAX_NUMBER = 1_000_000
# The automatic warm-up (warmup=None): runs until they add up to this much, at least one.
# One run is not enough for a cell of about a millisecond: the first runs after a pause take
# longer (caches, branch predictors, the allocator), and with one warm-up run the median of
# 3 samples could read well above Timer's, where a few warm-up runs brought it into line
# (issue 7; benchmarks/RESULTS.md, "Measurements behind design choices", M8; section 2
# measures the defaults against Timer). 5 ms of warm-up costs a cell of 5 ms or more its
# single warm-up run, as before.
WARMUP_BUDGET_US = 5_000.0
# Most automatic warm-up runs (a cell measuring 0 us must not loop forever).
MAX_AUTO_WARMUP = 10_000


def auto_number(run_us: tuple[float, ...], target_us: float = BLOCK_TARGET_US) -> int:
    """Return the runs per sample for a cell whose runs took `run_us` (microseconds): as
    many as fit in `target_us` at the fastest run's pace, at least 1 (so 1 for a cell slower
    than half the target). With no run to go by, 1."""
    if not run_us:
        return 1
    fastest = min(run_us)
    if fastest <= 0:
        return MAX_NUMBER
    return max(1, min(MAX_NUMBER, math.floor(target_us / fastest)))


def time_cell(
    run: Callable[[], object],
    *,
    warmup: int | None = 1,
    repeat: int = 3,
    once: bool = False,
    sync: Callable[[], None] | None = None,
    use_cuda_events: bool = False,
    device_name: str = "cpu",
    clock: Callable[[], int] = time.perf_counter_ns,
    before_each: Callable[[], object] | None = None,
    number: int | None = 1,
    run_block: Callable[[int], Callable[[], object] | None] | None = None,
) -> TimingStats:
    """Return per-run wall times (and CUDA-event device times) in microseconds, one per
    sample; a sample is `number` back-to-back runs and its time is the block's divided by
    `number` (TimingStats.number says how many).

    `warmup` runs are single runs timed by wall clock only and kept in `warmup_wall_us`,
    never in the statistics; `warmup=None` runs at least one and goes on until they add up
    to WARMUP_BUDGET_US (a short cell reaches its steady pace; a slow one runs once).
    `number=None` picks the runs per sample the way timeit does: 1 without a warm-up or
    when the fastest warm-up run took over half of BLOCK_TARGET_US;
    otherwise one more untimed block, sized from the warm-up, measures the pace of runs
    that follow one another (the first run of a cell is often slower), and samples are
    blocks of about BLOCK_TARGET_US at that pace (auto_number). When the warm-up said
    "slow" but the first timed run is short (a cold start), that run is not kept: the
    calibration starts from it and all `repeat` samples are blocks.

    `once` runs `run` exactly one time, measured (so it includes cold-start effects).
    `sync` (e.g. torch.cuda.synchronize) is called before each sample starts and after it
    ends, so the wall time covers the device work it queued, not just its launch; CUDA
    events bracket the whole block. `clock` returns nanoseconds; tests pass a fake one.
    `run_block(n)`, if given, returns a callable that runs the cell n times back to back
    (e.g. the cell compiled inside a loop: no call per run) or None; it is built before the
    clock starts. Without it, or when it returns None, a block calls `run` n times.

    `before_each` (e.g. resetting grad mode) is called before every warm-up run and every
    sample, outside the timed span. A truthy return says the previous run had changed
    state it had to put back: then automatic blocks are not used (each run must start from
    the state it found), and with a forced `number` above 1 it is also called between the
    runs of a block, inside the timed span. Exceptions from `run` propagate as is.
    """
    # IPython leaves frames that set __tracebackhide__ out of the user's traceback, so an
    # error in a profiled cell reads as if the cell had run on its own.
    __tracebackhide__ = True  # noqa: F841
    _check_counts(warmup=warmup, repeat=repeat, once=once, number=number)
    n_warm, n_timed = (0, 1) if once else (warmup, repeat)
    warm = _warm_up(run, n_warm, before_each, sync, clock)
    if once:
        number = 1
    samples = _Samples(
        run,
        number=number,
        # A cold first run (lazy initialisation, first kernel selection) can make a short
        # cell look slow: the first timed run gets one look too, and if it shows a short
        # cell it is not kept but starts the calibration. Not with --warmup 0 (no run may
        # go unmeasured).
        probing=number is None and bool(warm),
        sync=sync,
        clock=clock,
        before_each=before_each,
        run_block=run_block,
        use_cuda_events=use_cuda_events,
    )
    delay0, real0 = read_run_delay_ns(), time.perf_counter_ns()
    wall, device = samples.take(n_timed, warm)
    waited = _waited_since(delay0, real0)
    return TimingStats(
        wall_us=tuple(wall),
        device_us=tuple(device) if use_cuda_events else None,
        warmup_wall_us=tuple(warm),
        once=once,
        device_name=device_name,
        number=samples.number or 1,
        calibration_runs=samples.untimed,
        waited_fraction=waited,
    )


def _waited_since(delay0: int | None, real0: int) -> float | None:
    """Return the share (0-1) of the time since `real0` (perf_counter_ns) this thread
    spent waiting for a core, from its run delay then (`delay0`, ns) and now; None where
    the OS does not say."""
    delay1, real1 = read_run_delay_ns(), time.perf_counter_ns()
    if delay0 is not None and delay1 is not None and real1 > real0:
        return min(max((delay1 - delay0) / (real1 - real0), 0.0), 1.0)
    return None


def _check_counts(*, warmup: int | None, repeat: int, once: bool, number: int | None) -> None:
    """Raise ValueError for a run count time_cell cannot honour."""
    if repeat < 1 and not once:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if warmup is not None and warmup < 0:
        raise ValueError(f"warmup must be 0 or more, got {warmup}")
    if number is not None and number < 1:
        raise ValueError(f"number must be at least 1, got {number}")


def _warm_up(
    run: Callable[[], object],
    n_warm: int | None,
    before_each: Callable[[], object] | None,
    sync: Callable[[], None] | None,
    clock: Callable[[], int],
) -> list[float]:
    """Return the wall times (us) of the warm-up's single runs: `n_warm` of them, or with
    None at least one and more until they add up to WARMUP_BUDGET_US (at most
    MAX_AUTO_WARMUP)."""
    __tracebackhide__ = True  # noqa: F841
    warm: list[float] = []
    spent_us = 0.0
    while (
        len(warm) < n_warm
        if n_warm is not None
        else not warm or (spent_us < WARMUP_BUDGET_US and len(warm) < MAX_AUTO_WARMUP)
    ):
        if before_each is not None:
            before_each()
        warm.append(_wall_block(run, 1, sync, clock))
        spent_us += warm[-1]
    return warm


class _Samples:
    """The timed samples of one time_cell call, with what deciding the block size left
    behind: `number` (runs per sample; None until calibrated), `untimed` (runs between the
    warm-up and the samples: calibration, a probe not kept) and `between` (what runs
    between the runs of a block, once a run was seen to change state)."""

    __slots__ = (
        "before_each",
        "between",
        "clock",
        "number",
        "probing",
        "run",
        "run_block",
        "sync",
        "untimed",
        "use_cuda_events",
    )

    def __init__(
        self,
        run: Callable[[], object],
        *,
        number: int | None,
        probing: bool,
        sync: Callable[[], None] | None,
        clock: Callable[[], int],
        before_each: Callable[[], object] | None,
        run_block: Callable[[int], Callable[[], object] | None] | None,
        use_cuda_events: bool,
    ) -> None:
        self.run = run
        self.number = number
        self.probing = probing
        self.sync = sync
        self.clock = clock
        self.before_each = before_each
        self.run_block = run_block
        self.use_cuda_events = use_cuda_events
        self.between: Callable[[], object] | None = None
        self.untimed = 0

    def take(self, n_timed: int, warm: list[float]) -> tuple[list[float], list[float]]:
        """Return the wall and device times (us per run) of `n_timed` kept samples (device
        times only with CUDA events), sizing blocks from the `warm` runs' pace when
        `number` is None."""
        __tracebackhide__ = True  # noqa: F841
        before_each = self.before_each
        wall: list[float] = []
        device: list[float] = []
        while len(wall) < n_timed:
            if before_each is not None and before_each():
                # The previous run changed state (grad/autocast mode): runs must not follow
                # one another unreset. Decided here, after a real run, so it costs nothing
                # otherwise.
                if self.number is None:
                    self.number = 1
                self.probing = False
                self.between = before_each
            if self.number is None:
                # The warm-up's pace (often a cold first run) sizes a calibration block; the
                # block's own pace sizes the samples.
                self.number = auto_number(tuple(warm))
                if self.number > 1:
                    self.number, self.probing = self.calibrated(self.number), False
            number = self.number
            block = _block(self.run, number, self.between, self.run_block)
            if self.use_cuda_events:
                wall_us, device_us = _cuda_block(block, number, self.sync, self.clock)
            else:
                wall_us, device_us = _wall_block(block, number, self.sync, self.clock), 0.0
            if self.probing:
                self.probing = False
                first_number = auto_number((wall_us,))
                if first_number > 1 and self.between is None:
                    self.untimed += number
                    self.number = self.calibrated(first_number)
                    continue
            wall.append(wall_us)
            if self.use_cuda_events:
                device.append(device_us)
        return wall, device

    def calibrated(self, first_number: int) -> int:
        """Time one untimed block of `first_number` runs; return the runs per sample its
        pace gives (1 if a run changed state that must be reset)."""
        __tracebackhide__ = True  # noqa: F841
        self.untimed += first_number
        block = _block(self.run, first_number, None, self.run_block)
        pace_us = _wall_block(block, first_number, self.sync, self.clock)
        if self.before_each is not None and self.before_each():
            self.between = self.before_each
            return 1
        return auto_number((pace_us,))


# This thread's scheduler statistics (Linux): the second field is the time it has waited
# for a core while ready to run, in nanoseconds.
SCHEDSTAT = "/proc/thread-self/schedstat"


def read_run_delay_ns() -> int | None:
    """The time this thread has waited for a core while ready to run (ns), or None where
    the OS does not say (not Linux, schedstat off)."""
    try:
        with open(SCHEDSTAT, "rb") as fh:
            return int(fh.read(128).split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _block(
    run: Callable[[], object],
    number: int,
    between: Callable[[], object] | None,
    run_block: Callable[[int], Callable[[], object] | None] | None,
) -> Callable[[], object]:
    """Return a callable that runs one block of `number` runs (`run` itself for one run)."""
    if number == 1:
        return run
    if between is None and run_block is not None:
        block = run_block(number)
        if block is not None:
            return block
    return functools.partial(_loop, run, number, between)


def _loop(run: Callable[[], object], number: int, between: Callable[[], object] | None) -> None:
    """Run `run` `number` times back to back (calling `between` between runs if given)."""
    __tracebackhide__ = True  # noqa: F841
    if between is None:
        for _ in range(number):
            run()
        return
    run()
    for _ in range(number - 1):
        between()
        run()


def _wall_block(
    block: Callable[[], object],
    number: int,
    sync: Callable[[], None] | None,
    clock: Callable[[], int],
) -> float:
    """Return the wall time per run of one synchronised block of `number` runs, in
    microseconds."""
    __tracebackhide__ = True  # noqa: F841
    if sync is not None:
        sync()
    start = clock()
    block()
    if sync is not None:
        sync()
    return (clock() - start) / 1e3 / number


def _cuda_block(
    block: Callable[[], object],
    number: int,
    sync: Callable[[], None] | None,
    clock: Callable[[], int],
) -> tuple[float, float]:
    """Return (wall_us, device_us) per run of one block of `number` runs; device time from
    CUDA events on the current stream around the whole block (elapsed_time reports
    milliseconds)."""
    __tracebackhide__ = True  # noqa: F841
    sync_fn = sync if sync is not None else torch.cuda.synchronize
    start_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    sync_fn()
    start = clock()
    start_ev.record()
    block()
    end_ev.record()
    sync_fn()
    wall_us = (clock() - start) / 1e3 / number
    return wall_us, float(start_ev.elapsed_time(end_ev)) * 1e3 / number
