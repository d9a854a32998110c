"""The GitHub Actions example (docs/examples/perf-gate.yml) rehearsed on this CPU: its
baseline job's and its gate job's shell steps run as written, with docs/examples/
profile_step.py as perf/profile_step.py and `gpuprof` on the PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "docs" / "examples"


def _steps(job: dict) -> dict[str, str]:
    return {s["name"]: s["run"] for s in job["steps"] if "name" in s and "run" in s}


def test_the_workflow_gates_on_the_saved_baseline(tmp_path: Path) -> None:
    workflow = yaml.safe_load((EXAMPLES / "perf-gate.yml").read_text())
    gate, baseline = _steps(workflow["jobs"]["gate"]), _steps(workflow["jobs"]["baseline"])
    compare_step = next(v for k, v in gate.items() if k.startswith("Compare"))
    assert "gpuprof compare --baseline main" in compare_step and '"$code" -ne 3' in compare_step

    repo = tmp_path / "repo"
    (repo / "perf").mkdir(parents=True)
    shutil.copy(EXAMPLES / "profile_step.py", repo / "perf" / "profile_step.py")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "gpuprof"  # what `pip install gpuprof_nb` puts on the PATH
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpuprof_nb "$@"\n')
    shim.chmod(0o755)
    python = bin_dir / "python"  # this environment's (a symlink would lose the venv)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("GPUPROF_BASELINES", None)

    def bash(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-e", "-c", script], cwd=repo, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip

    saved = bash(baseline["Save the baseline `main`"])
    assert saved.returncode == 0, saved.stderr
    assert (repo / ".gpuprof" / "baselines" / "main.json").is_file()
    profiled = bash(gate["Profile the training step"])
    assert profiled.returncode == 0, profiled.stderr
    gated = bash(compare_step)
    # The same code on the same machine: never a regression (3 only after three noisy tries).
    assert gated.returncode in (0, 3), gated.stdout[-800:] + gated.stderr[-800:]
    assert (repo / "build" / "perf.md").read_text().startswith("### gpuprof_nb before and after")
