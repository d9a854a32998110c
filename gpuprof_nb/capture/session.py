"""How `%%gpuprofile` runs a cell, start to finish. The magic (magics.py) parses the option
line (options.py), calls `run_cell` and shows the report it returns.

`run_cell`, in order:
1. refuses to start while a torch profiler is already recording;
2. compiles the cell as IPython would, cached for re-runs (cell.py: CellCompiler);
3. times it without the profiler (timing.py: time_cell): warm-up runs, then --repeat
   samples; a short cell's samples are blocks of back-to-back runs, the cell compiled inside
   a loop (cell.py: block_builder), sized by one calibration block;
4. runs it once more under torch.profiler (profiler.py), unless --timing-only; with --once
   its single run is timed and profiled together; beside that run, samplers record the
   machine's utilisation (utilisation.py) and, with --stack, the Python line the cell is
   running (sampling.py);
5. reads the trace, names the notebook cells in it (--stack), writes --trace and analyses it
   into a ProfileReport.
Grad mode and autocast are put back before every run or block and once more at the end
(cell.py: CellRunner.restore_modes). The cell's own exceptions propagate unchanged; once it
has run, a fault of ours (a trace that cannot be read, written or analysed) becomes a note in
the report, which keeps the timings and the raw trace.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from IPython.core.error import UsageError

from gpuprof_nb.capture.cell import CellCompiler, CellRunner, block_builder
from gpuprof_nb.capture.dynamo import CompileRecorder
from gpuprof_nb.capture.linetrace import LineTracer, default_engine
from gpuprof_nb.capture.modules import ModuleRecorder
from gpuprof_nb.capture.profiler import (
    ProfilerStoppedByCell,
    Sampler,
    profile_cell,
    profiler_running,
)
from gpuprof_nb.capture.sampling import LineSampler
from gpuprof_nb.capture.timing import time_cell
from gpuprof_nb.capture.utilisation import UtilisationSampler
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.results.report import ProfileReport

# Where the report's trace says it came from.
TRACE_SOURCE = "%%gpuprofile cell"


def run_cell(
    cells: CellCompiler,
    cell: str,
    args: Any,
    *,
    clock: Callable[[], int],
    show_partial: Callable[[ProfileReport], object],
) -> ProfileReport:
    """Run `cell` in the shell of `cells` as the parsed options `args` say and return its
    report. `clock` is the nanosecond clock the timed runs read. If the profiled run
    raises, the finished timings go to `show_partial` (as a timing-only report) before the
    cell's exception propagates."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
    if profiler_running():
        # Checked before any run: timed runs under someone else's profiler would be
        # inflated, and ours could not start afterwards.
        raise UsageError(
            "%%gpuprofile: a torch profiler is already recording (started in an earlier "
            "cell?); stop it first (prof.stop() or leave its `with` block)"
        )
    code, source = cells.compile(cell)
    namespace = cells.shell.user_ns
    cuda = _cuda_available()
    runner = CellRunner(code, namespace)
    # The timed runs call exec directly: no Python frame of ours between the clock reads
    # and the cell's code (a method call per run showed in ~10 us cells).
    run = functools.partial(exec, code, namespace)
    notes = _notes(args, cuda)
    device_name = _device_name(cuda)
    sync = _cuda_sync if cuda else None
    stats: TimingStats
    artifact = None
    # What torch.compile does in every run of the cell (it compiles in the warm-up).
    compiles = CompileRecorder()
    compiles.start()
    try:
        if args.once and not args.timing_only:
            # One run only: it is both timed and profiled, so its time includes the
            # profiler's overhead (said in the notes).
            box: list[TimingStats] = []

            def timed_once() -> None:
                __tracebackhide__ = True  # noqa: F841
                box.append(
                    time_cell(
                        runner,
                        once=True,
                        sync=sync,
                        use_cuda_events=cuda,
                        device_name=device_name,
                        clock=clock,
                        before_each=runner.restore_modes,
                    )
                )

            try:
                artifact = profile_cell(
                    timed_once,
                    runs=1,
                    stack=args.stack,
                    memory=args.memory,
                    cuda=cuda,
                    samplers=_samplers(code, args, cuda, namespace),
                )
            except ProfilerStoppedByCell as exc:
                notes.append(f"no trace: {exc}")
            stats = dataclasses.replace(box[0], profiled=True)
        else:
            stats = time_cell(
                run,
                warmup=args.warmup,
                repeat=args.repeat,
                once=args.once,
                sync=sync,
                use_cuda_events=cuda,
                device_name=device_name,
                before_each=runner.restore_modes,
                number=args.number,
                clock=clock,
                run_block=block_builder(cells, source, code),
            )
            if stats.number > 1:
                notes.append(_block_note(stats.number, args.number is None))
            if not args.timing_only:
                runner.restore_modes()
                try:
                    artifact = profile_cell(
                        runner,
                        runs=1,
                        stack=args.stack,
                        memory=args.memory,
                        cuda=cuda,
                        samplers=_samplers(code, args, cuda, namespace),
                    )
                except ProfilerStoppedByCell as exc:
                    # The timings stand; only the trace is lost, so say so and go on.
                    notes.append(f"no trace: {exc}")
                except BaseException as exc:
                    # The timed runs had finished: their numbers stand, so they are shown
                    # (and stored) before the cell's own error propagates.
                    _show_partial(show_partial, stats, notes, exc)
                    raise
    finally:
        runner.restore_modes()
        compiles.stop()
    return _report(cells, stats, compiles.attach(artifact, cells.cell_numbers), args, notes)


