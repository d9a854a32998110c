"""The utilisation samples gpuprof_nb keeps with a trace it recorded, under its own top-level
key beside the cell names (io/cells.py): `{"gpuprof_nb": {"utilisation": {...}}}`, written by
capture/utilisation.py:

    {"source": "psutil+nvml", "period_ms": 10.0,
     "ts_us": [trace-clock end of each interval, ...],
     "series": {"cpu0": {"unit": "%", "label": "CPU 0", "values": [one per ts_us]}, ...},
     "notes": ["NVML not available: pip install nvidia-ml-py", ...]}

Read strictly: a malformed entry raises TraceFormatError naming the field that is wrong."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.cells import KEY
from gpuprof_nb.model.utilisation import Utilisation, UtilisationSeries

PATH = f"{KEY}.utilisation"
_FIX = (
    "; record the cell again, or delete the trace's 'gpuprof_nb.utilisation' entry to load the rest"
)


def _fail(where: str, what: str) -> TraceFormatError:
    return TraceFormatError(f"{where}: {what}{_FIX}")


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _number(value: object, where: str) -> float:
    """Return a finite int or float as a float (bools and strings are not numbers)."""
    if type(value) not in (int, float):
        raise _fail(where, f"expected a number, got {_kind(value)} {value!r:.40}")
    number = float(value)  # type: ignore[arg-type]  # int or float, checked above
    if not math.isfinite(number):
        raise _fail(where, f"expected a finite number, got {value!r}")
    return number


def _numbers(value: object, where: str) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)):
        raise _fail(where, f"expected a list of numbers, got {_kind(value)}")
    return tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(value))


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, f"expected a string, got {_kind(value)} {value!r:.40}")
    return value


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"expected an object, got {_kind(value)}")
    return value


def _field(entry: Mapping[str, Any], name: str, where: str) -> object:
    if name not in entry:
        raise _fail(where, f"has no {name!r}")
    return entry[name]


def utilisation_of(top: Mapping[str, Any]) -> Utilisation | None:
    """Return the utilisation samples stored in a trace's top-level dict, or None when it
    holds none. Raises TraceFormatError, naming the field (e.g.
    "gpuprof_nb.utilisation.series['cpu0'].values: 12 values for 13 times"), when the entry
    is there but malformed."""
    own = top.get(KEY)
    if not isinstance(own, Mapping) or "utilisation" not in own:
        return None
    entry = _mapping(own["utilisation"], PATH)
    source = _text(_field(entry, "source", PATH), f"{PATH}.source")
    period_ms = _number(_field(entry, "period_ms", PATH), f"{PATH}.period_ms")
    if period_ms <= 0:
        raise _fail(f"{PATH}.period_ms", f"must be above 0, got {period_ms!r}")
    ts_us = _numbers(_field(entry, "ts_us", PATH), f"{PATH}.ts_us")
    for i in range(1, len(ts_us)):
        if ts_us[i] < ts_us[i - 1]:
            raise _fail(
                f"{PATH}.ts_us[{i}]",
                f"{ts_us[i]!r} is before the time ahead of it "
                f"({ts_us[i - 1]!r}); times must not decrease",
            )
    raw_series = _mapping(_field(entry, "series", PATH), f"{PATH}.series")
    raw_cores = entry.get("cores", 0)
    cores = raw_cores if type(raw_cores) is int and raw_cores > 0 else 0
    n_cpus = sum(1 for name in raw_series if isinstance(name, str) and _is_core(name))
    most = cores or n_cpus
    series = []
    for name, raw in raw_series.items():
        where = f"{PATH}.series[{name!r}]"
        if not isinstance(name, str) or not name:
            raise _fail(where, "a series needs a non-empty string name")
        item = _mapping(raw, where)
        unit = _text(_field(item, "unit", where), f"{where}.unit")
        label = _text(_field(item, "label", where), f"{where}.label")
        values = _numbers(_field(item, "values", where), f"{where}.values")
        if len(values) != len(ts_us):
            raise _fail(f"{where}.values", f"{len(values)} values for {len(ts_us)} times")
        # Traces recorded before the sampler clamped its last, shortest interval can hold a
        # value above the machine: read as the most it can be.
        if unit == "%":
            values = tuple(min(max(v, 0.0), 100.0) for v in values)
        elif unit == "cores" and most:
            values = tuple(min(max(v, 0.0), float(most)) for v in values)
        series.append(UtilisationSeries(name=name, unit=unit, label=label, values=values))
    raw_notes = entry.get("notes", [])
    if not isinstance(raw_notes, (list, tuple)):
        raise _fail(f"{PATH}.notes", f"expected a list of strings, got {_kind(raw_notes)}")
    notes = tuple(_text(n, f"{PATH}.notes[{i}]") for i, n in enumerate(raw_notes))
    return Utilisation(
        source=source,
        period_ms=period_ms,
        ts_us=ts_us,
        series=tuple(series),
        notes=notes,
        cores=cores,
    )


def _is_core(name: str) -> bool:
    return name.startswith("cpu") and name[3:].isdigit()


def utilisation_dict(u: Utilisation) -> dict[str, Any]:
    """Return `u` as the JSON-able dict utilisation_of reads (lists, not tuples)."""
    return {
        "source": u.source,
        **({"cores": u.cores} if u.cores else {}),
        "period_ms": u.period_ms,
        "ts_us": list(u.ts_us),
        "series": {
            s.name: {"unit": s.unit, "label": s.label, "values": list(s.values)} for s in u.series
        },
        "notes": list(u.notes),
    }
