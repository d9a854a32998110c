"""Real before/after traces for the command-line tests, recorded here with torch.profiler on
the CPU: the same training-like step with and without a planted slowdown, and a step whose
time swings so widely that no verdict can be given. Each step is marked `ProfilerStep#N`, as
the profiler's own schedule marks it, so the steps are the verdict's samples."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
STEPS = 8


def record_steps(path: Path, matmuls: Sequence[int]) -> Path:
    """Profile one step per entry of `matmuls`: a small training step, then that many
    128x128 matmuls of extra work (a planted slowdown). The extra work is CPU work, not a
    sleep: on a loaded machine both sides then stretch alike, where a sleep's wake-up can
    wait tens of ms for a core and drown the difference."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    w = torch.randn(128, 128)
    # One thread: on a shared 2-core machine torch's pool of spinning threads can stretch
    # this tiny step to tens of ms, drowning the planted difference.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i, extra in enumerate(matmuls):
                with record_function(f"ProfilerStep#{i}"):
                    loss = model(x).square().mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    for _ in range(extra):
                        w @ w
    finally:
        torch.set_num_threads(threads)
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Traces with known truth: `base` and `again` (the same step twice), `slow` (20x the
    extra work a step: a loaded 2-core machine can stretch one side's steps 2-3x, so a
    smaller planted slowdown can drown in the noise the verdict rightly reports), `noisy`
    (steps of 5 or 200 extra matmuls in turn: a tenth of `base`'s step or four times it, so
    its median sits between, and a resample can land on either side)."""
    where = tmp_path_factory.mktemp("pair")
    return {
        "base": record_steps(where / "base.json", [50] * STEPS),
        "again": record_steps(where / "again.json", [50] * STEPS),
        "slow": record_steps(where / "slow.json", [1000] * STEPS),
        "noisy": record_steps(where / "noisy.json", [5, 200] * (STEPS // 2)),
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
