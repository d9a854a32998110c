"""Fuzzing: random mutations of real traces and snapshots go through loading, analysis and
rendering. A mutated file either gives a report or the library's own error
(TraceFormatError, SnapshotFormatError): never a KeyError, RecursionError, numpy casting
error or any other raw exception, and never an analysis that quietly failed."""

from __future__ import annotations

import copy
import gzip
import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from gpuprof_nb.errors import GpuprofError, SnapshotFormatError, TraceFormatError
from gpuprof_nb.io.snapshot import load_snapshot, snapshot_from_dict
from gpuprof_nb.io.trace import load_trace, trace_from_dict
from gpuprof_nb.session.analyze import analyze, analyze_memory

DATA = Path(__file__).parents[1] / "data"
TRACES = [
    "h100_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
    "mi300_compile_triton/trace.json.gz",
    "amd_mi250_toy/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "a100_triton/triton_example.json.gz",
    "a100_event_sync/event_sync_trace.json.gz",
    "cpu_only_trace/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
]
# numpy's RuntimeWarnings (a NaN cast, an overflow) would reach users as warnings in the
# notebook: here they fail the test.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

SNAPSHOTS = [
    "train_time.pickle",
    "oom.pickle",
    "fragmented.pickle",
    "legacy_history.pickle",
    "two_devices.pickle",
]

# Values a damaged or hand-edited file puts where a number, string or list belongs.
ODD_VALUES: list[Any] = [
    None,
    "",
    "x",
    -1,
    -5,
    0,
    3.5,
    -1e300,
    1e300,
    2**70,
    -(2**70),
    True,
    [],
    {},
    [1, 2],
    {"a": 1},
    float("nan"),
    float("inf"),
    "1e3",
    [[[[[[[[[[1]]]]]]]]]],
]


def _report_or_format_error(load: Any, allowed: type[GpuprofError]) -> bool:
    """Load, analyse and render; return True when a report came out. Only `allowed` may be
    raised, and an analysis that failed inside the report (a note) counts as a failure."""
    try:
        report = load()
    except allowed:
        return False
    text = report.text() if hasattr(report, "text") else repr(report)
    bundle = report._repr_mimebundle_()
    assert bundle["text/plain"] and "text/html" in bundle
    notes = getattr(report, "notes", ())
    broken = [n for n in notes if "could not be computed" in n or "failed" in n]
    assert not broken, broken
    assert text
    return True


def _mutate_text(text: str, rng: random.Random) -> str:
    """One random change to the JSON text: cut, delete, insert, duplicate or overwrite."""
    n = len(text)
    i = rng.randrange(n)
    j = min(n, i + rng.randrange(1, 200))
    choice = rng.randrange(6)
    if choice == 0:
        return text[:i]
    if choice == 1:
        return text[:i] + text[j:]
    if choice == 2:
        junk = rng.choice(
            [
                "[",
                "{",
                "]",
                "}",
                '"',
                ",",
                ":",
                "NaN",
                "-",
                "1e999",
                "\\",
                "\x00",
                "\u00e9",
                "[" * 5000,
                "null",
                "true",
            ]
        )
        return text[:i] + junk + text[i:]
    if choice == 3:
        return text[:j] + text[i:j] + text[j:]
    if choice == 4:
        return (
            text[:i]
            + "".join(rng.choice('0123456789,:"{}[] ae-.') for _ in range(j - i))
            + text[j:]
        )
    return text[:i] + text[i:j][::-1] + text[j:]


def _mutate_events(trace: dict[str, Any], rng: random.Random) -> None:
    """A few random changes to event fields, the top-level keys or the event list."""
    events = trace["traceEvents"]
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.1:
            trace[
                rng.choice(
                    [
                        "traceEvents",
                        "deviceProperties",
                        "distributedInfo",
                        "displayTimeUnit",
                        "baseTimeNanoseconds",
                    ]
                )
            ] = rng.choice(ODD_VALUES)
            return
        if not events:
            return
        e = rng.choice(events)
        if not isinstance(e, dict):
            continue
        if r < 0.2:
            events.append(rng.choice(ODD_VALUES))
        elif r < 0.3 and e:
            del e[rng.choice(sorted(e))]
        elif r < 0.5 and isinstance(e.get("args"), dict) and e["args"]:
            args = e["args"]
            args[rng.choice(sorted(args))] = rng.choice(ODD_VALUES)
        else:
            e[
                rng.choice(
                    ["ph", "name", "cat", "ts", "dur", "pid", "tid", "args", "id", "s", "bp"]
                )
            ] = rng.choice(ODD_VALUES)


