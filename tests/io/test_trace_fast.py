"""The msgspec fast path of load_trace gives exactly what the standard-library reader gives.

The fast path decodes runs of whole events per msgspec call and falls back to the per-event
reader wherever that fails; these tests check that nothing about the result or the errors
depends on which reader did the work (Trace objects compared with == on every real trace),
that the fast path really carries the load, and that msgspec is optional.
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _paths import SHARED_TRACES as SHARED

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.trace import build as trace_build
from gpuprof_nb.io.trace import decode as trace_decode
from gpuprof_nb.io.trace import load as trace_load
from gpuprof_nb.io.trace import load_trace, trace_from_dict

pytest.importorskip("msgspec")

try:
    from isal import igzip
except ImportError:
    igzip = None

DATA = Path(__file__).parents[1] / "data"
SMALL = DATA / "a100_event_sync" / "event_sync_trace.json.gz"
BERT = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"


def _traces(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        if not (p.is_file() and p.name.endswith((".json", ".json.gz"))):
            continue
        head = p.read_bytes()[:2]
        opener: Any = gzip.open if head == b"\x1f\x8b" else open
        with opener(p, "rb") as f:
            start = f.read(1 << 16)
        if b'"traceEvents"' in start or b'"ph"' in start:
            out.append(p)
    return out


LOCAL = _traces(DATA)
SHARED_FILES = _traces(SHARED)
# gzip traces read by both decompressors (isal's and the standard library's): the small ones,
# each file's whole stream (several MB of JSON each).
GZIPPED = [
    p
    for p in LOCAL + SHARED_FILES
    if p.read_bytes()[:2] == b"\x1f\x8b" and p.stat().st_size < 2_000_000
]


class _Counting:
    """Counts the events the fast path hands to the builder."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events = 0
        original = trace_build.Builder.add_events

        def add_events(builder: Any, events: list[Any], first_index: int) -> None:
            self.events += len(events)
            original(builder, events, first_index)

        monkeypatch.setattr(trace_build.Builder, "add_events", add_events)


