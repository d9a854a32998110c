"""The pure rules: three-run reading, keep/drop verdicts, plateau, drift - on synthetic numbers."""

from __future__ import annotations

import math
import statistics

import pytest

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.ladder.verdicts import (
    BatchPoint,
    BatchSweep,
    LadderReport,
    RungResult,
    find_plateau,
    judge_checkpoint_rung,
    judge_speed_rung,
    read_three_runs,
    recommend,
    relative_drift,
)


def test_small_precision_gain_points_to_the_data_loader():
    reading = read_three_runs(1000.0, 1100.0, 1500.0)
    assert reading.precision_gain == pytest.approx(0.10)
    assert reading.compile_gain == pytest.approx(1500 / 1100 - 1)
    assert reading.precision_is_bottleneck is False
    assert "not precision" in reading.verdict
    assert "DataLoader" in reading.next_step


def test_large_precision_gain_and_small_compile_gain():
    reading = read_three_runs(1000.0, 1500.0, 1560.0)
    assert reading.precision_gain == pytest.approx(0.5)
    assert reading.compile_gain == pytest.approx(0.04)
    assert reading.precision_is_bottleneck is True
    assert "already well fused" in reading.verdict


def test_threshold_is_exclusive_at_twenty_percent():
    assert read_three_runs(100.0, 120.0, None).precision_is_bottleneck is True
    assert read_three_runs(100.0, 119.9, None).precision_is_bottleneck is False


def test_slower_compile_says_so():
    reading = read_three_runs(1000.0, 1500.0, 1200.0)
    assert reading.compile_gain == pytest.approx(-0.2)
    assert "made it slower (-20.0%)" in reading.verdict


def test_slower_low_precision_is_not_a_precision_bottleneck():
    reading = read_three_runs(1000.0, 400.0, None)
    assert reading.precision_gain == pytest.approx(-0.6)
    assert reading.precision_is_bottleneck is False
    assert reading.compile_gain is None
    assert "not measured" in reading.verdict


def test_missing_runs_and_bad_baseline():
    reading = read_three_runs(1000.0, None, None)
    assert reading.precision_is_bottleneck is None
    with pytest.raises(GpuprofError, match="fp32"):
        read_three_runs(0.0, 100.0, None)
    with pytest.raises(GpuprofError):
        read_three_runs(math.nan, 100.0, None)


def test_judge_speed_rung():
    assert judge_speed_rung(100.0, 110.0, 0.001, loss_tolerance=0.05, min_gain=0.03)[0] == "kept"
    status, reason = judge_speed_rung(100.0, 101.0, 0.0, loss_tolerance=0.05, min_gain=0.03)
    assert status == "dropped" and "+1.0%" in reason
    status, reason = judge_speed_rung(100.0, 50.0, 0.0, loss_tolerance=0.05, min_gain=0.03)
    assert status == "dropped" and "50.0% slower" in reason
    status, reason = judge_speed_rung(100.0, 300.0, 0.2, loss_tolerance=0.05, min_gain=0.03)
    assert status == "flagged" and "20.00%" in reason
    assert judge_speed_rung(100.0, 300.0, None, loss_tolerance=0.05, min_gain=0.03)[0] == "flagged"
    assert (
        judge_speed_rung(100.0, 300.0, math.inf, loss_tolerance=0.05, min_gain=0.03)[0] == "flagged"
    )


def test_judge_speed_rung_by_the_noise_aware_verdict():
    """With step times on both sides, the verdict compare() gives decides: a gain inside
    the noise is 'no clear change', not kept and not dropped."""
    base = (1000.0, 1100.0, 950.0, 1050.0)
    noisy = (930.0, 1080.0, 900.0, 990.0)  # a 6% median gain, the samples overlapping
    status, reason = judge_speed_rung(
        100.0,
        106.0,
        0.0,
        loss_tolerance=0.05,
        min_gain=0.03,
        current_us_per_sample=base,
        candidate_us_per_sample=noisy,
    )
    assert status == "no clear change" and "inside the noise" in reason
    clear = tuple(t / 1.5 for t in base)
    assert (
        judge_speed_rung(
            100.0,
            150.0,
            0.0,
            loss_tolerance=0.05,
            min_gain=0.03,
            current_us_per_sample=base,
            candidate_us_per_sample=clear,
        )[0]
        == "kept"
    )
    slower = tuple(t * 1.5 for t in base)
    assert (
        judge_speed_rung(
            100.0,
            66.7,
            0.0,
            loss_tolerance=0.05,
            min_gain=0.03,
            current_us_per_sample=base,
            candidate_us_per_sample=slower,
        )[0]
        == "dropped"
    )