@pytest.fixture(scope="module")
def trace_texts() -> dict[str, str]:
    return {name: gzip.decompress((DATA / name).read_bytes()).decode("utf-8") for name in TRACES}


def _fuzz(
    count: int, names: list[str], mutated: Any, allowed: type[GpuprofError]
) -> tuple[int, int]:
    """Run `count` mutations, cycling over `names`: `mutated(k, name)` returns a callable
    that loads and analyses the k-th mutant. Return how many gave a report and how many were
    refused with `allowed`; anything else fails, naming the mutation."""
    made = refused = 0
    for k in range(count):
        name = names[k % len(names)]
        try:
            ok = _report_or_format_error(mutated(k, name), allowed)
        except AssertionError as exc:
            raise AssertionError(f"mutation {k} of {name}: {exc}") from None
        made += ok
        refused += not ok
    return made, refused


@pytest.mark.slow
def test_mutated_trace_files_give_reports_or_trace_format_errors(
    trace_texts: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(20261125)

    def mutated(k: int, name: str) -> Any:
        path = tmp_path / f"m{k}.json"
        path.write_text(
            _mutate_text(trace_texts[name], rng), encoding="utf-8", errors="surrogatepass"
        )
        return lambda: analyze(load_trace(path))

    made, refused = _fuzz(240, TRACES, mutated, TraceFormatError)
    # Both outcomes occur: the mutations are neither all harmless nor all fatal.
    assert made > 20 and refused > 20, (made, refused)


@pytest.mark.slow
def test_mutated_trace_events_give_reports_or_trace_format_errors(
    trace_texts: dict[str, str],
) -> None:
    rng = random.Random(7)
    parsed = {name: json.loads(text) for name, text in trace_texts.items()}

    def mutated(k: int, name: str) -> Any:
        trace = copy.deepcopy(parsed[name])
        _mutate_events(trace, rng)
        return lambda: analyze(trace_from_dict(trace, "fuzz"))

    made, refused = _fuzz(240, TRACES, mutated, TraceFormatError)
    assert made > 20 and refused > 20, (made, refused)


def _raw(name: str) -> dict[str, Any]:
    with open(DATA / "snapshots" / name, "rb") as f:
        return pickle.load(f)


def _mutate_snapshot(d: dict[str, Any], rng: random.Random) -> None:
    """A few random changes to history entries, segments, blocks or the top level."""
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        traces = d.get("device_traces")
        if r < 0.1:
            d[rng.choice(["segments", "device_traces", "allocator_settings", "gpuprof_nb"])] = (
                rng.choice(ODD_VALUES)
            )
            return
        if (
            r < 0.6
            and isinstance(traces, list)
            and traces
            and isinstance(traces[0], list)
            and traces[0]
        ):
            entries = traces[0]
            if rng.random() < 0.3:
                # An entry out of nowhere: a free of a block nobody allocated, an odd action.
                entries.insert(
                    rng.randrange(len(entries) + 1),
                    {
                        "action": rng.choice(
                            [
                                "free_completed",
                                "alloc",
                                "oom",
                                "segment_free",
                                "free_requested",
                                "snapshot",
                                "weird",
                            ]
                        ),
                        "addr": rng.choice([99, 0, -4, 2**40]),
                        "size": rng.choice([10, 10**12, 10**15, -5, 0, 2**62]),
                    },
                )
                continue
            e = rng.choice(entries)
            e[
                rng.choice(
                    [
                        "action",
                        "addr",
                        "size",
                        "frames",
                        "time_us",
                        "device_free",
                        "stream",
                        "category",
                    ]
                )
            ] = rng.choice(ODD_VALUES)
        elif isinstance(d.get("segments"), list) and d["segments"]:
            seg = rng.choice(d["segments"])
            if not isinstance(seg, dict):
                continue
            blocks = seg.get("blocks")
            usable = isinstance(blocks, list) and blocks and isinstance(blocks[0], dict)
            target = rng.choice(blocks) if usable and rng.random() < 0.6 else seg
            target[
                rng.choice(
                    [
                        "size",
                        "address",
                        "state",
                        "frames",
                        "total_size",
                        "blocks",
                        "device",
                        "requested_size",
                        "active_size",
                        "history",
                    ]
                )
            ] = rng.choice(ODD_VALUES)


@pytest.mark.slow
def test_mutated_snapshot_dicts_give_reports_or_snapshot_format_errors() -> None:
    rng = random.Random(11)
    bases = {name: _raw(name) for name in SNAPSHOTS}

    def mutated(k: int, name: str) -> Any:
        d = copy.deepcopy(bases[name])
        _mutate_snapshot(d, rng)
        return lambda: analyze_memory(snapshot_from_dict(d))

    made, refused = _fuzz(300, SNAPSHOTS, mutated, SnapshotFormatError)
    assert made > 20 and refused > 20, (made, refused)


@pytest.mark.slow
def test_mutated_snapshot_files_give_reports_or_snapshot_format_errors(tmp_path: Path) -> None:
    rng = random.Random(3)

    def mutated(k: int, name: str) -> Any:
        raw = bytearray((DATA / "snapshots" / name).read_bytes())
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(raw))
            if rng.random() < 0.2:
                raw = raw[:i]
                break
            raw[i] = rng.randrange(256)
        data = bytes(raw)
        if rng.random() < 0.3:
            data = gzip.compress(data)
        path = tmp_path / f"m{k}.pickle"
        path.write_bytes(data)
        return lambda: analyze_memory(load_snapshot(path))

    made, refused = _fuzz(200, SNAPSHOTS, mutated, SnapshotFormatError)
    assert made > 5 and refused > 20, (made, refused)


