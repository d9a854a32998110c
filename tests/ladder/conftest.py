"""A tiny classification problem the ladder can climb in a few seconds on CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import TensorDataset


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    # A 2-layer MLP gains nothing from intra-op threads, and on a shared runner spinning
    # OpenMP threads make step times swing by an order of magnitude.
    yield


def _dataset(n: int = 256, features: int = 16) -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(n, features, generator=gen)
    targets = inputs[:, :4].argmax(dim=1)
    return TensorDataset(inputs, targets)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2)


@pytest.fixture(scope="session")
def tiny() -> SimpleNamespace:
    """model_fn, optimizer_fn, loss_fn and a 256-sample dataset."""
    return SimpleNamespace(
        dataset=_dataset(),
        model_fn=_model,
        optimizer_fn=_optimizer,
        loss_fn=torch.nn.functional.cross_entropy,
        make_dataset=_dataset,
    )
