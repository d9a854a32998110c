"""A pytest helper for performance checks in a user's own suite: the `gpuprof` fixture
profiles a function, compares it with a named baseline and fails with the verdict's text
when it got slower. Installed with the package (a `pytest11` entry point); or list
`pytest_plugins = ["gpuprof_nb.pytest_plugin"]` in a conftest.py.

    def test_train_step_speed(gpuprof):
        gpuprof.check("train-step", train_step, repeat=10)

- `pytest --gpuprof-save` records (or replaces) each check's baseline; without it a check
  compares with its baseline, and is skipped, saying how to record one, when there is none.
- Baselines live in `--gpuprof-baselines DIR`, else the `gpuprof_baselines` ini option,
  else $GPUPROF_BASELINES, else `.gpuprof/baselines` under the rootdir: the same files
  `gpuprof baseline save` writes and `gpuprof compare --baseline` reads.
- A regression fails the test with the gate's line and the comparison's text; noise that
  covers the difference passes with a GpuprofNoiseWarning (run again to settle it).

Timed assertions belong in a dedicated benchmark job, on a quiet machine of a fixed kind,
not in the unit-test run: there a shared or loaded machine turns noise into failures
(docs/ci.md). Importing this module costs nothing: gpuprof_nb and torch load when a check
runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_OPTION_DIR = "--gpuprof-baselines"
_OPTION_SAVE = "--gpuprof-save"
_INI_DIR = "gpuprof_baselines"


class GpuprofNoiseWarning(UserWarning):
    """A performance check whose noise covers the difference: neither passed nor failed."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuprof", "gpuprof_nb performance checks (the gpuprof fixture)")
    group.addoption(
        _OPTION_SAVE,
        action="store_true",
        default=False,
        help="save each gpuprof check's result as its named baseline instead of comparing",
    )
    group.addoption(
        _OPTION_DIR,
        metavar="DIR",
        default=None,
        help="where gpuprof baselines live (default: the gpuprof_baselines ini option, "
        "$GPUPROF_BASELINES, else .gpuprof/baselines under the rootdir)",
    )
    parser.addini(_INI_DIR, "where gpuprof baselines live, relative to the rootdir", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gpuprof: a gpuprof_nb performance check (run it in a benchmark job)"
    )


def _directory(config: pytest.Config) -> Path:
    flag = config.getoption(_OPTION_DIR)
    if flag:
        return Path(flag)
    ini = str(config.getini(_INI_DIR) or "").strip()
    if ini:
        return config.rootpath / ini
    env = os.environ.get("GPUPROF_BASELINES", "").strip()
    if env:
        return Path(env)
    return config.rootpath / ".gpuprof" / "baselines"


class PerfCheck:
    """What the `gpuprof` fixture gives a test: `check(name, fn, ...)`."""

    def __init__(self, directory: Path, save: bool) -> None:
        self.directory = directory
        self.save = save
        self.report: Any = None  # the last check's ProfileReport
        self.comparison: Any = None  # and its Comparison with the baseline (None when saved)

    def check(
        self,
        name: str,
        fn: Callable[..., object],
        *args: Any,
        repeat: int = 5,
        warmup: int | None = None,
        number: int | None = None,
        threshold: float | None = None,
        fail_on: str = "slower",
        profile: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Profile `fn(*args, **kwargs)` (gpuprof_nb.session.functions.profile_function) and compare
        it with the baseline `name`; fail the test on a regression with the verdict's text.
        `threshold`: the fraction of change called real (default: the library's 20% noise
        floor; lower it only on a quiet, dedicated machine). Returns the Comparison."""
        from gpuprof_nb.errors import GpuprofError
        from gpuprof_nb.model.arguments import describe
        from gpuprof_nb.results.compare import COMPARE_NOISE_FLOOR
        from gpuprof_nb.session.analyze import check_threshold, compare, regression_gate
        from gpuprof_nb.session.baselines import (
            baseline_names,
            check_name,
            load_baseline,
            save_baseline,
        )
        from gpuprof_nb.session.functions import profile_function

        try:
            check_name(name)
            # Checked before the function runs, also when saving (where no gate reads them).
            if threshold is not None:
                check_threshold(threshold)
            if not isinstance(fail_on, str) or fail_on not in ("slower", "any"):
                raise GpuprofError(f"fail_on must be 'slower' or 'any', got {describe(fail_on)}")
            report = profile_function(
                fn, *args, warmup=warmup, repeat=repeat, number=number, profile=profile, **kwargs
            )
        except GpuprofError as exc:
            pytest.fail(f"gpuprof check {name!r}: {exc}", pytrace=False)
        self.report, self.comparison = report, None
        if self.save:
            try:
                path = save_baseline(name, report, directory=self.directory)
            except GpuprofError as exc:
                pytest.fail(f"gpuprof check {name!r}: {exc}", pytrace=False)
            print(f"gpuprof: saved baseline {name} in {path}")
            return None
        if name not in baseline_names(self.directory):
            pytest.skip(
                f"gpuprof: no baseline {name!r} in {self.directory}; record it with "
                f"`pytest {_OPTION_SAVE}` on the machine that runs this check"
            )
        try:
            baseline = load_baseline(name, self.directory)
            comparison = compare(
                baseline,
                report,
                before_label=f"baseline {name}",
                after_label="this run",
                noise_floor=COMPARE_NOISE_FLOOR if threshold is None else threshold,
            )
            gate = regression_gate(comparison, fail_on=fail_on)  # type: ignore[arg-type]
        except GpuprofError as exc:
            pytest.fail(f"gpuprof check {name!r}: {exc}", pytrace=False)
        self.comparison = comparison
        if gate.outcome == "regression":
            pytest.fail(f"{gate.line()}\n\n{comparison.text()}", pytrace=False)
        if gate.outcome == "noisy":
            warnings.warn(GpuprofNoiseWarning(f"check {name!r}: {gate.line()}"), stacklevel=2)
        return comparison


@pytest.fixture
def gpuprof(request: pytest.FixtureRequest) -> PerfCheck:
    """Performance checks against named baselines: `gpuprof.check(name, fn, ...)`."""
    config = request.config
    return PerfCheck(_directory(config), bool(config.getoption(_OPTION_SAVE)))
