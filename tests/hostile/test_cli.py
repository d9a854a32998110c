"""The `gpuprof` command line given hostile paths and flags: FIFOs, directories and files
under a file as sources and as `-o`, non-trace files, counts of 23 digits, NaN and infinite
thresholds, baseline names that climb out of their folder, and baselines whose records are
nested 100,000 deep, binary, infinite or a FIFO. Each must be exit code 2 with one line on
stderr in the library's own words (not "an unexpected failure", never a traceback), or a
correct run, within the harness's limits (harness.py): a `-o` FIFO hung the command forever.

The command runs in the harness's child through `gpuprof_nb.cli.main` (what the console
script calls); an exit of 2 with a clean line counts as the library's own error."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness import Case

DATA = Path(__file__).parents[1] / "data"
TRACE = DATA / "planted_cpu" / "launch_overhead.json.gz"
SNAPSHOT = DATA / "snapshots" / "train_time.pickle"

PRELUDE = """
import contextlib, io
from gpuprof_nb.cli import main
from gpuprof_nb.errors import GpuprofError

def gp(*argv):
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv], out=out)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    said = err.getvalue()
    if code == 2:
        lines = [line for line in said.splitlines() if line.strip()]
        if "unexpected failure" in said or "Traceback" in said or len(lines) != 1:
            raise RuntimeError(said)
        raise GpuprofError(said)
    return code, out.getvalue()
"""


def _refused(name: str, *argv: object, words: str | None = None) -> Case:
    return Case(name, f"result = gp(*{[str(a) for a in argv]!r})", "refuse", words=words)


def _files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    out_fifo = tmp_path / "out.md"
    os.mkfifo(out_fifo)
    text = tmp_path / "text.txt"
    text.write_text("hello")
    empty = tmp_path / "empty"
    empty.mkdir()
    return {"fifo": fifo, "out_fifo": out_fifo, "text": text, "empty": empty}


def test_paths_and_flags(hostile, tmp_path: Path) -> None:
    f = _files(tmp_path)
    huge = "9" * 23
    cases = [
        _refused("report-fifo", "report", f["fifo"]),
        _refused("report-empty-dir", "report", f["empty"]),
        _refused("report-text", "report", f["text"]),
        _refused("report-missing", "report", tmp_path / "nope.json"),
        _refused("report-snapshot-among-traces", "report", TRACE, SNAPSHOT),
        _refused("report-o-fifo", "report", TRACE, "-o", f["out_fifo"], words="FIFO"),
        _refused("report-o-fifo-json", "report", TRACE, "-o", f["fifo"], words="FIFO"),
        _refused("report-o-dir", "report", TRACE, "-o", f["empty"], "--format", "md"),
        _refused("report-o-under-file", "report", TRACE, "-o", f["text"] / "x.md"),
        _refused("report-o-suffix", "report", TRACE, "-o", tmp_path / "x.exe"),
        _refused("report-top-zero", "report", TRACE, "--top", "0"),
        _refused("report-top-huge", "report", TRACE, "--top", huge, words="100,000"),
        _refused("report-top-text", "report", TRACE, "--top", "many"),
        _refused("report-workers-huge", "report", TRACE, "--workers", huge),
        _refused("report-format", "report", TRACE, "--format", "pdf"),
        _refused("compare-one-side", "compare", TRACE),
        _refused("compare-fifo", "compare", TRACE, f["fifo"]),
        _refused("compare-snapshot", "compare", TRACE, SNAPSHOT),
        _refused("compare-threshold-nan", "compare", TRACE, TRACE, "--threshold", "nan"),
        _refused("compare-threshold-inf", "compare", TRACE, TRACE, "--threshold", "inf%"),
        _refused("compare-threshold-1e999", "compare", TRACE, TRACE, "--threshold", "1e999"),
        _refused("compare-threshold-text", "compare", TRACE, TRACE, "--threshold", "lots"),
        _refused("compare-fail-on", "compare", TRACE, TRACE, "--fail-on", "never"),
        _refused("compare-o-fifo", "compare", TRACE, TRACE, "-o", f["out_fifo"]),
        _refused("baseline-name-climbs", "baseline", "save", "../x", TRACE),
        _refused("baseline-name-hidden", "baseline", "save", ".x", TRACE),
        _refused("baseline-save-fifo", "baseline", "save", "x", f["fifo"]),
        _refused("baseline-dir-is-file", "baseline", "save", "x", TRACE, "--baselines", f["text"]),
        _refused("no-command", "bogus"),
        Case(
            "report-ok",
            f"result = gp('report', {str(TRACE)!r}, '-o', {str(tmp_path / 'r.md')!r})",
            "accept",
            check=f"result[0] == 0 and open({str(tmp_path / 'r.md')!r}).read().startswith('#')",
        ),
    ]
    hostile(cases, prelude=PRELUDE, seconds=120)


def test_hostile_baseline_records(hostile, tmp_path: Path) -> None:
    where = tmp_path / "baselines"
    where.mkdir()

    def record(name: str, **fields: object) -> None:
        body = {"schema": "gpuprof_nb.baseline", "schema_version": 1, "trace_file": None}
        body.update(fields)
        (where / f"{name}.json").write_text(json.dumps(body))

    (where / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (where / "binary.json").write_bytes(b"\xff\xfe\x00\x1f\x8b" + os.urandom(64))
    (where / "gzip.json").write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(64))
    (where / "huge-int.json").write_text('{"schema": ' + "9" * 5000 + "}")
    os.mkfifo(where / "pipe.json")
    record("infinite", timing={"wall_us": [1e400]})
    record("negative", timing={"wall_us": [-5, 1]})
    record("steps-per-run-huge", timing={"wall_us": [1, 2], "steps_per_run": 10**300})
    record("number-huge", timing={"wall_us": [1, 2], "number": 2**64})
    record("steps-bool", timing={"wall_us": [1, 2], "steps_per_run": True})
    record("timing-list", timing=[1, 2])
    record("trace-climbs", trace_file="../../etc/passwd")
    record("trace-missing", trace_file="nope.trace.json.gz")
    record("trace-is-dir", trace_file="")
    record("version", schema_version=99)
    (where / "other-schema.json").write_text('{"schema": "x"}')
    d = str(where)
    names = (
        "deep",
        "binary",
        "gzip",
        "huge-int",
        "pipe",
        "infinite",
        "negative",
        "steps-per-run-huge",
        "number-huge",
        "steps-bool",
        "timing-list",
        "trace-climbs",
        "trace-missing",
        "trace-is-dir",
        "version",
        "other-schema",
    )
    cases = []
    for name in names:
        cases.append(
            _refused(f"cli-{name}", "compare", "--baseline", name, "--baselines", d, TRACE)
        )
        cases.append(
            Case(
                f"api-{name}",
                f"from gpuprof_nb import load_baseline\nresult = load_baseline({name!r}, {d!r})",
                "refuse",
            )
        )
    for name in ("deep", "binary", "pipe"):
        cases.append(_refused(f"show-{name}", "baseline", "show", name, "--baselines", d))
    # The listing names every unreadable record and goes on to the others.
    cases.append(
        Case(
            "list-goes-on",
            f"result = gp('baseline', 'list', '--baselines', {d!r})",
            "accept",
            check="result[0] == 0 and 'deep\\t(unreadable' in result[1]"
            " and 'pipe' not in result[1]",
        )
    )
    hostile(cases, prelude=PRELUDE, seconds=120)
