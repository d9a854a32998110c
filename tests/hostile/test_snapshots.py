"""Hostile memory snapshots: pickles written opcode by opcode (nesting a million deep where
torch writes a few levels, lengths and memo indices the file does not hold, classes named,
integers of thousands of digits), values of the wrong type where torch writes integers,
gzip bombs, and paths that are not files. Each must give the library's own error or a
correct report, within the harness's memory and time limits (harness.py)."""

from __future__ import annotations

import gzip
import os
import pickle
import socket
import struct
from pathlib import Path

import pytest
from harness import Case

DATA = Path(__file__).parents[1] / "data" / "snapshots"
ANALYSE = "from gpuprof_nb import load_snapshot, analyze_memory\n"


def _s(text: str) -> bytes:
    raw = text.encode("utf-8")
    return b"\x8c" + bytes([len(raw)]) + raw


def _pickle(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


def _nested(kind: str, depth: int) -> bytes:
    """Opcodes that push one value nested `depth` deep: tuples (TUPLE1 around TUPLE1),
    lists (EMPTY_LIST ... APPEND) or dicts (EMPTY_DICT, key, ..., SETITEM)."""
    if kind == "tuple":
        return b"K\x01" + b"\x85" * depth
    if kind == "list":
        return b"]" * depth + b"a" * (depth - 1)
    return (b"}K\x01") * depth + b"N" + b"s" * depth


def _entry(**fields: bytes) -> bytes:
    """A history entry dict whose fields are given as opcodes pushing their values."""
    base = {
        "action": _s("alloc"),
        "addr": b"J" + struct.pack("<i", 4096),
        "size": b"J" + struct.pack("<i", 512),
        "stream": b"K\x00",
    }
    base.update(fields)
    return b"}(" + b"".join(_s(k) + v for k, v in base.items()) + b"u"


def _snapshot(entries: list[bytes], *, segments: bytes = b"]", extra: bytes = b"") -> bytes:
    body = (
        b"}("
        + _s("segments")
        + segments
        + _s("device_traces")
        + b"](]("
        + b"".join(entries)
        + b"ee"
        + extra
        + b"u"
    )
    return _pickle(body)


def _frames(filename: bytes) -> bytes:
    return (
        b"](}(" + _s("filename") + filename + _s("line") + b"K\x07" + _s("name") + _s("f") + b"ue"
    )


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _load(path: str) -> str:
    return f"result = analyze_memory(load_snapshot({path!r}))"


def test_the_hand_written_pickles_are_snapshots_when_nothing_is_odd() -> None:
    from gpuprof_nb import analyze_memory, load_snapshot

    plain = _snapshot([_entry(frames=_frames(_s("a.py"))), _entry(addr=b"K\x00")])
    assert pickle.loads(plain)["device_traces"][0][0]["frames"][0]["filename"] == "a.py"
    report = analyze_memory(load_snapshot(plain))
    assert report.peak_bytes == 1024
    extra = _s("allocator_settings") + b"}" + _s("x") + b"K\x01s"
    assert load_snapshot(_snapshot([_entry()], extra=extra)).allocator_settings == {"x": 1}
    for kind in ("tuple", "list", "dict"):
        value = pickle.loads(_pickle(_nested(kind, 3)))
        assert value in ((((1,),),), [[[]]], {1: {1: {1: None}}})


def test_nesting_anywhere_is_refused_or_read_never_a_crash(hostile, tmp_path: Path) -> None:
    cases = []
    for kind in ("tuple", "list", "dict"):
        for depth in (40, 5_000, 300_000):
            deep = _nested(kind, depth)
            where = {
                "size": (_snapshot([_entry(size=deep)]), "refuse"),
                "action": (_snapshot([_entry(action=deep)]), "refuse"),
                "frames": (_snapshot([_entry(frames=_frames(deep))]), "refuse"),
                "segments": (_pickle(b"}" + _s("segments") + deep + b"s"), "refuse"),
                "settings": (
                    _snapshot(
                        [_entry()], extra=_s("allocator_settings") + b"}" + _s("x") + deep + b"s"
                    ),
                    "accept",
                ),
                "steps": (
                    _snapshot(
                        [_entry()], extra=_s("gpuprof_nb") + b"}" + _s("step_starts") + deep + b"s"
                    ),
                    "accept",
                ),
            }
            if kind == "tuple":  # only a tuple can be a key: it is hashed while unpickling
                where["top_key"] = (_pickle(b"}" + deep + b"Ns"), "refuse")
                where["entry_key"] = (
                    _snapshot([b"}(" + _s("action") + _s("alloc") + deep + b"Nu"]),
                    "either",
                )
            for place, (data, expect) in where.items():
                name = f"{place}-{kind}-{depth}"
                path = _write(tmp_path, f"{name}.pickle", data)
                cases.append(Case(name, _load(path), expect))
    hostile(cases, prelude=ANALYSE)


def test_lengths_and_memo_indices_beyond_the_file_are_refused_first(hostile, tmp_path) -> None:
    cases = []
    opcodes = {
        "FRAME": (b"\x95", "<Q"),
        "BINBYTES8": (b"\x8e", "<Q"),
        "BINUNICODE8": (b"\x8d", "<Q"),
        "BYTEARRAY8": (b"\x96", "<Q"),
        "BINUNICODE": (b"X", "<I"),
        "BINBYTES": (b"B", "<I"),
        "BINSTRING": (b"T", "<i"),
        "LONG4": (b"\x8b", "<i"),
    }
    for name, (op, fmt) in opcodes.items():
        top = {"<Q": 2**64 - 1, "<I": 2**32 - 1, "<i": 2**31 - 1}[fmt]
        for length in (top, top // 3, 1_000):
            data = b"\x80\x04" + op + struct.pack(fmt, length) + b"abc."
            path = _write(tmp_path, f"{name}-{length}.pickle", data)
            cases.append(Case(f"{name}-{length}", _load(path), "refuse", words="refused"))
    negative = b"\x80\x02T" + struct.pack("<i", -5) + b"."
    cases.append(Case("BINSTRING-negative", _load(_write(tmp_path, "neg.p", negative)), "refuse"))
    for index in (2**28, 2**31, 2**32 - 1):
        data = b"\x80\x02N" + b"r" + struct.pack("<I", index) + b"0N."
        path = _write(tmp_path, f"put-{index}.pickle", data)
        cases.append(Case(f"LONG_BINPUT-{index}", _load(path), "refuse", words="memo"))
        text = b"N" + b"p" + str(index).encode() + b"\n0N."
        path = _write(tmp_path, f"textput-{index}.pickle", text)
        cases.append(Case(f"PUT-{index}", _load(path), "refuse", words="memo"))
    cases.append(
        Case(
            "LONG_BINGET-2**31",
            _load(_write(tmp_path, "get.p", b"\x80\x02j\x00\x00\x00\x80.")),
            "refuse",
        )
    )
    hostile(cases, prelude=ANALYSE, memory_mb=600)


def test_huge_integers_and_code_are_refused(hostile, tmp_path: Path) -> None:
    cases = []
    digits = b"9" * 5_000
    bodies = {
        "text-INT": b"I" + digits + b"\n.",
        "text-LONG": b"L" + digits + b"L\n.",
        "LONG1-255-as-size": _snapshot([_entry(size=b"\x8a\xff" + b"\x01" * 255)]),
        "LONG1-9-as-addr": _snapshot([_entry(addr=b"\x8a\x09" + b"\x01" * 9)]),
        "GLOBAL": b"cos\nsystem\n(S'echo hi'\ntR.",
        "STACK_GLOBAL": b"\x80\x04" + _s("os") + _s("system") + b"\x93" + _s("id") + b"\x85R.",
        "REDUCE-no-callable": b"\x80\x02N)R.",
        "BUILD-on-dict": b"\x80\x02}}b.",
        "EXT1": b"\x80\x02\x82\x01.",
        "PERSID": b"Pabc\n.",
        "BINPERSID": b"\x80\x02NQ.",
        "not-a-pickle": b"hello world",
        "no-STOP": b"\x80\x04}" + _s("segments") + b"]s",
        "unknown-opcode": b"\x80\x04\xff.",
        "empty": b"",
    }
    for name, data in bodies.items():
        path = _write(tmp_path, f"{name}.pickle", data)
        cases.append(Case(name, _load(path), "refuse"))
    for value in ("None", "123", "[]", "b''", "object()"):
        cases.append(Case(f"argument-{value}", f"result = load_snapshot({value})", "refuse"))
    hostile(cases, prelude=ANALYSE)


ODD = {
    "float": b"G" + struct.pack(">d", 1.9),
    "text": _s("4096"),
    "bool": b"\x88",
    "inf": b"G" + struct.pack(">d", float("inf")),
    "nan": b"G" + struct.pack(">d", float("nan")),
    "negative": b"J" + struct.pack("<i", -1),
    "huge": b"\x8a\x09" + b"\x00" * 8 + b"\x01",
    "list": b"]",
    "dict": b"}",
}


@pytest.mark.parametrize("field", ["size", "addr", "stream", "time_us"])
def test_values_of_the_wrong_type_are_refused_not_coerced(hostile, tmp_path, field) -> None:
    cases = []
    for kind, value in ODD.items():
        if field == "time_us" and kind in ("float", "negative"):
            continue  # a time may be a float; a negative one is a clock's choice
        path = _write(tmp_path, f"{field}-{kind}.pickle", _snapshot([_entry(**{field: value})]))
        cases.append(Case(f"{field}-{kind}", _load(path), "refuse", words=f"'{field}'"))
    absent = _write(tmp_path, f"{field}-none.pickle", _snapshot([_entry(**{field: b"N"})]))
    cases.append(Case(f"{field}-None", _load(absent), "accept"))
    hostile(cases, prelude=ANALYSE)


def test_segment_and_frame_values_are_checked(hostile, tmp_path: Path) -> None:
    def segment(**fields: bytes) -> bytes:
        base = {
            "device": b"K\x00",
            "address": b"J" + struct.pack("<i", 4096),
            "total_size": b"J" + struct.pack("<i", 2**20),
            "stream": b"K\x00",
        }
        base.update(fields)
        return b"](}(" + b"".join(_s(k) + v for k, v in base.items()) + b"ue"

    cases = []
    for field in ("device", "address", "total_size", "stream"):
        for kind in ("float", "text", "bool", "negative", "list"):
            data = _snapshot([], segments=segment(**{field: ODD[kind]}))
            path = _write(tmp_path, f"seg-{field}-{kind}.pickle", data)
            cases.append(Case(f"segment-{field}-{kind}", _load(path), "refuse"))
    for field, value in {
        "filename": b"K\x05",
        "name": b"]",
        "line": _s("7"),
        "line-float": b"G" + struct.pack(">d", 7.5),
    }.items():
        key = field.split("-")[0]
        frame = b"](}(" + _s(key) + value + b"ue"
        data = _snapshot([_entry(frames=frame)])
        cases.append(
            Case(f"frame-{field}", _load(_write(tmp_path, f"f-{field}.p", data)), "refuse")
        )
    hostile(cases, prelude=ANALYSE)


def test_gzip_bombs_and_cut_gzip_are_refused(hostile, tmp_path: Path) -> None:
    zeros = tmp_path / "zeros.pickle.gz"
    with gzip.open(zeros, "wb", compresslevel=9) as f:
        chunk = b"\x00" * (1 << 20)
        for _ in range(300):
            f.write(chunk)
    real = (DATA / "train_time.pickle").read_bytes()
    padded = tmp_path / "padded.pickle.gz"
    with gzip.open(padded, "wb", compresslevel=9) as f:
        f.write(real[:-1] + b"N" * (200 << 20) + b".")
    packed = gzip.compress(real)
    cut = _write(tmp_path, "cut.pickle.gz", packed[: len(packed) // 2])
    whole = _write(tmp_path, "whole.pickle.gz", packed)
    cases = [
        Case("zeros", _load(str(zeros)), "refuse", words="expands more than"),
        Case("padded", _load(str(padded)), "refuse", words="expands more than"),
        Case("cut", _load(cut), "refuse"),
        Case("bytes-bomb", f"result = load_snapshot(open({str(zeros)!r}, 'rb').read())", "refuse"),
        Case("whole", _load(whole), "accept", check="result.peak_bytes > 0"),
    ]
    hostile(cases, prelude=ANALYSE, memory_mb=800)


def test_paths_that_are_not_files_are_refused_without_blocking(hostile, tmp_path) -> None:
    fifo = tmp_path / "fifo.pickle"
    os.mkfifo(fifo)
    sock_path = tmp_path / "s.pickle"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        cases = [
            Case("fifo", _load(str(fifo)), "refuse", words="FIFO"),
            Case("directory", _load(str(tmp_path)), "refuse", words="directory"),
            Case("device", _load("/dev/zero"), "refuse", words="device"),
            Case("socket", _load(str(sock_path)), "refuse", words="socket"),
            Case("missing", _load(str(tmp_path / "nope.pickle")), "refuse"),
        ]
        hostile(cases, prelude=ANALYSE, seconds=60)
    finally:
        sock.close()


def test_long_shared_names_and_many_tuples_give_bounded_reports(hostile, tmp_path) -> None:
    big = "x" * 1_500_000
    entries = [
        {
            "action": "alloc",
            "addr": 4096 * i,
            "size": 512,
            "stream": 0,
            "frames": [{"filename": big, "line": i, "name": "f" * 100_000}],
        }
        for i in range(3_000)
    ]
    path = tmp_path / "names.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    segments = [
        {
            "device": 0,
            "address": 2**21 * i,
            "total_size": 2**21,
            "stream": 0,
            "blocks": [],
            "segment_pool_id": (0, i),
        }
        for i in range(6_000)
    ]
    tuples = tmp_path / "tuples.pickle"
    tuples.write_bytes(pickle.dumps({"segments": segments, "device_traces": []}, protocol=4))
    small = "len(result._repr_mimebundle_()['text/html']) < 5_000_000"
    cases = [
        Case("long-names", _load(str(path)), "accept", check=small),
        Case(
            "6000-tuples",
            _load(str(tuples)),
            "accept",
            check="len(result.snapshot.segments) == 6000",
        ),
    ]
    rows = hostile(cases, prelude=ANALYSE, memory_mb=800)
    assert rows["long-names"]["text_chars"] < 5_000_000
