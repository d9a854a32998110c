"""What records beside `%%gpuprofile`'s profiled run (profiler.py's `samplers`): the
machine's utilisation always, the nn.Module ranges unless turned off, and the Python line
the cell runs with --stack (exact line events where the interpreter offers them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import CodeType
from typing import Any

import torch

from gpuprof_nb.capture.linetrace import LineTracer, default_engine
from gpuprof_nb.capture.modules import ModuleRecorder
from gpuprof_nb.capture.profiler import Sampler
from gpuprof_nb.capture.sampling import LineSampler
from gpuprof_nb.capture.utilisation import UtilisationSampler


def cell_samplers(
    code: CodeType,
    *,
    stack: bool,
    modules: bool,
    cuda: bool,
    namespace: Mapping[str, Any] | None = None,
) -> list[tuple[str, Sampler]]:
    """Return what samples beside the profiled run of `code`: the utilisation of the
    machine, the nn.Module ranges with `modules` (roots named from `namespace`), and with
    `stack` the Python line the cell runs (keyed as the trace stores them)."""
    samplers: list[tuple[str, Sampler]] = [
        ("utilisation", UtilisationSampler(cuda=cuda, device_index=nvml_index(cuda)))
    ]
    if modules:
        samplers.append(("modules", ModuleRecorder(namespace)))
    if stack:
        samplers.append(("samples", line_recorder(code)))
    return samplers


def line_recorder(code: CodeType) -> Sampler:
    """Return what records the cell's lines under --stack: exact line events of the user's
    code (linetrace.py) where the interpreter offers them, else the line sampler (another
    tool holds sys.settrace, a debugger or coverage, or every sys.monitoring tool id is
    taken)."""
    engine = default_engine()
    if engine is not None:
        return LineTracer(code, engine=engine)
    return LineSampler(code)


def nvml_index(cuda: bool) -> int:
    """Return NVML's index of the current CUDA device. NVML numbers GPUs as the driver does
    and ignores CUDA_VISIBLE_DEVICES, so a list of indices there maps CUDA's numbering onto
    NVML's (GPU UUIDs there are not mapped: the current index is used)."""
    if not cuda:
        return 0
    current = int(torch.cuda.current_device())
    visible = [
        p.strip() for p in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if p.strip()
    ]
    if current < len(visible) and visible[current].isdigit():
        return int(visible[current])
    return current
