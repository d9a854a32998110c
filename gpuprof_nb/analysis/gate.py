"""The regression gate of a CI job: a comparison's verdict (analysis/compare.py) turned into
pass, regression or noisy, the three answers `gpuprof compare` gives as exit codes.

- With a verdict (timed runs, or the profiled steps of two traces): slower is a regression;
  faster passes (under fail_on="any" it fails too: the baseline is out of date); no clear
  change passes when the whole 95% interval lies inside the threshold, and is noisy when the
  interval reaches past it: the noise covers the difference, so neither answer can be
  claimed, and a job retries (or records more samples).
- Without one (a trace of one profiled window a side), the ratio of the two windows is all
  there is and its noise cannot be measured: within the threshold passes, beyond the
  library's noise floor (20%, or the threshold when higher) is a regression, and between
  the two is noisy.
- The same measurement on both sides (a trace compared with itself) always passes.
"""

from __future__ import annotations

import math
from typing import get_args

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.arguments import check_type, describe
from gpuprof_nb.results.compare import COMPARE_NOISE_FLOOR, Comparison, Verdict
from gpuprof_nb.results.gate import Basis, FailOn, Gate

_UNIT = {"step": "per step", "run": "per run", "window": "over the profiled window"}


def check_threshold(threshold: float) -> float:
    """Return `threshold` (a fraction of change) when it is a finite number from 0 up to 10;
    GpuprofError otherwise."""
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not math.isfinite(threshold)
        or not 0 <= threshold <= 10
    ):
        raise GpuprofError(
            "threshold must be a fraction of change from 0 to 10 (0.05 for 5%), got "
            f"{describe(threshold)}"
        )
    return float(threshold)


def _x(value: float) -> str:
    return f"{value:.3g}x"


def regression_gate(
    comparison: Comparison, *, fail_on: FailOn = "slower", threshold: float | None = None
) -> Gate:
    """Return the gate's decision on `comparison` (see the module docstring). `threshold` is
    the fraction of change called real; with a verdict it is the verdict's own noise floor
    (compare(..., noise_floor=...)), so leave it None there; without one it defaults to the
    library's noise floor (COMPARE_NOISE_FLOOR)."""
    check_type(comparison, Comparison, "regression_gate's comparison", "a Comparison (compare())")
    if not isinstance(fail_on, str) or fail_on not in get_args(FailOn):
        raise GpuprofError(f"fail_on must be 'slower' or 'any', got {describe(fail_on)}")
    c = comparison
    v = c.verdict
    floor = check_threshold(
        threshold if threshold is not None else v.noise_floor if v else COMPARE_NOISE_FLOOR
    )
    before, after = c.median_step_us
    unit = _UNIT[c.per]
    if before is not None and before == after and not c.changes:
        return Gate(
            "pass",
            f"the two sides are the same measurement ({before:.6g} us {unit} each, nothing "
            "changed): no regression",
            floor,
            fail_on,
            "same measurement",
        )
    if v is not None:
        return _gate_on_verdict(c, v, fail_on)
    return _gate_on_one_window(c, floor, fail_on)


def _gate_on_verdict(c: Comparison, v: Verdict, fail_on: FailOn) -> Gate:
    """The gate from a verdict's 95% interval: slower is a regression, faster passes (but
    fails under fail_on="any"), no clear change passes when the interval stays inside the
    threshold and is noisy otherwise."""
    unit = _UNIT[c.per]
    basis: Basis = "profiled steps" if c.samples_from == "profiled steps" else "timed runs"
    up, down = 1.0 + v.noise_floor, 1.0 / (1.0 + v.noise_floor)
    where = (
        f"after takes {_x(v.ratio)} the time of before {unit} (95% interval "
        f"{_x(v.ci_low)} to {_x(v.ci_high)}, {v.before_samples} and {v.after_samples} "
        f"{basis}; threshold {v.noise_floor:.0%})"
    )
    if v.kind == "slower":
        return Gate("regression", f"slower: {where}", v.noise_floor, fail_on, basis)
    if v.kind == "faster":
        if fail_on == "any":
            return Gate(
                "regression",
                f"faster, and --fail-on any fails on every clear change: {where}; "
                "save a new baseline",
                v.noise_floor,
                fail_on,
                basis,
            )
        return Gate("pass", f"faster: {where}", v.noise_floor, fail_on, basis)
    if v.kind == "no clear change":
        reaches_slower = v.ci_high > up
        reaches_faster = fail_on == "any" and v.ci_low < down
        if not (reaches_slower or reaches_faster):
            return Gate("pass", f"no clear change: {where}", v.noise_floor, fail_on, basis)
    return Gate(
        "noisy",
        f"the noise covers the difference: {where}; the interval reaches past the "
        "threshold, so neither a pass nor a regression can be claimed: run again, or "
        "take more samples (--repeat, more profiled steps)",
        v.noise_floor,
        fail_on,
        basis,
    )


def _gate_on_one_window(c: Comparison, floor: float, fail_on: FailOn) -> Gate:
    """The gate from the ratio of two profiled windows, whose noise cannot be measured:
    within `floor` passes, beyond the library's noise floor (or `floor` when higher) is a
    regression, and between the two is noisy."""
    before, after = c.median_step_us
    unit = _UNIT[c.per]
    if not before or not after or before <= 0 or after <= 0:
        raise GpuprofError(
            f"nothing to compare {unit}: a side has no time ({c.verdict_note or 'no steps'}); "
            "compare two traces, or two saved %%gpuprofile reports"
        )
    ratio = after / before
    hard = max(floor, COMPARE_NOISE_FLOOR)
    where = (
        f"after takes {_x(ratio)} the time of before {unit}, judged on one profiled window "
        "a side, whose noise cannot be measured (record two or more steps, or save "
        "%%gpuprofile reports, for a verdict)"
    )
    if ratio > 1.0 + hard:
        return Gate("regression", f"slower: {where}", floor, fail_on, "one window")
    if fail_on == "any" and ratio < 1.0 / (1.0 + hard):
        return Gate(
            "regression",
            f"faster, and --fail-on any fails on every clear change: {where}",
            floor,
            fail_on,
            "one window",
        )
    if fail_on == "slower" and ratio < 1.0 / (1.0 + floor):
        return Gate("pass", f"faster: {where}", floor, fail_on, "one window")
    inside = ratio <= 1.0 + floor and (fail_on == "slower" or ratio >= 1.0 / (1.0 + floor))
    if inside:
        return Gate(
            "pass", f"within the {floor:.0%} threshold: {where}", floor, fail_on, "one window"
        )
    return Gate(
        "noisy",
        f"beyond the {floor:.0%} threshold but inside the {hard:.0%} a single window can "
        f"drift: {where}; run again",
        floor,
        fail_on,
        "one window",
    )
