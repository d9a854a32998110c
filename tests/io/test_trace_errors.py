"""Bad input to the trace loader: always a TraceFormatError that names the file and says what
is wrong and what to do; never a KeyError/TypeError/ValueError/UnicodeDecodeError/EOFError."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

try:
    from isal import igzip
except ImportError:
    igzip = None

from gpuprof_nb.errors import GpuprofError, TraceFormatError
from gpuprof_nb.io.trace import load as trace_load
from gpuprof_nb.io.trace import load_trace, trace_from_dict

DATA = Path(__file__).parents[1] / "data"
SMALL = DATA / "a100_event_sync" / "event_sync_trace.json.gz"


def _kernel(**over: object) -> dict:
    event = {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "pid": 0,
        "tid": 7,
        "ts": 10,
        "dur": 5,
        "args": {"device": 0, "stream": 7},
    }
    event.update(over)
    return event


def _load_text(tmp_path: Path, text: str | bytes, name: str = "t.json") -> TraceFormatError:
    p = tmp_path / name
    if isinstance(text, str):
        p.write_text(text)
    else:
        p.write_bytes(text)
    with pytest.raises(TraceFormatError) as info:
        load_trace(p)
    assert str(p) in str(info.value)  # names the file
    assert isinstance(info.value, GpuprofError)
    return info.value


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("this is not json", ["not a JSON trace"]),
        ("", ["empty"]),
        ("   \n", ["empty"]),
        ('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}', ["truncated?"]),
        ('{"traceEvents": [{"ph": "X", "name": "aten::', ["truncated?"]),
        ('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2},', ["truncated?"]),
        ('{"traceEvents": [', ["truncated?"]),
        ('{"traceEvents"', ["truncated?"]),
        ('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}]} trailing', ["extra data"]),
        ('{"traceEvents": [{"ph": "X" "ts": 1}]}', ["not valid JSON"]),
        ('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2},]}', ["not valid JSON"]),
        ('{"schemaVersion": 1, "deviceProperties": []}', ["no 'traceEvents'", "schemaVersion"]),
        ('{"traceEvents": {"ph": "X"}}', ["not a list"]),
        ("[1, 2, 3]", ["not of trace events"]),
        ('"a string"', ["not a JSON trace"]),
        ('{"traceEvents": []}', ["empty trace", "no events"]),
        (
            '{"traceEvents": [{"ph": "M", "name": "process_name", "ts": 0, "pid": 1}]}',
            ["empty trace", "only metadata"],
        ),
        ('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, 17]}', ["event 1", "not a JSON object"]),
        (
            '{"traceEvents": [{"ph": "X", "name": "aten::mm", "dur": 2}]}',
            ["event 0", "'aten::mm'", "'ts'"],
        ),
        (
            '{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "ts": 1, "dur": "3"}]}',
            ["event 0", "'dur'"],
        ),
        (
            '{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}, {"ph": "X", "ts": 1, "dur": "3"}]}',
            ["event 1", "'dur'"],
        ),
        ('{"traceEvents": [{"ph": "X", "ts": NaN, "dur": 1}]}', ["event 0", "'ts'"]),
        ('{"traceEvents": [{"ph": "X", "ts": null, "dur": 1}]}', ["event 0", "'ts'"]),
        ('{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": "x"}]}', ["event 0", "'ts'"]),
    ],
)
def test_bad_json_text(tmp_path: Path, text: str, words: list[str]) -> None:
    message = str(_load_text(tmp_path, text))
    for word in words:
        assert word in message
    # Every message also says what to do.
    assert "export" in message


def test_binary_file_is_not_a_trace(tmp_path: Path) -> None:
    message = str(_load_text(tmp_path, b"\x89PNG\r\n\x1a\n\xff\xfe\x00garbage", "img.json"))
    assert "UTF-8" in message or "not a JSON trace" in message


def test_invalid_utf8_inside_the_events(tmp_path: Path) -> None:
    text = b'{"traceEvents": [{"ph": "X", "name": "\xff\xfe", "ts": 1, "dur": 1}]}'
    assert "UTF-8" in str(_load_text(tmp_path, text))


# Every gzip test runs with both decompressors: ISA-L's (python-isal, used where installed)
# and the standard library's (the fallback); each raises its own error classes.
GZIP_READERS = {"stdlib": gzip.GzipFile}
if igzip is not None:
    GZIP_READERS["isal"] = igzip.GzipFile


@pytest.fixture(params=sorted(GZIP_READERS))
def gzip_reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(trace_load, "_gzip_file", GZIP_READERS[request.param])
    return str(request.param)


def test_isal_is_the_reader_where_installed() -> None:
    assert trace_load._gzip_file is (igzip.GzipFile if igzip is not None else gzip.GzipFile)


def test_truncated_gzip(tmp_path: Path, gzip_reader: str) -> None:
    raw = SMALL.read_bytes()
    message = str(_load_text(tmp_path, raw[: len(raw) // 2], "cut.json.gz"))
    assert "truncated?" in message


def test_corrupt_gzip(tmp_path: Path, gzip_reader: str) -> None:
    raw = bytearray(SMALL.read_bytes())
    raw[20:40] = b"\x00" * 20
    message = str(_load_text(tmp_path, bytes(raw), "corrupt.json.gz"))
    assert "truncated?" in message or "corrupt" in message or "not valid JSON" in message


def test_invalid_deflate_block(tmp_path: Path, gzip_reader: str) -> None:
    # The first deflate byte after the 10-byte gzip header: final block, block type 3, which
    # deflate reserves: zlib.error / isal's IsalError, each turned into the same message.
    raw = bytearray(gzip.compress(b'{"traceEvents": []}', mtime=0))
    raw[10] = 0x07
    message = str(_load_text(tmp_path, bytes(raw), "bad_block.json.gz"))
    assert "cannot decompress it" in message and "corrupt" in message


def test_gzip_of_truncated_json(tmp_path: Path, gzip_reader: str) -> None:
    text = gzip.decompress(SMALL.read_bytes())
    message = str(_load_text(tmp_path, gzip.compress(text[: len(text) - 500]), "short.json.gz"))
    assert "truncated?" in message


def test_memory_timeline_is_recognised() -> None:
    path = DATA / "memory_timeline_raw" / "memory_timeline.raw.gz"
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert "export_memory_timeline" in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError) as info:
        load_trace(tmp_path / "nope.json")
    assert "nope.json" in str(info.value) and "cannot open" in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError):
        load_trace(tmp_path)


@pytest.mark.parametrize(
    "bad",
    [
        None,
        42,
        "text",
        {"schemaVersion": 1},
        {"traceEvents": 5},
        {"traceEvents": [1]},
        {"traceEvents": [{"ph": "X", "ts": "1", "dur": 2}]},
        {"traceEvents": [{"ph": "X", "ts": 1, "dur": [2]}]},
        {"traceEvents": []},
        {"traceEvents": [_kernel(args=["not", "a", "dict"]), _kernel(ts={"a": 1})]},
        {"traceEvents": [_kernel(pid=[1, 2])]},
        {"traceEvents": [_kernel(cat=["kernel"])]},
        {"traceEvents": [_kernel(ts=1e400, dur=1)]},
    ],
)
def test_trace_from_dict_rejects_bad_input(bad: object) -> None:
    with pytest.raises(TraceFormatError) as info:
        trace_from_dict(bad, source="live capture")  # type: ignore[arg-type]
    assert "live capture" in str(info.value)


@pytest.mark.parametrize(
    "event",
    [
        _kernel(args=None),
        _kernel(args={"device": "zero", "stream": "seven", "correlation": "x", "grid": "big"}),
        _kernel(name=12),
        _kernel(pid=None, tid=None),
        _kernel(cat="cpu_op", args={"Input Dims": "oops", "Input type": 5, "Call stack": 3}),
        _kernel(cat="cuda_sync", args={"stream": None}),
        _kernel(cat=None),
        {"ph": "i", "name": "[memory]", "ts": 3, "args": {"Bytes": "many"}},
        {"ph": "i", "name": "[memory]", "ts": 3, "args": 7},
    ],
)
def test_odd_but_timed_events_load_without_crashing(event: dict) -> None:
    # Wrongly typed optional fields are tolerated (dropped), never a KeyError/TypeError.
    # (Beside one plain op: a trace of nothing torch.profiler records is refused, below.)
    t = trace_from_dict(
        {
            "traceEvents": [event, _kernel(cat="cpu_op", name="aten::mm")],
            "deviceProperties": [{"id": "x"}, 3],
            "distributedInfo": "rank 0",
        }
    )
    assert t.bounds_us[0] <= t.bounds_us[1]
    assert t.distributed is None


def test_round_trip_of_a_written_dict(tmp_path: Path) -> None:
    d = {"traceEvents": [_kernel(), _kernel(ts=20, name="k2")], "schemaVersion": 1}
    p = tmp_path / "x.json"
    p.write_text(json.dumps(d))
    assert load_trace(p).kernels == trace_from_dict(d).kernels


def test_malformed_own_samples_cost_only_themselves() -> None:
    """gpuprof_nb's line and utilisation samples ride along with a trace: a malformed entry
    is left out with a warning naming what was wrong, and the trace still loads."""
    from gpuprof_nb.io.trace import trace_from_dict

    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5, "pid": 1, "tid": 1}
    ]
    samples = {
        "mode": "signal",
        "period_us": 3000.0,
        "start_us": 0.0,
        "end_us": 10.0,
        "frames": [["<c>", 1, "<module>", ""]],
        "stacks": [[0]],
        "ts_us": [5.0, 2.0],
        "stack_of": [0, 0],
    }
    trace = trace_from_dict(
        {
            "traceEvents": events,
            "gpuprof_nb": {"samples": samples, "utilisation": {"ts_us": "nope"}},
        },
        "t.json",
    )
    assert len(trace.ops) == 1
    assert trace.samples is None and trace.utilisation is None
    warned = " ".join(trace.load_warnings)
    assert "gpuprof_nb.samples.ts_us must not decrease" in warned
    assert "the line samples were left out" in warned
    assert "the utilisation samples were left out" in warned
