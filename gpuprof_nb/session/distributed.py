"""`analyze_run(traces)`: every rank of a distributed run analysed on an executor, one rank per
task, and the compact summaries read together (analysis/distributed.py). The default executor is a
local process pool; any `concurrent.futures.Executor` works, a Dask client's
`client.get_executor()` among them (the `gpuprof_nb[distributed]` extra).
"""

from __future__ import annotations

import functools
import glob
import multiprocessing
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import (
    BrokenExecutor,
    Executor,
    Future,
    ProcessPoolExecutor,
    as_completed,
)
from dataclasses import replace
from pathlib import Path

from gpuprof_nb.analysis.distributed import combine, rank_from_name, summarize_rank
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.guards import FileIdentity, check_regular
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.arguments import check_number, check_type, describe
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.render.progress import Progress
from gpuprof_nb.render.widgets import live_kernel
from gpuprof_nb.results.distributed import RankSummary, RunReport
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.session.analyze import analyze, trace_inputs

# What a directory's trace files are called (torch.profiler's export_chrome_trace and
# tensorboard_trace_handler write *.json or *.pt.trace.json, optionally gzipped).
TRACE_PATTERNS = ("*.json", "*.json.gz")

Source = str | os.PathLike[str] | Trace


def analyze_run(
    traces: str | os.PathLike[str] | Sequence[Source],
    *,
    executor: Executor | None = None,
    progress: bool | Progress = True,
) -> RunReport:
    """Analyse every rank of a distributed run and return its RunReport.

    `traces`: a directory (its *.json and *.json.gz files), a glob, or a list of paths or
    `Trace` objects, one per rank. A rank is the trace's distributedInfo rank, else the one
    its file name gives (`rank-3`, `worker3`), else (Trace objects only) its place in the list.
    Each file is loaded and summarised in a task on `executor` (default: a process pool with
    one worker per core); only the summary comes back. Trace objects already in memory are
    summarised here. In a notebook a progress bar counts the ranks (`progress=False`: none;
    a Progress object, such as the command line's terminal bar, counts them instead).
    A rank that cannot be read is named in the report's `failures`; the others still count.
    """
    if executor is not None and not isinstance(executor, Executor):
        raise GpuprofError(
            f"analyze_run: executor must be a concurrent.futures.Executor (a process pool, a "
            f"Dask client's client.get_executor()) or None, got {describe(executor)}"
        )
    check_type(progress, (bool, Progress), "analyze_run's progress", "True, False or a Progress")
    items = _sources(traces)
    paths = [(i, item) for i, item in enumerate(items) if not isinstance(item, Trace)]
    # What each file was when the run was read, checked before run.rank(k) reads it again.
    identities = {i: _identity(str(item)) for i, item in paths}
    summaries: dict[int, RankSummary] = {}
    bar = (
        progress
        if isinstance(progress, Progress)
        else Progress(len(items), enabled=progress and live_kernel(), what="ranks", unit="ranks")
    )
    try:
        for i, item in enumerate(items):
            if isinstance(item, Trace):
                summaries[i] = _summarize_object(item, i)
                bar.finish(_outcome(summaries[i]))
        if paths:
            for i, summary in _summarize_files(paths, executor):
                summaries[i] = summary
                bar.finish(_outcome(summary))
    finally:
        bar.close()
    report = combine([summaries[i] for i in range(len(items))])
    by_rank = {s.rank: (items[i], identities.get(i)) for i, s in summaries.items() if not s.error}
    return _with_loader(report, by_rank)


def _identity(path: str) -> FileIdentity | None:
    try:
        return FileIdentity.of(path, os.stat(path))
    except OSError:
        return None  # the worker says what is wrong with it


def _sources(traces: str | os.PathLike[str] | Sequence[Source]) -> list[str | Trace]:
    """The traces to read, in order: a directory's trace files, a glob's matches, a list."""
    if isinstance(traces, Trace):
        return [traces]
    if isinstance(traces, (str, os.PathLike)):
        text = os.fsdecode(os.fspath(traces))
        path = Path(text)
        if os.path.lexists(text) and not path.is_dir():
            check_regular(text, what="a trace file, a directory of them or a glob", error=_error)
        if path.is_dir():
            found: list[str | Trace] = [
                *sorted({str(p) for pattern in TRACE_PATTERNS for p in path.glob(pattern)})
            ]
            if not found:
                raise GpuprofError(
                    f"{text}: no trace files in this directory (looked for "
                    f"{', '.join(TRACE_PATTERNS)}); pass the directory the "
                    "ranks wrote their traces to, or a glob"
                )
            return found
        if path.is_file():
            return [text]
        if glob.has_magic(text):
            matches: list[str | Trace] = [*sorted(glob.glob(text))]
            if not matches:
                raise GpuprofError(f"{text}: the glob matches no file")
            return matches
        raise GpuprofError(f"{text}: no such file or directory")
    if not isinstance(traces, Iterable) or isinstance(traces, (bytes, bytearray, Mapping)):
        raise GpuprofError(
            f"analyze_run: traces must be a directory, a glob, or a list of trace paths or "
            f"Trace objects, got {describe(traces)}"
        )
    items: list[str | Trace] = []
    for i, item in enumerate(traces):
        if isinstance(item, Trace):
            items.append(item)
        elif isinstance(item, (str, os.PathLike)):
            items.append(os.fsdecode(os.fspath(item)))
        else:
            raise GpuprofError(
                f"traces[{i}] is a {type(item).__name__}: pass trace file paths "
                "or Trace objects (gpuprof_nb.load_trace)"
            )
    if not items:
        raise GpuprofError("no traces given: pass a directory, a glob, or a list of paths")
    return items


