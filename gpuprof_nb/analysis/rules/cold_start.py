"""The cold-start rule: the first run's one-off cost, from the run timings and from
one-time setup ops in the trace (`cold_start`)."""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.derived import op_columns
from gpuprof_nb.analysis.intervals import intersect_intervals, merge_intervals, union_length
from gpuprof_nb.analysis.rules.context import (
    Context,
    duration_words,
    make_finding,
    name_rows,
    top_rows,
)
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Op
from gpuprof_nb.results.diagnosis import Finding


def _median_without(durations: list[float], value: float) -> float | None:
    """statistics.median of the sorted `durations` with one `value` taken out (None when
    nothing is left), without copying them: the same middle element(s), the same mean."""
    m = len(durations) - 1
    if m <= 0:
        return None
    j = bisect.bisect_left(durations, value)

    def at(k: int) -> float:
        return durations[k] if k < j else durations[k + 1]

    return float(at(m // 2)) if m % 2 else float((at(m // 2 - 1) + at(m // 2)) / 2)


def cold_ops_idle_us(c: Context) -> tuple[float, tuple[Op, ...]]:
    """Return the device-idle microseconds spent inside one-time setup ops on the host, and
    those ops: calls of at least COLD_OP_MIN_US that are the only call of their name and
    input shapes or far slower than its other calls (lazy CUDA init in the first .to(),
    cuDNN autotuning in the first convolution of each shape, ...)."""
    if not c.on_device:
        return 0.0, ()
    # Only long calls can be setup (a few at most); their names' other calls are then read.
    # The top-level ops as rows of the op columns, where they are the index's.
    rows = top_rows(c)
    if rows is None:
        long_calls = [o for o in c.top_ops if o.dur_us >= th.COLD_OP_MIN_US]
    else:
        cols = op_columns(c.index)
        long_rows = rows[cols.dur[rows] >= th.COLD_OP_MIN_US]
        long_calls = [cols.ops[i] for i in long_rows.tolist()]
    start_up = _profiler_start_up_candidate(c)
    if start_up is not None:
        long_calls.append(start_up)
    if not long_calls:
        return 0.0, ()
    # Against the calls with the same inputs: cuDNN autotunes each new convolution shape (on
    # a GPU each of a fresh model's convolutions can take a second or more: the same op name
    # with different inputs; benchmarks/RESULTS.md, "Measurements behind design choices",
    # M3). Over several steps, against the op's other calls too: a slow op called with a new
    # shape in every step is the steady state (variable-size batches).
    names = {o.name for o in long_calls}
    by_key: dict[tuple[str, str], list[float]] = {}
    if rows is None:
        named: Sequence[Op] = c.top_ops
    else:
        named = [cols.ops[i] for i in name_rows(c.index, frozenset(names), rows).tolist()]
    for o in named:
        if o.name in names:
            by_key.setdefault(_shape_key(o), []).append(o.dur_us)
            if c.n_steps > 1:
                by_key.setdefault((o.name, ""), []).append(o.dur_us)
    for durations in by_key.values():
        durations.sort()

    def far_slower(o: Op, key: tuple[str, str], alone: bool) -> bool:
        others = _median_without(by_key[key], o.dur_us)
        return alone if others is None else o.dur_us >= th.COLD_OP_RATIO * others

    cold: list[Op] = []
    for o in long_calls:
        # The start-up candidate is shorter than a setup call: only against later calls.
        alone = o is not start_up
        if far_slower(o, _shape_key(o), alone) and (
            c.n_steps <= 1 or far_slower(o, (o.name, ""), alone)
        ):
            cold.append(o)
    if not cold:
        return 0.0, ()
    spans = merge_intervals((o.start_us, o.end_us) for o in cold)
    # Only the host gaps that reach into the calls' stretch can overlap them.
    lo, hi = spans[0][0], spans[-1][1]
    host_gaps = [
        (g.start_us, g.end_us)
        for g in c.timeline.gaps
        if g.cause == "host" and g.start_us < hi and g.end_us > lo
    ]
    return union_length(intersect_intervals(spans, merge_intervals(host_gaps))), tuple(cold)


def _profiler_start_up_candidate(c: Context) -> Op | None:
    """The window's first top-level op when it could hold the profiler's start-up: it began
    before any kernel and took PROFILER_START_MIN_US..COLD_OP_MIN_US (longer ones are read
    as setup anyway)."""
    if not c.top_ops or not len(c.kcols.start):
        return None
    rows = top_rows(c)
    if rows is None:
        first = min(c.top_ops, key=attrgetter("start_us"))
    else:
        # The first of the earliest, as min() picks it.
        cols = op_columns(c.index)
        first = cols.ops[int(rows[np.argmin(cols.start[rows])])]
    if not th.PROFILER_START_MIN_US <= first.dur_us < th.COLD_OP_MIN_US:
        return None
    return first if first.start_us < float(c.kcols.start.min()) else None


def is_profiler_start_up(ops: Sequence[Op]) -> bool:
    """Whether setup ops are only the profiler's start-up (one first op under COLD_OP_MIN_US:
    see _profiler_start_up_candidate)."""
    return len(ops) == 1 and ops[0].dur_us < th.COLD_OP_MIN_US


def _shape_key(o: Op) -> tuple[str, str]:
    return o.name, repr(o.input_dims)


def rule_cold_start(c: Context, timing: TimingStats | None) -> Finding | None:
    """The first run's one-off cost. From the run timings: the first warm-up run against the
    timed runs, only when its excess over their median lies beyond their own spread (a
    noisy machine makes every run differ; that is not a cold start). From the trace: setup
    ops (see cold_ops_idle_us). Unless the cell ran once (--once, where the first run is
    what was measured), a one-off is not the steady state users ask about: the finding is
    `info` and comes after every steady-state finding."""
    evidence: dict[str, float] = {}
    share = 0.0
    titles: list[str] = []
    if timing is not None and timing.warmup_wall_us and timing.wall_us:
        first = timing.warmup_wall_us[0]
        # Warm-up runs only have wall time: compare wall with wall.
        median = float(statistics.median(timing.wall_us))
        spread = max(timing.wall_us) - min(timing.wall_us)
        if median > 0:
            ratio = first / median
            total = first + sum(timing.wall_us) + sum(timing.warmup_wall_us[1:])
            if ratio >= th.COLD_START_RATIO and first - median > spread and total > 0:
                share = (first - median) / total
            evidence.update(
                {
                    "first_run_us": first,
                    "median_run_us": median,
                    "first_over_median_ratio": ratio,
                    "timed_runs_spread_us": spread,
                }
            )
            titles.append(f"the first run took {ratio:.3g}x the median run")
    if c.setup_ops:
        idle_us = c.setup_idle_us
        longest = max(c.setup_ops, key=lambda o: (o.dur_us, -o.index))
        evidence.update(
            {
                "device_idle_in_setup_ops_us": idle_us,
                "longest_setup_op_us": longest.dur_us,
                "setup_share_of_window_fraction": c.frac_of_window(idle_us),
            }
        )
        share = max(share, c.frac_of_window(idle_us))
        if is_profiler_start_up(c.setup_ops):
            titles.append(
                f"a start-up cost held the window's first op ({longest.name}, "
                f"{duration_words(longest.dur_us)}, {th.COLD_OP_RATIO:g}x its later "
                f"calls) while the GPU idled, "
                f"{c.frac_of_window(idle_us) * 100:.0f}% of the window: "
                "the profiler's own start-up, or a library's first call (profile "
                "after a warm-up step, or with a schedule's warmup)"
            )
        else:
            titles.append(
                f"one-time setup inside torch ops keeps the GPU idle "
                f"{c.frac_of_window(idle_us) * 100:.0f}% of the window (first "
                f"{longest.name} took {duration_words(longest.dur_us)})"
            )
    if not evidence:
        return None
    once = timing is not None and timing.once
    title = "; ".join(titles)
    if not (c.setup_ops and is_profiler_start_up(c.setup_ops)):
        title += " (allocation, initialisation, autotuning)"
    if once:
        return make_finding("cold_start", title[0].upper() + title[1:], share, evidence)
    f = make_finding("cold_start", "One-off, not the steady state: " + title, share, evidence)
    return dataclasses.replace(f, severity="info")
