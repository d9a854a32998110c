"""Faults after the cell has run never lose its timings or its trace."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

import gpuprof_nb.session.profile  # noqa: E402
from gpuprof_nb.model.timing import TimingStats  # noqa: E402
from gpuprof_nb.results.report import ProfileReport  # noqa: E402


def test_analysis_failure_keeps_timings_and_trace(ipython_shell, monkeypatch, tmp_path) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("boom in analysis")

    monkeypatch.setattr(gpuprof_nb.session.profile, "analyze", broken)
    ipython_shell.user_ns["W"] = torch.randn(64, 64)
    ipython_shell.run_cell_magic("gpuprofile", "-o rf --quiet --repeat 2", "V = W @ W")
    report = ipython_shell.user_ns["rf"]
    assert report.timing is not None and report.timing.runs == 2
    assert report.trace is not None and report.artifact is not None
    assert any("analysis failed: RuntimeError: boom in analysis" in n for n in report.notes)
    saved = report.save(tmp_path / "kept.json")
    assert gpuprof_nb.load_trace(saved).ops  # the raw trace survived and reads back
    assert "boom in analysis" in report._repr_mimebundle_()["text/plain"]


def test_runs_that_measured_zero_are_not_called_noisy() -> None:
    stats = TimingStats(wall_us=(5.0, 6.0, 7.0), device_us=(0.0, 0.003, 0.002))
    assert not stats.noisy
    text = ProfileReport(timing=stats, trace=None)._repr_mimebundle_()["text/plain"]
    assert "could not render" not in text


def test_a_profiler_left_running_is_refused_before_the_cell_runs(ipython_shell) -> None:
    from IPython.core.error import UsageError

    ipython_shell.user_ns["ran"] = 0
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    try:
        with pytest.raises(UsageError, match="already recording"):
            ipython_shell.run_cell_magic("gpuprofile", "--quiet", "ran += 1")
    finally:
        prof.stop()
    assert ipython_shell.user_ns["ran"] == 0
