"""time_cell on a fake clock: exact per-run times, warm-up kept apart, sync around runs."""

from __future__ import annotations

import statistics
import time

import pytest

from gpuprof_nb.capture.timing import time_cell


class FakeWorkload:
    """A 'cell' whose n-th call advances a fake nanosecond clock by durations_ns[n]."""

    def __init__(self, durations_ns: list[int]) -> None:
        self.durations_ns = durations_ns
        self.now_ns = 1_000_000
        self.calls = 0
        self.events: list[str] = []

    def clock(self) -> int:
        return self.now_ns

    def run(self) -> None:
        self.events.append("run")
        self.now_ns += self.durations_ns[self.calls]
        self.calls += 1

    def sync(self) -> None:
        self.events.append("sync")


def test_warmup_runs_are_kept_apart_and_not_in_the_statistics() -> None:
    work = FakeWorkload([90_000_000, 10_000_000, 12_000_000, 11_000_000])
    stats = time_cell(work.run, warmup=1, repeat=3, clock=work.clock)
    assert work.calls == 4
    assert stats.warmup_wall_us == pytest.approx((90_000.0,))
    assert stats.wall_us == pytest.approx((10_000.0, 12_000.0, 11_000.0))
    assert stats.device_us is None
    # The statistics, recomputed by hand from the three timed runs only.
    assert stats.median_us == pytest.approx(11_000.0)
    assert stats.min_us == pytest.approx(10_000.0)
    assert stats.max_us == pytest.approx(12_000.0)
    assert stats.iqr_us == pytest.approx(11_500.0 - 10_500.0)
    assert not stats.noisy
    assert not stats.once


def test_noisy_when_slowest_run_is_over_one_and_a_half_times_the_fastest() -> None:
    work = FakeWorkload([1, 10_000, 16_000, 11_000])
    stats = time_cell(work.run, warmup=1, repeat=3, clock=work.clock)
    assert stats.max_us / stats.min_us == pytest.approx(1.6)
    assert stats.noisy


def test_once_runs_exactly_one_time_and_measures_it() -> None:
    work = FakeWorkload([42_000_000])
    stats = time_cell(work.run, warmup=5, repeat=7, once=True, clock=work.clock)
    assert work.calls == 1
    assert stats.once
    assert stats.warmup_wall_us == ()
    assert stats.wall_us == pytest.approx((42_000.0,))
    assert stats.median_us == pytest.approx(42_000.0)


def test_sync_brackets_every_run() -> None:
    work = FakeWorkload([5, 5, 5])
    time_cell(work.run, warmup=1, repeat=2, sync=work.sync, clock=work.clock)
    assert work.events == ["sync", "run", "sync"] * 3


def test_real_clock_readings_become_the_samples() -> None:
    # A real workload on the real clock: every sample is exactly the difference of the two
    # clock readings around its run (the readings are recorded as they are made), so the
    # arithmetic is checked without asserting anything about the machine's speed.
    import time

    readings: list[int] = []

    def clock() -> int:
        readings.append(time.perf_counter_ns())
        return readings[-1]

    def work() -> None:
        sum(i * i for i in range(2_000))

    stats = time_cell(work, warmup=1, repeat=5, number=1, clock=clock)
    assert len(readings) == 2 * (1 + 5)
    spans = [(b - a) / 1e3 for a, b in zip(readings[::2], readings[1::2], strict=True)]
    assert stats.warmup_wall_us == (spans[0],)
    assert stats.wall_us == tuple(spans[1:])
    assert all(t > 0 for t in stats.wall_us)
    assert stats.median_us == statistics.median(spans[1:])


def test_exception_propagates_unchanged() -> None:
    boom = ValueError("cell failed")

    def run() -> None:
        raise boom

    with pytest.raises(ValueError) as info:
        time_cell(run, warmup=0, repeat=3)
    assert info.value is boom


@pytest.mark.parametrize("kwargs", [{"repeat": 0}, {"warmup": -1}])
def test_bad_counts_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        time_cell(lambda: None, **kwargs)


@pytest.mark.gpu
def test_cuda_event_timing_matches_hand_written_events() -> None:
    import torch

    a = torch.randn(4096, 4096, device="cuda")

    def run() -> None:
        for _ in range(10):
            a @ a

    stats = time_cell(
        run,
        warmup=2,
        repeat=5,
        sync=torch.cuda.synchronize,
        use_cuda_events=True,
        device_name=torch.cuda.get_device_name(),
    )
    hand = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        hand.append(start.elapsed_time(end) * 1e3)
    assert stats.device_us is not None and len(stats.device_us) == 5
    assert stats.median_us == pytest.approx(statistics.median(hand), rel=0.1)
    # Wall time brackets the device time of a synchronised run.
    assert all(w >= d * 0.99 for w, d in zip(stats.wall_us, stats.device_us, strict=True))


