"""The ladder itself: climb the rungs in order, keep what helps, build on what was kept."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import torch

from gpuprof_nb.capture.dynamo import CompileRecorder
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.ladder.measure import (
    LoaderSettings,
    Measurement,
    NonFiniteLossError,
    OutOfMemory,
    RungConfig,
    Workload,
    accumulation_blocked,
    amp_precision,
    apply_checkpointing,
    checkpoint_targets,
    first_line,
    free_memory,
    is_oom,
    loader_grid,
    measure,
    memory_method,
    resolve_data,
)
from gpuprof_nb.ladder.mfu import count_flops, graph_breaks_of, with_mfu
from gpuprof_nb.ladder.plan import plan_for
from gpuprof_nb.ladder.verdicts import (
    RUNG_NAMES,
    BatchPoint,
    BatchSweep,
    LadderReport,
    RungResult,
    judge_checkpoint_rung,
    judge_speed_rung,
    read_three_runs,
    relative_drift,
)
from gpuprof_nb.model.arguments import check_number, check_type, describe
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.render.progress import Progress
from gpuprof_nb.render.units import fmt_bytes
from gpuprof_nb.results.fit import budget_bytes
from gpuprof_nb.results.ladder import RungStatus

# Measured on the shared 2-core machine the ladder was written on (see docs/ladder.md).
_CPU_COMPILE_SKIP = (
    "torch.compile on CPU builds C++ kernels with gcc: a cold compile of a small MLP took "
    "42-57 s on a 2-core machine (0.5-5 s from a warm cache); pass compile=True to run it"
)


# Far more steps, warm-up steps and batch-size points than a ladder needs (each rung runs
# `steps` steps): a larger count is a typo that would run for hours.
MAX_STEPS = 10_000
MAX_BATCH_SIZE = 1 << 24
MAX_BATCH_POINTS = 64


def _check_ladder_arguments(
    *functions: Any,
    steps: Any,
    warmup: Any,
    batch_size: Any,
    batch_sizes: Any,
    seed: Any,
    progress: Any,
) -> None:
    """Raise GpuprofError naming the first argument of run_ladder / sweep_batch_sizes that
    is not what it takes (before anything runs)."""
    for name, fn in zip(("model_fn", "loss_fn", "optimizer_fn"), functions, strict=True):
        if not callable(fn):
            raise GpuprofError(f"{name} must be a function, got {describe(fn)}")
    check_number(steps, "steps", low=1, high=MAX_STEPS, integer=True)
    check_number(warmup, "warmup", low=0, high=MAX_STEPS, integer=True)
    if batch_size is not None:
        check_number(batch_size, "batch_size", low=1, high=MAX_BATCH_SIZE, integer=True)
    if batch_sizes is not None:
        if not isinstance(batch_sizes, (list, tuple, range)):
            raise GpuprofError(f"batch_sizes must be a list of sizes, got {describe(batch_sizes)}")
        sizes = list(batch_sizes)
        if len(sizes) > MAX_BATCH_POINTS:
            raise GpuprofError(
                f"batch_sizes holds {len(sizes)} sizes; at most {MAX_BATCH_POINTS} are measured"
            )
        for size in sizes:
            check_number(size, "each of batch_sizes", low=1, high=MAX_BATCH_SIZE, integer=True)
    check_number(seed, "seed", low=0, integer=True)
    check_type(progress, bool, "progress", "True or False")


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise GpuprofError(f"device must be a name such as 'cuda' or 'cpu', got {describe(device)}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GpuprofError(
            f"device {describe(device)} is not a torch device ({str(exc)[:120]}); pass 'cuda', "
            "'cuda:1', 'cpu', or leave it out"
        ) from None
    if resolved.type not in ("cuda", "cpu"):
        raise GpuprofError(
            f"device {describe(device)}: the ladder runs on 'cuda' or 'cpu' devices only"
        )
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise GpuprofError(
            f"device {device!r} asked for, but torch sees no CUDA device; "
            "pass device='cpu' or leave it out"
        )
    return resolved


def _fmt_rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.4g}"


def _outcome(result: RungResult) -> str:
    rate = result.samples_per_s
    speed = f"{_fmt_rate(rate)} samples/s, " if rate else ""
    return f"{result.name}: {result.status} ({speed}{result.reason})"


class _Climb:
    """State of one ladder run: the workload, the kept configuration and its measurement."""

    def __init__(
        self, workload: Workload, progress: Progress, *, loss_tolerance: float, min_gain: float
    ) -> None:
        self.workload = workload
        self.progress = progress
        self.loss_tolerance = loss_tolerance
        self.min_gain = min_gain
        self.results: list[RungResult] = []
        self.baseline_loss: float | None = None
        self.current: RungConfig = RungConfig()
        self.current_measurement: Measurement | None = None
        # MFU: the baseline's FLOPs per sample (None: not counted, `flops_note` says why)
        # and each rung's precision.
        self.flops_per_sample: float | None = None
        self.flops_note = ""
        self.precisions: dict[str, str] = {}

    def try_measure(self, name: str, config: RungConfig, label: str) -> Measurement | RungResult:
        """Measure `config`; on failure return a failed RungResult (memory already freed)."""
        self.progress.start(f"{name}: {label}")
        try:
            return measure(self.workload, config)
        except Exception as exc:  # a rung that fails must not stop the ladder
            if isinstance(exc, OutOfMemory | NonFiniteLossError):
                reason = str(exc).split(";")[0]
            elif is_oom(exc):
                reason = "out of memory: " + first_line(exc)
            else:
                reason = first_line(exc)
        # Outside the except block: the error and the frames it held are gone, so what the
        # failed rung allocated can be returned now.
        free_memory(self.workload.device)
        return RungResult(name=name, settings=config.describe(), status="failed", reason=reason)

    def result_from(
        self, name: str, config: RungConfig, measured: Measurement, status: RungStatus, reason: str
    ) -> RungResult:
        timing = TimingStats(wall_us=measured.step_times_us)
        self.precisions[name] = config.precision
        if timing.iqr_us > 0.5 * timing.median_us:
            # Say so rather than hide it: a loaded machine can flip a keep/drop verdict.
            reason += " [noisy: step-time IQR over half the median; re-run on an idle machine]"
        return RungResult(
            name=name,
            settings=config.describe(),
            status=status,
            reason=reason,
            step_times_us=measured.step_times_us,
            samples_per_step=measured.samples_per_step,
            peak_memory_bytes=measured.peak_memory_bytes,
            compile_time_us=measured.compile_time_us,
            final_loss=measured.final_loss,
            loss_drift=relative_drift(measured.final_loss, self.baseline_loss),
        )

    def record(self, result: RungResult) -> RungResult:
        self.results.append(result)
        self.progress.finish(_outcome(result))
        return result

    def skip(self, name: str, reason: str) -> RungResult:
        result = RungResult(
            name=name, settings=self.current.describe(), status="skipped", reason=reason
        )
        self.results.append(result)
        return result

    def current_us_per_sample(self) -> tuple[float, ...]:
        """Step times per sample of the configuration kept so far."""
        if self.current_measurement is None:
            raise GpuprofError("internal: the ladder has no baseline measurement yet")
        return _us_per_sample(self.current_measurement)

    def current_rate(self) -> float:
        """Samples/s of the configuration kept so far."""
        if self.current_measurement is None:
            raise GpuprofError("internal: the ladder has no baseline measurement yet")
        return _rate(self.current_measurement)

    def speed_rung(
        self, name: str, config: RungConfig, label: str, note: Callable[[float], str] | None = None
    ) -> RungResult:
        """Measure a rung meant to go faster; keep it (it becomes current) if it does."""
        got = self.try_measure(name, config, label)
        if isinstance(got, RungResult):
            return self.record(got)
        drift = relative_drift(got.final_loss, self.baseline_loss)
        status, reason = judge_speed_rung(
            self.current_rate(),
            _rate(got),
            drift,
            loss_tolerance=self.loss_tolerance,
            min_gain=self.min_gain,
            current_us_per_sample=self.current_us_per_sample(),
            candidate_us_per_sample=_us_per_sample(got),
        )
        if status != "kept" and note is not None:
            extra = note(_rate(got) / self.current_rate())
            reason = f"{reason}; {extra}" if extra else reason
        result = self.record(self.result_from(name, config, got, status, reason))
        if status == "kept":
            self.current, self.current_measurement = config, got
        return result


def _us_per_sample(measured: Measurement) -> tuple[float, ...]:
    """Each step's time over its samples (what the speed verdict compares)."""
    n = measured.samples_per_step or 1
    return tuple(t / n for t in measured.step_times_us)


