"""Run one configuration of the user's training step and measure it.

Each measurement starts from the same seed and the same data slice, builds a fresh model and
optimizer, runs `warmup` untimed optimizer steps and then `steps` timed ones, and leaves
nothing behind: autocast and grad mode are context managers, the model, optimizer and loader
workers are dropped, memory is freed and torch.compile's caches are reset.
"""

from __future__ import annotations

import functools
import gc
import itertools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from gpuprof_nb.capture.timing import time_cell
from gpuprof_nb.errors import GpuprofError

# The range around each training step, for counting one step's FLOPs under the profiler
# (ladder/mfu.py): the probe's evaluation forward stays outside it.
STEP_MARKER = "gpuprof_nb::ladder-step"


class NonFiniteLossError(GpuprofError):
    """The training loss became NaN or infinite."""


class OutOfMemory(GpuprofError):
    """A step did not fit in memory (device memory on GPU, host memory on CPU)."""


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    """DataLoader knobs the ladder sweeps."""

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None

    def describe(self) -> str:
        text = f"num_workers={self.num_workers}"
        if self.pin_memory:
            text += ", pin_memory"
        if self.persistent_workers:
            text += ", persistent_workers"
        if self.prefetch_factor is not None and self.num_workers > 0:
            text += f", prefetch_factor={self.prefetch_factor}"
        return text


@dataclass(frozen=True, slots=True)
class RungConfig:
    """Everything a rung may switch on; the ladder builds each rung on the kept ones."""

    precision: str = "fp32"  # "fp32", "bf16" or "fp16" (fp16 runs with a GradScaler)
    compile_mode: str | None = None  # None, "default" or "reduce-overhead"
    compile_backend: str = "inductor"
    fused_optimizer: bool = False
    accumulation_steps: int = 1
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    checkpoint: bool = False

    def describe(self) -> str:
        parts = [self.precision if self.precision == "fp32" else f"{self.precision} autocast"]
        if self.compile_mode:
            backend = "" if self.compile_backend == "inductor" else f", {self.compile_backend}"
            parts.append(f"compile({self.compile_mode}{backend})")
        if self.fused_optimizer:
            parts.append("fused optimizer")
        if self.accumulation_steps > 1:
            parts.append(f"grad accumulation x{self.accumulation_steps}")
        parts.append(self.loader.describe())
        if self.checkpoint:
            parts.append("activation checkpointing")
        return " + ".join(parts)

    def with_(self, **changes: Any) -> RungConfig:
        return replace(self, **changes)


@dataclass(frozen=True)
class Workload:
    """The user's training problem, fixed for every rung."""

    model_fn: Callable[[], torch.nn.Module]
    dataset: Any
    collate_fn: Callable[..., Any] | None
    loss_fn: Callable[[Any, Any], torch.Tensor]
    optimizer_fn: Callable[[Any], torch.optim.Optimizer]
    batch_size: int
    steps: int
    warmup: int
    device: torch.device
    seed: int
    checkpoint_modules: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Measurement:
    """What one configuration measured: step times in microseconds, memory in bytes."""

    step_times_us: tuple[float, ...]
    samples_per_step: int
    peak_memory_bytes: int | None
    compile_time_us: float | None
    final_loss: float
    static_shapes: bool = True


def accumulation_blocked(config: RungConfig, device: torch.device) -> str | None:
    """Why gradient accumulation cannot be measured on top of `config`, or None.

    CUDA graphs (compile mode reduce-overhead) own their output buffers, gradients included:
    the next micro-batch's graph replay overwrites the gradient the previous one left in
    .grad (on an H100 the rung failed with "accessing tensor output of CUDAGraphs that has
    been overwritten by a subsequent run"; pytorch/pytorch#169545, where marking a step
    before each micro-batch does not help either)."""
    if config.compile_mode == "reduce-overhead" and device.type == "cuda":
        return (
            "not measured on top of compile(reduce-overhead): CUDA graphs overwrite the "
            "gradients a micro-batch leaves for the next (pytorch/pytorch#169545); "
            "accumulate with compile(default), or without compile"
        )
    return None


