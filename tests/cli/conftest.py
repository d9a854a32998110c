"""Real before/after traces for the command-line tests, recorded here with torch.profiler on
the CPU: the same training-like step with and without a planted slowdown, and a step whose
time swings so widely that no verdict can be given. Each step is marked `ProfilerStep#N`, as
the profiler's own schedule marks it, so the steps are the verdict's samples."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
STEPS = 8


def record_steps(path: Path, sleeps_s: Sequence[float]) -> Path:
    """Profile one step per entry of `sleeps_s`: a small matmul training step, then that
    many seconds waiting on the host (a planted slowdown: a slow data source, a sync)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    # One thread: on a shared 2-core machine torch's pool of spinning threads can stretch
    # this tiny step to tens of ms, drowning the planted difference.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i, pause in enumerate(sleeps_s):
                with record_function(f"ProfilerStep#{i}"):
                    loss = model(x).square().mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    time.sleep(pause)
    finally:
        torch.set_num_threads(threads)
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Traces with known truth: `base` and `again` (the same step twice), `slow` (6 ms more a
    step: about 3x), `noisy` (steps of 1 or 15 ms in turn: its median sits between, and a
    resample can land on either side)."""
    where = tmp_path_factory.mktemp("pair")
    return {
        "base": record_steps(where / "base.json", [0.002] * STEPS),
        "again": record_steps(where / "again.json", [0.002] * STEPS),
        "slow": record_steps(where / "slow.json", [0.008] * STEPS),
        "noisy": record_steps(where / "noisy.json", [0.001, 0.015] * (STEPS // 2)),
    }


def run_cli(
    *args: str | os.PathLike[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `python -m gpuprof_nb ARGS` in a fresh process (this checkout first on the path)."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), environ.get("PYTHONPATH", "")) if p
    )
    environ.pop("GPUPROF_BASELINES", None)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpuprof_nb", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=environ,
    )


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_cli
