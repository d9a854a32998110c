"""Activation checkpointing: which modules get wrapped, and what it does to memory and loss."""

from __future__ import annotations

import re

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
    # The rung checkpoints what a plan picks for a quarter off the recorded peak, not every
    # block. Each block keeps 4 activations of 1024 x 256 fp32 (1 MiB each) for backward,
    # 24 MiB for six; checkpointed, it keeps only its output (the next block's input) and
    # recomputes the other 3 MiB in backward, one block at a time.
    m = re.match(
        r"plan for ([\d.]+) MiB \(recorded peak ([\d.]+) MiB, "
        r"predicted [\d.]+ MiB\): on ([\d, ]+):",
        rung.reason,
    )
    assert m, rung.reason
    budget, recorded = float(m.group(1)) * 2**20, float(m.group(2)) * 2**20
    blocks = m.group(3).split(", ")
    assert budget == pytest.approx(0.75 * recorded, rel=0.01)
    # 3 MiB per block against a quarter of ~29 MiB (and the plan's 4% headroom): three.
    assert len(blocks) == 3 and set(blocks) <= {"0", "1", "2", "3", "4", "5"}
    # Recomputation is exact on CPU: same loss as without checkpointing.
    assert rung.final_loss == pytest.approx(report.baseline.final_loss, rel=1e-6)
    saved = report.baseline.peak_memory_bytes - rung.peak_memory_bytes
    assert 8 * 2**20 <= saved <= 10 * 2**20
    assert rung.peak_memory_bytes <= budget


def test_a_budget_the_step_already_fits_skips_the_rung_and_one_names_the_budget():
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 256, generator=gen)
    data = TensorDataset(inputs, inputs[:, :4].argmax(dim=1))
    common = dict(
        steps=1,
        warmup=1,
        batch_size=256,
        rungs=["fp32", "checkpoint"],
        progress=False,
    )
    sgd = lambda p: torch.optim.SGD(p, lr=1e-2)  # noqa: E731
    roomy = run_ladder(
        _blocks_model, data, nn.functional.cross_entropy, sgd, memory_budget="1GiB", **common
    )
    rung = roomy.rung("checkpoint")
    assert rung.status == "skipped" and "already fits the budget (1 GiB)" in rung.reason
    tight = run_ladder(
        _blocks_model, data, nn.functional.cross_entropy, sgd, memory_budget=3 * 2**20, **common
    )
    assert tight.rung("checkpoint").reason.startswith("plan for 3 MiB")
    # The user's own modules win over any plan.
    named = run_ladder(
        _blocks_model,
        data,
        nn.functional.cross_entropy,
        sgd,
        checkpoint_modules=["2"],
        memory_budget="1GiB",
        **common,
    )
    assert named.rung("checkpoint").reason.startswith("on 2:")
    with pytest.raises(GpuprofError, match="budget"):
        run_ladder(_blocks_model, data, nn.functional.cross_entropy, sgd, memory_budget="lots")
