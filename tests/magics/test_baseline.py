"""%%gpuprofile --baseline NAME: the run compared with an earlier report, the comparison
shown first (the verdict alone after --timing-only), and bad names refused before the cell
runs. Times come from the fake clock, so the verdicts are exact."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

LINE = "--warmup 1 --repeat 5 --number 1"


@pytest.fixture
def ip(ipython_shell, fake_clock, cpu_path, monkeypatch):
    # cpu_path: the fake clock drives the wall clock only; on CUDA the reported times would
    # be the CUDA events' real ones. The utilisation sampler reads the real machine: other
    # work on a loaded test machine would rightly make compare withhold its call
    # (tests/analysis/test_compare.py checks that), which the fake clock's exact verdicts
    # here are not about.
    from gpuprof_nb.analysis import compare

    monkeypatch.setattr(compare, "_other_work", lambda side: None)
    monkeypatch.setattr(compare, "_waited", lambda side: None)
    ipython_shell.user_ns["runs"] = 0
    return ipython_shell


def run(ip, line: str, us: float):
    """Run a cell whose every run takes `us` on the fake clock; return the captured output."""
    ip.user_ns["us"] = us
    with capture_output() as cap:
        ip.run_cell_magic("gpuprofile", line, "runs += 1\nspend(us)")
    return cap


def test_a_planted_slowdown_is_called_and_shown_first(ip) -> None:
    run(ip, f"-o base --quiet {LINE}", 1000.0)
    cap = run(ip, f"-o new --baseline base {LINE}", 1500.0)
    assert ip.user_ns["new"].timing.median_us == 1500.0  # -o still stores the new report
    titles = [o.data["text/plain"].splitlines()[0] for o in cap.outputs]
    assert titles == ["gpuprof_nb comparison: base -> this run", "gpuprof_nb profile"]
    assert (
        "Slower: after takes 1.5x the time of before per run" in cap.outputs[0].data["text/plain"]
    )


def test_the_same_cell_again_is_no_clear_change(ip) -> None:
    run(ip, f"-o base --quiet {LINE}", 1000.0)
    cap = run(ip, f"--timing-only --baseline base {LINE}", 1010.0)
    # --timing-only prints the verdict alone.
    assert not cap.outputs
    assert cap.stdout.startswith("vs base: No clear change: after takes 1.01x")
    assert cap.stdout.count("\n") == 1


def test_bad_baseline_names_are_usage_errors_before_the_cell_runs(ip) -> None:
    ip.user_ns["not_a_report"] = 42
    ip.user_ns.pop("nowhere", None)
    for line, words in (
        (f"--baseline nowhere {LINE}", "no variable 'nowhere'"),
        (f"--baseline not_a_report {LINE}", "'not_a_report' is a int"),
        (f"--baseline 3x {LINE}", "needs a variable name"),
    ):
        with pytest.raises(UsageError, match=words):
            ip.run_cell_magic("gpuprofile", line, "runs += 1")
    assert ip.user_ns["runs"] == 0
