"""The pytest helper in a user's own suite, run with pytester: no baseline (skipped, saying
how to record one), --gpuprof-save, the same code again (passes), a planted slowdown (fails
with the verdict's text), noisy samples (a warning), and where baselines live."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]

USER_TEST = """
import os

import torch

torch.set_num_threads(1)
W = torch.randn(128, 128)


def step():
    # as many small matmuls as the suite says (the planted slowdown: more of them); CPU
    # work, so that a loaded machine stretches both sides alike
    for _ in range(int(os.environ["MATMULS"])):
        W @ W


def test_step_speed(gpuprof):
    gpuprof.check("step", step, repeat=5, warmup=1)
"""


def _plugin_args() -> list[str]:
    """Name the plugin: where the installed package registers it already (its pytest11
    entry point is named as the module), naming it again is harmless."""
    return ["-p", "gpuprof_nb.pytest_plugin"]


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("GPUPROF_BASELINES", raising=False)
    monkeypatch.setenv("MATMULS", "20")
    pytester.makepyfile(test_user=USER_TEST)
    return pytester


def _run(suite: pytest.Pytester, *args: str) -> pytest.RunResult:
    # In a subprocess: an in-process run unloads torch afterwards, and torch cannot be
    # imported twice in one process.
    return suite.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "-rsw", *args)


def test_record_then_gate_a_slowdown(suite: pytest.Pytester, monkeypatch) -> None:
    first = _run(suite)
    first.assert_outcomes(skipped=1)
    first.stdout.fnmatch_lines(["*no baseline 'step'*pytest --gpuprof-save*"])

    saved = _run(suite, "--gpuprof-save")
    saved.assert_outcomes(passed=1)
    record = json.loads((suite.path / ".gpuprof" / "baselines" / "step.json").read_text())
    assert record["samples_from"] == "timed runs" and len(record["samples_us"]) == 5
    assert min(record["samples_us"]) > 0

    _run(suite).assert_outcomes(passed=1)

    monkeypatch.setenv("MATMULS", "800")  # forty times the work: beyond a loaded machine's noise
    slow = _run(suite)
    slow.assert_outcomes(failed=1)
    slow.stdout.fnmatch_lines(
        ["*gpuprof: REGRESSION (exit 1): slower: after takes *x the time of before per run*"]
    )
    slow.stdout.fnmatch_lines(["*-- Verdict --*", "*Slower: after takes*"])
    assert "Traceback" not in slow.stdout.str()


def test_the_baseline_directory_option(suite: pytest.Pytester, tmp_path) -> None:
    where = tmp_path / "elsewhere"
    _run(suite, "--gpuprof-save", "--gpuprof-baselines", str(where)).assert_outcomes(passed=1)
    assert (where / "step.json").is_file()
    assert not (suite.path / ".gpuprof").exists()
    _run(suite, "--gpuprof-baselines", str(where)).assert_outcomes(passed=1)
    suite.makeini("[pytest]\ngpuprof_baselines = perf/baselines\n")
    _run(suite, "--gpuprof-save").assert_outcomes(passed=1)
    assert (suite.path / "perf" / "baselines" / "step.json").is_file()


def test_bad_arguments_fail_the_check_in_one_line(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_bad="""
def test_bad_name(gpuprof):
    gpuprof.check("../escape", lambda: None)

def test_bad_repeat(gpuprof):
    gpuprof.check("ok", lambda: None, repeat=0)
"""
    )
    result = _run(suite, "test_bad.py")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*baseline name '../escape' is not usable*"])
    result.stdout.fnmatch_lines(["*repeat must be a whole number*"])