def _rate(measured: Measurement) -> float:
    """Samples/s at the median step time."""
    return measured.samples_per_step / (statistics.median(measured.step_times_us) / 1e6)


def run_ladder(
    model_fn: Callable[[], torch.nn.Module],
    data: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    optimizer_fn: Callable[[Any], torch.optim.Optimizer],
    *,
    steps: int = 20,
    warmup: int = 3,
    batch_size: int | None = None,
    target_effective_batch: int | None = None,
    device: str | torch.device | None = None,
    rungs: Iterable[str] | None = None,
    compile: bool | str = "auto",
    compile_backend: str = "inductor",
    checkpoint_modules: Sequence[str] | None = None,
    memory_budget: int | str | None = None,
    loader_settings: Sequence[LoaderSettings] | None = None,
    batch_sizes: Sequence[int] | None = None,
    seed: int = 0,
    loss_tolerance: float = 0.05,
    min_gain: float = 0.03,
    label: str = "",
    progress: bool = True,
) -> LadderReport:
    """Return a LadderReport: every rung measured on the user's model (samples/s, step time
    median and IQR in microseconds, peak memory in bytes, compile time, probe loss).

    `model_fn()` builds a fresh model; `optimizer_fn(params)` its optimizer; `loss_fn(out,
    target)` the loss; `data` is a Dataset or DataLoader of (inputs, targets). `rungs` limits
    which rungs run (fp32 always does). `compile="auto"` compiles on CUDA and skips on CPU
    (saying why). `batch_sizes` adds a batch-size sweep of the final configuration. The
    checkpoint rung checkpoints `checkpoint_modules` when given, else the modules a plan
    picks to bring the peak under `memory_budget` (bytes or '8GiB'; default a quarter
    under the recorded peak) with the least recompute (docs/fit.md).

    Long only in its signature: 23 keyword arguments (the public API's); the body is five
    named steps (checks, workload, plan, climb, report).
    """
    _check_ladder_arguments(
        model_fn,
        loss_fn,
        optimizer_fn,
        steps=steps,
        warmup=warmup,
        batch_size=batch_size,
        batch_sizes=batch_sizes,
        seed=seed,
        progress=progress,
    )
    wanted = _wanted_rungs(
        rungs,
        target_effective_batch=target_effective_batch,
        loss_tolerance=loss_tolerance,
        min_gain=min_gain,
        label=label,
        compile=compile,
        compile_backend=compile_backend,
        checkpoint_modules=checkpoint_modules,
    )
    budget = budget_bytes(memory_budget) if memory_budget is not None else None
    workload, base_loader = _workload(
        model_fn,
        data,
        loss_fn,
        optimizer_fn,
        batch_size=batch_size,
        steps=steps,
        warmup=warmup,
        device=device,
        seed=seed,
        checkpoint_modules=checkpoint_modules,
    )
    grid = tuple(loader_settings) if loader_settings else loader_grid(workload.device)
    bar = Progress(_planned_rungs(wanted, grid, batch_sizes), enabled=progress)
    climb = _Climb(workload, bar, loss_tolerance=loss_tolerance, min_gain=min_gain)
    base_config = RungConfig(compile_backend=compile_backend, loader=base_loader)
    climbed = _climb_rungs(
        climb,
        base_config,
        wanted,
        compile=compile,
        target_effective_batch=target_effective_batch,
        grid=grid,
        budget=budget,
        batch_sizes=batch_sizes,
    )
    return _ladder_report(climb, climbed, label=label)