def _summarize_object(trace: Trace, position: int) -> RankSummary:
    """A Trace already in memory: its distributedInfo rank, else its name's, else its place."""
    dist = trace.distributed
    named = (
        dist.rank if dist is not None and dist.rank is not None else rank_from_name(trace.source)
    )
    try:
        device, timing = trace_inputs(trace)
        return summarize_rank(
            trace,
            trace.source or f"traces[{position}]",
            named if named is not None else position,
            ceilings=device,
            timing=timing,
        )
    except GpuprofError as exc:
        return RankSummary(
            rank=position,
            source=trace.source or f"traces[{position}]",
            error=f"{type(exc).__name__}: {exc}",
        )


def summarize_path(path: str, rank: int | None = None) -> RankSummary:
    """Load one rank's trace file and summarise it (what each worker runs); a file that
    cannot be read gives a summary holding only the error, so the other ranks still count."""
    try:
        trace = load_trace(path)
        device, timing = trace_inputs(trace)
        return summarize_rank(trace, str(path), rank, ceilings=device, timing=timing)
    except (GpuprofError, OSError) as exc:
        guess = rank if rank is not None else rank_from_name(str(path))
        return RankSummary(
            rank=guess if guess is not None else -1,
            source=str(path),
            error=f"{type(exc).__name__}: {exc}",
        )


def _summarize_files(
    paths: Sequence[tuple[int, str | Trace]], executor: Executor | None
) -> Iterable[tuple[int, RankSummary]]:
    """Yield (position, summary) for each file as its task finishes."""
    own = executor is None and len(paths) > 1
    pool: Executor | None = executor
    if own:
        # spawn: a worker forked from a kernel that holds torch's thread pools can hang.
        pool = ProcessPoolExecutor(
            max_workers=min(os.cpu_count() or 1, len(paths)),
            mp_context=multiprocessing.get_context("spawn"),
        )
    try:
        if pool is None:  # one file: no pool to start
            for i, path in paths:
                yield i, summarize_path(str(path))
            return
        futures: dict[Future[RankSummary], tuple[int, str]] = {}
        for i, path in paths:
            try:
                futures[pool.submit(summarize_path, str(path))] = (i, str(path))
            except Exception as exc:  # noqa: BLE001 - a shut-down or broken executor
                for future in futures:
                    future.cancel()
                raise GpuprofError(
                    f"analyze_run: the executor refused the work ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); is it shut down? Pass a running executor, or None "
                    "for a local process pool"
                ) from None
        for future in as_completed(futures):
            i, path = futures[future]
            try:
                summary = future.result()
            except BrokenExecutor as exc:  # the pool itself died: no rank can be read
                raise GpuprofError(
                    f"the worker processes died ({type(exc).__name__}) before {path} was "
                    'read. In a script, call analyze_run under `if __name__ == "__main__":`'
                    " (the pool starts fresh processes that import the script); otherwise "
                    "the workers' own error is printed above"
                ) from exc
            except Exception as exc:  # a worker's own failure: name it, keep the others
                guess = rank_from_name(path)
                summary = RankSummary(
                    rank=guess if guess is not None else -1,
                    source=path,
                    error=f"{type(exc).__name__}: {exc}",
                )
            yield i, summary
    finally:
        if own and pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _outcome(summary: RankSummary) -> str:
    name = Path(summary.source).name
    return f"{name}: could not be read" if summary.error else f"rank {summary.rank} ({name})"


def _with_loader(
    report: RunReport, by_rank: dict[int, tuple[str | Trace, FileIdentity | None]]
) -> RunReport:
    return replace(report, _load_rank=functools.partial(_rank_report, by_rank))


def _rank_report(
    by_rank: dict[int, tuple[str | Trace, FileIdentity | None]], n: int
) -> ProfileReport:
    check_number(n, "run.rank's rank", low=0, integer=True)
    if n not in by_rank:
        have = ", ".join(map(str, sorted(by_rank))) or "none"
        raise GpuprofError(f"rank {n} is not in this run (ranks read: {have})")
    item, identity = by_rank[n]
    if isinstance(item, Trace):
        return analyze(item)
    if identity is not None:
        identity.check(what=f"rank {n}", error=_error)
    return analyze(load_trace(item))


def _error(message: str) -> GpuprofError:
    return GpuprofError(message)
