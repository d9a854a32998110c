"""Wrong arguments at every public function: each is the library's own error naming the
argument (never a TypeError, AttributeError, OverflowError or RuntimeError from inside),
and nothing is quietly coerced (a NaN threshold, a float count, a reversed window). Run under
the harness's limits (harness.py), since a count of 10**9 must be refused, not run."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Case

DATA = Path(__file__).parents[1] / "data"
TRACE = DATA / "planted_cpu" / "launch_overhead.json.gz"
SNAPSHOT = DATA / "snapshots" / "train_time.pickle"

ANALYSIS = f"""
import math
import gpuprof_nb
from gpuprof_nb import analyze, analyze_memory, compare, diagnose, load_snapshot, load_trace
TRACE = load_trace({str(TRACE)!r})
SNAP = load_snapshot({str(SNAPSHOT)!r})
"""


def test_analysis_functions_check_their_arguments(hostile) -> None:
    refused = {
        "analyze-path": f"analyze({str(TRACE)!r})",
        "analyze-none": "analyze(None)",
        "analyze-dict": "analyze({'traceEvents': []})",
        "analyze-device-number": "analyze(TRACE, device=5)",
        "analyze-top-zero": "analyze(TRACE, top=0)",
        "analyze-top-float": "analyze(TRACE, top=1.5)",
        "analyze-sort": "analyze(TRACE, sort='bogus')",
        "analyze-timing": "analyze(TRACE, timing='fast')",
        "diagnose-none": "diagnose(None)",
        "diagnose-path": f"diagnose({str(TRACE)!r})",
        "memory-none": "analyze_memory(None)",
        "memory-window-strings": "analyze_memory(SNAP, window=('a', 'b'))",
        "memory-window-reversed": "analyze_memory(SNAP, window=(5, 1))",
        "memory-window-nan": "analyze_memory(SNAP, window=(math.nan, 1))",
        "memory-window-inf": "analyze_memory(SNAP, window=(0, math.inf))",
        "memory-window-three": "analyze_memory(SNAP, window=(1, 2, 3))",
        "memory-window-text": "analyze_memory(SNAP, window='5:1')",
        "memory-steps-nested": "analyze_memory(SNAP, step_starts=[[1, 2]])",
        "memory-steps-negative": "analyze_memory(SNAP, step_starts=[-1])",
        "memory-steps-float": "analyze_memory(SNAP, step_starts=[1.5])",
        "memory-device-negative": "analyze_memory(SNAP, device=-1)",
        "memory-device-text": "analyze_memory(SNAP, device='0')",
        "memory-device-absent": "analyze_memory(SNAP, device=7)",
        "compare-noise-nan": "compare(TRACE, TRACE, noise_floor=math.nan)",
        "compare-noise-inf": "compare(TRACE, TRACE, noise_floor=math.inf)",
        "compare-noise-text": "compare(TRACE, TRACE, noise_floor='x')",
        "compare-noise-negative": "compare(TRACE, TRACE, noise_floor=-0.1)",
        "compare-none": "compare(None, TRACE)",
        "compare-label": "compare(TRACE, TRACE, before_label=5)",
        "snapshot-number": "load_snapshot(5)",
        "trace-list": "load_trace([1])",
    }
    cases = [Case(name, f"result = {call}", "refuse") for name, call in refused.items()]
    cases += [
        Case("analyze-ok", "result = analyze(TRACE, top=3)", "accept"),
        Case("memory-window-open", "result = analyze_memory(SNAP, window=(None, 5))", "accept"),
        Case("compare-ok", "result = compare(TRACE, TRACE, noise_floor=0.1)", "accept"),
    ]
    hostile(cases, prelude=ANALYSIS)


LADDER = """
import math
import torch
from torch.utils.data import TensorDataset, DataLoader
from gpuprof_nb.ladder import run_ladder, sweep_batch_sizes
torch.set_num_threads(1)
data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
model = lambda: torch.nn.Linear(4, 2)
loss = torch.nn.functional.cross_entropy
opt = lambda p: torch.optim.SGD(p, lr=0.1)
def ladder(**kw):
    kw.setdefault("batch_size", 8)
    return run_ladder(model, data, loss, opt, rungs=[], progress=False, **kw)
"""


@pytest.mark.slow
def test_the_ladder_checks_its_arguments_before_running(hostile) -> None:
    refused = {
        "steps-none": "ladder(steps=None)",
        "steps-billion": "ladder(steps=10**9)",
        "steps-float": "ladder(steps=2.5)",
        "steps-inf": "ladder(steps=math.inf)",
        "warmup-none": "ladder(warmup=None)",
        "warmup-negative": "ladder(warmup=-1)",
        "batch-zero": "ladder(batch_size=0)",
        "batch-float": "ladder(batch_size=1.5)",
        "batch-zero-loader": "run_ladder(model, DataLoader(data, batch_size=16), loss, opt, "
        "batch_size=0, progress=False)",
        "device-bogus": "ladder(device='bogus')",
        "device-number": "ladder(device=3)",
        "tolerance-inf": "ladder(loss_tolerance=math.inf)",
        "tolerance-nan": "ladder(loss_tolerance=math.nan)",
        "min-gain-nan": "ladder(min_gain=math.nan)",
        "min-gain-text": "ladder(min_gain='x')",
        "rungs-number": "run_ladder(model, data, loss, opt, batch_size=8, rungs=5)",
        "model-not-callable": "run_ladder(5, data, loss, opt, batch_size=8)",
        "data-none": "run_ladder(model, None, loss, opt, batch_size=8)",
        "sweep-sizes-float": "sweep_batch_sizes(model, data, loss, opt, [1.5], progress=False)",
        "sweep-sizes-many": "sweep_batch_sizes(model, data, loss, opt, range(1, 1000))",
        "sweep-steps-billion": "sweep_batch_sizes(model, data, loss, opt, [8], steps=10**9)",
    }
    cases = [Case(name, f"result = {call}", "refuse") for name, call in refused.items()]
    cases.append(
        Case(
            "tiny-ladder",
            "result = ladder(steps=2, warmup=0)",
            "accept",
            check="result.baseline.samples_per_step == 8",
        )
    )
    hostile(cases, prelude=LADDER, seconds=300)
