"""Before and after: `compare(before, after)` puts two profiles side by side and says whether
the change is real (docs/compare.md has the method).

- Each side is a ProfileReport (from %%gpuprofile or `analyze`) or a Trace; the public
  `gpuprof_nb.compare` (session/analyze.py) reads trace files first.
- Times are per training step when both sides have steps, else per run of the cell (two
  %%gpuprofile reports), else per profiled window.
- The verdict comes from the timed samples of %%gpuprofile reports: a 95% bootstrap interval
  for the ratio of median times, called faster or slower only when it lies wholly beyond the
  noise floor. Two traces without timed samples are judged on their profiled steps (two or
  more a side); a trace of one profiled window gets the numbers and no verdict.
- Changes are matched by name across the two sides, tolerating the renames users meet:
  kernels that differ only in tile sizes or template arguments are one family, the
  DataLoader's iterator classes are one DataLoader row, and eager ops or kernels that ran
  before only, when compiled code (Triton kernels, compiled regions) ran after, are marked
  as replaced by it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.classify import is_host_collective, kernel_name_class
from gpuprof_nb.analysis.derived import TraceIndex
from gpuprof_nb.analysis.intervals import clip_intervals, merge_intervals, union_length
from gpuprof_nb.analysis.noise import (
    other_work_share,
    runs_to_settle,
    spread_of,
    typical_spread,
)
from gpuprof_nb.analysis.ops import kernel_table, top_ops
from gpuprof_nb.analysis.report import analyze, count_steps_per_run
from gpuprof_nb.analysis.timeline import dataloader_ops
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.arguments import check_number, check_type
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.compare import (
    COMPARE_NOISE_FLOOR,
    ChangeRow,
    Comparison,
    IdleDelta,
    Per,
    Verdict,
)
from gpuprof_nb.results.diagnosis import Finding
from gpuprof_nb.results.report import ProfileReport

# Trace files are read by the public front end (session/analyze.py), which names a side by
# its file name.
Side = ProfileReport | Trace

# What compiled code looks like in a trace: Triton kernels, compiled regions and graphs.
_COMPILED_OP_MARKS = ("Torch-Compiled Region", "CompiledFunction", "Compiled Function")
_DATALOADER = "DataLoader (next batch)"


def timing_verdict(
    before: Sequence[float],
    after: Sequence[float],
    *,
    noise_floor: float = COMPARE_NOISE_FLOOR,
    other_work: tuple[float | None, float | None] = (None, None),
    waited: tuple[float | None, float | None] = (None, None),
) -> Verdict | None:
    """Return the verdict on two sets of timed samples (Verdict.from_samples), made
    noise-aware (docs/compare.md): a side is noisy when its samples spread more than
    NOISY_SAMPLE_SPREAD (slowest over fastest; from five samples on, what the middle
    half's spread makes of ten: noise.typical_spread), and the pair when the cell's thread waited
    for a core NOISY_WAITED_CHANGE more of its timed runs on one side (`waited`, from
    the timing), or, where that is not measured, other processes held
    NOISY_OTHER_WORK_CHANGE more of the cores on one side (`other_work`, from the
    utilisation). Then a change is called only when the ratio lies beyond the product of
    the noise factors (each side's spread, and 1 / (1 - that change)): a machine that far
    off could have made that much of no change.
    The verdict also says how many samples per side would settle a question it leaves
    open."""
    v = Verdict.from_samples(before, after, noise_floor=noise_floor)
    if v is None:
        return None
    spreads = (spread_of(before), spread_of(after))
    factors, reasons = _sample_noise(before, after)
    machine = _machine_change(other_work, waited)
    if machine is not None:
        factors.append(machine[0])
        reasons.append(machine[1])
    kind, why = v.kind, ""
    covers = math.prod(factors)
    if kind != "no clear change" and reasons and max(v.ratio, 1 / v.ratio) <= covers:
        kind = "no clear change"
        why = (
            f"the noise covers the difference: {' and '.join(reasons)}, so a "
            f"{max(v.ratio, 1 / v.ratio):.2f}x difference is within what the machine alone "
            f"could do (up to {covers:.2f}x)"
        )
    elif kind == "no clear change":
        why = "the interval reaches into the noise floor"
    settle = (
        runs_to_settle(before, after, v.ratio, noise_floor) if kind == "no clear change" else None
    )
    return dataclasses.replace(
        v,
        kind=kind,
        spread_before=spreads[0],
        spread_after=spreads[1],
        runs_to_settle=settle,
        why=why,
    )


def _sample_noise(before: Sequence[float], after: Sequence[float]) -> tuple[list[float], list[str]]:
    """Return each side's noise factor (its samples' typical spread, 1.0 when unknown), and
    why a side is noisy, for the sides whose spread passes NOISY_SAMPLE_SPREAD."""
    factors = []
    reasons = []
    for side, samples in (("before", before), ("after", after)):
        # Robust from five samples on: one or two slow outliers do not move a median of
        # ten, so they do not make a tight 13x interval "noise".
        spread = typical_spread(samples)
        if spread is not None and spread > th.NOISY_SAMPLE_SPREAD:
            many = len(samples) >= 5
            reasons.append(
                f"{side}'s samples spread {spread:.2f}x"
                + (" (their middle half, scaled to ten samples)" if many else "")
            )
        factors.append(spread or 1.0)
    return factors, reasons


def _machine_change(
    other_work: tuple[float | None, float | None], waited: tuple[float | None, float | None]
) -> tuple[float, str] | None:
    """Return the noise factor of a machine that changed between the two sides, and why,
    or None when it did not change enough to matter."""
    # The machine changed between the runs: the cell's thread waited for a core more on
    # one side (the direct measure, where the OS gives it), else other work held more of
    # the cores on one side. The same load on both sides slows both alike.
    if waited[0] is not None and waited[1] is not None:
        change = abs(waited[0] - waited[1])
        if not change >= th.NOISY_WAITED_CHANGE:
            return None
        side = "before" if waited[0] > waited[1] else "after"
        return 1.0 / max(1.0 - change, 0.1), (
            f"the cell's thread waited for a core {change * 100:.0f}% of the time more "
            f"during {side}"
        )
    known = [o for o in other_work if o is not None]
    change = max(known) - (min(known) if len(known) == 2 else 0.0) if known else 0.0
    if not change >= th.NOISY_OTHER_WORK_CHANGE:
        return None
    side = "before" if (other_work[0] or 0.0) >= (other_work[1] or 0.0) else "after"
    return 1.0 / max(1.0 - change, 0.1), (
        f"other work held {change * 100:.0f}% more of the cores during {side} than "
        "during the other side"
    )


@dataclass(frozen=True, slots=True)
class _Side:
    label: str
    report: ProfileReport
    trace: Trace | None
    timing: TimingStats | None
    steps: int | None


def _side(value: object, which: str, label: str | None) -> _Side:
    if isinstance(value, ProfileReport):
        report, name = value, which
    elif isinstance(value, Trace):
        report, name = analyze(value), which
    else:
        raise GpuprofError(
            f"compare: {which} is a {type(value).__name__}; pass a ProfileReport (from "
            "%%gpuprofile -o NAME or gpuprof_nb.analyze), a Trace, or a trace file's path"
        )
    trace = report.trace
    steps = count_steps_per_run(trace) if trace is not None else None
    return _Side(label or name, report, trace, report.timing, steps)


def _per(before: _Side, after: _Side, notes: list[str]) -> Per:
    if before.steps and after.steps:
        return "step"
    if before.steps or after.steps:
        notes.append(
            "one side has training steps and the other not: times are per "
            + ("run" if before.timing and after.timing else "profiled window")
        )
    return "run" if before.timing is not None and after.timing is not None else "window"


def _step_median(side: _Side, per: Per) -> float | None:
    timing, summary = side.timing, side.report.summary
    if per == "step":
        if timing is not None and timing.median_step_us is not None:
            return timing.median_step_us
        if summary is not None and summary.median_step_us is not None:
            return summary.median_step_us
        return summary.window_us / side.steps if summary is not None and side.steps else None
    if per == "run" and timing is not None:
        return timing.median_us
    return summary.window_us if summary is not None else None


def _samples(side: _Side, per: Per, profiled_steps: bool = False) -> tuple[float, ...]:
    """Return a side's samples: its timed runs; with `profiled_steps` (neither side has timed
    runs), the durations of its trace's profiled steps, the profiler attached on both sides
    alike: the steps its median step time is taken over."""
    timing = side.timing
    if timing is None:
        if profiled_steps and per == "step" and side.trace is not None:
            return tuple(s.dur_us for s in side.trace.steps)
        return ()
    steps = timing.steps_per_run if per == "step" and timing.steps_per_run else 1
    return tuple(t / steps for t in timing.times_us)


def kernel_family(name: str) -> str:
    """Return the family of a kernel name: without template and argument lists, tile and
    stage sizes, or a trailing instance number, so `..._128x64_stage3...<float, 4>` and
    `..._64x64_stage4...<float, 2>`, or `triton_poi_fused_add_0` and `..._1`, are one."""
    head = re.split(r"[<(]", name, maxsplit=1)[0].strip() or name
    head = re.sub(r"\d+x\d+(?:x\d+)*", "NxN", head)
    head = re.sub(
        r"(tile|stage|warp|cta|block|split|align)(size)?\d+", r"\1N", head, flags=re.IGNORECASE
    )
    return re.sub(r"_\d+$", "", head)


def _rows(side: _Side, divisor: float) -> dict[tuple[str, str], ChangeRow]:
    """Per (category, name): time and calls per step/run/window of one side (as a ChangeRow
    whose `before` fields hold them)."""
    trace = side.trace
    rows: dict[tuple[str, str], ChangeRow] = {}
    if trace is None:
        return rows
    ix = TraceIndex(trace)

    def add(category: str, name: str, us: float, calls: float) -> None:
        old = rows.get((category, name))
        if old is not None:
            us, calls = us + old.before_us * divisor, calls + old.calls_before * divisor
        rows[(category, name)] = ChangeRow(name, category, us / divisor, 0.0, calls / divisor, 0.0)

    loader = dataloader_ops(ix)
    loader_names = {o.name for o in loader}
    for op in top_ops(ix, n=None, sort="self_cpu_us").rows:
        if op.name in loader_names:
            continue  # the DataLoader row below holds it, whatever its iterator's class
        comm = is_host_collective(op.name)
        add("communication" if comm else "op", op.name, op.self_cpu_us, op.calls)
    # The report's own kernel table is this trace's (analyze made it), when it has one.
    kernels = side.report.kernels if side.report.kernels is not None else kernel_table(ix)
    for k in kernels.rows:
        if k.kind == "kernel":
            category = "communication" if kernel_name_class(k.name) == "comm" else "kernel"
        else:
            category = k.kind
        add(
            category, kernel_family(k.name) if category == "kernel" else k.name, k.total_us, k.calls
        )
    if loader:
        spans = merge_intervals(
            clip_intervals(((o.start_us, o.end_us) for o in loader), *trace.bounds_us)
        )
        add("DataLoader", _DATALOADER, union_length(spans), len(loader))
    return rows


def _compiled(side: _Side) -> int:
    """How many compiled-code items ran: Triton kernel calls and compiled regions."""
    trace = side.trace
    if trace is None:
        return 0
    return sum(1 for k in trace.kernels if k.name.startswith("triton_")) + sum(
        1 for o in trace.ops if any(m in o.name for m in _COMPILED_OP_MARKS)
    )


def _changes(before: _Side, after: _Side, per: Per) -> tuple[ChangeRow, ...]:
    div_b = float(before.steps) if per == "step" and before.steps else 1.0
    div_a = float(after.steps) if per == "step" and after.steps else 1.0
    rows_b, rows_a = _rows(before, div_b), _rows(after, div_a)
    compiled_after = _compiled(after) > 0 and _compiled(before) == 0
    out = []
    for key in set(rows_b) | set(rows_a):
        b, a = rows_b.get(key), rows_a.get(key)
        before_us = b.before_us if b else 0.0
        after_us = a.before_us if a else 0.0
        if abs(after_us - before_us) <= 1e-6:
            continue
        replaced = (
            "compiled code (Triton kernels, compiled regions)"
            if compiled_after and a is None and key[0] in ("op", "kernel")
            else ""
        )
        out.append(
            ChangeRow(
                key[1],
                key[0],
                before_us,
                after_us,
                b.calls_before if b else 0.0,
                a.calls_before if a else 0.0,
                replaced,
            )
        )
    out.sort(key=lambda r: (-abs(r.delta_us), r.category, r.name))
    return tuple(out)


def _other_work(side: _Side) -> float | None:
    """The share of the cores other processes kept busy while the side ran, where its
    utilisation sampler saw it."""
    return other_work_share(side.trace.utilisation) if side.trace is not None else None


def _waited(side: _Side) -> float | None:
    """The share of its timed runs the side's thread waited for a core, where measured."""
    return side.timing.waited_fraction if side.timing is not None else None


