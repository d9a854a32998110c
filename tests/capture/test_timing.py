"""time_cell on a fake clock: exact per-run times, warm-up kept apart, sync around runs."""

from __future__ import annotations

import statistics

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


def test_real_clock_against_perf_counter_sum() -> None:
    # A real (sleep-free) workload timed by time_cell vs the same runs timed by hand.
    import time

    def work() -> None:
        sum(i * i for i in range(20_000))

    stats = time_cell(work, warmup=1, repeat=5)
    hand = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        work()
        hand.append((time.perf_counter_ns() - t0) / 1e3)
    assert len(stats.wall_us) == 5
    assert all(t > 0 for t in stats.wall_us)
    # Same order of magnitude as a hand measurement (loose: the machine is shared).
    assert 0.2 < stats.median_us / statistics.median(hand) < 5


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

    stats = time_cell(run, warmup=2, repeat=5, sync=torch.cuda.synchronize,
                      use_cuda_events=True, device_name=torch.cuda.get_device_name())
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
    stats = time_cell(work.run, warmup=1, repeat=2, sync=work.sync, use_cuda_events=True,
                      device_name="Fake GPU", clock=work.clock)
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
