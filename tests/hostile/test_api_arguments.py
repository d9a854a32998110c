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


FIT = DATA / "fit"
NEWER = f"""
import math
import os
import numpy as np
from gpuprof_nb import (
    analyze, analyze_batches, analyze_memory, compare, load_baseline, load_snapshot,
    load_trace, profile_function, save_baseline,
)
from gpuprof_nb.analysis.gate import regression_gate
TRACE = load_trace({str(TRACE)!r})
REPORT = analyze(TRACE)
SNAP = load_snapshot({str(SNAPSHOT)!r})
B8 = load_snapshot({str(FIT / "tiny_b8.pickle")!r})
B4 = load_snapshot({str(FIT / "tiny_b4.pickle")!r})
FIT = analyze_memory(B8)
NOFIT = analyze_memory(SNAP)
COMPARISON = compare(REPORT, REPORT)
os.mkfifo("fifo.json")
os.mkdir("folder")
DEEP = []
_x = DEEP
for _ in range(100_000):
    _x.append([])
    _x = _x[0]
"""


def test_arguments_added_since_are_checked(hostile) -> None:
    """Will it fit, analyze_batches, exports, the regression gate, named baselines and
    profile_function: each wrong argument is the library's own error (fails on main: raw
    OverflowError, TypeError, RecursionError, hangs on FIFOs, and silent accepts)."""
    refused = {
        # will it fit: batch sizes and budgets
        "predict-nan": "FIT.predict(math.nan)",
        "predict-float": "FIT.predict(1.5)",
        "predict-zero": "FIT.predict(0)",
        "predict-bool": "FIT.predict(True)",
        "predict-10**30": "FIT.predict(10**30)",
        "predict-10**400": "FIT.predict(10**400)",
        "predict-recorded-bool": "FIT.predict(8, recorded_batch_size=True)",
        "predict-recorded-zero": "NOFIT.predict(8, recorded_batch_size=0)",
        "largest-text": "FIT.largest_batch('lots')",
        "largest-1e400": "FIT.largest_batch('1e400GiB')",
        "largest-10**30": "FIT.largest_batch(10**30)",
        "largest-negative": "FIT.largest_batch(-5)",
        "largest-nan": "FIT.largest_batch(math.nan)",
        "largest-inf": "FIT.largest_batch(math.inf)",
        "largest-list": "FIT.largest_batch([1])",
        "largest-deep": "FIT.largest_batch(DEEP)",
        "largest-bytes": "FIT.largest_batch(b'8GiB')",
        "largest-conservative": "FIT.largest_batch('8GiB', conservative='no')",
        "plan-1e400": "FIT.checkpoint_plan('1e400GiB')",
        "plan-10**400": "FIT.checkpoint_plan(10**400)",
        "plan-deep": "FIT.checkpoint_plan(DEEP)",
        "plan-batch-float": "FIT.checkpoint_plan('8GiB', batch_size=1.5)",
        "plan-batch-10**30": "FIT.checkpoint_plan('8GiB', batch_size=10**30)",
        "plan-batch-bool": "FIT.checkpoint_plan('8GiB', batch_size=True)",
        "batches-none": "analyze_batches(B8, None, B4, 4)",
        "batches-float": "analyze_batches(B8, 8.5, B4, 4)",
        "batches-10**30": "analyze_batches(B8, 10**30, B4, 4)",
        "batches-other-size-0": "analyze_batches(B8, 8, B4, 0)",
        "batches-same": "analyze_batches(B8, 8, B4, 8)",
        "batches-other-path": "analyze_batches(B8, 8, 'x.pickle', 4)",
        "batches-budget-text": "analyze_batches(B8, 8, B4, 4, budget_bytes='x')",
        "batches-budget-nan": "analyze_batches(B8, 8, B4, 4, budget_bytes=math.nan)",
        "batches-budget-negative": "analyze_batches(B8, 8, B4, 4, budget_bytes=-1)",
        "batches-variable": "analyze_batches(B8, 8, B4, 4, variable=5)",
        # exports
        "json-fifo": "REPORT.to_json('fifo.json')",
        "markdown-fifo": "REPORT.to_markdown('fifo.json')",
        "json-folder": "REPORT.to_json('folder')",
        "json-number": "REPORT.to_json(5)",
        "json-nul": "REPORT.to_json('a\\x00b')",
        "json-indent-huge": "REPORT.to_json(indent=10**9)",
        "json-indent-text": "REPORT.to_json(indent='x')",
        "memory-json-fifo": "FIT.to_json('fifo.json')",
        "comparison-markdown-fifo": "COMPARISON.to_markdown('fifo.json')",
        "log-prefix": "REPORT.log_to(object(), prefix=5)",
        "log-step": "REPORT.log_to(object(), step=-1)",
        "tensorboard-step": "REPORT.to_tensorboard(object(), step=math.nan)",
        # the regression gate
        "gate-none": "regression_gate(None)",
        "gate-fail-on": "regression_gate(COMPARISON, fail_on='never')",
        "gate-fail-on-deep": "regression_gate(COMPARISON, fail_on=DEEP)",
        "gate-threshold": "regression_gate(COMPARISON, threshold=math.nan)",
        # named baselines
        "baseline-name": "save_baseline(5, REPORT)",
        "baseline-name-climbs": "save_baseline('../x', REPORT, directory='b')",
        "baseline-directory-number": "save_baseline('a', REPORT, directory=5)",
        "baseline-directory-fifo": "save_baseline('a', REPORT, directory='fifo.json')",
        "baseline-source-fifo": "save_baseline('a', 'fifo.json', directory='b')",
        "baseline-source-memory": "save_baseline('a', FIT, directory='b')",
        "load-baseline-directory": "load_baseline('a', directory=5)",
        "load-baseline-nul": "load_baseline('a', directory='a\\x00')",
        # profile_function
        "profile-flag": "profile_function(lambda: None, repeat=1, profile='no')",
        "profile-repeat": "profile_function(lambda: None, repeat=1.5)",
        "profile-repeat-huge": "profile_function(lambda: None, repeat=10**9)",
        "profile-not-callable": "profile_function(DEEP)",
        # load_trace's capture
        "capture-number": "load_trace({TRACE!r}, capture=5)",
        "capture-fifo": "load_trace({TRACE!r}, capture='fifo.json')",
    }
    cases = [
        Case(name, f"result = {call}".replace("{TRACE!r}", repr(str(TRACE))), "refuse")
        for name, call in refused.items()
    ]
    cases += [
        Case(
            "predict-ok",
            "result = FIT.predict(np.int64(16))",
            "accept",
            check="result.batch_size == 16",
        ),
        Case(
            "largest-float-ok",
            "result = FIT.largest_batch(1.5e9)",
            "accept",
            check="result is None or result >= 1",
        ),
        Case(
            "largest-size-ok",
            "result = FIT.largest_batch('8GiB')",
            "accept",
            check="result is None or result >= 1",
        ),
        Case(
            "batches-ok",
            "result = analyze_batches(B8, 8, B4, 4, budget_bytes='1MiB')",
            "accept",
            check="result.fit is not None",
        ),
        Case(
            "json-ok",
            "result = REPORT.to_json('out/r.json', indent=1)",
            "accept",
            check="os.path.isfile('out/r.json')",
        ),
        Case(
            "baseline-ok",
            "result = load_baseline('a', save_baseline('a', REPORT, directory='b').parent)",
            "accept",
        ),
    ]
    hostile(cases, prelude=NEWER)
