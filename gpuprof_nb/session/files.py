"""The files users hand the command line and the pytest helper: which kind each is (a
profiler trace, a memory snapshot, a run's directory) and its report, read the way the
notebook reads it (`load_trace` + `analyze`, `load_snapshot` + `analyze_memory`). A trace a
%%gpuprofile report saved brings its timed samples back with it (io/timing.py). And the
files a run will write (--trace, --save), checked before it runs."""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from pathlib import Path
from typing import Literal

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.guards import check_writable
from gpuprof_nb.io.snapshot import load_snapshot
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.results.report import MemoryReport, ProfileReport
from gpuprof_nb.session.analyze import analyze, analyze_memory

__all__ = [
    "FileKind",
    "file_kind",
    "load_report",
    "load_snapshot",
    "load_trace",
    "load_trace_report",
    "writable_problem",
]

FileKind = Literal["trace", "snapshot", "directory"]

_GZIP = b"\x1f\x8b"
_PICKLE = b"\x80"  # pickle protocol 2 and later, what torch's _dump_snapshot writes


def file_kind(path: str | os.PathLike[str]) -> FileKind:
    """Return what `path` holds, going by its first bytes (under gzip, those of the content):
    a pickle is a memory snapshot, anything else is read as a trace (whose loader says what
    is wrong with it). GpuprofError when it is missing or not a regular file."""
    text = os.fspath(path)
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        raise GpuprofError(f"{text}: no such file or directory") from None
    except OSError as exc:
        raise GpuprofError(f"{text}: cannot read it ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        return "directory"
    if not stat.S_ISREG(mode):
        raise GpuprofError(f"{text}: not a regular file (a pipe or device?); pass a file")
    try:
        with open(text, "rb") as fh:
            head = fh.read(2)
        if head == _GZIP:
            with gzip.open(text, "rb") as fh:
                head = fh.read(2)
    except (OSError, EOFError, zlib.error):
        return "trace"  # unreadable or damaged gzip: the trace loader names the problem
    return "snapshot" if head[:1] == _PICKLE else "trace"


def load_report(path: str | os.PathLike[str]) -> ProfileReport | MemoryReport:
    """Return the report of a trace file (ProfileReport) or a snapshot (MemoryReport)."""
    kind = file_kind(path)
    if kind == "directory":
        raise GpuprofError(
            f"{os.fspath(path)}: a directory; a run's directory of rank traces is read by "
            "gpuprof_nb.analyze_run (`gpuprof report DIR`)"
        )
    if kind == "snapshot":
        return analyze_memory(load_snapshot(path))
    return analyze(load_trace(path))


def load_trace_report(path: str | os.PathLike[str], role: str = "a trace") -> ProfileReport:
    """Return the ProfileReport of a trace file; a clear GpuprofError when `path` is a
    snapshot or a directory (`role` says what the file was given as)."""
    text = os.fspath(path)
    kind = file_kind(path)
    if kind == "snapshot":
        raise GpuprofError(
            f"{text}: a memory snapshot (pickle), not a profiler trace; {role} must be a "
            "Chrome trace (torch.profiler's export_chrome_trace, or report.save()); "
            f"`gpuprof report {Path(text).name}` shows a snapshot"
        )
    if kind == "directory":
        raise GpuprofError(f"{text}: a directory, not a trace file; {role} must be one trace file")
    return analyze(load_trace(text))


def writable_problem(path: str, flag: str) -> str | None:
    """Return why a file cannot be written at `path` (a FIFO, a directory, a device, a
    parent that is no folder), or None; checked before a cell runs."""
    try:
        check_writable(path, what=f"{flag}", error=GpuprofError)
    except GpuprofError as exc:
        return f"{flag}: {exc}"
    return None
