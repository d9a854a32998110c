"""A noisy measurement says so first (analysis/noise.py): samples that spread widely, other
work on the cores, a thread that waited for a core. Checked on a real CPU trace with the
timings and the utilisation a noisy run records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.noise import log_sigma, other_work_share, runs_to_settle, spread_of
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.utilisation import Utilisation, UtilisationSeries
from gpuprof_nb.results.invariants import impossible

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE = DATA / "planted_cpu" / "compute_bound.json.gz"


def busy_machine(trace, cores_busy: float, process: float, n: int = 10) -> Utilisation:
    """Utilisation over the trace's window on a 2-core machine: each core `cores_busy`%
    busy, this process using `process` cores."""
    lo, hi = trace.bounds_us
    step = (hi - lo) / n
    ts = tuple(lo + step * (i + 1) for i in range(n))
    series = (
        UtilisationSeries("cpu0", "%", "CPU 0", (cores_busy,) * n),
        UtilisationSeries("cpu1", "%", "CPU 1", (cores_busy,) * n),
        UtilisationSeries("process", "cores", "this process", (process,) * n),
    )
    return Utilisation("proc", step / 1000, ts, series, cores=2)


def test_the_issues_run_is_headlined_noisy_not_healthy() -> None:
    """Samples spread 7.88x on cores 94% busy with other work: the Diagnosis leads with it."""
    trace = load_trace(TRACE)
    calm = analyze(trace, timing=TimingStats(wall_us=(1000.0, 1010.0, 1005.0)))
    assert calm.diagnosis.finding("noisy_measurement") is None
    assert not calm.diagnosis.verdict.startswith("Noisy")
    # The other processes: 2 cores 97% busy, 0.06 cores of it this process's: 94%.
    noisy_trace = dataclasses.replace(trace, utilisation=busy_machine(trace, 97.0, 0.06))
    timing = TimingStats(wall_us=(1000.0, 7880.0, 1200.0, 2500.0, 1100.0))
    r = analyze(noisy_trace, timing=timing)
    first = r.diagnosis.findings[0]
    assert first.kind == "noisy_measurement" and first.severity == "high"
    assert first.evidence["sample_spread_ratio"] == pytest.approx(7.88)
    assert first.evidence["other_work_cores_fraction"] == pytest.approx(0.94)
    assert "7.88x" in first.title and "94% of the CPU cores" in first.title
    assert "--repeat" in first.fix and "close other work" in first.fix
    assert r.diagnosis.verdict.startswith("Noisy measurement: the 5 timed samples spread 7.88x")
    # The usual verdict follows it.
    assert calm.diagnosis.verdict in r.diagnosis.verdict
    assert impossible(r) == []
    assert "noisy_measurement" in r.text()


def test_each_sign_alone_is_enough_and_says_which() -> None:
    trace = load_trace(TRACE)
    spread = analyze(trace, timing=TimingStats(wall_us=(1000.0, 1600.0)))
    f = spread.diagnosis.findings[0]
    assert f.kind == "noisy_measurement" and f.severity == "medium"
    assert "other processes" not in f.title and "1.60x" in f.title
    busy = dataclasses.replace(trace, utilisation=busy_machine(trace, 80.0, 0.5))
    g = analyze(busy, timing=TimingStats(wall_us=(1000.0, 1001.0))).diagnosis.findings[0]
    assert g.kind == "noisy_measurement"
    assert g.evidence["other_work_cores_fraction"] == pytest.approx((1.6 - 0.5) / 2)
    assert "spread" not in g.title
    # Below the thresholds: nothing.
    quiet = dataclasses.replace(trace, utilisation=busy_machine(trace, 40.0, 0.5))
    assert analyze(quiet).diagnosis.finding("noisy_measurement") is None


def test_other_work_is_time_weighted_and_never_below_zero() -> None:
    u = Utilisation(
        "proc",
        10.0,
        (10_000.0, 20_000.0, 40_000.0),
        (
            UtilisationSeries("cpu0", "%", "CPU 0", (100.0, 50.0, 100.0)),
            UtilisationSeries("cpu1", "%", "CPU 1", (100.0, 50.0, 0.0)),
            UtilisationSeries("process", "cores", "p", (1.0, 1.0, 1.5)),
        ),
    )
    # Intervals of 10, 10 and 20 ms: other work 1.0, 0.0 (never below), 0.0 cores.
    assert other_work_share(u) == pytest.approx((1.0 * 10 + 0 + 0) / 40 / 2)
    assert other_work_share(None) is None


def test_spread_and_runs_to_settle() -> None:
    assert spread_of([2.0, 4.0, 3.0]) == 2.0 and spread_of([1.0]) is None
    assert log_sigma([1.0, 1.0, 1.0, 1.0]) == 0.0
    before = [100.0, 104.0, 98.0, 101.0, 103.0]
    after = [70.0, 73.0, 69.0, 72.0, 71.0]
    n = runs_to_settle(before, after, 71 / 101, 0.2)
    assert n is not None and 2 <= n <= th.MAX_RUNS_TO_SETTLE
    # A change within the floor is never worth calling, however many runs.
    assert runs_to_settle(before, before, 1.05, 0.2) is None
    # Wider spread, more runs.
    wide = runs_to_settle([80.0, 120.0, 100.0, 90.0], [60.0, 85.0, 70.0, 75.0], 0.72, 0.2)
    assert wide is not None and wide > n