# The cases outside testing found, each named.


def test_deeply_nested_events_are_a_trace_format_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"traceEvents": [' + "[" * 200_000, encoding="utf-8")
    with pytest.raises(TraceFormatError, match="nesting too deep"):
        load_trace(path)
    event = (
        '{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 2, "pid": 1, "tid": 1}'
    )
    path.write_text(
        '{"traceEvents": [' + event + ", " + "[" * 200_000 + "]" * 200_000 + "]}", encoding="utf-8"
    )
    with pytest.raises(TraceFormatError, match="nesting too deep|event 1"):
        load_trace(path)


def test_a_free_of_an_unknown_block_analyses() -> None:
    report = analyze_memory(
        {
            "segments": [],
            "device_traces": [[{"action": "free_completed", "addr": 99, "size": 10**12}]],
        }
    )
    # Live since before recording, freed by the one entry: the peak is the start.
    assert report.timeline.start_bytes == report.peak_bytes == 10**12
    assert report.timeline.end_bytes == 0


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"action": "free_completed", "addr": 99, "size": 10**15}, r"\[0\]\[0\]: 'size' is 1,000"),
        ({"action": "alloc", "addr": 99, "size": -5}, r"\[0\]\[0\]: 'size' is -5"),
    ],
)
def test_impossible_sizes_are_snapshot_format_errors_naming_the_entry(
    entry: dict[str, Any], words: str
) -> None:
    with pytest.raises(SnapshotFormatError, match=words):
        analyze_memory({"segments": [], "device_traces": [[entry]]})


def test_an_oom_may_ask_for_more_than_any_device_holds() -> None:
    report = analyze_memory(
        {
            "segments": [],
            "device_traces": [[{"action": "oom", "size": 10**15, "device_free": 1024}]],
        }
    )
    assert report.ooms[0].requested_bytes == 10**15


def test_a_negative_block_size_names_the_block() -> None:
    with pytest.raises(SnapshotFormatError, match=r"segments\[0\]\.blocks\[1\]: 'size' is -5"):
        snapshot_from_dict(
            {
                "segments": [
                    {
                        "address": 0,
                        "blocks": [
                            {"size": 512, "state": "active_allocated"},
                            {"size": -5, "state": "inactive"},
                        ],
                    }
                ],
                "device_traces": [],
            }
        )