class _Climbed(NamedTuple):
    """What the climb gives besides its rungs: the mixed precision tried (`amp`) and its
    rung, the compiled rung's samples/s, the batch-size sweep, and notes."""

    amp: str
    amp_result: RungResult | None
    compile_rate: float | None
    sweep: BatchSweep | None
    notes: list[str]


def _climb_rungs(
    climb: _Climb,
    base_config: RungConfig,
    wanted: set[str],
    *,
    compile: bool | str,
    target_effective_batch: int | None,
    grid: Sequence[LoaderSettings],
    budget: int | None,
    batch_sizes: Sequence[int] | None,
) -> _Climbed:
    """Climb the `wanted` rungs in order from `base_config`, then sweep `batch_sizes`. The
    progress bar is closed and device memory freed whatever a rung raised."""
    dev = climb.workload.device
    do_compile = compile is True or (compile == "auto" and dev.type == "cuda")
    notes: list[str] = []
    amp = amp_precision(dev)
    try:
        _run_baseline(climb, base_config)
        amp_result = _run_amp(climb, wanted, amp)
        compile_rate = _run_compile(climb, wanted, amp, amp_result, do_compile, dev, notes)
        _run_reduce_overhead(climb, wanted, do_compile, dev)
        _run_fused(climb, wanted)
        _run_accumulation(climb, wanted, target_effective_batch)
        _run_dataloader(climb, wanted, grid)
        _run_checkpoint(climb, wanted, budget)
        sweep = sweep_batch_sizes_of(climb, batch_sizes) if batch_sizes else None
    finally:
        climb.progress.close()
        free_memory(dev, collect=False)
    return _Climbed(amp, amp_result, compile_rate, sweep, notes)


