"""How `%%memsnap` runs a cell, start to finish, from frozen `MemsnapOptions` to the
MemoryReport. The magic (magics/memsnap.py) parses its line into MemsnapOptions, calls
`run_cell`, and publishes the report (storing, showing, --save).

`run_cell`, in order:
1. compiles the cell as IPython would (capture/cell.py) and, with `fit`, checks that the
   cell reads the batch-size variable and does not assign it;
2. records memory around `repeat` runs of it (capture/memory.py: the CUDA allocator's
   history, else the CPU profiler fallback), or with `fit` at the other batch size and then
   at the variable's own (capture/batches.py); grad and autocast modes are put back before
   every run and at the end;
3. completes the recorded snapshot dict once under gpuprof_nb's key (the runs' step starts,
   the capture's notes), reads it once (io), the notebook cells its frames ran in named
   while it is read, and analyses it (analysis);
4. with `fit` or a budget: the fit, the budget (given, or the device's memory) and the
   checkpointing plan; with `apply`, the plan applied for one more run and measured.
A CUDA out-of-memory error of the cell is not raised here: the run holds it (`oom`), so the
report about it can be shown before the magic raises it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

from gpuprof_nb.analysis.report import analyze_memory, with_fit
from gpuprof_nb.capture.batches import (
    BatchRuns,
    check_batch_variable,
    checkpoint_applied,
    memory_capacity,
    record_batch_sizes,
)
from gpuprof_nb.capture.cell import CellCompiler, CellRunner
from gpuprof_nb.capture.memory import DEFAULT_MAX_ENTRIES, MemoryCapture, record_memory
from gpuprof_nb.errors import OptionError
from gpuprof_nb.io.cells import KEY
from gpuprof_nb.io.snapshot import save_snapshot, snapshot_from_dict
from gpuprof_nb.results.report import MemoryReport
from gpuprof_nb.session.options import MemsnapOptions, Window

__all__ = ["MemsnapOptions", "MemsnapRun", "run_cell", "run_of_capture", "save_run"]


@dataclass(frozen=True, slots=True)
class MemsnapRun:
    """What recording a cell gave: its report; the snapshot dict as recorded and completed
    (what --save writes on CUDA: the allocator's own dict, for PyTorch's memory_viz); where
    it came from ("cuda" or "cpu-profiler"); and the cell's out-of-memory error, if any."""

    report: MemoryReport
    artifact: dict[str, Any]
    source: str
    oom: BaseException | None


def run_cell(cells: CellCompiler, cell: str, options: MemsnapOptions) -> MemsnapRun:
    """Record memory around `cell` in the shell of `cells` as `options` say and return the
    run (see the module docstring). OptionError for options with problems, or a --fit
    variable the cell cannot be recorded with; the cell's own exceptions propagate, except
    a CUDA out-of-memory error, which the run holds."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
    problems = options.problems()
    if problems:
        raise OptionError("", "; ".join(problems))
    code, source = cells.compile(cell)
    namespace = cells.shell.user_ns
    if options.fit:
        try:
            check_batch_variable(source, options.fit, namespace)
        except ValueError as e:
            raise OptionError("--fit", str(e)) from None
    runner = CellRunner(code, namespace)

    def run() -> None:
        __tracebackhide__ = True  # noqa: F841
        runner.restore_modes()
        runner()

    record = _Recording(options.max_entries or DEFAULT_MAX_ENTRIES, options.stacks, namespace, code)
    runs = None
    try:
        if options.fit:
            runs = record_batch_sizes(
                run,
                namespace,
                options.fit,
                max_entries=record.max_entries,
                stacks=record.stacks,
                cell_code=code,
            )
            capture = runs.main
        else:
            capture = record(run, repeat=options.repeat)
    finally:
        runner.restore_modes()
    try:
        done = run_of_capture(capture, window=options.window, name_cells=cells.cell_numbers)
        # After an out-of-memory error the report is about that error, not a fit.
        if (options.fit or options.budget_bytes is not None) and capture.oom is None:
            fitted = _fitted(done.report, capture, runs, options, run, record)
            done = dataclasses.replace(done, report=fitted)
    except BaseException:
        # The user's out-of-memory error is what propagates, whatever happened here.
        if capture.oom is not None:
            raise capture.oom  # noqa: B904 - the failure above stays as its context
        raise
    return done


def run_of_capture(
    capture: MemoryCapture,
    *,
    window: Window | None = None,
    name_cells: Callable[[Iterable[str]], Mapping[str, int]] | None = None,
) -> MemsnapRun:
    """Return the run of one recording: its snapshot dict completed once (see
    `_completed`), read once (the notebook cells its frames ran in named by `name_cells`)
    and analysed over `window`."""
    artifact = _completed(capture)
    snapshot = snapshot_from_dict(artifact, where="%%memsnap", name_cells=name_cells)
    device = capture.device if capture.device in snapshot.devices else None
    oom = f"{type(capture.oom).__name__}: {capture.oom}" if capture.oom else None
    report = analyze_memory(
        snapshot,
        device=device,
        window=window,
        step_starts=capture.step_starts or None,
        oom_message=oom,
    )
    return MemsnapRun(report=report, artifact=artifact, source=capture.source, oom=capture.oom)


@dataclass(frozen=True, slots=True)
class _Recording:
    """Records a cell with the run's --max-entries and --stacks (capture/memory.py); the
    CPU fallback reads the lines of the cell's `code` that allocated."""

    max_entries: int
    stacks: str
    namespace: dict[str, Any]
    code: CodeType | None = None

    def __call__(self, run: Callable[[], object], *, repeat: int = 1) -> MemoryCapture:
        return record_memory(
            run,
            repeat=repeat,
            namespace=self.namespace,
            max_entries=self.max_entries,
            stacks=self.stacks,
            cell_code=self.code,
        )