def test_judge_checkpoint_rung():
    # 40% memory saved for 25% more time per sample: worth it.
    status, reason = judge_checkpoint_rung(
        100.0, 10 * 2**20, 80.0, 6 * 2**20, 0.0, loss_tolerance=0.05
    )
    assert status == "kept"
    assert "40.0%" in reason and "+25.0%" in reason
    # 10% saved: not worth it.
    assert (
        judge_checkpoint_rung(100.0, 10 * 2**20, 90.0, 9 * 2**20, 0.0, loss_tolerance=0.05)[0]
        == "dropped"
    )
    # Under 1 MiB either way: too small to claim a saving.
    status, reason = judge_checkpoint_rung(100.0, 900_000, 99.0, 100, 0.0, loss_tolerance=0.05)
    assert status == "dropped" and "too small" in reason
    # No memory number: cannot claim a saving.
    assert judge_checkpoint_rung(100.0, None, 90.0, 10, 0.0, loss_tolerance=0.05)[0] == "dropped"


def test_relative_drift():
    assert relative_drift(1.1, 1.0) == pytest.approx(0.1)
    assert relative_drift(float("nan"), 1.0) == math.inf
    assert relative_drift(None, 1.0) is None


def _point(batch: int, rate: float) -> BatchPoint:
    # Three steps whose median makes exactly `rate` samples/s.
    step_us = batch / rate * 1e6
    return BatchPoint(batch, "ok", (step_us * 0.9, step_us, step_us * 1.2))


def test_plateau_and_oom():
    points = (
        _point(8, 100.0),
        _point(16, 190.0),
        _point(32, 300.0),
        _point(64, 320.0),
        _point(128, 310.0),
        BatchPoint(256, "oom", error="out of memory"),
    )
    assert points[2].samples_per_s == pytest.approx(300.0)
    assert find_plateau(points) == 32
    sweep = BatchSweep("fp32", points)
    assert sweep.plateau_batch_size == 32
    assert sweep.oom_batch_size == 256
    assert sweep.best is not None and sweep.best.batch_size == 64
    assert "from batch size 32" in sweep.summary() and "256 ran out" in sweep.summary()


def test_no_plateau_while_throughput_climbs():
    points = (_point(8, 100.0), _point(16, 200.0), _point(32, 400.0))
    assert find_plateau(points) is None
    assert find_plateau(points[:1]) is None


def _rung(name: str, status: str, rate: float, peak: int, reason: str = "r") -> RungResult:
    step_us = 32 / rate * 1e6
    return RungResult(
        name,
        f"{name} settings",
        status,
        reason,
        step_times_us=(step_us, step_us * 1.1, step_us * 0.95),
        samples_per_step=32,
        peak_memory_bytes=peak,
        final_loss=1.0,
        loss_drift=0.0,
    )


def _report(*rungs: RungResult) -> LadderReport:
    return LadderReport(
        rungs=rungs,
        three_run=None,
        device_name="cpu",
        memory_method="m",
        steps=3,
        warmup=1,
        batch_size=32,
        seed=0,
        loss_tolerance=0.05,
    )


def test_rung_numbers_match_an_independent_computation():
    rung = RungResult(
        "x", "s", "kept", step_times_us=(100.0, 300.0, 200.0, 1000.0), samples_per_step=10
    )
    median = statistics.median([100.0, 300.0, 200.0, 1000.0])
    assert rung.median_step_us == pytest.approx(250.0) == pytest.approx(median)
    assert rung.samples_per_s == pytest.approx(10 / 250e-6)
    # numpy's default quantiles of (100, 200, 300, 1000): 175 and 475.
    assert rung.step_iqr_us == pytest.approx(475.0 - 175.0)


def test_recommendation_combines_kept_rungs():
    report = _report(
        _rung("fp32", "baseline", 1000.0, 4 * 2**20),
        _rung("bf16", "kept", 1800.0, 3 * 2**20, "faster"),
        _rung("compile", "failed", 1.0, 0, "RuntimeError: boom"),
        _rung("fused_adamw", "kept", 2000.0, 2 * 2**20, "faster still"),
    )
    assert report.final.name == "fused_adamw"
    assert report.speedup == pytest.approx(2.0)
    assert report.memory_ratio == pytest.approx(0.5)
    text = recommend(report)
    assert "Keep: bf16 (faster); fused_adamw (faster still)" in text
    assert "2.00x" in text and "0.50x" in text
    assert "Failed: compile (RuntimeError: boom)" in text


def test_nothing_kept_recommends_the_baseline():
    report = _report(_rung("fp32", "baseline", 1000.0, 10), _rung("bf16", "dropped", 500.0, 10))
    assert report.final.name == "fp32"
    assert report.speedup == pytest.approx(1.0)
    assert "Keep the fp32 baseline" in report.recommendation
    assert "too small to compare" in report.recommendation
    with pytest.raises(GpuprofError, match="no rung named"):
        report.rung("nope")
