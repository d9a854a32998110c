"""`profile_function(fn)`: what `%%gpuprofile` does for a cell, done for a plain function
(the pytest helper's and scripts' way in): warm-up runs, timed samples without the
profiler (CUDA events on a GPU, wall clock on the CPU), then one run under torch.profiler,
analysed into a ProfileReport whose `timing` the before/after verdict reads. From the trace
dict on, the road is the cell's (profile.py: report_of_artifact)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.results.report import ProfileReport

# The most timed samples a call may ask for (each is a run, or a block of runs).
MAX_REPEAT = 10_000


def _count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_REPEAT:
        raise GpuprofError(
            f"{name} must be a whole number from {low} to {MAX_REPEAT}, got {describe(value)}"
        )
    return value


def profile_function(
    fn: Callable[..., object],
    *args: Any,
    warmup: int | None = None,
    repeat: int = 5,
    number: int | None = None,
    profile: bool = True,
    **kwargs: Any,
) -> ProfileReport:
    """Return the ProfileReport of `fn(*args, **kwargs)`: `warmup` unmeasured runs (None:
    as %%gpuprofile picks them), `repeat` timed samples (a sample is one run, or a block of
    `number` back-to-back runs for a short function; None picks it as timeit does), then,
    with `profile`, one run under torch.profiler for the tables and the diagnosis. Times are
    per run."""
    if not callable(fn):
        raise GpuprofError(f"profile_function needs a callable, got a {type(fn).__name__}")
    repeat = _count("repeat", repeat, 1)
    if warmup is not None:
        warmup = _count("warmup", warmup, 0)
    if number is not None:
        number = _count("number", number, 1)
    if not isinstance(profile, bool):
        raise GpuprofError(f"profile must be True or False, got {describe(profile)}")
    # torch is imported here, not with the package: a script that never profiles never
    # pays for it.
    from gpuprof_nb.capture import device
    from gpuprof_nb.capture.profiler import profile_cell
    from gpuprof_nb.capture.timing import time_cell
    from gpuprof_nb.session.profile import report_of_artifact

    def run() -> None:
        fn(*args, **kwargs)

    cuda = device.cuda_available()
    stats = time_cell(
        run,
        warmup=warmup,
        repeat=repeat,
        number=number,
        sync=device.synchronize if cuda else None,
        use_cuda_events=cuda,
        device_name=device.device_name(cuda),
    )
    if not profile:
        return ProfileReport(timing=stats, trace=None)
    artifact = profile_cell(run, runs=1, cuda=cuda)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    # A training loop's own ProfilerStep/optimizer steps give its times per step too.
    return report_of_artifact(artifact, stats, source=f"profile_function({name})", notes=[])
