"""The exact line tracer (capture/linetrace.py): the planted cells of linetrace_cases.py in
this interpreter, and the same cells under every other Python 3.10+ found on the machine, so
both roads (sys.monitoring on 3.12+, sys.settrace before) are tested whichever one runs the
suite. Those interpreters need neither torch nor numpy: the tracer and the cases use the
standard library only."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from gpuprof_nb.capture.linetrace import LineTracer, _share_quiet

sys.path.insert(0, str(Path(__file__).parent))
from linetrace_cases import CASES  # noqa: E402

ROOT = Path(__file__).parents[2]
CASES_FILE = Path(__file__).with_name("linetrace_cases.py")


@pytest.mark.parametrize("name", sorted(CASES))
def test_planted_cell(name: str) -> None:
    CASES[name]()


@cache
def other_interpreters() -> dict[str, str]:
    """{"3.12": path, ...}: one Python 3.10+ per minor version other than this one, from
    GPUPROF_OTHER_PYTHONS (paths separated by os.pathsep), pythonX.Y on PATH and pyenv's
    versions; each checked by running it."""
    found: dict[str, str] = {}
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [p for p in os.environ.get("GPUPROF_OTHER_PYTHONS", "").split(os.pathsep) if p]
    for minor in range(10, 16):
        candidates.append(f"python3.{minor}")
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        candidates += sorted(glob.glob(os.path.join(root, "versions", f"3.{minor}*", "bin")))
    for c in candidates:
        exe = os.path.join(c, "python3") if os.path.isdir(c) else c
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        version = out.stdout.strip()
        if out.returncode == 0 and version != here and version >= "3.10" and version not in found:
            found[version] = exe
    return found


@pytest.mark.parametrize("road", ["monitoring", "settrace"])
def test_the_other_road_under_another_python(road: str) -> None:
    """The road this interpreter does not take, under one that does."""
    here_road = "monitoring" if sys.version_info >= (3, 12) else "settrace"
    if road == here_road:
        pytest.skip(f"this interpreter takes the {road} road: test_planted_cell covers it")
    wanted = [
        (v, exe)
        for v, exe in sorted(other_interpreters().items())
        if (tuple(map(int, v.split("."))) >= (3, 12)) == (road == "monitoring")
    ]
    if not wanted:
        pytest.skip(f"no other Python for the {road} road here (set GPUPROF_OTHER_PYTHONS)")
    for version, exe in wanted:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [exe, str(CASES_FILE)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
        )
        assert out.returncode == 0, f"Python {version}:\n{out.stdout}\n{out.stderr[-3000:]}"
        assert out.stdout.count("ok ") == len(CASES), out.stdout
        assert f"({road}, Python {version}" in out.stdout


def test_a_quiet_stretch_is_shared_as_the_burst_measured() -> None:
    # A slow stack 2 led into a loop where stack 0 runs 30 ns and stack 1 10 ns, in turn; then
    # the events go quiet for 4000 ns.
    ts, of, t = [0], [2], 100
    for _ in range(40):
        ts += [t, t + 30]
        of += [0, 1]
        t += 40
    quiet_at = len(ts)
    ts.append(t)
    of.append(-2)
    end = t + 4000
    out_ts, out_of, shared = _share_quiet(ts, of, {quiet_at: 0}, end=end)
    assert shared == 4000
    assert all(b >= a for a, b in zip(out_ts, out_ts[1:], strict=False))
    # Time per stack inside the quiet stretch: 3:1 as the loop's last stretches measured;
    # the slow line before the loop takes none of it.
    bounds = [*out_ts, end]
    inside: dict[int, float] = {}
    for i, sid in enumerate(out_of):
        lo, hi = max(bounds[i], t), bounds[i + 1]
        if hi > lo:
            inside[sid] = inside.get(sid, 0) + hi - lo
    assert inside == {0: 3000, 1: 1000}


def test_an_unknown_engine_is_refused() -> None:
    code = compile("pass", "<c>", "exec")
    with pytest.raises(ValueError, match="engine"):
        LineTracer(code, engine="dtrace")