def test_cuda_event_path_on_fake_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch without a GPU: fake events stamped from the fake clock, so the device
    time is known exactly and the order sync -> record -> run -> record -> sync is checked."""
    import gpuprof_nb.capture.timing as timing_mod

    work = FakeWorkload([1_000_000, 2_000_000, 3_000_000])

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.ns = None

        def record(self) -> None:
            work.events.append("record")
            self.ns = work.now_ns

        def elapsed_time(self, end: FakeEvent) -> float:
            return (end.ns - self.ns) / 1e6  # milliseconds, as torch reports

    monkeypatch.setattr(timing_mod.torch.cuda, "Event", FakeEvent)
    stats = time_cell(
        work.run,
        warmup=1,
        repeat=2,
        sync=work.sync,
        use_cuda_events=True,
        device_name="Fake GPU",
        clock=work.clock,
    )
    assert stats.device_us == pytest.approx((2_000.0, 3_000.0))
    assert stats.wall_us == pytest.approx((2_000.0, 3_000.0))
    assert stats.warmup_wall_us == pytest.approx((1_000.0,))
    assert stats.times_us == stats.device_us and stats.device_name == "Fake GPU"
    assert work.events == ["sync", "run", "sync"] + ["sync", "record", "run", "record", "sync"] * 2


def test_before_each_runs_before_every_run_outside_the_timed_span() -> None:
    work = FakeWorkload([1_000, 2_000, 3_000])

    def before() -> None:
        work.events.append("before")
        work.now_ns += 10_000_000  # would dominate every time if it were inside the span

    stats = time_cell(work.run, warmup=1, repeat=2, clock=work.clock, before_each=before)
    assert work.events == ["before", "run"] * 3
    assert stats.warmup_wall_us == pytest.approx((1.0,))
    assert stats.wall_us == pytest.approx((2.0, 3.0))


# Blocks: short cells are timed as samples of `number` back-to-back runs (per run = block / k).


def test_auto_number_fills_the_target_at_the_fastest_pace() -> None:
    from gpuprof_nb.capture.timing import BLOCK_TARGET_US, MAX_NUMBER, auto_number

    assert auto_number(()) == 1  # nothing to go by
    assert auto_number((BLOCK_TARGET_US / 10,)) == 10
    assert auto_number((BLOCK_TARGET_US / 3, BLOCK_TARGET_US / 7)) == 7  # the fastest run
    assert auto_number((BLOCK_TARGET_US * 0.51,)) == 1  # over half the target: one run
    assert auto_number((BLOCK_TARGET_US * 5,)) == 1
    assert auto_number((0.0,)) == MAX_NUMBER  # below the clock's resolution: capped


def test_forced_number_times_blocks_and_reports_per_run_times() -> None:
    durations = [7_000, *range(1_000, 1_000 + 3 * 4 * 10, 10)]  # ns: 1 warm-up, 3 blocks of 4
    work = FakeWorkload(durations)
    stats = time_cell(work.run, warmup=1, repeat=3, number=4, sync=work.sync, clock=work.clock)
    assert work.calls == 1 + 3 * 4
    assert stats.number == 4 and stats.runs == 3 and stats.timed_runs == 12
    # Per run = the block's four durations summed, over four (recomputed from the list).
    blocks = [durations[1 + 4 * i : 5 + 4 * i] for i in range(3)]
    assert stats.wall_us == pytest.approx(tuple(sum(b) / 4 / 1e3 for b in blocks))
    assert stats.warmup_wall_us == pytest.approx((7.0,))  # warm-up runs stay single runs
    # The sync brackets each block, not each run.
    assert work.events == ["sync", "run", "sync"] + (["sync"] + ["run"] * 4 + ["sync"]) * 3


def test_auto_blocks_calibrate_on_a_block_then_time_blocks_of_the_target() -> None:
    from gpuprof_nb.capture.timing import BLOCK_TARGET_US

    cold_ns, warm_ns = 400_000, 50_000  # a cold first run of 400 us, then 50 us per run
    k0 = int(BLOCK_TARGET_US // 400)  # calibration block sized from the warm-up run
    k = int(BLOCK_TARGET_US // 50)  # samples sized from the calibration block's pace
    work = FakeWorkload([cold_ns] + [warm_ns] * (k0 + 3 * k))
    stats = time_cell(work.run, warmup=1, repeat=3, number=None, clock=work.clock)
    assert stats.number == k
    assert work.calls == 1 + k0 + 3 * k
    # Every call of the cell is accounted for, calibration included.
    assert stats.calibration_runs == k0 and stats.cell_runs == work.calls
    assert stats.wall_us == pytest.approx((50.0, 50.0, 50.0))
    assert stats.warmup_wall_us == pytest.approx((400.0,))


def test_auto_leaves_slow_cells_and_cells_without_warmup_one_run_per_sample() -> None:
    from gpuprof_nb.capture.timing import BLOCK_TARGET_US

    slow_ns = int(BLOCK_TARGET_US * 1e3 * 0.6)
    work = FakeWorkload([slow_ns] * 4)
    stats = time_cell(work.run, warmup=1, repeat=3, number=None, clock=work.clock)
    assert stats.number == 1 and work.calls == 4
    work = FakeWorkload([1_000] * 3)
    stats = time_cell(work.run, warmup=0, repeat=3, number=None, clock=work.clock)
    assert stats.number == 1 and work.calls == 3


def test_a_cell_that_changes_state_is_not_blocked_automatically() -> None:
    work = FakeWorkload([1_000] * 4)

    def before() -> bool:
        work.events.append("before")
        return work.calls > 0  # every run leaves state to put back

    stats = time_cell(
        work.run, warmup=1, repeat=3, number=None, clock=work.clock, before_each=before
    )
    assert stats.number == 1 and work.calls == 4
    assert work.events == ["before", "run"] * 4


def test_forced_blocks_reset_state_between_runs_inside_the_block() -> None:
    work = FakeWorkload([1_000] * 7)

    def before() -> bool:
        work.events.append("before")
        work.now_ns += 500  # inside the timed span only when called between runs
        return work.calls > 0

    stats = time_cell(work.run, warmup=1, repeat=2, number=3, clock=work.clock, before_each=before)
    assert work.events == (
        ["before", "run"] + ["before", "run", "before", "run", "before", "run"] * 2
    )
    # Each block: 3 runs of 1 us and the 2 resets between them (0.5 us each), over 3.
    assert stats.wall_us == pytest.approx(((3_000 + 2 * 500) / 3 / 1e3,) * 2)


@pytest.mark.parametrize("number", [None, 5])
def test_exception_inside_a_block_propagates_unchanged(number: int | None) -> None:
    boom = ValueError("run 4 failed")
    calls = []

    def run() -> None:
        calls.append(1)
        if len(calls) == 4:  # 1 warm-up, then the 3rd run of the first block
            raise boom

    with pytest.raises(ValueError) as info:
        time_cell(run, warmup=1, repeat=3, number=number)
    assert info.value is boom and len(calls) == 4


def test_bad_number_is_refused() -> None:
    with pytest.raises(ValueError, match="number"):
        time_cell(lambda: None, number=0)


def test_cuda_blocks_put_the_events_around_the_whole_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpuprof_nb.capture.timing as timing_mod

    work = FakeWorkload([9_000] + [1_000, 2_000, 3_000] * 2)

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            self.ns = 0

        def record(self) -> None:
            work.events.append("record")
            self.ns = work.now_ns

        def elapsed_time(self, end: FakeEvent) -> float:
            return (end.ns - self.ns) / 1e6

    monkeypatch.setattr(timing_mod.torch.cuda, "Event", FakeEvent)
    stats = time_cell(
        work.run,
        warmup=1,
        repeat=2,
        number=3,
        sync=work.sync,
        use_cuda_events=True,
        clock=work.clock,
    )
    assert stats.device_us == pytest.approx((2.0, 2.0))  # (1 + 2 + 3) us / 3 per block
    assert stats.wall_us == pytest.approx((2.0, 2.0))
    assert work.events == (
        ["sync", "run", "sync"] + ["sync", "record", "run", "run", "run", "record", "sync"] * 2
    )


@pytest.mark.gpu
def test_cuda_blocks_match_hand_written_events_around_k_runs() -> None:
    """Blocks of K runs between two CUDA events, against the same loop written by hand.
    The two alternate over rounds and their pooled medians are compared: on an H100 one
    round of a 256x256 matmul moved by up to 30% against the next (GPU clocks), while
    the median over 40 alternating rounds agreed within 1% (docs/gpu-results.md)."""
    import torch

    a = torch.randn(256, 256, device="cuda")

    def run() -> None:
        a @ a

    ours: list[float] = []
    hand: list[float] = []
    for _round in range(7):
        stats = time_cell(
            run,
            warmup=3,
            repeat=5,
            number=50,
            sync=torch.cuda.synchronize,
            use_cuda_events=True,
            device_name=torch.cuda.get_device_name(),
        )
        assert stats.number == 50 and stats.device_us is not None
        ours += stats.times_us  # what the report shows: the device times
        for _ in range(5):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(50):
                run()
            end.record()
            torch.cuda.synchronize()
            hand.append(start.elapsed_time(end) * 1e3 / 50)
    assert statistics.median(ours) == pytest.approx(statistics.median(hand), rel=0.15)


def test_a_cold_warmup_does_not_hide_a_short_cell() -> None:
    """The warm-up ran slow (a cold start) but the first timed run is short: that run is
    not kept, a calibration block follows, and every sample is a block."""
    from gpuprof_nb.capture.timing import BLOCK_TARGET_US

    cold_ns, warm_ns = int(BLOCK_TARGET_US * 1e3 * 0.8), 40_000
    k = int(BLOCK_TARGET_US // 40)
    work = FakeWorkload([cold_ns] + [warm_ns] * (1 + k + 3 * k))
    stats = time_cell(work.run, warmup=1, repeat=3, number=None, clock=work.clock)
    assert stats.number == k and stats.runs == 3
    assert work.calls == 1 + 1 + k + 3 * k  # warm-up, dropped probe, calibration, samples
    assert stats.calibration_runs == 1 + k and stats.cell_runs == work.calls
    assert stats.wall_us == pytest.approx((40.0, 40.0, 40.0))
    assert stats.warmup_wall_us == pytest.approx((BLOCK_TARGET_US * 0.8,))


def test_old_and_new_agree_run_by_run_for_cells_of_half_a_block_or_more() -> None:
    """Cells slower than half the block target are timed exactly as before blocks existed:
    one run per sample, per-run time = (end - start) / 1e3, recomputed here."""
    import random

    from gpuprof_nb.capture.timing import BLOCK_TARGET_US

    rng = random.Random(7)
    for _ in range(50):
        durations = [rng.randint(int(BLOCK_TARGET_US * 500) + 1, 10**9) for _ in range(12)]
        warmup, repeat = rng.randint(0, 3), rng.randint(1, 8)
        work = FakeWorkload(durations)
        stats = time_cell(work.run, warmup=warmup, repeat=repeat, number=None, clock=work.clock)
        assert stats.number == 1 and work.calls == warmup + repeat
        assert stats.warmup_wall_us == tuple(d / 1e3 for d in durations[:warmup])
        assert stats.wall_us == tuple(d / 1e3 for d in durations[warmup : warmup + repeat])


def test_automatic_warmup_runs_until_the_budget_then_stops() -> None:
    from gpuprof_nb.capture.timing import WARMUP_BUDGET_US

    # 1.2 ms runs: five warm-up runs reach 6 ms, four only 4.8 ms of the 5 ms budget.
    run_ns = 1_200_000
    assert 4 * run_ns / 1e3 < WARMUP_BUDGET_US <= 5 * run_ns / 1e3
    work = FakeWorkload([run_ns] * 8)
    stats = time_cell(work.run, warmup=None, repeat=3, clock=work.clock)
    assert len(stats.warmup_wall_us) == 5 and work.calls == 8 == stats.cell_runs
    # A cell slower than the budget warms up exactly once, as with warmup=1.
    work = FakeWorkload([int(WARMUP_BUDGET_US * 1e3) + 1] * 4)
    stats = time_cell(work.run, warmup=None, repeat=3, clock=work.clock)
    assert len(stats.warmup_wall_us) == 1 and work.calls == 4


def test_automatic_warmup_of_a_zero_time_cell_is_capped() -> None:
    from gpuprof_nb.capture.timing import MAX_AUTO_WARMUP

    work = FakeWorkload([0] * (MAX_AUTO_WARMUP + 3))
    stats = time_cell(work.run, warmup=None, repeat=3, clock=work.clock)
    assert len(stats.warmup_wall_us) == MAX_AUTO_WARMUP
    assert work.calls == MAX_AUTO_WARMUP + 3


def test_the_wait_for_a_core_is_measured_around_the_timed_runs(monkeypatch) -> None:
    """The scheduler's run delay (a stand-in counter here) read before and after the timed
    samples: its growth over their wall time is the share the thread waited for a core."""
    from gpuprof_nb.capture import timing as timing_mod

    reads = iter([1_000_000, 1_000_000 + 2_000_000])
    monkeypatch.setattr(timing_mod, "read_run_delay_ns", lambda: next(reads))
    stats = timing_mod.time_cell(lambda: time.sleep(0.01), warmup=0, repeat=1, number=1)
    # 2 ms of waiting in a run of at least 10 ms.
    assert 0 < stats.waited_fraction <= 0.2
    monkeypatch.setattr(timing_mod, "read_run_delay_ns", lambda: None)
    assert timing_mod.time_cell(lambda: None, warmup=0, repeat=1).waited_fraction is None
