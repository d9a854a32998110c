"""What the utilisation sampler costs the cell it runs beside (target: under 1%).

Two fixed CPU workloads of about 200 ms each, a small torch MLP training loop (forward and
backward) and a pure-Python loop, are timed bare and with a UtilisationSampler running
(default period, CPU only), interleaved round by round with the order flipped every round so
drift hits both alike. The overhead is the ratio of the medians, minus one.

Run: `.venv/bin/python benchmarks/utilisation_overhead.py [rounds [period_s]]`.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuprof_nb.capture.utilisation import UtilisationSampler

TARGET_S = 0.2


def _python_loop(n: int) -> Callable[[], object]:
    def run() -> object:
        total = 0
        for i in range(n):
            total += i * i % 7
        return total

    return run


def _torch_mlp(n: int) -> Callable[[], object]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def run() -> object:
        for _ in range(n):
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
        return loss

    return run


def _sized(make: Callable[[int], Callable[[], object]], target_s: float) -> Callable[[], object]:
    """Return make(n) with n chosen so one call takes about target_s."""
    n = 1
    while True:
        run = make(n)
        run()  # warm up
        t0 = time.perf_counter()
        run()
        took = time.perf_counter() - t0
        if took >= target_s / 4:
            return make(max(1, round(n * target_s / took)))
        n *= 4


def _time(
    run: Callable[[], object], sampled: bool, period_s: float = 0.01
) -> tuple[float, float | None]:
    """Return (seconds, samples per second or None) of one call, with or without a sampler."""
    gc.collect()
    if not sampled:
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0, None
    sampler = UtilisationSampler(period_s=period_s)
    t0 = time.perf_counter()
    with sampler:
        run()
    took = time.perf_counter() - t0
    rate = len(sampler.record(lambda ns: ns / 1e3)["ts_us"]) / took
    return took, rate


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def measure(rounds: int = 7, period_s: float = 0.01) -> dict[str, Any]:
    """Return, per workload, the median milliseconds bare and sampled, the overhead in %
    (median sampled / median bare - 1; and of the fastest runs), the samples per second the
    sampler took and the bare runs' interquartile spread (the noise floor), in %. The
    sampler's start and stop are inside the timed span (about 0.5 ms together)."""
    workloads = {
        "torch MLP forward+backward (~200 ms)": _sized(_torch_mlp, TARGET_S),
        "pure-Python loop (~200 ms)": _sized(_python_loop, TARGET_S),
    }
    out: dict[str, Any] = {
        "rounds": rounds,
        "period_ms": period_s * 1e3,
        "target_overhead_pct": 1.0,
        "workloads": {},
    }
    for name, run in workloads.items():
        bare: list[float] = []
        sampled: list[float] = []
        rates: list[float] = []
        _time(run, True, period_s)  # the sampler's first use (imports, first reads) is not measured
        for r in range(rounds):
            for with_sampler in (False, True) if r % 2 == 0 else (True, False):
                took, rate = _time(run, with_sampler, period_s)
                (sampled if with_sampler else bare).append(took)
                if rate is not None:
                    rates.append(rate)
        med_bare, med_sampled = statistics.median(bare), statistics.median(sampled)
        out["workloads"][name] = {
            "bare_ms": round(med_bare * 1e3, 2),
            "sampled_ms": round(med_sampled * 1e3, 2),
            "overhead_pct": round((med_sampled / med_bare - 1) * 100, 2),
            # The fastest of each: less sensitive to other processes on a busy machine.
            "overhead_of_fastest_pct": round((min(sampled) / min(bare) - 1) * 100, 2),
            "samples_per_s": round(statistics.median(rates), 1),
            # Noise floor: the spread of the bare runs' middle half, % of their median.
            "bare_iqr_pct": round(_iqr(bare) / med_bare * 100, 2),
        }
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print(
        json.dumps(
            measure(int(args[0]) if args else 7, float(args[1]) if len(args) > 1 else 0.01),
            indent=2,
        )
    )
