"""Named baselines for a regression gate: `gpuprof baseline save NAME TRACE` (or
`save_baseline(name, report)`) keeps what a later `gpuprof compare --baseline NAME TRACE`
needs to give the same verdict the notebook would, in a directory of readable files:

    .gpuprof/baselines/NAME.json           what the verdict reads: the timed samples (a saved
                                           %%gpuprofile report's) or the profiled steps, the
                                           median, the headline numbers, where it came from
    .gpuprof/baselines/NAME.trace.json.gz  a copy of the trace (the changes and findings)

The directory is `directory=` (the command line's `--baselines DIR`), else the environment
variable GPUPROF_BASELINES, else `.gpuprof/baselines` under the current directory. Commit it
beside the code it measures, or keep it as a CI artifact.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuprof_nb.analysis.report import count_steps_per_run
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.guards import loads_json, open_for_writing, open_regular
from gpuprof_nb.io.timing import timing_dict, timing_of
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.render.records import headline
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.session.analyze import analyze
from gpuprof_nb.session.files import load_trace_report

ENV = "GPUPROF_BASELINES"
DEFAULT_DIRECTORY = Path(".gpuprof") / "baselines"
SCHEMA = "gpuprof_nb.baseline"
SCHEMA_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def baseline_directory(directory: str | os.PathLike[str] | None = None) -> Path:
    """Return where baselines live: `directory`, else $GPUPROF_BASELINES, else
    .gpuprof/baselines."""
    if directory is not None:
        if not isinstance(directory, (str, os.PathLike)) or "\x00" in os.fspath(directory):
            raise GpuprofError(
                f"the baselines' directory must be a folder's path, got {describe(directory)}"
            )
        return Path(directory)
    env = os.environ.get(ENV, "").strip()
    return Path(env) if env else DEFAULT_DIRECTORY


def check_name(name: object) -> str:
    """Return `name` when it can name a baseline file (letters, digits, `.`, `_`, `-`, not
    starting with a dot, at most 100 characters); GpuprofError otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.endswith(".trace"):
        raise GpuprofError(
            f"baseline name {describe(name)} is not usable: use letters, digits, '.', '_' and '-' "
            "(not first), at most 100 characters, e.g. train-step"
        )
    return name


def _samples(report: ProfileReport) -> tuple[str, str, list[float]]:
    """Return (per, samples_from, samples in us) as compare() would take them from this
    report alone: timed runs (per step when the trace has steps), else profiled steps."""
    timing, trace = report.timing, report.trace
    steps = count_steps_per_run(trace) if trace is not None else None
    if timing is not None:
        per_run = timing.steps_per_run if steps and timing.steps_per_run else 1
        return (
            "step" if steps else "run",
            "timed runs",
            [t / per_run for t in timing.times_us],
        )
    if trace is not None and steps:
        return "step", "profiled steps", [s.dur_us for s in trace.steps]
    return "window", "", []


def save_baseline(
    name: str,
    source: ProfileReport | str | os.PathLike[str],
    *,
    directory: str | os.PathLike[str] | None = None,
) -> Path:
    """Save `source` (a ProfileReport, e.g. `%%gpuprofile -o r`'s, or a trace file, e.g. one
    `report.save()` wrote) as the baseline `name`, replacing one of that name; return the
    path of its JSON file."""
    name = check_name(name)
    if isinstance(source, ProfileReport):
        report, origin = source, (source.trace.source if source.trace is not None else "")
    elif isinstance(source, (str, os.PathLike)):
        report, origin = load_trace_report(source, "a baseline"), os.fspath(source)
    else:
        raise GpuprofError(
            f"save_baseline: source is a {type(source).__name__}; pass a ProfileReport or "
            "a trace file's path"
        )
    if report.trace is None and report.timing is None:
        raise GpuprofError(f"baseline {name}: the report has neither a trace nor timed runs")
    where = baseline_directory(directory)
    trace_name = f"{name}.trace.json.gz" if report.trace is not None else None
    per, samples_from, samples = _samples(report)
    record = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": origin,
        "trace_file": trace_name,
        "per": per,
        "samples_from": samples_from,
        "samples_us": samples,
        "timing": None if report.timing is None else timing_dict(report.timing),
        "headline": headline(report),
    }
    try:
        where.mkdir(parents=True, exist_ok=True)
        if trace_name is not None:
            report.save(where / f".{trace_name}.partial")
            os.replace(where / f".{trace_name}.partial", where / trace_name)
        target = where / f"{name}.json"
        partial = where / f".{name}.json.partial"
        text = json.dumps(record, indent=2, allow_nan=False) + "\n"
        with open_for_writing(partial, what=f"baseline {name}", error=GpuprofError) as out:
            out.write(text.encode("utf-8", "surrogatepass"))
        os.replace(partial, target)
    except OSError as exc:
        raise GpuprofError(f"cannot write baseline {name} in {where}: {exc}") from None
    return target