def _workload(
    model_fn: Callable[[], torch.nn.Module],
    data: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    optimizer_fn: Callable[[Any], torch.optim.Optimizer],
    *,
    batch_size: int | None,
    steps: int,
    warmup: int,
    device: str | torch.device | None,
    seed: int,
    checkpoint_modules: Sequence[str] | None,
) -> tuple[Workload, LoaderSettings]:
    """Return the workload every rung trains (on the resolved device, with the batch size
    given or `data`'s own) and the loader settings `data` came with."""
    dev = _resolve_device(device)
    dataset, collate_fn, size, base_loader = resolve_data(data, batch_size)
    if size < 1:
        raise GpuprofError(f"batch_size must be >= 1; got {size}")
    workload = Workload(
        model_fn=model_fn,
        dataset=dataset,
        collate_fn=collate_fn,
        loss_fn=loss_fn,
        optimizer_fn=optimizer_fn,
        batch_size=size,
        steps=steps,
        warmup=warmup,
        device=dev,
        seed=seed,
        checkpoint_modules=tuple(checkpoint_modules) if checkpoint_modules else None,
    )
    return workload, base_loader


def _ladder_report(climb: _Climb, climbed: _Climbed, *, label: str) -> LadderReport:
    """Return the LadderReport of a finished climb: its rungs with MFU, the three-run
    reading of fp32, mixed precision and compiled, the batch-size sweep, and the climb's
    notes (with one on a missing MFU)."""
    workload = climb.workload
    dev = workload.device
    baseline = climb.results[0]
    rungs_mfu, peak_source = with_mfu(climb.results, climb.flops_per_sample, dev, climb.precisions)
    notes = climbed.notes + _mfu_notes(climb, peak_source)
    amp_result = climbed.amp_result
    three = read_three_runs(
        baseline.samples_per_s or math.nan,
        amp_result.samples_per_s if amp_result is not None else None,
        climbed.compile_rate,
        amp_label=climbed.amp,
    )
    return LadderReport(
        rungs=rungs_mfu,
        model_flops_per_sample=climb.flops_per_sample,
        peak_source=peak_source,
        three_run=three,
        device_name=_device_name(dev),
        memory_method=memory_method(dev),
        steps=workload.steps,
        warmup=workload.warmup,
        batch_size=workload.batch_size,
        seed=workload.seed,
        loss_tolerance=climb.loss_tolerance,
        torch_version=str(torch.__version__),
        created_utc=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        label=label,
        notes=tuple(notes),
        batch_sweep=climbed.sweep,
    )


def _wanted_rungs(
    rungs: Iterable[str] | None,
    *,
    target_effective_batch: int | None,
    loss_tolerance: float,
    min_gain: float,
    label: str,
    compile: bool | str,
    compile_backend: str,
    checkpoint_modules: Sequence[str] | None,
) -> set[str]:
    """Return the rungs to run (fp32 always among them); raise GpuprofError naming the
    first of run_ladder's own arguments that is not what it takes (before anything runs)."""
    if target_effective_batch is not None:
        check_number(target_effective_batch, "target_effective_batch", low=1, integer=True)
    check_number(loss_tolerance, "loss_tolerance", low=0, above=True, high=10, hint="e.g. 0.05")
    check_number(min_gain, "min_gain", low=0, high=0.99, hint="a fraction, e.g. 0.03")
    check_type(label, str, "label", "a string")
    check_type(compile_backend, str, "compile_backend", "a backend name such as 'inductor'")
    if rungs is not None and (
        not isinstance(rungs, (list, tuple, set, frozenset))
        or not all(isinstance(r, str) for r in rungs)
    ):
        raise GpuprofError(f"rungs must be a list of rung names, got {describe(rungs)}")
    if checkpoint_modules is not None and (
        not isinstance(checkpoint_modules, (list, tuple))
        or not all(isinstance(m, str) for m in checkpoint_modules)
    ):
        raise GpuprofError(
            f"checkpoint_modules must be a list of module names, got {describe(checkpoint_modules)}"
        )
    wanted = set(RUNG_NAMES if rungs is None else rungs) | {"fp32"}
    unknown = sorted(wanted - set(RUNG_NAMES))
    if unknown:
        raise GpuprofError(
            f"unknown rung(s) {', '.join(unknown)}; choose from {', '.join(RUNG_NAMES)}"
        )
    if compile not in (True, False, "auto"):
        raise GpuprofError(f"compile must be True, False or 'auto'; got {compile!r}")
    return wanted