def _show_partial(
    show: Callable[[ProfileReport], object],
    stats: TimingStats,
    notes: list[str],
    exc: BaseException,
) -> None:
    """Show a timing-only report after the profiled run raised; never raise itself, so the
    user's exception is the one that propagates."""
    why = f"the profiled run raised {type(exc).__name__}: only the timed runs are shown"
    try:
        show(ProfileReport(timing=stats, trace=None, notes=(why, *notes)))
    except Exception:  # noqa: BLE001, S110 - the cell's error matters more than ours
        pass


def _report(
    cells: CellCompiler,
    stats: TimingStats,
    artifact: dict[str, Any] | None,
    args: Any,
    notes: list[str],
) -> ProfileReport:
    """Return the report of the run: the timings alone without a trace; else the trace
    read, its cells named (--stack), written (--trace) and analysed."""
    if artifact is None:
        return ProfileReport(timing=stats, trace=None, notes=tuple(notes))
    from gpuprof_nb.analysis.report import analyze, count_steps_per_run
    from gpuprof_nb.capture.device import trace_device_spec
    from gpuprof_nb.errors import GpuprofError
    from gpuprof_nb.io.timing import with_timing
    from gpuprof_nb.io.trace import save_trace_dict, trace_from_dict

    if args.stack:
        _name_cells(cells, artifact)
    notes.extend(_sampling_notes(artifact))
    try:
        trace = trace_from_dict(artifact, TRACE_SOURCE)
    except GpuprofError as exc:
        # The cell has run and may not be repeatable: keep its timings and the raw trace
        # (.save(path) writes it) instead of losing both to a reader error.
        notes.append(f"the recorded trace could not be read: {exc}")
        return ProfileReport(timing=stats, trace=None, artifact=artifact, notes=tuple(notes))
    steps = count_steps_per_run(trace)
    if steps:
        stats = dataclasses.replace(stats, steps_per_run=steps)
    if args.trace:
        # The run is done and costly to repeat: a trace that cannot be written becomes a
        # note in the report (which -o still stores) rather than an error that loses it.
        try:
            path = save_trace_dict(with_timing(artifact, stats), args.trace)
            notes.append(f"trace written to {path} (open it in ui.perfetto.dev)")
        except GpuprofError as exc:
            notes.append(f"trace NOT written: {exc}; call .save(path) on the report")
    # --sort was checked before the cell ran, so a failure here is ours, not the user's:
    # keep the timings and the raw trace, and say what broke.
    try:
        # Captured here: this machine's measured CPU ceilings apply too (io/ceilings.py).
        device = trace_device_spec(trace, this_machine=True)
        return analyze(
            trace,
            device,
            timing=stats,
            top=args.top,
            sort=args.sort,
            artifact=artifact,
            notes=notes,
        )
    except Exception as exc:  # noqa: BLE001 - reported in the notes, never hidden
        notes.append(f"analysis failed: {type(exc).__name__}: {exc}")
        return ProfileReport(timing=stats, trace=trace, artifact=artifact, notes=tuple(notes))