def _completed(capture: MemoryCapture) -> dict[str, Any]:
    """Return the recorded snapshot dict with what the run knows under gpuprof_nb's key: on
    CUDA, the capture's notes (e.g. a full --max-entries buffer) and the entries where each
    repeat began, so a saved --repeat snapshot still has its runs (without them, a leak
    across runs reads as one run's growth offline). The CPU fallback's dict has them
    already. The recorded dict itself is left as it is."""
    if capture.source != "cuda":
        return capture.snapshot
    own = capture.snapshot.get(KEY)
    extra: dict[str, Any] = dict(own) if isinstance(own, dict) else {}
    if capture.notes:
        extra["notes"] = [*extra.get("notes", ()), *capture.notes]
    if capture.step_starts:
        starts: list[list[int]] = [[] for _ in range(capture.device + 1)]
        starts[capture.device] = list(capture.step_starts)
        extra["step_starts"] = starts
    return {**capture.snapshot, KEY: extra}


def _fitted(
    report: MemoryReport,
    capture: MemoryCapture,
    runs: BatchRuns | None,
    options: MemsnapOptions,
    run: Callable[[], object],
    record: _Recording,
) -> MemoryReport:
    """Return the report with its fit (measured from `runs` with --fit), budget and plan;
    with --apply, the plan applied for one more run of the cell and its measured peak."""
    budget, source = options.budget_bytes, "--budget"
    if budget is None:
        budget, source = memory_capacity(capture.source)
        if capture.source != "cuda":
            # The step's parameters and optimizer state are already resident.
            budget += report.timeline.start_bytes
            source += (
                f"; plus {report.timeline.start_bytes:,} B the step held when it began "
                "(already resident)"
            )
    other = None
    if runs is not None:
        other = snapshot_from_dict(runs.other.snapshot, where="%%memsnap --fit")
    report = with_fit(
        report,
        runs.batch_size if runs is not None else None,
        other,
        runs.other_batch_size if runs is not None else None,
        variable=options.fit or "",
        budget_bytes=budget,
        budget_source=source,
    )
    plan = report.plan
    if not options.apply or plan is None or not plan.modules:
        return report
    step = report.snapshot.step
    name = next((r.name for r in step.roots if r.name), "") if step else ""
    model = record.namespace.get(name)
    if model is None:
        note = "--apply: no variable here holds the model, so the plan was not applied."
        return dataclasses.replace(
            report, plan=dataclasses.replace(plan, notes=plan.notes + (note,))
        )
    with checkpoint_applied(model, plan.paths):
        again = record(run)
    measured = analyze_memory(snapshot_from_dict(again.snapshot, where="%%memsnap --apply"))
    return dataclasses.replace(
        report, plan=dataclasses.replace(plan, measured_peak_bytes=measured.peak_bytes)
    )


def save_run(run: MemsnapRun, path: str) -> Path:
    """Write the run's snapshot as a pickle; return the path. On CUDA the allocator's own
    dict is written as recorded (plus gpuprof_nb's own key, which PyTorch's memory_viz
    ignores, holding the cells as the report names them), as
    torch.cuda.memory._dump_snapshot writes it; the CPU fallback writes the rebuilt one.
    GpuprofError or OSError when it cannot be written."""
    if run.source != "cuda":
        return save_snapshot(run.report.snapshot, path)
    data = run.artifact
    cells = run.report.snapshot.cells
    if cells:
        data = {**data, KEY: {**data.get(KEY, {}), "cells": dict(cells)}}
    return save_snapshot(data, path)
