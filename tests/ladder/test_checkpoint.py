"""Activation checkpointing: which modules get wrapped, and what it does to memory and loss."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.ladder import run_ladder
from gpuprof_nb.ladder.measure import SEGMENTS, checkpoint_targets


def _blocks_model() -> nn.Module:
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU())
        for _ in range(6)
    ]
    return nn.Sequential(*blocks, nn.Linear(256, 4))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_targets_prefer_repeated_blocks():
    assert [n for n, _ in checkpoint_targets(_blocks_model(), None)] == [
        "0",
        "1",
        "2",
        "3",
        "4",
        "5",
    ]
    assert [n for n, _ in checkpoint_targets(Encoder(), None)] == [
        "layers.0",
        "layers.1",
        "layers.2",
    ]
    flat = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())
    assert [n for n, _ in checkpoint_targets(flat, None)] == [SEGMENTS]
    assert [n for n, _ in checkpoint_targets(Encoder(), ["head"])] == ["head"]
    with pytest.raises(GpuprofError, match="no submodule 'nope'"):
        checkpoint_targets(Encoder(), ["nope"])
    assert checkpoint_targets(nn.Linear(2, 2), None) == ()


def test_checkpointing_blocks_keeps_the_loss_and_lowers_the_peak():
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(1024, 256, generator=gen)
    data = TensorDataset(inputs, inputs[:, :4].argmax(dim=1))
    report = run_ladder(
        _blocks_model,
        data,
        nn.functional.cross_entropy,
        lambda p: torch.optim.SGD(p, lr=1e-2),
        steps=2,
        warmup=1,
        batch_size=1024,
        rungs=["fp32", "checkpoint"],
        progress=False,
    )
    rung = report.rung("checkpoint")
    assert rung.status in ("kept", "dropped", "no clear change")
    assert rung.reason.startswith("on 0, 1, 2, 3, 4, 5:")
    # Recomputation is exact on CPU: same loss as without checkpointing.
    assert rung.final_loss == pytest.approx(report.baseline.final_loss, rel=1e-6)
    # Without checkpointing each block keeps 4 activations of 1024 x 256 fp32 (1 MiB each)
    # for backward: 24 MiB for six blocks. With it a block keeps only its input (6 MiB) and
    # recomputes one block at a time in backward (4 MiB more): about 14 MiB less at the peak.
    saved = report.baseline.peak_memory_bytes - rung.peak_memory_bytes
    assert 12 * 2**20 <= saved <= 16 * 2**20
