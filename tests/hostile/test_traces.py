"""Hostile trace files: nesting deep in events and args, junk and NUL padding where an event
belongs, numbers of thousands of digits, times of ±1e308, shapes no tensor has, names of
millions of characters and lone surrogates, gzip bombs and cut gzip, foreign Chrome traces,
and paths that are not files. Each must give TraceFormatError (or another GpuprofError) or a
correct, bounded report, within the harness's limits (harness.py)."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

from harness import Case

PRELUDE = "from gpuprof_nb import load_trace, analyze\n"
SMALL = Path(__file__).parents[1] / "data" / "planted_cpu" / "launch_overhead.json.gz"


def _op(name: str = "aten::mm", ts: object = 10, dur: object = 5, **args: object) -> str:
    event = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return json.dumps(event)


def _trace(*events: str, head: str = "") -> str:
    return '{"schemaVersion": 1, ' + head + '"traceEvents": [' + ", ".join(events) + "]}"


def _write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(text)
    return str(path)


def _analyse(path: str) -> str:
    return f"result = analyze(load_trace({path!r}))"


def test_deep_nesting_and_junk_are_refused_or_read(hostile, tmp_path: Path) -> None:
    cases = []
    plain = _op()
    for depth in (30, 900, 5_000, 200_000):
        nests = {
            "events": _trace(plain, "[" * depth + "]" * depth),
            "args": _trace(plain[:-1] + ', "args": {"x": ' + "[" * depth + "]" * depth + "}}"),
            "dims": _trace(
                plain[:-1] + ', "args": {"Input Dims": ' + "[" * depth + "]" * depth + "}}"
            ),
            "stack": _trace(
                plain[:-1] + ', "args": {"Call stack": [' + "[" * depth + "]" * depth + "]}}"
            ),
            "top": _trace(plain, head='"deviceProperties": ' + "[" * depth + "]" * depth + ", "),
            "unclosed": '{"traceEvents": [' + plain + ", " + "[" * depth,
        }
        for where, text in nests.items():
            path = _write(tmp_path, f"{where}-{depth}.json", text)
            cases.append(Case(f"{where}-{depth}", _analyse(path), "either"))
    junk = {
        "nul-padding": '{"traceEvents": [' + "\x00" * 3_000_000,
        "nul-after-event": '{"traceEvents": [' + plain + ", " + "\x00" * 3_000_000,
        "binary": os.urandom(3_000_000),
        "utf16": _trace(plain).encode("utf-16"),
        "huge-int-ts": _trace(plain).replace('"ts": 10', '"ts": ' + "9" * 5000),
        "huge-int-arg": _trace(_op(**{"External id": 7})).replace(": 7}", ": " + "9" * 5000 + "}"),
        "huge-int-first": '{"traceEvents": [' + "9" * 5000 + "]}",
        "ts-1e308": _trace(_op(), _op(ts=1e308)),
        "ts-minus-1e308": _trace(_op(ts=-1e308), _op(ts=1e308)),
        "dur-1e308": _trace(_op(dur=1e308)),
        "ts-NaN": _trace(plain).replace('"ts": 10', '"ts": NaN'),
        "ts-Infinity": _trace(plain).replace('"ts": 10', '"ts": Infinity'),
        "empty": "",
        "not-json": "hello",
        "list-of-numbers": "[1, 2, 3]",
        "no-events": '{"schemaVersion": 1}',
        "cut": _trace(plain, plain)[:-20],
    }
    for name, text in junk.items():
        cases.append(Case(name, _analyse(_write(tmp_path, f"{name}.json", text)), "refuse"))
    rows = hostile(cases, prelude=PRELUDE, memory_mb=1000)
    # Junk is said at once, not after reading the whole file.
    assert "character 17" in rows["nul-padding"]["message"], rows["nul-padding"]


def test_values_no_trace_holds_are_refused_or_left_out_with_a_warning(hostile, tmp_path) -> None:
    shapes = {
        "negative": [[-4, 8]],
        "huge": [[2**60, 2**60]],
        "float": [[1.5, 2]],
        "text": [["4", "8"]],
        "dict": [[{"a": 1}]],
        "deep": [[[[[[[1]]]]]]],
    }
    cases = []
    for name, dims in shapes.items():
        text = _trace(_op(**{"Input Dims": dims, "Input type": ["float", "float"]}))
        path = _write(tmp_path, f"shape-{name}.json", text)
        check = "any('not sizes any tensor' in w for w in result.trace.load_warnings)"
        cases.append(Case(f"shape-{name}", _analyse(path), "accept", check=check))
    chrome = json.dumps(
        {
            "traceEvents": [
                {
                    "ph": "X",
                    "cat": "devtools.timeline",
                    "name": "RunTask",
                    "ts": 1,
                    "dur": 5,
                    "pid": 1,
                    "tid": 1,
                },
                {
                    "ph": "X",
                    "cat": "v8",
                    "name": "v8.compile",
                    "ts": 2,
                    "dur": 1,
                    "pid": 1,
                    "tid": 1,
                },
            ],
            "metadata": {"trace-config": ""},
        }
    )
    # 100,000 ops of the same start and end nest one in the next: a tree 100,000 deep.
    same = _trace(*[_op(ts=1, dur=1)] * 100_000)
    cases.append(
        Case(
            "same-times",
            _analyse(_write(tmp_path, "same.json", same)),
            "accept",
            check="result.ops.rows[0].calls == 100_000",
        )
    )
    cases.append(
        Case(
            "chrome",
            _analyse(_write(tmp_path, "chrome.json", chrome)),
            "refuse",
            words="not a PyTorch trace",
        )
    )
    hostile(cases, prelude=PRELUDE)


def test_long_names_and_lone_surrogates_render_bounded(hostile, tmp_path: Path) -> None:
    long_op = "aten::" + "x" * 10_000_000
    kernel = {
        "ph": "X",
        "cat": "kernel",
        "name": "void k<" + "int," * 400_000 + ">()",
        "pid": 0,
        "tid": 7,
        "ts": 11,
        "dur": 2,
        "args": {"device": 0, "stream": 7, "correlation": 1},
    }
    runtime = {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": 1,
        "ts": 10,
        "dur": 1,
        "args": {"correlation": 1},
    }
    many = [_op(name=long_op, ts=10 + i) for i in range(3)]
    paths = {
        "long-op": _write(tmp_path, "long.json", _trace(*many)),
        "long-kernel": _write(
            tmp_path, "kernel.json", _trace(_op(), json.dumps(kernel), json.dumps(runtime))
        ),
        "surrogate": _write(tmp_path, "sur.json", _trace(_op(name="aten::\ud800bad"))),
        "escaped-surrogate": _write(
            tmp_path, "esc.json", _trace(_op()).replace("aten::mm", "aten::\\udc80x")
        ),
    }
    bounded = "len(result._repr_mimebundle_()['text/html']) < 5_000_000"
    cases = [Case(name, _analyse(p), "accept", check=bounded) for name, p in paths.items()]
    cases.append(
        Case(
            "full-name-kept",
            _analyse(paths["long-op"]),
            "accept",
            check="result.ops.rows[0].name == 'aten::' + 'x' * 10_000_000",
        )
    )
    rows = hostile(cases, prelude=PRELUDE, memory_mb=1500)
    for name in paths:
        assert rows[name]["text_chars"] < 5_000_000, rows[name]


def test_gzip_bombs_and_cut_gzip_are_refused(hostile, tmp_path: Path) -> None:
    nul = tmp_path / "nul.json.gz"
    with gzip.open(nul, "wb") as f:
        f.write(b'{"traceEvents": [')
        for _ in range(64):
            f.write(b"\x00" * (1 << 20))
    spaces = tmp_path / "spaces.json.gz"
    with gzip.open(spaces, "wb") as f:
        f.write(b'{"traceEvents": [')
        for _ in range(64):
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    events = tmp_path / "events.json.gz"
    with gzip.open(events, "wb") as f:
        f.write(b'{"schemaVersion": 1, "traceEvents": [')
        rows = (_op() + ", ").encode() * 1000
        for _ in range(400):
            f.write(rows)
        f.write(_op().encode() + b"]}")
    real = SMALL.read_bytes()
    cut = _write(tmp_path, "cut.json.gz", real[: len(real) // 2])
    cases = [
        Case("nul", _analyse(str(nul)), "refuse"),
        Case("spaces", _analyse(str(spaces)), "refuse", words="expands more than"),
        Case("repeated-events", _analyse(str(events)), "refuse", words="expands more than"),
        Case("cut", _analyse(cut), "refuse", words="truncated"),
        Case("real", _analyse(str(SMALL)), "accept", check="result.trace.ops"),
    ]
    hostile(cases, prelude=PRELUDE, memory_mb=800)


def test_paths_that_are_not_files_are_refused_without_blocking(hostile, tmp_path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases = [
        Case("fifo", _analyse(str(fifo)), "refuse", words="FIFO"),
        Case("directory", _analyse(str(tmp_path)), "refuse", words="directory"),
        Case("device", _analyse("/dev/zero"), "refuse", words="device"),
        Case("missing", _analyse(str(tmp_path / "none.json")), "refuse"),
        Case("nul-in-path", "result = load_trace('a\\x00b.json')", "refuse"),
        Case("none", "result = load_trace(None)", "refuse"),
        Case("number", "result = load_trace(3)", "refuse"),
    ]
    hostile(cases, prelude=PRELUDE, seconds=60)


def test_random_damage_to_a_real_trace(hostile, tmp_path: Path) -> None:
    """Generated: a real trace cut, overwritten or stuffed at random places (a seed per
    run of the module, printed on failure)."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    text = gzip.decompress(SMALL.read_bytes()).decode()
    stuffing = ["[" * 3000, "\x00" * 5000, "9" * 5000, '"', "1e999", "\ud800", "}" * 50]
    cases = []
    for k in range(24):
        i = rng.randrange(len(text))
        choice = k % 3
        if choice == 0:
            mutated = text[:i]
        elif choice == 1:
            mutated = text[:i] + rng.choice(stuffing) + text[i:]
        else:
            mutated = text[:i] + "".join(rng.choice('0123456789,:"{}[] -.') for _ in range(40))
            mutated += text[i + 40 :]
        path = _write(tmp_path, f"m{k}.json", mutated)
        cases.append(Case(f"seed{seed}-m{k}", _analyse(path), "either"))
    hostile(cases, prelude=PRELUDE)


