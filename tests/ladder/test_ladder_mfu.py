"""MFU per rung on the ladder (the baseline's FLOPs per sample against a hand count, each
rung's MFU from its samples/s and its precision's peak) and the graph breaks the compile
rung met, on CPU."""

from __future__ import annotations

import pytest
import torch

from gpuprof_nb.capture.device import _cpu_identity
from gpuprof_nb.io.ceilings import CACHE_ENV, device_key, write_ceilings
from gpuprof_nb.ladder import run_ladder
from gpuprof_nb.ladder.verdicts import report_from_dict
from gpuprof_nb.model.device import DeviceSpec

BATCH, IN, HIDDEN, OUT = 32, 64, 256, 8
PEAK = 50e9


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)
    )


class Breaking(torch.nn.Module):
    """Reads a tensor's value mid-forward: a graph break under torch.compile."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        if y.abs().mean().item() > 1e9:
            y = y * 0
        return y


def _data(n: int = 128) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, IN, generator=gen)
    return torch.utils.data.TensorDataset(x, x[:, :OUT].argmax(dim=1))


@pytest.fixture
def measured_cpu(tmp_path, monkeypatch):
    """This CPU's ceilings in a private cache: a fp32 peak of 50 GFLOP/s."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    name, threads = _cpu_identity()
    spec = DeviceSpec(
        name=name,
        kind="cpu",
        fp32_flops_per_s=PEAK,
        bandwidth_bytes_per_s=10e9,
        source="test",
        measured=True,
    )
    write_ceilings(device_key("cpu", name, threads), spec)
    return spec


def test_mfu_per_rung_from_the_baselines_flops_per_sample(measured_cpu) -> None:
    report = run_ladder(
        _model,
        _data(),
        torch.nn.functional.cross_entropy,
        lambda p: torch.optim.SGD(p, lr=0.01),
        steps=3,
        warmup=1,
        batch_size=BATCH,
        rungs=["fp32", "grad_accum"],
        target_effective_batch=2 * BATCH,
        device="cpu",
        progress=False,
    )
    # Matmul FLOPs a sample: forward 2*in*hidden + 2*hidden*out; backward the weight
    # gradients of both layers and the input gradient of the second (the input needs none).
    gemm = 2 * IN * HIDDEN + 2 * HIDDEN * OUT + 2 * IN * HIDDEN + 4 * HIDDEN * OUT
    fps = report.model_flops_per_sample
    assert fps is not None and gemm <= fps <= 1.05 * gemm  # plus elementwise, loss, SGD
    assert "measured" in report.peak_source
    for rung in report.rungs:
        if rung.measured:
            assert rung.mfu == pytest.approx(fps * rung.samples_per_s / PEAK)
            assert 0 < rung.mfu <= 1
    again = report_from_dict(report.to_dict())
    assert [r.mfu for r in again.rungs] == [r.mfu for r in report.rungs]
    assert again.model_flops_per_sample == fps
    assert "MFU" in report.text()


def test_without_a_peak_the_ladder_says_why_and_shows_no_mfu(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # an empty cache: this CPU was never measured
    report = run_ladder(
        _model,
        _data(),
        torch.nn.functional.cross_entropy,
        lambda p: torch.optim.SGD(p, lr=0.01),
        steps=2,
        warmup=1,
        batch_size=BATCH,
        rungs=["fp32"],
        device="cpu",
        progress=False,
    )
    assert all(r.mfu is None for r in report.rungs)
    assert any("no MFU" in n and "measure_ceilings" in n for n in report.notes)


@pytest.mark.slow
def test_the_compile_rung_shows_the_graph_breaks_it_met() -> None:
    torch._dynamo.reset()
    report = run_ladder(
        Breaking,
        _data(),
        torch.nn.functional.cross_entropy,
        lambda p: torch.optim.SGD(p, lr=0.01),
        steps=2,
        warmup=1,
        batch_size=BATCH,
        rungs=["fp32", "compile"],
        compile=True,
        compile_backend="eager",
        device="cpu",
        progress=False,
    )
    rung = report.rung("compile")
    assert rung.graph_breaks, rung
    assert any("item()" in b and "forward" in b for b in rung.graph_breaks)
    assert "graph break" in rung.reason