def _planned_rungs(
    wanted: set[str], grid: Sequence[LoaderSettings], batch_sizes: Sequence[int] | None
) -> int:
    """Return how many measurements the progress bar counts: the baseline, each wanted
    rung, each loader setting tried, each batch size swept."""
    return (
        1
        + len(
            {"bf16", "compile", "reduce_overhead", "fused_adamw", "grad_accum", "checkpoint"}
            & wanted
        )
        + (len(grid) if "dataloader" in wanted else 0)
        + len(batch_sizes or ())
    )


def _mfu_notes(climb: _Climb, peak_source: str) -> list[str]:
    """Return the note saying why the report has no MFU, if it has none."""
    if climb.flops_note:
        return [f"no MFU: {climb.flops_note}"]
    if climb.flops_per_sample and not peak_source:
        return [
            "no MFU: no peak is known for this device (gpuprof_nb.measure_ceilings() measures it)"
        ]
    return []


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _run_baseline(climb: _Climb, config: RungConfig) -> None:
    climb.progress.start("fp32: baseline")
    try:
        # One untimed step first, so one-time costs (library loading, allocator and thread
        # pool start-up) land on no rung's time or peak memory; profiled, it gives the
        # model's FLOPs per step (MFU).
        first = replace(climb.workload, steps=1, warmup=0)
        once, flops, why = count_flops(lambda: measure(first, config), climb.workload.device)
        climb.flops_per_sample = flops / once.samples_per_step if flops else None
        climb.flops_note = why
        got = measure(climb.workload, config)
    except GpuprofError:
        raise
    except Exception as exc:
        raise GpuprofError(
            f"the fp32 baseline failed ({first_line(exc)}); the ladder needs a baseline - make "
            "one training step work first (model_fn, loss_fn, optimizer_fn, data)"
        ) from exc
    climb.baseline_loss = got.final_loss
    climb.current, climb.current_measurement = config, got
    climb.record(climb.result_from("fp32", config, got, "baseline", "reference for every rung"))


def _run_amp(climb: _Climb, wanted: set[str], amp: str) -> RungResult | None:
    if "bf16" not in wanted:
        climb.skip("bf16", "not asked for (rungs=...)")
        return None
    device = climb.workload.device

    def cpu_note(ratio: float) -> str:
        if device.type != "cuda" and ratio < 1.0:
            text = (
                f"bf16 autocast ran {1 / ratio:.1f}x slower than fp32 on this CPU: on CPU it "
                "pays only with fast bf16 matrix units (AMX) and large matmuls, otherwise it "
                "only adds casts; dropped"
            )
            return text
        return ""

    label = f"{amp} autocast" + (" + GradScaler" if amp == "fp16" else "")
    return climb.speed_rung("bf16", climb.current.with_(precision=amp), label, note=cpu_note)


