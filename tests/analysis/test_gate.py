"""The regression gate: a comparison's verdict turned into pass, regression or noisy, for
every kind of verdict and for one-window traces, checked against the verdict's own numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprof_nb.analysis.gate import regression_gate
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.results.gate import EXIT_NOISY, EXIT_PASS, EXIT_REGRESSION
from gpuprof_nb.session.analyze import compare

DATA = Path(__file__).parents[1] / "data"
TRACE = load_trace(DATA / "mi210_gpu_only" / "gpu_only_trace.json.gz")  # no steps
OTHER = load_trace(DATA / "gpu" / "memory_bound.json.gz")


def _timed(*samples: float):
    return analyze(TRACE, timing=TimingStats(wall_us=samples))


BASE = _timed(1000.0, 1010.0, 990.0, 1005.0, 995.0)


@pytest.mark.parametrize(
    ("after", "fail_on", "outcome"),
    [
        ((1500.0, 1510.0, 1490.0, 1505.0, 1495.0), "slower", "regression"),
        ((700.0, 705.0, 698.0, 702.0, 699.0), "slower", "pass"),
        ((700.0, 705.0, 698.0, 702.0, 699.0), "any", "regression"),
        ((1010.0, 1000.0, 1020.0, 1005.0, 995.0), "slower", "pass"),
        ((1010.0, 1000.0, 1020.0, 1005.0, 995.0), "any", "pass"),
        # Samples spread from 0.8x to 1.6x: the interval reaches past 1.2 -> noisy.
        ((800.0, 1600.0, 900.0, 1500.0, 1100.0), "slower", "noisy"),
    ],
)
def test_verdicts_map_to_outcomes(after, fail_on, outcome) -> None:
    c = compare(BASE, _timed(*after))
    gate = regression_gate(c, fail_on=fail_on)
    assert gate.outcome == outcome, (c.verdict, gate.reason)
    assert (
        gate.exit_code
        == {"pass": EXIT_PASS, "regression": EXIT_REGRESSION, "noisy": EXIT_NOISY}[outcome]
    )
    assert gate.basis == "timed runs" and gate.threshold == c.verdict.noise_floor
    v = c.verdict
    # The outcome follows from the interval and the floor alone.
    if outcome == "noisy":
        assert v.kind == "no clear change" and v.ci_high > 1 + v.noise_floor
    assert f"{v.ratio:.3g}x" in gate.line()


def test_a_lower_threshold_calls_a_smaller_change() -> None:
    after = _timed(1100.0, 1110.0, 1095.0, 1105.0, 1102.0)
    assert regression_gate(compare(BASE, after)).outcome == "pass"
    strict = compare(BASE, after, noise_floor=0.05)
    assert regression_gate(strict).outcome == "regression"


def test_the_same_measurement_always_passes() -> None:
    for report in (BASE, analyze(TRACE), analyze(OTHER)):
        for fail_on in ("slower", "any"):
            gate = regression_gate(compare(report, report), fail_on=fail_on, threshold=0.0)
            assert gate.outcome == "pass" and gate.basis == "same measurement"


def test_one_window_a_side_is_judged_on_the_ratio() -> None:
    c = compare(TRACE, OTHER)
    assert c.verdict is None and c.per == "window"
    ratio = 1 / c.speedup
    gate = regression_gate(c)
    assert gate.basis == "one window"
    assert gate.outcome == ("regression" if ratio > 1.2 else "pass")
    back = regression_gate(compare(OTHER, TRACE))
    assert back.outcome == ("regression" if 1 / ratio > 1.2 else "pass")


def test_bad_arguments_are_library_errors() -> None:
    c = compare(BASE, BASE)
    with pytest.raises(GpuprofError, match="fail_on"):
        regression_gate(c, fail_on="faster")  # type: ignore[arg-type]
    for bad in (float("nan"), -0.1, 11.0, True, "5%"):
        with pytest.raises(GpuprofError, match="threshold"):
            regression_gate(c, threshold=bad)  # type: ignore[arg-type]