def _unchanged_share(changes: Sequence[ChangeRow]) -> float | None:
    """The share of the net change in time that lies in rows both sides ran the same
    number of times (same name, same calls, nothing replacing them), in the direction of
    the whole change; None when the rows barely move."""
    total = sum(r.delta_us for r in changes)
    if abs(total) <= 1e-9:
        return None
    same = sum(
        r.delta_us
        for r in changes
        if r.before_us > 0
        and r.after_us > 0
        and not r.replaced_by
        and abs(r.calls_after - r.calls_before) <= 1e-6 * max(r.calls_before, 1.0)
    )
    return min(max(same / total, 0.0), 1.0)


def _idle(before: _Side, after: _Side, per: Per, notes: list[str]) -> tuple[IdleDelta, ...]:
    tb, ta = before.report.timeline, after.report.timeline
    if tb is None or ta is None or tb.breakdown is None or ta.breakdown is None:
        return ()
    if tb.on_device != ta.on_device:
        notes.append(
            "the idle breakdown is of the device on one side and of the host on the "
            "other (one trace has no device activity): compare it with care"
        )
    div_b = float(before.steps) if per == "step" and before.steps else 1.0
    div_a = float(after.steps) if per == "step" and after.steps else 1.0
    b, a = tb.breakdown.us_by_category(), ta.breakdown.us_by_category()
    return tuple(IdleDelta(c, b[c] / div_b, a[c] / div_a) for c in b)


