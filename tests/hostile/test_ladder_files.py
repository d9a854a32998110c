"""Hostile ladder report files for `gpuprof_nb.ladder.load`: NaN, negative, infinite and
wrongly typed step times and counts, thousands of rungs, nesting, binary and gzip files,
oversized files and paths that are not files. Each must give the library's own error or a
correct, bounded report, within the harness's limits (harness.py)."""

from __future__ import annotations

import copy
import gzip
import json
import os
from pathlib import Path
from typing import Any

from harness import Case

from gpuprof_nb.ladder.verdicts import (
    BatchPoint,
    BatchSweep,
    LadderReport,
    RungResult,
    read_three_runs,
)

PRELUDE = "from gpuprof_nb.ladder import load\n"


def _valid() -> dict[str, Any]:
    rungs = (
        RungResult("fp32", "fp32", "baseline", "reference", (1000.0, 1010.0), 32, 2**20),
        RungResult("bf16", "bf16", "kept", "faster", (500.0, 505.0), 32, 2**20, final_loss=0.5),
    )
    report = LadderReport(
        rungs=rungs,
        three_run=read_three_runs(32000.0, 64000.0, None),
        device_name="cpu",
        memory_method="tensor bytes",
        steps=2,
        warmup=1,
        batch_size=32,
        seed=0,
        loss_tolerance=0.05,
        batch_sweep=BatchSweep("fp32", (BatchPoint(8, "ok", (100.0, 100.0)),)),
    )
    return json.loads(json.dumps(report.to_dict()))  # lists, as a file holds them


def _write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / f"{name}.json"
    if isinstance(data, bytes):
        path.write_bytes(data)
    elif isinstance(data, str):
        path.write_text(data, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_text(json.dumps(data, allow_nan=True), encoding="utf-8", errors="surrogatepass")
    return str(path)


def _load(path: str) -> str:
    return f"result = load({path!r})"


def test_a_valid_file_loads() -> None:
    from gpuprof_nb.ladder import load

    report = load(_write_tmp(_valid()))
    assert report.rungs[1].step_times_us == (500.0, 505.0)


def _write_tmp(data: Any) -> str:
    import tempfile

    fd, name = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    return name


def test_values_no_ladder_holds_are_refused(hostile, tmp_path: Path) -> None:
    odd: dict[str, Any] = {
        "nan": float("nan"),
        "inf": float("inf"),
        "negative": -5.0,
        "zero": 0,
        "text": "5",
        "bool": True,
        "list": [1],
        "null": None,
    }
    cases = []
    for kind, value in odd.items():
        data = _valid()
        data["rungs"][0]["step_times_us"][0] = value
        path = _write(tmp_path, f"time-{kind}", data)
        cases.append(Case(f"step-time-{kind}", _load(path), "refuse", words="step_times_us"))
        for field in ("steps", "batch_size", "warmup"):
            if field == "warmup" and kind == "zero":
                continue  # no warm-up is a choice
            data = _valid()
            data[field] = value
            cases.append(
                Case(f"{field}-{kind}", _load(_write(tmp_path, f"{field}-{kind}", data)), "refuse")
            )
    for mfu in (1.5, -0.1, float("inf")):
        data = _valid()
        data["rungs"][1]["mfu"] = mfu
        path = _write(tmp_path, f"mfu-{mfu!r}", data)
        cases.append(Case(f"mfu-{mfu!r}", _load(path), "refuse", words="mfu"))
    for status in ("great", "", 3, None):
        data = _valid()
        data["rungs"][1]["status"] = status
        path = _write(tmp_path, f"status-{status!r}", data)
        cases.append(Case(f"status-{status!r}", _load(path), "refuse", words="status"))
    data = _valid()
    data["loss_tolerance"] = float("inf")
    cases.append(Case("tolerance-inf", _load(_write(tmp_path, "tol", data)), "refuse"))
    data = _valid()
    data["rungs"][1]["final_loss"] = float("nan")  # a loss that diverged: a real outcome
    cases.append(Case("loss-nan-kept", _load(_write(tmp_path, "loss", data)), "accept"))
    data = _valid()
    data["rungs"][0]["trials"] = [dict(data["rungs"][1], trials=[data["rungs"][1]])]
    cases.append(Case("trials-in-trials", _load(_write(tmp_path, "trials", data)), "refuse"))
    data = _valid()
    data["rungs"] = []
    cases.append(Case("no-rungs", _load(_write(tmp_path, "norungs", data)), "refuse"))
    data = _valid()
    data["format"] = "other/1"
    cases.append(Case("format", _load(_write(tmp_path, "format", data)), "refuse"))
    text = json.dumps(_valid()).replace('"seed": 0', '"seed": ' + "9" * 5000)
    cases.append(Case("digits", _load(_write(tmp_path, "digits", text)), "refuse"))
    data = _valid()
    data["notes"] = ["\ud800 odd note"]
    cases.append(Case("surrogate-note", _load(_write(tmp_path, "sur", data)), "accept"))
    hostile(cases, prelude=PRELUDE)


def test_many_rungs_are_refused_or_render_bounded(hostile, tmp_path: Path) -> None:
    base = _valid()
    rung = base["rungs"][1]
    many = copy.deepcopy(base)
    many["rungs"] = [base["rungs"][0]] + [dict(rung, name=f"r{i}") for i in range(999)]
    too_many = copy.deepcopy(base)
    too_many["rungs"] = [base["rungs"][0]] + [dict(rung, name=f"r{i}") for i in range(20_000)]
    long_times = copy.deepcopy(base)
    long_times["rungs"][1]["step_times_us"] = [500.0] * 200_000
    bounded = "len(result._repr_mimebundle_()['text/html']) < 5_000_000"
    cases = [
        Case("999-rungs", _load(_write(tmp_path, "many", many)), "accept", check=bounded),
        Case("20000-rungs", _load(_write(tmp_path, "toomany", too_many)), "refuse"),
        Case("200000-times", _load(_write(tmp_path, "times", long_times)), "refuse"),
    ]
    rows = hostile(cases, prelude=PRELUDE)
    assert rows["999-rungs"]["text_chars"] < 5_000_000


def test_files_that_are_not_ladder_reports_are_refused(hostile, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(65 << 20)  # sparse: 65 MB that cost nothing to write
    deep = _valid()
    deep["notes"] = [json.loads("[" * 50 + "]" * 50)]
    cases = [
        Case("gzip", _load(_write(tmp_path, "gz", gzip.compress(b"{}"))), "refuse", words="gzip"),
        Case("binary", _load(_write(tmp_path, "bin", os.urandom(4096))), "refuse"),
        Case("deep", _load(_write(tmp_path, "deep", "[" * 100_000 + "]" * 100_000)), "refuse"),
        Case("deep-notes", _load(_write(tmp_path, "deepnotes", deep)), "refuse"),
        Case("fifo", _load(str(fifo)), "refuse", words="FIFO"),
        Case("directory", _load(str(tmp_path)), "refuse", words="directory"),
        Case("oversized", _load(str(big)), "refuse"),
        Case("none", "result = load(None)", "refuse"),
        Case("empty", _load(_write(tmp_path, "empty", "")), "refuse"),
    ]
    hostile(cases, prelude=PRELUDE, seconds=60)
