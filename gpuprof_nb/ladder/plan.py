"""The checkpointing rung's plan: record one training step of the configuration kept so far
with the step record (capture/step.py), then ask analysis/fit.py which modules to checkpoint
so the peak fits a budget with the least recompute, instead of checkpointing every block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpuprof_nb.analysis.memory import analyze_snapshot
from gpuprof_nb.analysis.plan import plan_checkpointing
from gpuprof_nb.capture.memory import record_cpu_memory, record_cuda_memory
from gpuprof_nb.capture.step import StepRecorder
from gpuprof_nb.io.snapshot import snapshot_from_dict
from gpuprof_nb.ladder.measure import (
    LoaderSettings,
    RungConfig,
    Workload,
    _amp_dtype,
    _batches,
    _split_batch,
    _to_device,
    build_loader,
    build_optimizer,
)
from gpuprof_nb.results.fit import CheckpointPlan

# Without a budget the rung asks for what it keeps a checkpointing rung for: a quarter off
# the peak (judge_checkpoint_rung's min_memory_saved).
DEFAULT_CUT = 0.25


@dataclass(frozen=True, slots=True)
class RungPlan:
    """The plan and the recorded step's peak (bytes) it was made from."""

    plan: CheckpointPlan
    recorded_peak_bytes: int
    budget_bytes: int


def plan_for(workload: Workload, config: RungConfig, budget_bytes: int | None) -> RungPlan:
    """Return the checkpointing plan for `config` on `workload`: one warm-up step, then one
    step recorded with its modules; the budget defaults to the recorded peak less
    DEFAULT_CUT. Raises GpuprofError when the step has no module calls with a backward."""
    device = workload.device
    torch.manual_seed(workload.seed)
    model = workload.model_fn().to(device)
    optimizer = build_optimizer(workload.optimizer_fn, model, config.fused_optimizer)
    loader = build_loader(workload, LoaderSettings(), workload.batch_size)
    batches = _batches(loader)
    amp = _amp_dtype(config.precision)

    def step() -> None:
        inputs, targets = _to_device(_split_batch(next(batches)), device, False)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            out: Any = model(*inputs) if isinstance(inputs, tuple | list) else model(inputs)
            loss = workload.loss_fn(out, targets)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    names = {"model": model, "optimizer": optimizer}
    with torch.enable_grad():
        step()  # the optimizer's state, as every later step finds it
        recorder = StepRecorder(device, names)
        if device.type == "cuda":
            capture = record_cuda_memory(step, recorder=recorder)
        else:
            capture = record_cpu_memory(step, recorder=recorder)
    snapshot = snapshot_from_dict(capture.snapshot, where="the checkpointing rung's step")
    peak = analyze_snapshot(snapshot).timeline.peak_bytes
    budget = budget_bytes if budget_bytes is not None else int(peak * (1 - DEFAULT_CUT))
    return RungPlan(plan_checkpointing(snapshot, budget), peak, budget)