def _run_compile(
    climb: _Climb,
    wanted: set[str],
    amp: str,
    amp_result: RungResult | None,
    do_compile: bool,
    dev: torch.device,
    notes: list[str],
) -> float | None:
    """Run the compile rung; return the low-precision + compile samples/s for the three-run
    reading (None where not measured)."""
    if "compile" not in wanted:
        climb.skip("compile", "not asked for (rungs=...)")
        return None
    if not do_compile:
        reason = _CPU_COMPILE_SKIP if dev.type != "cuda" else "compile=False"
        notes.append("compile rung skipped: " + reason)
        climb.skip("compile", reason)
        return None
    amp_kept = amp_result is not None and amp_result.status == "kept"
    config = climb.current.with_(compile_mode="default")
    recorder = CompileRecorder()
    recorder.start()
    try:
        result = climb.speed_rung("compile", config, "torch.compile (default mode)")
    finally:
        recorder.stop()
    breaks = graph_breaks_of(recorder.record())
    if breaks:
        result = dataclasses.replace(
            result,
            graph_breaks=breaks,
            reason=f"{result.reason}; {len(breaks)} graph break(s): " + "; ".join(breaks),
        )
        climb.results[-1] = result if climb.results[-1].name == "compile" else climb.results[-1]
    if amp_kept or amp_result is None or amp_result.status == "failed":
        return result.samples_per_s if config.precision == amp else None
    # Low precision was dropped, so the compile rung ran without it; the three-run reading
    # still needs low precision + compile, measured for reference only.
    ref_config = config.with_(precision=amp)
    got = climb.try_measure("amp+compile", ref_config, f"{amp} + compile (three-run)")
    if isinstance(got, RungResult):
        climb.record(got)
        return None
    climb.record(
        climb.result_from(
            "amp+compile", ref_config, got, "reference", "measured for the three-run reading only"
        )
    )
    return _rate(got)


def _run_reduce_overhead(
    climb: _Climb, wanted: set[str], do_compile: bool, dev: torch.device
) -> None:
    if "reduce_overhead" not in wanted:
        climb.skip("reduce_overhead", "not asked for (rungs=...)")
        return
    if dev.type != "cuda":
        climb.skip("reduce_overhead", "mode='reduce-overhead' records CUDA graphs: GPU only")
        return
    if not do_compile:
        climb.skip("reduce_overhead", "compile=False")
        return
    base = climb.current_measurement
    if base is not None and not base.static_shapes:
        climb.skip(
            "reduce_overhead",
            "input shapes changed between steps; CUDA graphs need "
            "static shapes (pad to fixed sizes first)",
        )
        return
    # drop_last=True keeps every batch the same size, as CUDA graphs need.
    config = climb.current.with_(compile_mode="reduce-overhead")
    climb.speed_rung("reduce_overhead", config, "torch.compile(mode='reduce-overhead')")


def _run_fused(climb: _Climb, wanted: set[str]) -> None:
    if "fused_adamw" not in wanted:
        climb.skip("fused_adamw", "not asked for (rungs=...)")
        return
    probe = climb.workload.optimizer_fn([torch.nn.Parameter(torch.zeros(1))])
    if not isinstance(probe, torch.optim.Adam | torch.optim.AdamW):
        climb.skip(
            "fused_adamw",
            f"the optimizer is {type(probe).__name__}; fused AdamW replaces Adam/AdamW only",
        )
        return
    if probe.defaults.get("fused"):
        climb.skip("fused_adamw", "the optimizer is already fused")
        return
    config = climb.current.with_(fused_optimizer=True)
    climb.speed_rung("fused_adamw", config, f"{type(probe).__name__}(fused=True)")


def _run_accumulation(climb: _Climb, wanted: set[str], target: int | None) -> None:
    if "grad_accum" not in wanted:
        climb.skip("grad_accum", "not asked for (rungs=...)")
        return
    size = climb.workload.batch_size
    if target is None or target <= size:
        climb.skip("grad_accum", "no target_effective_batch above the batch size given")
        return
    blocked = accumulation_blocked(climb.current, climb.workload.device)
    if blocked is not None:
        climb.skip("grad_accum", blocked)
        return
    k = math.ceil(target / size)
    config = climb.current.with_(accumulation_steps=k)
    got = climb.try_measure("grad_accum", config, f"{k} micro-batches of {size}")
    if isinstance(got, RungResult):
        climb.record(got)
        return
    drift = relative_drift(got.final_loss, climb.baseline_loss)
    change = _rate(got) / climb.current_rate() - 1.0
    reach = f"effective batch {size * k} (target {target})"
    status: RungStatus
    if drift is None or drift > climb.loss_tolerance:
        status = "flagged"
        reason = (
            f"{reach}, but the loss drifted {drift * 100 if drift is not None else 0:.2f}%"
            f" (tolerance {climb.loss_tolerance * 100:.1f}%)"
        )
    elif change >= -0.10:
        # Accumulation is for the effective batch, not speed: keep it unless it costs > 10%.
        status, reason = "kept", f"{reach} at {change * 100:+.1f}% samples/s"
    else:
        status, reason = "dropped", f"{reach} but {change * 100:+.1f}% samples/s"
    climb.record(climb.result_from("grad_accum", config, got, status, reason))
    if status == "kept":
        climb.current, climb.current_measurement = config, got


