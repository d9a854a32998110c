"""What a CI job does with a comparison (built by analysis/gate.py): pass, fail on a
regression, or retry when the noise covers the difference; with the exit code the
`gpuprof compare` command line returns for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Exit codes of `gpuprof compare` (and of every `gpuprof` command: 2 is bad input).
EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_INPUT_ERROR = 2
EXIT_NOISY = 3

GateOutcome = Literal["pass", "regression", "noisy"]
FailOn = Literal["slower", "any"]
Basis = Literal["timed runs", "profiled steps", "one window", "same measurement"]

_EXIT = {"pass": EXIT_PASS, "regression": EXIT_REGRESSION, "noisy": EXIT_NOISY}


@dataclass(frozen=True, slots=True)
class Gate:
    """The gate's decision on a comparison. `outcome`: pass, regression (after is slower,
    or under fail_on="any" any clear change), or noisy (the noise covers the difference:
    neither a pass nor a regression can be claimed; retry, or record more samples).
    `reason` says why in one sentence; `threshold` is the fraction of change the gate
    called real (the verdict's noise floor); `basis` what was judged: the verdict on timed
    runs or profiled steps, one profiled window a side, or the same measurement twice."""

    outcome: GateOutcome
    reason: str
    threshold: float
    fail_on: FailOn
    basis: Basis

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression, 3 noisy (2 is left to input errors)."""
        return _EXIT[self.outcome]

    def line(self) -> str:
        """Return the one line a CI log shows: the outcome, the exit code and why."""
        word = {"pass": "PASS", "regression": "REGRESSION", "noisy": "NOISY"}[self.outcome]
        return f"gpuprof: {word} (exit {self.exit_code}): {self.reason}"
