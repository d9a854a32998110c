"""The built wheel carries what the package promises: the MIT license text it declares."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_carries_the_license_text(tmp_path: Path) -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License"), "LICENSE at the root must be the MIT text"
    # Built from a copy, so setuptools' build/ and egg-info never land in the checkout; no
    # build isolation: this environment's setuptools builds it, offline.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "gpuprof_nb", src / "gpuprof_nb", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path / "dist"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wheels = list(out.glob("gpuprof_nb-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        licenses = [n for n in names if ".dist-info/" in n and n.endswith("/LICENSE")]
        assert licenses, [n for n in names if ".dist-info/" in n]
        assert wheel.read(licenses[0]).decode("utf-8") == license_text
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        entry_points = wheel.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        ).decode("utf-8")
    # The `gpuprof` command line and the pytest helper are installed with the package.
    assert "gpuprof = gpuprof_nb.cli:entry" in entry_points
    assert "[pytest11]\ngpuprof_nb.pytest_plugin = gpuprof_nb.pytest_plugin" in entry_points
    assert b"License-Expression: MIT" in metadata
    assert b"License-File: LICENSE" in metadata