def _run_dataloader(climb: _Climb, wanted: set[str], grid: Sequence[LoaderSettings]) -> None:
    if "dataloader" not in wanted:
        climb.skip("dataloader", "not asked for (rungs=...)")
        return
    trials: list[RungResult] = []
    best: tuple[float, RungConfig, Measurement] | None = None
    for settings in grid:
        config = climb.current.with_(loader=settings)
        got = climb.try_measure("dataloader", config, settings.describe())
        if isinstance(got, RungResult):
            trial = RungResult(
                name=settings.describe(), settings=got.settings, status="failed", reason=got.reason
            )
        else:
            trial = RungResult(
                name=settings.describe(),
                settings=config.describe(),
                status="trial",
                reason="",
                step_times_us=got.step_times_us,
                samples_per_step=got.samples_per_step,
                peak_memory_bytes=got.peak_memory_bytes,
                final_loss=got.final_loss,
                loss_drift=relative_drift(got.final_loss, climb.baseline_loss),
            )
            rate = _rate(got)
            if best is None or rate > best[0]:
                best = (rate, config, got)
        trials.append(trial)
        climb.progress.finish(_outcome(trial))
    if best is None:
        climb.results.append(
            RungResult(
                name="dataloader",
                settings=climb.current.describe(),
                status="failed",
                reason="every DataLoader setting failed: " + trials[0].reason,
                trials=tuple(trials),
            )
        )
        return
    rate, config, got = best
    status: RungStatus
    if config.loader == climb.current.loader:
        status, reason = "dropped", "the current DataLoader settings were already the fastest"
    else:
        drift = relative_drift(got.final_loss, climb.baseline_loss)
        status, reason = judge_speed_rung(
            climb.current_rate(),
            rate,
            drift,
            loss_tolerance=climb.loss_tolerance,
            min_gain=climb.min_gain,
            current_us_per_sample=climb.current_us_per_sample(),
            candidate_us_per_sample=_us_per_sample(got),
        )
        reason = f"best of {len(grid)}: {config.loader.describe()}; {reason}"
    result = climb.result_from("dataloader", config, got, status, reason)
    climb.results.append(replace(result, trials=tuple(trials)))
    if status == "kept":
        climb.current, climb.current_measurement = config, got


def _planned(climb: _Climb, budget: int | None) -> tuple[Workload, str] | None:
    """Return the workload with the plan's modules to checkpoint and the plan in words;
    None when the recorded peak already fits the budget (the rung is then skipped)."""
    workload = climb.workload
    if workload.checkpoint_modules is not None:
        return workload, ""
    # The plan is made on the kept configuration without compile (its modules' calls are
    # what the plan reads).
    try:
        got = plan_for(workload, climb.current.with_(compile_mode=None), budget)
    except Exception as exc:  # no plan: the rung checkpoints every block, as before
        return workload, f"no plan ({first_line(exc)}); every block instead: "
    plan = got.plan
    if not plan.modules:
        if plan.fits:
            climb.skip(
                "checkpoint",
                f"the recorded peak ({fmt_bytes(got.recorded_peak_bytes)}) already fits the "
                f"budget ({fmt_bytes(got.budget_bytes)}): nothing to checkpoint",
            )
            return None
        return workload, "the plan found no module to checkpoint; every block instead: "
    words = (
        f"plan for {fmt_bytes(got.budget_bytes)} (recorded peak "
        f"{fmt_bytes(got.recorded_peak_bytes)}, predicted {fmt_bytes(plan.predicted_peak_bytes)}"
        + ("" if plan.fits else ", still over")
        + "): "
    )
    return replace(workload, checkpoint_modules=plan.paths), words


def _run_checkpoint(climb: _Climb, wanted: set[str], budget: int | None = None) -> None:
    if "checkpoint" not in wanted:
        climb.skip("checkpoint", "not asked for (rungs=...)")
        return
    planned = _planned(climb, budget)
    if planned is None:
        return
    workload, words = planned
    user_workload = climb.workload
    climb.workload = workload
    try:
        _measure_checkpoint(climb, words)
    finally:
        climb.workload = user_workload


