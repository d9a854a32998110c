"""A %%gpuprofile report saved with report.save() (or --trace) keeps its timed samples, so
`gpuprof compare` and a named baseline give the verdict the notebook gives. Times come from
the fake clock, so the verdicts are exact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuprof_nb.session.analyze import compare  # noqa: E402
from gpuprof_nb.session.baselines import load_baseline, save_baseline  # noqa: E402
from gpuprof_nb.session.files import load_trace_report  # noqa: E402

ROOT = Path(__file__).parents[2]
LINE = "--warmup 1 --repeat 5 --number 1 --quiet"


@pytest.fixture
def ip(ipython_shell, fake_clock, cpu_path):
    return ipython_shell


def _cell(ip, name: str, us: float, extra: str = "") -> None:
    ip.user_ns["us"] = us
    ip.run_cell_magic("gpuprofile", f"-o {name} {LINE} {extra}", "spend(us)")


def _cli(*args) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "gpuprof_nb", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_saved_reports_give_the_notebooks_verdict(ip, tmp_path: Path) -> None:
    _cell(ip, "before", 1000.0)
    _cell(ip, "after", 1500.0, f"--trace {tmp_path / 'after_trace.json.gz'}")
    before, after = ip.user_ns["before"], ip.user_ns["after"]
    notebook = compare(before, after)
    assert notebook.verdict.kind == "slower" and notebook.samples_from == "timed runs"

    b, a = before.save(tmp_path / "before.json.gz"), tmp_path / "after_trace.json.gz"
    assert load_trace_report(b).timing == before.timing
    assert load_trace_report(a).timing == after.timing
    assert compare(load_trace_report(b), load_trace_report(a)).verdict == notebook.verdict

    result = _cli("compare", b, a)
    assert result.returncode == 1, result.stdout[-600:]
    assert "5 and 5 timed runs" in result.stdout
    assert _cli("compare", a, b).returncode == 0

    # A named baseline from the saved file, or from the report itself, keeps the samples.
    saved = _cli("baseline", "save", "nb", b, "--baselines", tmp_path / "bl")
    assert saved.returncode == 0 and "5 timed runs" in saved.stdout
    assert _cli("compare", "--baseline", "nb", a, "--baselines", tmp_path / "bl").returncode == 1
    save_baseline("live", before, directory=tmp_path / "bl")
    assert load_baseline("live", tmp_path / "bl").timing == before.timing
