"""The timed samples of a `%%gpuprofile` run kept with its trace, so a saved report still
carries what the before/after verdict needs: under gpuprof_nb's own top-level key,
`{"gpuprof_nb": {"timing": {...}}}`, written by `ProfileReport.save` and by named baselines:

    {"wall_us": [per-run time of each sample, ...], "device_us": [...] or null,
     "warmup_wall_us": [...], "once": false, "device_name": "cpu", "steps_per_run": 10,
     "profiled": false, "number": 1, "calibration_runs": 0, "waited_fraction": 0.02 or null}

Read strictly: a malformed entry raises TraceFormatError naming the field that is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.cells import KEY
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.model.timing import TimingStats

PATH = f"{KEY}.timing"


def _fail(where: str, what: str) -> TraceFormatError:
    return TraceFormatError(
        f"{where}: {what}; save the report again, or delete the '{PATH}' entry to load the "
        "trace without its timed samples"
    )


def _times(value: object, where: str) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)):
        raise _fail(where, f"expected a list of microseconds, got {type(value).__name__}")
    out = []
    for i, v in enumerate(value):
        if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
            raise _fail(
                f"{where}[{i}]", f"expected a finite time of 0 us or more, got {describe(v)}"
            )
        out.append(float(v))
    return tuple(out)


# Runs per sample, steps per run, calibration runs: far past any real count (%%gpuprofile
# takes --number up to 10**7), so a crafted file cannot turn every sample into ~0 us.
MAX_COUNT = 2**31


def _count(entry: Mapping[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = entry.get(name, default)
    if value is None and default is None:
        return None
    if type(value) is not int or not low <= value <= MAX_COUNT:
        raise _fail(
            f"{PATH}.{name}",
            f"expected a whole number from {low} to {MAX_COUNT:,}, got {describe(value)}",
        )
    return value


def timing_of(top: Mapping[str, Any]) -> TimingStats | None:
    """Return the timed samples stored in a trace's top-level dict (or a trace's
    `metadata`), None when it holds none; TraceFormatError when the entry is malformed."""
    own = top.get(KEY)
    if not isinstance(own, Mapping) or own.get("timing") is None:
        return None
    entry = own["timing"]
    if not isinstance(entry, Mapping):
        raise _fail(PATH, f"expected an object, got {type(entry).__name__}")
    wall = _times(entry.get("wall_us"), f"{PATH}.wall_us")
    if not wall:
        raise _fail(f"{PATH}.wall_us", "holds no sample")
    device = entry.get("device_us")
    device_us = None if device is None else _times(device, f"{PATH}.device_us")
    if device_us is not None and len(device_us) != len(wall):
        raise _fail(f"{PATH}.device_us", f"{len(device_us)} samples for {len(wall)} wall times")
    name = entry.get("device_name", "cpu")
    if not isinstance(name, str):
        raise _fail(f"{PATH}.device_name", f"expected a string, got {type(name).__name__}")
    flags = {}
    for flag in ("once", "profiled"):
        value = entry.get(flag, False)
        if type(value) is not bool:
            raise _fail(f"{PATH}.{flag}", f"expected true or false, got {describe(value)}")
        flags[flag] = value
    waited = entry.get("waited_fraction")
    if waited is not None and (
        type(waited) not in (int, float) or not math.isfinite(waited) or not 0 <= waited <= 1
    ):
        raise _fail(
            f"{PATH}.waited_fraction", f"expected a share in 0..1 or null, got {waited!r:.40}"
        )
    return TimingStats(
        wall_us=wall,
        device_us=device_us,
        warmup_wall_us=_times(entry.get("warmup_wall_us", []), f"{PATH}.warmup_wall_us"),
        once=flags["once"],
        device_name=name,
        steps_per_run=_count(entry, "steps_per_run", None, 1),
        profiled=flags["profiled"],
        number=_count(entry, "number", 1, 1) or 1,
        calibration_runs=_count(entry, "calibration_runs", 0, 0) or 0,
        waited_fraction=None if waited is None else float(waited),
    )


def timing_dict(stats: TimingStats) -> dict[str, Any]:
    """Return `stats` as the JSON-able dict timing_of reads (lists, not tuples)."""
    return {
        "wall_us": list(stats.wall_us),
        "device_us": None if stats.device_us is None else list(stats.device_us),
        "warmup_wall_us": list(stats.warmup_wall_us),
        "once": stats.once,
        "device_name": stats.device_name,
        "steps_per_run": stats.steps_per_run,
        "profiled": stats.profiled,
        "number": stats.number,
        "calibration_runs": stats.calibration_runs,
        "waited_fraction": stats.waited_fraction,
    }


def with_timing(artifact: Mapping[str, Any], stats: TimingStats) -> dict[str, Any]:
    """Return a shallow copy of a trace dict with `stats` under gpuprof_nb's own key (the
    events are shared, not copied)."""
    out = dict(artifact)
    own = out.get(KEY)
    out[KEY] = {**(own if isinstance(own, Mapping) else {}), "timing": timing_dict(stats)}
    return out