def _idle_of(before: _Side, after: _Side) -> Literal["device", "host", "mixed"]:
    tb, ta = before.report.timeline, after.report.timeline
    kinds = {t.on_device for t in (tb, ta) if t is not None}
    if kinds == {True}:
        return "device"
    return "host" if kinds == {False} else "mixed"


def _peak(side: _Side) -> int | None:
    trace = side.trace
    levels = (
        [m.total_allocated for m in trace.memory if m.total_allocated is not None]
        if trace is not None
        else []
    )
    return max(levels) if levels else None


def _findings(
    before: _Side, after: _Side
) -> tuple[tuple[Finding, ...], tuple[Finding, ...], tuple[Finding, ...]]:
    fb = before.report.diagnosis.findings if before.report.diagnosis else ()
    fa = after.report.diagnosis.findings if after.report.diagnosis else ()
    kinds_b, kinds_a = {f.kind for f in fb}, {f.kind for f in fa}
    return (
        tuple(f for f in fb if f.kind not in kinds_a),
        tuple(f for f in fa if f.kind not in kinds_b),
        tuple(f for f in fa if f.kind in kinds_b),
    )


def _device_notes(before: _Side, after: _Side, notes: list[str]) -> None:
    names = []
    for side in (before, after):
        summary = side.report.summary
        if side.timing is not None:
            names.append(side.timing.device_name or "cpu")
        elif (
            summary is not None
            and summary.device_names
            and side.trace is not None
            and side.trace.kernels
        ):
            names.append(", ".join(summary.device_names))
        else:
            names.append("cpu")
    if names[0] != names[1]:
        notes.append(
            f"before ran on {names[0]}, after on {names[1]}: the difference mixes "
            "the change with the hardware; op rows compare host (CPU) time, kernel "
            "rows device time, where each side has it"
        )