def test_save_streams_the_file_loaded_and_refuses_one_changed_since(hostile, tmp_path) -> None:
    source = tmp_path / "src.json.gz"
    source.write_bytes(SMALL.read_bytes())
    out = tmp_path / "out.json"
    changed = f"""
report = analyze(load_trace({str(source)!r}))
with open({str(source)!r}, "ab") as f:
    f.write(b"\\0")
result = report.save({str(out)!r})
"""
    same = f"""
import gzip
report = analyze(load_trace({str(SMALL)!r}))
report.save({str(out)!r})
assert open({str(out)!r}, "rb").read() == gzip.decompress(open({str(SMALL)!r}, "rb").read())
fifo = {str(tmp_path / "fifo.json")!r}
import os
os.mkfifo(fifo)
try:
    report.save(fifo)
except gpuprof_nb.GpuprofError as exc:
    assert "FIFO" in str(exc), exc
else:
    raise AssertionError("saved into a FIFO")
result = None
"""
    cases = [
        Case("changed-source", changed, "refuse", words="changed since"),
        Case("same-source", same, "accept"),
    ]
    hostile(cases, prelude=PRELUDE + "import gpuprof_nb\n", seconds=60)


def test_the_text_of_a_name_with_a_lone_surrogate_encodes() -> None:
    from gpuprof_nb import analyze
    from gpuprof_nb.io.trace import trace_from_dict

    bad = json.loads(_op(name="aten::\ud800x"))
    trace = trace_from_dict({"schemaVersion": 1, "traceEvents": [bad]})
    text = analyze(trace).text()
    assert "aten::\ufffdx" in text
    text.encode("utf-8")