def memory_method(device: torch.device) -> str:
    """Return, in words, how peak memory is measured on `device`."""
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated growth over the rung"
    return (
        "tensor bytes: parameters + optimizer state + the peak a training step adds, "
        "from one extra step under torch.profiler(profile_memory=True)"
    )


def _tensor_bytes(tensors: Iterable[Any]) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def _cpu_step_peak_bytes(
    step: Callable[[], Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> int | None:
    """Return the CPU tensor bytes live at the peak of one training step: what is live before
    it (parameters, optimizer state) plus the highest running sum of the allocations and frees
    torch's profiler records during it. None while another profiler runs."""
    from torch.profiler import ProfilerActivity, profile

    try:
        active = bool(torch._C._autograd._profiler_enabled())
    except AttributeError:
        active = False
    if active:
        # Starting ours would end the caller's session (e.g. the ladder inside %%gpuprofile).
        return None
    state = (v for per_param in optimizer.state.values() for v in per_param.values())
    live = _tensor_bytes(itertools.chain(model.parameters(), model.buffers(), state))
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = prof.profiler.kineto_results.events() if prof.profiler else []
    except RuntimeError:
        return None
    memory = sorted(
        (e for e in events if e.name() == "[memory]" and e.device_type().name == "CPU"),
        key=lambda e: e.start_ns(),
    )
    running = peak = 0
    for event in memory:
        running += event.nbytes()
        peak = max(peak, running)
    return live + peak


class _PeakMeter:
    """Peak CUDA allocator growth over a rung (the CPU path profiles one step instead)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start_bytes = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)

    def peak_growth_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return max(torch.cuda.max_memory_allocated(self.device) - self.start_bytes, 0)


def is_oom(exc: BaseException) -> bool:
    """True when `exc` is an out-of-memory error from torch (device or host allocator)."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def first_line(exc: BaseException) -> str:
    """Return the error's type and the first non-empty line of its message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def free_memory(device: torch.device, *, collect: bool = True) -> None:
    """Collect garbage (when `collect`) and return cached device memory to the driver."""
    # A full collection is slow once torch is imported (benchmarks/RESULTS.md,
    # "Measurements behind design choices", M22), so CPU runs without reference cycles (no
    # checkpoint wrappers, no compile, no error) skip it.
    if collect or device.type == "cuda":
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _amp_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def _to_device(value: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, tuple | list):
        return type(value)(_to_device(v, device, non_blocking) for v in value)
    return value


def _shapes(value: Any) -> tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, tuple | list):
        return tuple(_shapes(v) for v in value)
    return ()


def _split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise GpuprofError(
        f"the ladder expects each batch to be (inputs, targets); got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, tuple | list) else "")
        + "; wrap the dataset so __getitem__ returns (inputs, target)"
    )


def _batches(loader: DataLoader[Any]) -> Iterator[Any]:
    """Cycle through the loader (so a short dataset still feeds every step); raise a clear
    error when it yields nothing at all."""
    for epoch in itertools.count():
        got = False
        source = iter(loader)
        while True:
            try:
                # Yielded straight through, never bound here: a suspended generator must not
                # keep the last batch alive (it would then be freed inside the next step).
                yield next(source)
            except StopIteration:
                break
            got = True
        if not got:
            where = "the data" if epoch == 0 else "the data after one pass"
            raise GpuprofError(
                f"{where} yielded no batches of {loader.batch_size} (empty dataset, or fewer "
                "samples than one batch with drop_last); pass more data or a smaller batch_size"
            )


def build_loader(workload: Workload, settings: LoaderSettings, batch_size: int) -> DataLoader[Any]:
    """Return a DataLoader over the workload's data in a fixed order (same slice every rung)."""
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "num_workers": settings.num_workers,
        "pin_memory": settings.pin_memory,
        # Static shapes for compile (and CUDA graphs): never a short last batch.
        "drop_last": True,
    }
    if workload.collate_fn is not None:
        kwargs["collate_fn"] = workload.collate_fn
    if settings.num_workers > 0:
        kwargs["persistent_workers"] = settings.persistent_workers
        if settings.prefetch_factor is not None:
            kwargs["prefetch_factor"] = settings.prefetch_factor
    if not isinstance(workload.dataset, IterableDataset):
        kwargs["shuffle"] = False
    return DataLoader(workload.dataset, **kwargs)


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


SEGMENTS = "segments"


def _has_parameters(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters())


def checkpoint_targets(
    model: torch.nn.Module, names: Sequence[str] | None
) -> tuple[tuple[str, torch.nn.Module], ...]:
    """Return (name, module) pairs to checkpoint, in this order of preference: `names`
    (dotted paths); the blocks of the first ModuleList/Sequential whose elements are
    themselves blocks (transformer layers, ResNet stages); for a Sequential of plain layers,
    the model itself cut into about sqrt(n) segments (name "segments"); else the model's
    direct children that hold parameters."""
    if names:
        found = []
        for name in names:
            try:
                found.append((name, model.get_submodule(name)))
            except AttributeError:
                raise GpuprofError(
                    f"checkpoint_modules: the model has no submodule {name!r}; use names from "
                    "model.named_modules()"
                ) from None
        return tuple(found)
    # Checkpointing one Linear saves nothing (its input is kept anyway); whole blocks do.
    for prefix, container in model.named_modules():
        if not isinstance(container, torch.nn.ModuleList | torch.nn.Sequential):
            continue
        # Blocks are children that have parameters and children of their own; a plain
        # head or embedding layer beside them is left alone.
        blocks = [
            (f"{prefix}.{name}" if prefix else name, child)
            for name, child in container.named_children()
            if _has_parameters(child) and any(True for _ in child.children())
        ]
        if len(blocks) >= 2:
            return tuple(blocks)
    if isinstance(model, torch.nn.Sequential) and len(model) >= 3:
        return ((SEGMENTS, model),)
    return tuple((name, child) for name, child in model.named_children() if _has_parameters(child))


def apply_checkpointing(model: torch.nn.Module, names: Sequence[str] | None) -> str:
    """Wrap the modules `checkpoint_targets` picks in non-reentrant checkpointing; return
    what was wrapped, in words."""
    targets = checkpoint_targets(model, names)
    if targets and targets[0][0] == SEGMENTS and isinstance(model, torch.nn.Sequential):
        from torch.utils.checkpoint import checkpoint_sequential

        segments = max(2, round(math.sqrt(len(model))))
        layers = model

        def forward(x: Any) -> Any:
            # torch leaves checkpoint_sequential unannotated.
            return checkpoint_sequential(  # type: ignore[no-untyped-call]
                layers, segments, x, use_reentrant=False
            )

        model.forward = forward  # type: ignore[method-assign]
        return f"{segments} segments of the Sequential (the last one is not checkpointed)"
    for _, module in targets:
        module.forward = _checkpointed(module.forward)
    return ", ".join(name for name, _ in targets)


def build_optimizer(
    optimizer_fn: Callable[[Any], torch.optim.Optimizer], model: torch.nn.Module, fused: bool
) -> torch.optim.Optimizer:
    """Return the user's optimizer, rebuilt with fused=True when asked (Adam/AdamW only)."""
    optimizer = optimizer_fn(model.parameters())
    if not fused:
        return optimizer
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise GpuprofError(
            f"fused AdamW replaces Adam/AdamW; the optimizer is {type(optimizer).__name__}"
        )
    groups = [
        {k: v for k, v in group.items() if k not in ("fused", "foreach")}
        for group in optimizer.param_groups
    ]
    return type(optimizer)(groups, fused=True)


def measure(
    workload: Workload, config: RungConfig, *, batch_size: int | None = None
) -> Measurement:
    """Return the measurement of `config` on `workload`; raises NonFiniteLossError,
    OutOfMemory, GpuprofError for bad data, or whatever the model raised."""
    device = workload.device
    batch = batch_size or workload.batch_size
    meter = _PeakMeter(device)
    compiled = config.compile_mode is not None
    failed = False
    try:
        meter.start()
        # Model, optimizer, loader and activations live only in _train's frame, so they are
        # gone when it returns, and on an error go with the traceback we drop below.
        return _train(workload, config, batch, meter)
    except Exception as exc:
        failed = True
        if is_oom(exc) and not isinstance(exc, OutOfMemory):
            # The traceback's frames hold the activations that did not fit: drop them so the
            # memory can be freed now, not when the user's last error is forgotten.
            exc.__traceback__ = None
            raise OutOfMemory(
                f"batch size {batch} ({config.describe()}) does not fit in "
                f"{'device' if device.type == 'cuda' else 'host'} memory: {first_line(exc)}; "
                "use a smaller batch_size (memory was freed)"
            ) from None
        raise
    finally:
        if compiled:
            torch._dynamo.reset()
        # Checkpoint wrappers (module -> wrapper -> bound forward -> module) and tracebacks
        # make reference cycles; only a collection frees what they hold.
        free_memory(device, collect=failed or compiled or config.checkpoint)


def _train(workload: Workload, config: RungConfig, batch: int, meter: _PeakMeter) -> Measurement:
    """Build, train and time one configuration (see `measure`)."""
    device = workload.device
    model, optimizer, train_model = _build_model(workload, config)
    amp = _amp_dtype(config.precision)
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    loader = build_loader(workload, config.loader, batch)
    batches = _batches(loader)
    non_blocking = config.loader.pin_memory and device.type == "cuda"
    probe: Any = None
    k = config.accumulation_steps
    shapes: set[tuple[Any, ...]] = set()
    losses: list[torch.Tensor] = []
    model.train()

    def step() -> torch.Tensor:
        """One optimizer step over k micro-batches; returns the summed loss (detached)."""
        nonlocal probe
        total = torch.zeros((), device=device)
        for _ in range(k):
            inputs, targets = _to_device(_split_batch(next(batches)), device, non_blocking)
            shapes.add(_shapes(inputs))
            if probe is None:
                # The slice's first batch: the same probe for every rung.
                probe = (inputs, targets)
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                out = (
                    train_model(*inputs)
                    if isinstance(inputs, tuple | list)
                    else train_model(inputs)
                )
                loss = workload.loss_fn(out, targets) / k
            if scaler is not None:
                # torch leaves Tensor.backward unannotated.
                scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            else:
                loss.backward()  # type: ignore[no-untyped-call]
            total = total + loss.detach().float()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    def marked_step() -> None:
        with torch.profiler.record_function(STEP_MARKER):
            losses.append(step())

    # One step per sample, synchronised before and after (capture/timing, as the magic
    # times a cell): the warm-up steps' times are kept apart, the first of them (or the
    # first timed step without a warm-up) is the one that compiled.
    with torch.enable_grad():
        stats = time_cell(
            marked_step,
            warmup=workload.warmup,
            repeat=workload.steps,
            number=1,
            sync=functools.partial(_sync, device),
        )
    times = list(stats.warmup_wall_us + stats.wall_us)
    _check_losses(losses, config)
    final_loss = _probe_loss(model, workload.loss_fn, probe)
    if device.type == "cuda":
        peak = meter.peak_growth_bytes()
    else:
        # After the probe, so the extra step changes no reported loss.
        with torch.enable_grad():
            peak = _cpu_step_peak_bytes(step, model, optimizer)
    timed = tuple(times[workload.warmup :])
    return Measurement(
        step_times_us=timed,
        samples_per_step=batch * k,
        peak_memory_bytes=peak,
        compile_time_us=_compile_time_us(times, timed) if config.compile_mode is not None else None,
        final_loss=final_loss,
        static_shapes=len(shapes) == 1,
    )


def _build_model(
    workload: Workload, config: RungConfig
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Callable[..., Any]]:
    """Return a fresh model (seeded, on the device, checkpointed as `config` says), its
    optimizer, and what the steps call: the model, or its torch.compile'd wrapper."""
    torch.manual_seed(workload.seed)
    model = workload.model_fn().to(workload.device)
    if config.checkpoint:
        apply_checkpointing(model, workload.checkpoint_modules)
    optimizer = build_optimizer(workload.optimizer_fn, model, config.fused_optimizer)
    train_model: Callable[..., Any] = model
    if config.compile_mode is not None:
        train_model = torch.compile(model, mode=config.compile_mode, backend=config.compile_backend)
    return model, optimizer, train_model


def _check_losses(losses: list[torch.Tensor], config: RungConfig) -> None:
    """Raise NonFiniteLossError at the first step whose loss is not finite."""
    stacked = torch.stack(losses).cpu()
    if not bool(torch.isfinite(stacked).all()):
        bad = int((~torch.isfinite(stacked)).nonzero()[0, 0])
        raise NonFiniteLossError(
            f"the loss became {float(stacked[bad])} at step {bad + 1} of "
            f"{len(losses)} ({config.describe()}); check the inputs and learning rate, or "
            "find the op with torch.autograd.detect_anomaly()"
        )


def _compile_time_us(times: list[float], timed: tuple[float, ...]) -> float:
    """Return what the first step (the one that compiled) took beyond a normal (median
    timed) step, in microseconds, at least 0."""
    timed_sorted = sorted(timed)
    median = timed_sorted[len(timed_sorted) // 2]
    return max(times[0] - median, 0.0)


def _probe_loss(
    model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], probe: Any
) -> float:
    """Return the fp32 eval-mode loss on the probe batch (the same for every rung)."""
    inputs, targets = probe
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(*inputs) if isinstance(inputs, tuple | list) else model(inputs)
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                out = out.float()
            value = float(loss_fn(out, targets))
    finally:
        model.train(was_training)
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"the loss on the probe batch after training is {value}; training diverged"
        )
    return value


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def amp_precision(device: torch.device) -> str:
    """Return 'bf16' where the device runs bf16, else 'fp16' (with GradScaler)."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"
    return "bf16"


def resolve_data(data: Any, batch_size: int | None) -> tuple[Any, Any, int, LoaderSettings]:
    """Return (dataset, collate_fn, batch_size, loader settings) from a Dataset or DataLoader."""
    if isinstance(data, DataLoader):
        size = batch_size if batch_size is not None else data.batch_size
        if size is None:
            raise GpuprofError(
                "the DataLoader has batch_size=None (a batch_sampler?); pass batch_size= to "
                "run_ladder"
            )
        settings = LoaderSettings(
            num_workers=data.num_workers,
            pin_memory=data.pin_memory,
            persistent_workers=data.persistent_workers,
            prefetch_factor=data.prefetch_factor if data.num_workers > 0 else None,
        )
        return data.dataset, data.collate_fn, int(size), settings
    if isinstance(data, Dataset | IterableDataset) or hasattr(data, "__getitem__"):
        if batch_size is None:
            raise GpuprofError("pass batch_size= to run_ladder when data is a Dataset")
        return data, None, int(batch_size), LoaderSettings()
    raise GpuprofError(f"data must be a torch Dataset or DataLoader; got {type(data).__name__}")


def cpu_cores() -> int:
    """Return the CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def loader_grid(device: torch.device, cores: int | None = None) -> tuple[LoaderSettings, ...]:
    """Return the DataLoader settings to sweep: num_workers at 0, about cores/2 and cores;
    with workers, persistent and prefetch_factor 2 or 4; pin_memory on CUDA."""
    n = cores or cpu_cores()
    pin = device.type == "cuda"
    grid = [LoaderSettings(0, pin, False, None)]
    for workers in sorted({max(1, n // 2), n}):
        for prefetch in (2, 4):
            grid.append(LoaderSettings(workers, pin, True, prefetch))
    return tuple(grid)