# Far more than a baseline's record holds (its timed samples: a few kB).
MAX_RECORD_BYTES = 64 << 20


def _read(path: Path, name: str) -> Mapping[str, Any]:
    again = f"save it again with `gpuprof baseline save {name} TRACE`"
    f, st = open_regular(path, what=f"baseline {name}'s record ({again})", error=GpuprofError)
    with f:
        if st.st_size > MAX_RECORD_BYTES:
            raise GpuprofError(
                f"{path}: {st.st_size:,} bytes, far more than a baseline's record holds; {again}"
            )
        try:
            raw = f.read()
        except OSError as exc:
            raise GpuprofError(f"{path}: cannot read baseline {name} ({exc}); {again}") from None
    try:
        record = loads_json(raw, f"{path}: cannot read baseline {name}", GpuprofError)
    except GpuprofError as exc:
        raise GpuprofError(f"{exc} {again[0].upper()}{again[1:]}.") from None
    if not isinstance(record, Mapping) or record.get("schema") != SCHEMA:
        raise GpuprofError(f"{path}: not a gpuprof_nb baseline (no schema {SCHEMA!r})")
    if record.get("schema_version") != SCHEMA_VERSION:
        raise GpuprofError(
            f"{path}: baseline schema version {record.get('schema_version')!r}, this "
            f"gpuprof_nb reads {SCHEMA_VERSION}; save the baseline again"
        )
    return record


def baseline_names(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Return the names of the baselines saved in the directory, sorted."""
    where = baseline_directory(directory)
    if not where.is_dir():
        return []
    return sorted(
        p.name[: -len(".json")]
        for p in where.glob("*.json")
        if _NAME.fullmatch(p.stem) and p.is_file()
    )


def baseline_info(name: str, directory: str | os.PathLike[str] | None = None) -> Mapping[str, Any]:
    """Return the baseline's JSON record (what `gpuprof baseline show` prints)."""
    name = check_name(name)
    where = baseline_directory(directory)
    path = where / f"{name}.json"
    if not path.is_file():
        have = ", ".join(baseline_names(where)) or "none"
        raise GpuprofError(
            f"no baseline {name!r} in {where} (saved there: {have}); save one with "
            f"`gpuprof baseline save {name} TRACE`"
        )
    return _read(path, name)


def load_baseline(name: str, directory: str | os.PathLike[str] | None = None) -> ProfileReport:
    """Return the baseline `name` as a ProfileReport: its trace analysed again, with the
    timed samples it was saved with."""
    record = baseline_info(name, directory)
    where = baseline_directory(directory)
    raw_timing = record.get("timing")
    try:
        timing = timing_of({"gpuprof_nb": {"timing": raw_timing}})
    except GpuprofError as exc:
        raise GpuprofError(f"{where / (name + '.json')}: {exc}") from None
    trace_file = record.get("trace_file")
    if trace_file is None:
        if timing is None:
            raise GpuprofError(f"{where / (name + '.json')}: holds neither a trace nor timings")
        return ProfileReport(timing=timing, trace=None)
    if not isinstance(trace_file, str) or Path(trace_file).name != trace_file:
        raise GpuprofError(f"{where / (name + '.json')}: trace_file must be a file name")
    return analyze(load_trace(where / trace_file), timing=timing)