def _load_without_msgspec(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(trace_load, "EVENT_DECODER", None)
        return load_trace(path)


def _raw_events(path: Path) -> list[Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    d = json.loads(raw)
    return d["traceEvents"] if isinstance(d, dict) else d


def _same_or_same_error(reference: Callable[[], Any], tested: Callable[[], Any]) -> str | None:
    """Run both readers: they must give equal traces (then None), or raise TraceFormatError
    with the same message (then that message)."""
    try:
        want = reference()
    except TraceFormatError as exc:
        with pytest.raises(TraceFormatError) as info:
            tested()
        assert str(info.value) == str(exc)
        return str(exc)
    assert tested() == want
    return None


def _check_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The reference reader (no msgspec) never hands the builder a batch: the counter sees
    # only the fast path's.
    counter = _Counting(monkeypatch)
    if (
        _same_or_same_error(
            lambda: _load_without_msgspec(path, monkeypatch), lambda: load_trace(path)
        )
        is not None
    ):
        return
    # The fast path must have done the work, not silently left it all to the fallback.
    events = len(_raw_events(path))
    if events > 1000:
        assert counter.events >= 0.9 * events


@pytest.mark.parametrize("path", LOCAL, ids=lambda p: str(p.relative_to(DATA)))
def test_fast_path_equals_stdlib_reader_on_copied_traces(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_same(path, monkeypatch)


@pytest.mark.skipif(not SHARED_FILES, reason="../shared/traces is not on this machine")
@pytest.mark.parametrize("path", SHARED_FILES, ids=lambda p: str(p.relative_to(SHARED)))
def test_fast_path_equals_stdlib_reader_on_shared_traces(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_same(path, monkeypatch)


# --------------------------------------------------------------------------------------------
# splits in awkward places: every chunk size cuts the text somewhere else


def _awkward_events() -> list[dict[str, Any]]:
    """Events whose text holds '}', ',' and '{' in strings and nested objects, at every place
    a chunk can end, plus values the two JSON libraries must read identically."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "x"}},
    ]
    for i in range(120):
        ts = 1000.0 + i * 3.25
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f'aten::op}},{{"{i}',
                "pid": 1,
                "tid": "2",
                "ts": ts,
                "dur": 2.5,
                "args": {
                    "External id": i,
                    "Input Dims": [[i, 2], [], [3]],
                    "Input type": ["float", "}, {"],
                    "Call stack": "a.py(1): f;b",
                },
            }
        )
        # Args with a list of objects: a '}' followed by ', {' one level down.
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "args": {
                    "correlation": 10_000 + i,
                    "nested": [{"a": "}"}, {"b": [1]}],
                    "External id": i,
                },
                "pid": 1,
                "tid": 2,
                "ts": ts + 0.5,
                "dur": 1,
            }
        )
        name = "void k<float, 1>(\u00e9\u4e2d\U0001f600)"
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": ts + 1,
                "dur": -0.0 if i % 7 == 0 else 1.125,
                "args": {
                    "device": 0,
                    "stream": 7,
                    "correlation": 10_000 + i,
                    "grid": [i, 1, 1],
                    "block": [128, 1, 1],
                    "External id": 2**70 + i,
                },
            }
        )
        events.append(
            {"ph": "s", "id": i, "cat": "ac2g", "name": "ac2g", "pid": 1, "tid": 2, "ts": ts + 0.5}
        )
        events.append(
            {
                "ph": "f",
                "id": i,
                "cat": "ac2g",
                "name": "ac2g",
                "pid": 0,
                "tid": 7,
                "ts": ts + 1,
                "bp": "e",
            }
        )
        if i % 5 == 0:
            events.append(
                {
                    "ph": "i",
                    "cat": "cpu_instant_event",
                    "name": "[memory]",
                    "pid": 1,
                    "tid": 2,
                    "ts": ts + 2,
                    "s": "t",
                    "args": {
                        "Bytes": 512 * (-1) ** i,
                        "Device Id": 0,
                        "Device Type": 1,
                        "Addr": 2**40 + i,
                        "Total Allocated": 4096 + i,
                        "Total Reserved": 8192,
                    },
                }
            )
    return events


def _awkward_text(indent: int | None) -> str:
    text = json.dumps(
        {
            "schemaVersion": 1,
            "traceEvents": _awkward_events(),
            "deviceProperties": [{"id": 0, "name": "GPU}{", "computeMajor": 9, "computeMinor": 0}],
        },
        indent=indent,
        ensure_ascii=False,
    )
    # A duplicate key inside one event: both readers keep the last value.
    return text.replace('"name": "process_name",', '"name": "first", "name": "process_name",', 1)


@pytest.mark.parametrize("indent", [None, 1])
@pytest.mark.parametrize("chunk", [16, 61, 97, 256, 1000, 4093, 1 << 18])
def test_chunk_splits_anywhere_give_the_json_load_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, indent: int | None
) -> None:
    text = _awkward_text(indent)
    p = tmp_path / "awkward.json"
    p.write_text(text, encoding="utf-8")
    expected = trace_from_dict(json.loads(text), source=str(p))
    monkeypatch.setattr(trace_decode, "CHUNK_CHARS", chunk)
    counter = _Counting(monkeypatch)
    assert load_trace(p) == expected
    if chunk >= 1000:
        assert counter.events > 0  # batches were decoded, not only the per-event loop
    # Sanity of the expectation itself, from the raw events.
    raw = _awkward_events()
    assert len(expected.kernels) == sum(1 for e in raw if e.get("cat") == "kernel")
    assert {k.external_id for k in expected.kernels} == {
        e["args"]["External id"] for e in raw if e.get("cat") == "kernel"
    }


def _odd_args_events() -> list[dict[str, Any]]:
    """Ops and kernels whose args take every form the loader reads: both spellings, null,
    wrong types, nested lists of lists, a call stack as one ';'-joined string, no args."""
    forms: list[Any] = [
        {"Input Dims": [[4, 8], [8]], "Input type": ["float", "float"], "External id": 3},
        {"Input Dims": None, "Input dims": [[2]], "external id": "7"},  # null -> 2021 key
        {"Input Dims": 5, "Input Strides": [[[1]], {"a": 1}], "Sequence number": 4.0},
        {"Input strides": [[8, 1]], "Concrete Inputs": ["", "1"], "Fwd thread id": 2},
        {"Call stack": "a.py(1): f;b.py(2): g;", "Input type": "float"},
        {"Input Dims": [[4, 8], [8]], "Input type": ["float", "float"]},  # repeats row 0
        {},
        [1, 2],  # not a dict
        None,
    ]
    events: list[dict[str, Any]] = []
    for i in range(200):
        ts = 10.0 + 4 * i
        op: dict[str, Any] = {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i % 3}",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": 1.0,
        }
        if i % 10 != 9:
            op["args"] = forms[i % len(forms)]
        events.append(op)
        grid: Any = [[i, 1, 1], 5, None, "x"][i % 4]
        events.append(
            {
                "ph": "X",
                "cat": "gpu_memcpy" if i % 5 == 0 else "kernel",
                "name": "k",
                "pid": 0,
                "tid": "stream 7",
                "ts": ts + 1,
                "dur": 1.0,
                "args": {"grid": grid, "block": [128, 1, 1], "bytes": 64, "correlation": i}
                if i % 6
                else forms[7],
            }
        )
    return events


def test_every_form_of_args_reads_the_same_on_every_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _odd_args_events()
    p = tmp_path / "odd_args.json"
    p.write_text(json.dumps({"traceEvents": events}))
    counter = _Counting(monkeypatch)
    fast = load_trace(p)
    assert counter.events >= 0.9 * len(events)  # the typed fast path read them
    assert fast == _load_without_msgspec(p, monkeypatch)
    assert fast == trace_from_dict(json.loads(p.read_text()), source=str(p))
    # The values themselves, from the JSON above.
    ops = {o.index: o for o in fast.ops}
    assert ops[0].input_dims == ((4, 8), (8,)) and ops[0].input_types == ("float", "float")
    assert ops[0].external_id == 3
    assert ops[2].input_dims == ((2,),) and ops[2].external_id == 7
    assert ops[4].input_dims is None and ops[4].sequence_number == 4
    # Strides holding a dict are no tensor's: left out, and said in the load warnings.
    assert ops[4].input_strides is None
    assert any("not sizes any tensor" in w for w in fast.load_warnings)
    assert ops[6].input_strides == ((8, 1),) and ops[6].concrete_inputs == ("", "1")
    assert ops[8].stack == ("a.py(1): f", "b.py(2): g") and ops[8].input_types == ("float",)
    assert ops[10].input_dims is ops[0].input_dims  # one shared tuple per distinct shape
    for i in (12, 14, 16, 18):  # {}, a list, null, no args
        o = ops[i]
        assert (o.external_id, o.input_dims, o.input_types, o.stack) == (None,) * 4
    kernels = {k.index: k for k in fast.kernels}
    assert kernels[9].grid == (4, 1, 1) and kernels[9].block == (128, 1, 1)
    assert kernels[3].grid is None and kernels[3].stream == 7  # grid 5; stream from the tid
    assert kernels[5].grid is None and kernels[7].grid is None  # null, "x"
    assert kernels[1].grid is None and kernels[1].correlation is None  # args [1, 2]
    assert kernels[21].kind == "memcpy" and kernels[21].bytes == 64


def test_bare_event_array_takes_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _raw_events(BERT)
    p = tmp_path / "array.json"
    p.write_text(json.dumps(events))
    counter = _Counting(monkeypatch)
    assert load_trace(p) == trace_from_dict(events, source=str(p))
    assert counter.events >= 0.9 * len(events)


def test_nan_in_the_middle_falls_back_for_that_stretch_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _awkward_events()
    # Python's json writes float('nan') as NaN: msgspec rejects it, the stdlib accepts it.
    events[len(events) // 2]["args"] = {"value": float("nan")}
    text = json.dumps({"traceEvents": events}, indent=1)
    assert "NaN" in text
    p = tmp_path / "nan.json"
    p.write_text(text)
    monkeypatch.setattr(trace_decode, "CHUNK_CHARS", 2000)
    counter = _Counting(monkeypatch)
    assert load_trace(p) == trace_from_dict(json.loads(text), source=str(p))
    assert 0 < counter.events < len(events)


# The kernel of round 80 (ts 1261.0), two thirds into the file: far beyond the first batch.
_DEEP = 1000 + 80 * 3.25 + 1


@pytest.mark.parametrize(
    "spoil",
    [
        {"dur": "x"},  # wrongly typed fields
        {"dur": [1]},
        {"pid": [1, 2]},
        {"ts": float("nan")},  # NaN: not JSON, but the stdlib reads it
        {"ts": None},
        "bad JSON",
    ],
    ids=str,
)
def test_errors_deep_in_a_file_are_the_stdlib_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Any
) -> None:
    events = _awkward_events()
    (deep,) = [e for e in events if e.get("cat") == "kernel" and e["ts"] == _DEEP]
    if isinstance(spoil, dict):
        deep.update(spoil)
    text = json.dumps({"traceEvents": events})
    if spoil == "bad JSON":
        text = text.replace(f'"tid": 7, "ts": {_DEEP}', f'"tid": 7 "ts": {_DEEP}')
        assert '"tid": 7 "ts"' in text
    p = tmp_path / "bad.json"
    p.write_text(text)
    monkeypatch.setattr(trace_decode, "CHUNK_CHARS", 3000)
    counter = _Counting(monkeypatch)
    with pytest.raises(TraceFormatError) as fast:
        load_trace(p)
    assert counter.events > 0  # the batches before the bad event took the fast path
    with pytest.raises(TraceFormatError) as slow:
        _load_without_msgspec(p, monkeypatch)
    assert str(fast.value) == str(slow.value)
    assert str(p) in str(fast.value)
    if spoil != "bad JSON":
        assert f"event {events.index(deep)} " in str(fast.value)


# --------------------------------------------------------------------------------------------
# msgspec is optional; the collector is paused and restored


def test_without_msgspec_installed(tmp_path: Path) -> None:
    odd = tmp_path / "odd_args.json"
    odd.write_text(json.dumps({"traceEvents": _odd_args_events()}))
    out = tmp_path / "traces.pickle"
    code = (
        "import pickle, sys\n"
        "sys.modules['msgspec'] = None  # import msgspec -> ImportError\n"
        "from gpuprof_nb.io import trace\n"
        "from gpuprof_nb.io.trace import decode, load\n"
        "assert decode.msgspec is None and load.EVENT_DECODER is None\n"
        f"t = [trace.load_trace(p) for p in ({str(BERT)!r}, {str(odd)!r})]\n"
        f"open({str(out)!r}, 'wb').write(pickle.dumps(t))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    assert pickle.loads(out.read_bytes()) == [load_trace(BERT), load_trace(odd)]


def test_without_isal_installed(tmp_path: Path) -> None:
    """Without python-isal, gzip traces are read by the standard library: the same Trace."""
    out = tmp_path / "traces.pickle"
    code = (
        "import gzip, pickle, sys\n"
        "sys.modules['isal'] = None  # import isal -> ImportError\n"
        "from gpuprof_nb.io import trace\n"
        "from gpuprof_nb.io.trace import load\n"
        "assert load._gzip_file is gzip.GzipFile\n"
        f"t = trace.load_trace({str(BERT)!r})\n"
        f"open({str(out)!r}, 'wb').write(pickle.dumps(t))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    assert pickle.loads(out.read_bytes()) == load_trace(BERT)


@pytest.mark.skipif(igzip is None, reason="python-isal not installed")
@pytest.mark.parametrize("path", GZIPPED, ids=lambda p: p.name)
def test_isal_and_the_standard_library_read_the_same_trace(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_isal = load_trace(path)
    monkeypatch.setattr(trace_load, "_gzip_file", gzip.GzipFile)
    assert load_trace(path) == with_isal


@pytest.mark.parametrize("enabled", [True, False])
def test_garbage_collector_state_is_restored(enabled: bool, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1}]}')
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        load_trace(SMALL)
        assert gc.isenabled() is enabled
        with pytest.raises(TraceFormatError):
            load_trace(bad)
        assert gc.isenabled() is enabled
        trace_from_dict({"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "cat": "cpu_op"}]})
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


# --------------------------------------------------------------------------------------------
# model objects built without the frozen __init__ are the same objects


def test_makers_build_what_the_dataclass_constructors_build() -> None:
    import dataclasses

    from gpuprof_nb.model.trace import Kernel, MemoryEvent, Op, RuntimeCall, SyncEvent

    makers = {
        Op: trace_build._new_op,
        Kernel: trace_build._new_kernel,
        RuntimeCall: trace_build._new_runtime,
        SyncEvent: trace_build._new_sync,
        MemoryEvent: trace_build._new_memory,
    }
    for cls, make in makers.items():
        assert make is not cls  # the fast maker is in use for the model as it is today
        names = [f.name for f in dataclasses.fields(cls)]
        values = [f"{cls.__name__}.{n}" if i % 2 else i * 1.5 for i, n in enumerate(names)]
        built = make(*values)
        expected = cls(*values)
        assert type(built) is cls and built == expected and hash(built) == hash(expected)
        assert [getattr(built, n) for n in names] == values
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(built, names[0], 3)  # still frozen
        # The fast way (a same-layout shell whose __class__ becomes cls) is the one in use.
        assert "_shell" in make.__code__.co_names


class _SlottedBase:
    __slots__ = ("extra",)


@dataclasses.dataclass(frozen=True, slots=True)
class _OtherLayout(_SlottedBase):
    x: int
    y: str


def test_maker_sets_the_slots_directly_when_the_layout_differs() -> None:
    make = trace_build._maker(_OtherLayout)
    assert make is not _OtherLayout and "_shell" not in make.__code__.co_names
    built = make(1, "a")
    assert type(built) is _OtherLayout and built == _OtherLayout(1, "a")


def test_maker_falls_back_to_the_class_when_it_does_more_than_store() -> None:
    import dataclasses

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    assert trace_build._maker(Checked) is Checked
    assert trace_build._maker(NoSlots) is NoSlots


# --------------------------------------------------------------------------------------------
# trace_from_dict: the event dicts converted in one msgspec call, or one at a time


def _from_dict_one_at_a_time(d: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(trace_load, "DICT_EVENTS", None)
        return trace_from_dict(d, source="t")


def _check_from_dict_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = path.read_bytes()
    d = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    _same_or_same_error(
        lambda: _from_dict_one_at_a_time(d, monkeypatch), lambda: trace_from_dict(d, source="t")
    )


@pytest.mark.parametrize("path", LOCAL, ids=lambda p: str(p.relative_to(DATA)))
def test_converted_dicts_equal_one_at_a_time_on_copied_traces(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_from_dict_same(path, monkeypatch)


@pytest.mark.skipif(not SHARED_FILES, reason="../shared/traces is not on this machine")
@pytest.mark.parametrize("path", SHARED_FILES, ids=lambda p: str(p.relative_to(SHARED)))
def test_converted_dicts_equal_one_at_a_time_on_shared_traces(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_from_dict_same(path, monkeypatch)


@pytest.mark.parametrize(
    "spoil",
    [
        {"args": {1: "an int key"}},  # msgspec.convert refuses it: the whole list goes one by one
        {"ts": float("nan")},
        {"dur": "x"},
    ],
    ids=str,
)
def test_converted_dicts_fall_back_with_the_same_result_or_message(
    spoil: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _awkward_events()
    kernel = next(i for i, e in enumerate(events) if e.get("cat") == "kernel")
    events[kernel] = {**events[kernel], **spoil}
    d = {"traceEvents": events}
    message = _same_or_same_error(
        lambda: _from_dict_one_at_a_time(d, monkeypatch), lambda: trace_from_dict(d, source="t")
    )
    if message is None:
        assert "args" in spoil  # only the odd args key is readable
    else:
        assert f"t: event {kernel} " in message
        assert "ts" not in spoil or "no numeric 'ts'" in message


def test_an_event_that_is_not_a_dict_is_named_by_trace_from_dict() -> None:
    with pytest.raises(TraceFormatError, match="is a str, not a JSON object"):
        trace_from_dict({"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}, "oops"]})