def compare(
    before: Side,
    after: Side,
    *,
    before_label: str | None = None,
    after_label: str | None = None,
    noise_floor: float = COMPARE_NOISE_FLOOR,
) -> Comparison:
    """Return `before` and `after` side by side (see the module docstring): step medians,
    the verdict (reports from %%gpuprofile only), the changes most important first, the
    idle breakdown, memory peaks and findings before and after. The labels name the sides
    in the display (default: "before"/"after", or the file names); `noise_floor` is the
    fraction of change below which no verdict calls a change (results/compare.py says why
    it is 20% by default; lower it on a quiet, dedicated machine)."""
    check_number(noise_floor, "compare's noise_floor", low=0, high=0.99, hint="e.g. 0.2")
    for name, label in (("before_label", before_label), ("after_label", after_label)):
        if label is not None:
            check_type(label, str, f"compare's {name}", "a string or None")
    b, a = _side(before, "before", before_label), _side(after, "after", after_label)
    notes: list[str] = []
    _device_notes(b, a, notes)
    per = _per(b, a, notes)
    steps = b.timing is None and a.timing is None
    verdict = timing_verdict(
        _samples(b, per, steps),
        _samples(a, per, steps),
        noise_floor=noise_floor,
        other_work=(_other_work(b), _other_work(a)),
        waited=(_waited(b), _waited(a)),
    )
    if verdict is not None:
        verdict_note = ""
    elif b.timing is None or a.timing is None:
        verdict_note = (
            "no verdict: a trace holds one profiled run, not timed samples (and not two "
            "profiled steps on each side); profile both sides with %%gpuprofile to know "
            "whether the change is real"
        )
    else:
        verdict_note = "no verdict: a side has fewer than two timed samples (raise --repeat)"
    changes = _changes(b, a, per)
    shared = _unchanged_share(changes)
    if shared is not None and shared >= th.SHARED_UNCHANGED_SHARE:
        notes.append(
            f"{shared * 100:.0f}% of the difference lies in ops and kernels both sides ran "
            "the same number of times under the same names: unless the change speeds up or "
            "slows down everything alike (threads, clocks, the device), the difference looks "
            "like noise (the machine's speed moved between the runs)"
        )
    if verdict is not None and verdict.kind == "no clear change":
        settle = (
            f"about {verdict.runs_to_settle} timed samples per side (--repeat "
            f"{verdict.runs_to_settle}) on a steady machine would settle it"
            if verdict.runs_to_settle is not None
            else "the difference is within the noise floor: no number of runs makes it a "
            "change worth calling"
        )
        verdict_note = f"{verdict.why}; {settle}" if verdict.why else settle
    resolved, new, still = _findings(b, a)
    return Comparison(
        before_label=b.label,
        after_label=a.label,
        per=per,
        median_step_us=(_step_median(b, per), _step_median(a, per)),
        verdict=verdict,
        verdict_note=verdict_note,
        changes=changes,
        idle=_idle(b, a, per, notes),
        memory_peak_bytes=(_peak(b), _peak(a)),
        idle_of=_idle_of(b, a),
        findings_resolved=resolved,
        findings_new=new,
        findings_still=still,
        notes=tuple(notes),
        samples_from="" if verdict is None else "profiled steps" if steps else "timed runs",
    )
