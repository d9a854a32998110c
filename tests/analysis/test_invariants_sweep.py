"""Every real trace and snapshot we hold, analysed whole: no share outside 0..1, breakdowns
that add up, busy time within its window, no "N% of a step" above 100, a utilisation series
within the machine, a memory timeline whose area reaches its peak (results/invariants.py
names what it finds). The shared traces (../shared/traces) are swept too where present."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpuprof_nb.results.invariants import impossible

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location(
        "record_golden", ROOT / "tools" / "record_golden.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


INPUTS = list(_tool().inputs())


@pytest.mark.slow
@pytest.mark.parametrize(("key", "kind", "path"), INPUTS, ids=[k for k, _, _ in INPUTS])
def test_nothing_impossible(key: str, kind: str, path: Path) -> None:
    from gpuprof_nb.analysis.report import analyze, analyze_memory
    from gpuprof_nb.io.snapshot import load_snapshot
    from gpuprof_nb.io.trace import load_trace

    if kind == "snapshot":
        report = analyze_memory(load_snapshot(path))
    else:
        report = analyze(load_trace(path))
    assert impossible(report, key) == []


RUNS = sorted(p for p in (ROOT / "tests" / "data" / "gloo_run").iterdir() if p.is_dir())


@pytest.mark.slow
@pytest.mark.parametrize("run_dir", RUNS, ids=[p.name for p in RUNS])
def test_nothing_impossible_in_a_run(run_dir: Path) -> None:
    """A real multi-rank run (4 gloo ranks, one planted slow): no share outside 0..1, no
    "N% of a step" above 100."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuprof_nb.session.distributed import analyze_run

    with ThreadPoolExecutor(2) as pool:
        report = analyze_run(run_dir, executor=pool, progress=False)
    assert impossible(report, run_dir.name) == []