def _samplers(
    code: Any, args: Any, cuda: bool, namespace: dict[str, Any] | None = None
) -> list[tuple[str, Sampler]]:
    """Return what samples beside the profiled run: the utilisation of the machine, the
    nn.Module ranges (unless --no-modules; roots named from `namespace`), and with --stack
    the Python line the cell runs (keyed as the trace stores them)."""
    samplers: list[tuple[str, Sampler]] = [
        ("utilisation", UtilisationSampler(cuda=cuda, device_index=_nvml_index(cuda)))
    ]
    if getattr(args, "modules", True):
        samplers.append(("modules", ModuleRecorder(namespace)))
    if args.stack:
        samplers.append(("samples", line_recorder(code)))
    return samplers


def line_recorder(code: Any) -> Sampler:
    """Return what records the cell's lines under --stack: exact line events of the user's
    code (linetrace.py) where the interpreter offers them, else the line sampler (another
    tool holds sys.settrace, a debugger or coverage, or every sys.monitoring tool id is
    taken)."""
    engine = default_engine()
    if engine is not None:
        return LineTracer(code, engine=engine)
    return LineSampler(code)


def _nvml_index(cuda: bool) -> int:
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


def _sampling_notes(artifact: dict[str, Any]) -> list[str]:
    """Return what went wrong beside the profiled run: samples that could not be placed on
    the trace's clock, a sampler that stopped early, a cell too short for the line sampler."""
    from gpuprof_nb.io.cells import KEY

    own = artifact.get(KEY)
    if not isinstance(own, dict):
        return []
    notes = []
    if own.get("sampling_error"):
        notes.append(f"samplers: {own['sampling_error']}; no lines or utilisation shown")
    samples = own.get("samples")
    if isinstance(samples, dict):
        if samples.get("error"):
            notes.append(f"line sampler: {samples['error']}")
        elif not samples.get("ts_us"):
            notes.append(
                "line sampler: no sample fell inside the cell (it ran for less than "
                f"{samples.get('period_us', 1000) / 1000:g} ms?)"
            )
    return notes


def _name_cells(cells: CellCompiler, artifact: dict[str, Any]) -> None:
    """Store, with the trace, the execution number of each notebook cell its Python frames
    ran in (under gpuprof_nb's own key, which other tools ignore), so the report, and the
    trace saved and loaded again, names them `In [n]`."""
    from gpuprof_nb.analysis.sources import profiler_frame_file
    from gpuprof_nb.io.cells import KEY

    events = artifact.get("traceEvents")
    files = [
        profiler_frame_file(str(e.get("name", "")))
        for e in events or ()
        if isinstance(e, dict) and e.get("cat") == "python_function"
    ]
    own = artifact.get(KEY)
    samples = own.get("samples") if isinstance(own, dict) else None
    if isinstance(samples, dict):
        files.extend(f[0] for f in samples.get("frames", ()))
    numbers = cells.cell_numbers(f for f in files if f)
    if numbers:
        artifact.setdefault(KEY, {}).setdefault("cells", {}).update(numbers)


def _notes(args: Any, cuda: bool) -> list[str]:
    """Return the notes every report of these options starts with."""
    notes = []
    if not cuda:
        notes.append("CPU mode: no CUDA device; times are host wall-clock (perf_counter_ns)")
    if args.once:
        if args.timing_only:
            notes.append("--once: the cell ran once; numbers include cold-start effects")
        else:
            notes.append(
                "--once: the cell ran once, under the profiler; numbers include cold-start "
                "effects and profiler overhead"
            )
    if args.timing_only:
        notes.append("--timing-only: no profiler trace was recorded")
    return notes


def _block_note(number: int, auto: bool) -> str:
    """Return the note saying that each timed sample is `number` back-to-back runs."""
    how = (
        "chosen from a calibration block after the warm-up; --number sets it"
        if auto
        else "--number"
    )
    return (
        f"each timed sample is {number:,} back-to-back runs ({how}); times are per "
        f"run: the sample's time / {number:,}"
    )


@functools.cache
def _cuda_available() -> bool:
    """Whether torch sees a CUDA device (asked once per process: the answer cannot change
    once torch has looked, and the call costs ~10 us per cell from cold caches)."""
    return bool(torch.cuda.is_available())


def _cuda_sync() -> None:
    torch.cuda.synchronize()


def _device_name(cuda: bool) -> str:
    return str(torch.cuda.get_device_name()) if cuda else "cpu"
