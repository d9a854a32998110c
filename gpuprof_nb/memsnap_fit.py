"""`%%memsnap --fit / --budget / --apply` after the recording: the report's fit (two runs,
or its categories), its budget (given, or the device's memory), the checkpointing plan, and
the plan applied for one more run. Glue between capture and analysis, like the magic."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from gpuprof_nb.analysis.report import analyze_memory, with_fit
from gpuprof_nb.capture.batches import BatchRuns, checkpoint_applied, memory_capacity
from gpuprof_nb.capture.memory import MemoryCapture, record_memory
from gpuprof_nb.io.snapshot import snapshot_from_dict
from gpuprof_nb.results.report import MemoryReport


def fitted_report(
    report: MemoryReport,
    capture: MemoryCapture,
    runs: BatchRuns | None,
    budget: int | None,
    *,
    variable: str,
    apply: bool,
    run: Callable[[], object],
    namespace: dict[str, Any],
    options: dict[str, Any],
) -> MemoryReport:
    """Return the report with its fit (measured from `runs` with --fit), budget and plan;
    with `apply`, the plan applied for one more run of the cell and its measured peak."""
    source = "--budget"
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
        variable=variable,
        budget_bytes=budget,
        budget_source=source,
    )
    plan = report.plan
    if not apply or plan is None or not plan.modules:
        return report
    record = report.snapshot.step
    name = next((r.name for r in record.roots if r.name), "") if record else ""
    model = namespace.get(name)
    if model is None:
        note = "--apply: no variable here holds the model, so the plan was not applied."
        return dataclasses.replace(
            report, plan=dataclasses.replace(plan, notes=plan.notes + (note,))
        )
    with checkpoint_applied(model, plan.paths):
        again = record_memory(run, namespace=namespace, **options)
    measured = analyze_memory(snapshot_from_dict(again.snapshot, where="%%memsnap --apply"))
    return dataclasses.replace(
        report, plan=dataclasses.replace(plan, measured_peak_bytes=measured.peak_bytes)
    )
