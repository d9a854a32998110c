"""Reading the utilisation entry of a trace: round trips, and every malformed entry refused
with a TraceFormatError that names the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.utilisation import utilisation_dict, utilisation_of
from gpuprof_nb.model.utilisation import Utilisation, UtilisationSeries


def _entry() -> dict[str, Any]:
    return {
        "source": "proc+nvml",
        "period_ms": 10.0,
        "ts_us": [1010.0, 1020.0, 1030.0],
        "series": {
            "cpu0": {"unit": "%", "label": "CPU 0", "values": [50.0, 100.0, 0.0]},
            "cpu1": {"unit": "%", "label": "CPU 1", "values": [0.0, 0, 25.5]},
            "process": {"unit": "cores", "label": "this process", "values": [0.5, 1.0, 0.0]},
            "gpu_mem_used": {
                "unit": "bytes",
                "label": "GPU 0 memory used",
                "values": [1e9, 2e9, 3e9],
            },
        },
        "notes": ["GPU 0 power not recorded: NVML says Not Supported"],
    }


def _top(entry: object) -> dict[str, Any]:
    return {"traceEvents": [], "gpuprof_nb": {"cells": {"<cell>": 3}, "utilisation": entry}}


def test_reads_the_entry() -> None:
    u = utilisation_of(_top(_entry()))
    assert u is not None
    assert u.source == "proc+nvml" and u.period_ms == 10.0
    assert u.ts_us == (1010.0, 1020.0, 1030.0)
    assert [s.name for s in u.series] == ["cpu0", "cpu1", "process", "gpu_mem_used"]
    assert u.series_named("cpu1") == UtilisationSeries("cpu1", "%", "CPU 1", (0.0, 0.0, 25.5))
    assert all(isinstance(v, float) for s in u.series for v in s.values)
    assert u.notes == ("GPU 0 power not recorded: NVML says Not Supported",)


def test_round_trip_through_json() -> None:
    u = utilisation_of(_top(_entry()))
    assert u is not None
    again = utilisation_of(json.loads(json.dumps(_top(utilisation_dict(u)))))
    assert again == u
    assert utilisation_dict(u) == json.loads(json.dumps(utilisation_dict(u)))


def test_round_trip_from_the_model() -> None:
    u = Utilisation(
        "psutil", 2.5, (1.0, 2.0), (UtilisationSeries("cpu0", "%", "CPU 0", (1.0, 2.0)),), ()
    )
    assert utilisation_of(_top(utilisation_dict(u))) == u


@pytest.mark.parametrize(
    "top", [{}, {"gpuprof_nb": {"cells": {}}}, {"gpuprof_nb": []}, {"traceEvents": []}]
)
def test_missing_entry_is_none(top: dict[str, Any]) -> None:
    assert utilisation_of(top) is None


def test_notes_are_optional() -> None:
    entry = _entry()
    del entry["notes"]
    u = utilisation_of(_top(entry))
    assert u is not None and u.notes == ()


def _set(path: tuple[Any, ...], value: object) -> dict[str, Any]:
    entry = copy.deepcopy(_entry())
    target: Any = entry
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return entry


def _without(path: tuple[Any, ...]) -> dict[str, Any]:
    entry = copy.deepcopy(_entry())
    target: Any = entry
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return entry


P = "gpuprof_nb.utilisation"
MALFORMED: list[tuple[object, str]] = [
    ([1, 2], f"{P}: expected an object, got list"),
    (None, f"{P}: expected an object, got null"),
    (_without(("source",)), f"{P}: has no 'source'"),
    (_without(("period_ms",)), f"{P}: has no 'period_ms'"),
    (_without(("ts_us",)), f"{P}: has no 'ts_us'"),
    (_without(("series",)), f"{P}: has no 'series'"),
    (_set(("source",), 3), f"{P}.source: expected a string, got int"),
    (_set(("period_ms",), "10"), f"{P}.period_ms: expected a number, got str"),
    (_set(("period_ms",), True), f"{P}.period_ms: expected a number, got bool"),
    (_set(("period_ms",), 0), f"{P}.period_ms: must be above 0"),
    (_set(("period_ms",), float("nan")), f"{P}.period_ms: expected a finite number"),
    (_set(("ts_us",), {"a": 1}), f"{P}.ts_us: expected a list of numbers, got dict"),
    (_set(("ts_us", 1), None), f"{P}.ts_us[1]: expected a number, got null"),
    (_set(("ts_us", 2), float("inf")), f"{P}.ts_us[2]: expected a finite number"),
    (_set(("ts_us", 2), 1000.0), f"{P}.ts_us[2]: 1000.0 is before the time ahead of it"),
    (_set(("series",), []), f"{P}.series: expected an object, got list"),
    (_set(("series", "cpu0"), 5), f"{P}.series['cpu0']: expected an object, got int"),
    (_without(("series", "cpu0", "unit")), f"{P}.series['cpu0']: has no 'unit'"),
    (_without(("series", "cpu0", "label")), f"{P}.series['cpu0']: has no 'label'"),
    (_without(("series", "cpu0", "values")), f"{P}.series['cpu0']: has no 'values'"),
    (_set(("series", "cpu0", "unit"), None), f"{P}.series['cpu0'].unit: expected a string"),
    (_set(("series", "process", "label"), 1), f"{P}.series['process'].label: expected a string"),
    (
        _set(("series", "cpu0", "values"), [1.0, 2.0]),
        f"{P}.series['cpu0'].values: 2 values for 3 times",
    ),
    (
        _set(("series", "cpu0", "values"), [1.0, 2.0, 3.0, 4.0]),
        f"{P}.series['cpu0'].values: 4 values for 3 times",
    ),
    (
        _set(("series", "cpu1", "values", 1), "x"),
        f"{P}.series['cpu1'].values[1]: expected a number, got str",
    ),
    (
        _set(("series", "cpu1", "values"), "123"),
        f"{P}.series['cpu1'].values: expected a list of numbers, got str",
    ),
    (
        _set(("series", ""), {"unit": "%", "label": "", "values": [1, 2, 3]}),
        f"{P}.series['']: a series needs a non-empty string name",
    ),
    (_set(("notes",), "oops"), f"{P}.notes: expected a list of strings, got str"),
    (_set(("notes", 0), 7), f"{P}.notes[0]: expected a string, got int"),
]


@pytest.mark.parametrize(("entry", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_entries_name_the_field(entry: object, message: str) -> None:
    with pytest.raises(TraceFormatError) as caught:
        utilisation_of(_top(entry))
    text = str(caught.value)
    assert text.startswith(message), text
    # And say what to do about it.
    assert "record the cell again" in text
