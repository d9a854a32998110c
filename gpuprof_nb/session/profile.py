"""How `%%gpuprofile` runs a cell, start to finish, from frozen `ProfileOptions` to the
ProfileReport. The magic (magics/gpuprofile.py) parses its line into ProfileOptions, calls
`run_cell` and publishes the report it returns.

`run_cell`, in order:
1. refuses to start while a torch profiler is already recording (ProfilerBusy);
2. compiles the cell as IPython would, cached for re-runs (capture/cell.py: CellCompiler);
3. times it without the profiler (capture/timing.py: time_cell): warm-up runs, then
   `repeat` samples; a short cell's samples are blocks of back-to-back runs, the cell
   compiled inside a loop (capture/cell.py: block_builder), sized by one calibration block;
4. runs it once more under torch.profiler (capture/profiler.py), unless `timing_only`; with
   `once` its single run is timed and profiled together; beside that run, samplers record
   the machine's utilisation, the nn.Module ranges and, with `stack`, the Python line the
   cell is running (capture/samplers.py);
5. completes the recorded trace dict once (the notebook cells its frames ran in, what
   torch.compile did), reads it (io), writes it to `trace_path`, and analyses it with this
   machine's ceilings (`report_of_artifact`, the road profile_function takes too).
Grad mode and autocast are put back before every run or block and once more at the end
(CellRunner.restore_modes). The cell's own exceptions propagate unchanged; once it has run,
a fault of ours (a trace that cannot be read, written or analysed) becomes a note in the
report, which keeps the timings and the raw trace.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any

from gpuprof_nb.analysis.report import analyze, count_steps_per_run
from gpuprof_nb.capture import device as capture_device
from gpuprof_nb.capture.cell import CellCompiler, CellRunner, block_builder
from gpuprof_nb.capture.dynamo import CompileRecorder
from gpuprof_nb.capture.profiler import (
    ProfilerStoppedByCell,
    Sampler,
    profile_cell,
    profiler_running,
)
from gpuprof_nb.capture.samplers import cell_samplers
from gpuprof_nb.capture.timing import time_cell
from gpuprof_nb.errors import CaptureError, GpuprofError
from gpuprof_nb.io.cells import KEY
from gpuprof_nb.io.timing import with_timing
from gpuprof_nb.io.trace import save_trace_dict, trace_from_dict
from gpuprof_nb.model.frames import profiler_frame_file
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.session.options import ProfileOptions

__all__ = ["ProfileOptions", "ProfilerBusy", "report_of_artifact", "run_cell"]

# Where the report's trace says it came from.
TRACE_SOURCE = "%%gpuprofile cell"


class ProfilerBusy(CaptureError):
    """A torch profiler was already recording when the cell was to run."""


def run_cell(
    cells: CellCompiler,
    cell: str,
    options: ProfileOptions,
    *,
    clock: Callable[[], int],
    show_partial: Callable[[ProfileReport], object],
) -> ProfileReport:
    """Run `cell` in the shell of `cells` as `options` say and return its report. `clock`
    is the nanosecond clock the timed runs read. If the profiled run raises, the finished
    timings go to `show_partial` (as a timing-only report) before the cell's exception
    propagates. GpuprofError for options with problems; ProfilerBusy before anything runs
    when another torch profiler is recording."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
    problems = options.problems()
    if problems:
        raise GpuprofError("; ".join(problems))
    if profiler_running():
        # Checked before any run: timed runs under someone else's profiler would be
        # inflated, and ours could not start afterwards.
        raise ProfilerBusy(
            "a torch profiler is already recording (started in an earlier cell?); stop it "
            "first (prof.stop() or leave its `with` block)"
        )
    code, source = cells.compile(cell)
    namespace = cells.shell.user_ns
    cuda = capture_device.cuda_available()
    runner = CellRunner(code, namespace)
    notes = _notes(options, cuda)
    runs = _Runs(
        runner=runner,
        options=options,
        cuda=cuda,
        device_name=capture_device.device_name(cuda),
        sync=capture_device.synchronize if cuda else None,
        clock=clock,
        samplers=functools.partial(
            cell_samplers,
            code,
            stack=options.stack,
            modules=options.modules,
            cuda=cuda,
            namespace=namespace,
        ),
        notes=notes,
    )
    # What torch.compile does in every run of the cell (it compiles in the warm-up).
    compiles = CompileRecorder()
    compiles.start()
    try:
        if options.once and not options.timing_only:
            stats, artifact = _timed_and_profiled_once(runs)
        else:
            # The timed runs call exec directly: no Python frame of ours between the clock
            # reads and the cell's code (a method call per run showed in the shortest cells:
            # benchmarks/RESULTS.md, "Measurements behind design choices", M11).
            run = functools.partial(exec, code, namespace)
            run_block = block_builder(cells, source, code)
            stats, artifact = _timed_then_profiled(runs, run, run_block, show_partial)
    finally:
        runner.restore_modes()
        compiles.stop()
    if artifact is None:
        return ProfileReport(timing=stats, trace=None, notes=tuple(notes))
    compiles.attach(artifact, cells.cell_numbers)
    if options.stack:
        _name_cells(artifact, cells.cell_numbers)
    return report_of_artifact(
        artifact,
        stats,
        source=TRACE_SOURCE,
        notes=notes,
        top=options.top,
        sort=options.sort,
        trace_path=options.trace_path,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Runs:
    """How run_cell runs one cell: its runner, the options, the device (CUDA events and
    sync, its name), the clock the timed runs read, what samples beside the profiled run,
    and the notes the report will carry (appended to as it goes)."""

    runner: CellRunner
    options: ProfileOptions
    cuda: bool
    device_name: str
    sync: Callable[[], None] | None
    clock: Callable[[], int]
    samplers: Callable[[], list[tuple[str, Sampler]]]
    notes: list[str]

    def profiled(self, run: Callable[[], object]) -> dict[str, Any] | None:
        """Return the trace of one run of `run` under torch.profiler; None, with a note,
        when the cell ran a profiler of its own that stopped ours."""
        __tracebackhide__ = True  # noqa: F841
        try:
            return profile_cell(
                run,
                runs=1,
                stack=self.options.stack,
                memory=self.options.memory,
                cuda=self.cuda,
                samplers=self.samplers(),
            )
        except ProfilerStoppedByCell as exc:
            self.notes.append(f"no trace: {exc}")
            return None


def _timed_and_profiled_once(runs: _Runs) -> tuple[TimingStats, dict[str, Any] | None]:
    """Return the timing and trace of the cell's one run, both at once: its time includes
    the profiler's overhead (said in the notes)."""
    __tracebackhide__ = True  # noqa: F841
    box: list[TimingStats] = []

    def timed_once() -> None:
        __tracebackhide__ = True  # noqa: F841
        box.append(
            time_cell(
                runs.runner,
                once=True,
                sync=runs.sync,
                use_cuda_events=runs.cuda,
                device_name=runs.device_name,
                clock=runs.clock,
                before_each=runs.runner.restore_modes,
            )
        )

    artifact = runs.profiled(timed_once)
    return dataclasses.replace(box[0], profiled=True), artifact


def _timed_then_profiled(
    runs: _Runs,
    run: Callable[[], object],
    run_block: Callable[[int], Callable[[], object] | None],
    show_partial: Callable[[ProfileReport], object],
) -> tuple[TimingStats, dict[str, Any] | None]:
    """Return the timings of `run` (warm-up, then the samples, in blocks of `run_block`
    where they help) and, unless timing_only, the trace of one more run under the
    profiler. If that run raises, the timings go to `show_partial` first."""
    __tracebackhide__ = True  # noqa: F841
    options = runs.options
    stats = time_cell(
        run,
        warmup=options.warmup,
        repeat=options.repeat,
        once=options.once,
        sync=runs.sync,
        use_cuda_events=runs.cuda,
        device_name=runs.device_name,
        before_each=runs.runner.restore_modes,
        number=options.number,
        clock=runs.clock,
        run_block=run_block,
    )
    if stats.number > 1:
        runs.notes.append(_block_note(stats.number, options.number is None))
    if options.timing_only:
        return stats, None
    runs.runner.restore_modes()
    try:
        # A cell stopping our profiler costs only the trace: the timings stand, and a
        # note says so.
        return stats, runs.profiled(runs.runner)
    except BaseException as exc:
        # The timed runs had finished: their numbers stand, so they are shown (and
        # stored) before the cell's own error propagates.
        _show_partial(show_partial, stats, runs.notes, exc)
        raise


def report_of_artifact(
    artifact: dict[str, Any],
    stats: TimingStats,
    *,
    source: str,
    notes: list[str],
    top: int | None = 20,
    sort: str | None = None,
    trace_path: str | None = None,
) -> ProfileReport:
    """Return the report of a live run's trace dict and its timings: the trace read, its
    steps counted into the timings, written to `trace_path`, and analysed with this
    machine's ceilings. The run is done and may not be repeatable, so a fault of ours
    (a trace that cannot be read, written or analysed) becomes a note, and the report keeps
    the timings and the raw trace."""
    notes.extend(_sampling_notes(artifact))
    try:
        trace = trace_from_dict(artifact, source)
    except GpuprofError as exc:
        # .save(path) still writes the raw trace.
        notes.append(f"the recorded trace could not be read: {exc}")
        return ProfileReport(timing=stats, trace=None, artifact=artifact, notes=tuple(notes))
    steps = count_steps_per_run(trace)
    if steps:
        stats = dataclasses.replace(stats, steps_per_run=steps)
    if trace_path:
        # A trace that cannot be written becomes a note in the report (which -o still
        # stores) rather than an error that loses it.
        try:
            path = save_trace_dict(with_timing(artifact, stats), trace_path)
            notes.append(f"trace written to {path} (open it in ui.perfetto.dev)")
        except GpuprofError as exc:
            notes.append(f"trace NOT written: {exc}; call .save(path) on the report")
    # The options were checked before the cell ran, so a failure here is ours, not the
    # user's: keep the timings and the raw trace, and say what broke.
    try:
        # Captured here: this machine's measured CPU ceilings apply too (io/ceilings.py).
        device = capture_device.trace_device_spec(trace, this_machine=True)
        return analyze(
            trace, device, timing=stats, top=top, sort=sort, artifact=artifact, notes=notes
        )
    except Exception as exc:  # noqa: BLE001 - reported in the notes, never hidden
        notes.append(f"analysis failed: {type(exc).__name__}: {exc}")
        return ProfileReport(timing=stats, trace=trace, artifact=artifact, notes=tuple(notes))


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


def _sampling_notes(artifact: dict[str, Any]) -> list[str]:
    """Return what went wrong beside the profiled run: samples that could not be placed on
    the trace's clock, a sampler that stopped early, a cell too short for the line sampler."""
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


def _name_cells(
    artifact: dict[str, Any], cell_numbers: Callable[[Iterable[str]], dict[str, int]]
) -> None:
    """Store, with the trace, the execution number of each notebook cell its Python frames
    ran in (under gpuprof_nb's own key, which other tools ignore), so the report, and the
    trace saved and loaded again, names them `In [n]`."""
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
    numbers = cell_numbers(f for f in files if f)
    if numbers:
        artifact.setdefault(KEY, {}).setdefault("cells", {}).update(numbers)


def _notes(options: ProfileOptions, cuda: bool) -> list[str]:
    """Return the notes every report of these options starts with."""
    notes = []
    if not cuda:
        notes.append("CPU mode: no CUDA device; times are host wall-clock (perf_counter_ns)")
    if options.once:
        if options.timing_only:
            notes.append("--once: the cell ran once; numbers include cold-start effects")
        else:
            notes.append(
                "--once: the cell ran once, under the profiler; numbers include cold-start "
                "effects and profiler overhead"
            )
    if options.timing_only:
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
