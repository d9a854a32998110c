"""Module ranges on a CUDA device: backward runs on autograd's own thread there, and its
kernels are still charged to the module whose forward made them; every kernel's time is in
one module or in none. Needs CUDA (marked gpu); tools/gpu_modules_check.py does more."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gpuprof_nb.analysis.modules import module_breakdown  # noqa: E402
from gpuprof_nb.capture.modules import ModuleRecorder  # noqa: E402
from gpuprof_nb.capture.profiler import profile_cell  # noqa: E402
from gpuprof_nb.io.trace import trace_from_dict  # noqa: E402

pytestmark = pytest.mark.gpu


def test_cuda_backward_kernels_are_charged_to_their_modules() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    x = torch.randn(512, 256, device="cuda")

    def step() -> None:
        model(x).square().mean().backward()

    step()
    torch.cuda.synchronize()
    artifact = profile_cell(step, cuda=True, samplers=[("m", ModuleRecorder({"model": model}))])
    trace = trace_from_dict(artifact)
    mb = module_breakdown(trace)
    assert mb.on_device
    kernels = sum(k.dur_us for k in trace.kernels)
    assert sum(r.device_us for r in mb.roots) + mb.outside_us == pytest.approx(kernels)
    for path in ("model.0", "model.2"):
        row = mb.row(path)
        assert row is not None and row.forward_device_us > 0 and row.backward_device_us > 0
    # Backward ran on another host thread than the forward's module ranges.
    threads = {(o.pid, o.tid) for o in trace.ops if o.name.startswith("autograd::engine")}
    forward = {(o.pid, o.tid) for o in trace.ops if o.name.startswith("nn.Module: ")}
    assert threads and threads != forward