def _measure_checkpoint(climb: _Climb, words: str) -> None:
    torch.manual_seed(climb.workload.seed)
    # A throwaway model, only to say which modules get checkpointed.
    sample = climb.workload.model_fn()
    try:
        if not checkpoint_targets(sample, climb.workload.checkpoint_modules):
            climb.skip(
                "checkpoint",
                "the model has no child modules with parameters to "
                "checkpoint; pass checkpoint_modules=[...]",
            )
            return
        names = apply_checkpointing(sample, climb.workload.checkpoint_modules)
    except GpuprofError as exc:
        climb.record(RungResult("checkpoint", climb.current.describe(), "failed", str(exc)))
        return
    finally:
        del sample
    config = climb.current.with_(checkpoint=True)
    got = climb.try_measure("checkpoint", config, f"checkpoint({names})")
    if isinstance(got, RungResult):
        climb.record(got)
        return
    current_peak = (
        climb.current_measurement.peak_memory_bytes if climb.current_measurement else None
    )
    drift = relative_drift(got.final_loss, climb.baseline_loss)
    status, reason = judge_checkpoint_rung(
        climb.current_rate(),
        current_peak,
        _rate(got),
        got.peak_memory_bytes,
        drift,
        loss_tolerance=climb.loss_tolerance,
    )
    climb.record(
        climb.result_from("checkpoint", config, got, status, f"{words}on {names}: {reason}")
    )
    if status == "kept":
        climb.current, climb.current_measurement = config, got


def sweep_batch_sizes_of(climb: _Climb, batch_sizes: Sequence[int]) -> BatchSweep:
    """Run the batch-size sweep on the climb's kept configuration (without accumulation)."""
    config = climb.current.with_(accumulation_steps=1)
    points: list[BatchPoint] = []
    for size in sorted(set(int(b) for b in batch_sizes)):
        climb.progress.start(f"batch size {size}")
        try:
            got = measure(climb.workload, config, batch_size=size)
        except OutOfMemory as exc:
            point = BatchPoint(size, "oom", error=str(exc).split(";")[0])
        except Exception as exc:
            point = BatchPoint(size, "failed", error=first_line(exc))
        else:
            point = BatchPoint(size, "ok", got.step_times_us, got.peak_memory_bytes)
        points.append(point)
        rate = point.samples_per_s
        climb.progress.finish(
            f"batch {size}: {_fmt_rate(rate)} samples/s"
            if rate
            else f"batch {size}: {point.status} ({point.error})"
        )
        if point.status == "oom":
            break  # larger batches will not fit either
    return BatchSweep(
        settings=config.describe(),
        points=tuple(points),
        memory_method=memory_method(climb.workload.device),
    )


def sweep_batch_sizes(
    model_fn: Callable[[], torch.nn.Module],
    data: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    optimizer_fn: Callable[[Any], torch.optim.Optimizer],
    batch_sizes: Sequence[int],
    *,
    steps: int = 10,
    warmup: int = 2,
    device: str | torch.device | None = None,
    config: RungConfig | None = None,
    seed: int = 0,
    progress: bool = True,
) -> BatchSweep:
    """Return samples/s and peak memory (bytes) at each batch size, stopping at the first that
    runs out of memory; the sweep's `plateau_batch_size` is where throughput stops rising."""
    _check_ladder_arguments(
        model_fn,
        loss_fn,
        optimizer_fn,
        steps=steps,
        warmup=warmup,
        batch_size=None,
        batch_sizes=batch_sizes,
        seed=seed,
        progress=progress,
    )
    if not batch_sizes:
        raise GpuprofError("batch_sizes must hold at least one size >= 1")
    if config is not None:
        check_type(config, RungConfig, "config", "a RungConfig or None")
    dev = _resolve_device(device)
    dataset, collate_fn, _, base_loader = resolve_data(data, max(batch_sizes))
    workload = Workload(
        model_fn=model_fn,
        dataset=dataset,
        collate_fn=collate_fn,
        loss_fn=loss_fn,
        optimizer_fn=optimizer_fn,
        batch_size=int(min(batch_sizes)),
        steps=steps,
        warmup=warmup,
        device=dev,
        seed=seed,
    )
    bar = Progress(len(set(batch_sizes)), enabled=progress)
    climb = _Climb(workload, bar, loss_tolerance=1.0, min_gain=0.0)
    climb.current = config or RungConfig(loader=base_loader)
    try:
        return sweep_batch_sizes_of(climb, batch_sizes)
    finally:
        bar.close()
