"""torch.profiler over a cell -> the Chrome-trace dict that `export_chrome_trace` writes,
so a live run and a trace file go through the same loader."""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from types import CodeType
from typing import Any, Protocol

try:
    import msgspec
except ImportError:  # optional: the standard library reads the exported trace without it
    msgspec = None  # type: ignore[assignment]

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from gpuprof_nb.errors import CaptureError
from gpuprof_nb.io.cells import KEY
from gpuprof_nb.model.frames import profiler_frame_parts

# The annotation that ties the samplers' clock to the trace's.
CLOCK_MARKER = "gpuprof_nb::clock"

# The annotation around a few tiny kernels run inside the profiler before the cell on CUDA,
# taken out of the trace with everything that ended before it ended. The first torch op in a
# CUDA profiling window spends milliseconds of host time before its first kernel (CUPTI
# setting itself up on the first launches; benchmarks/RESULTS.md, "Measurements behind
# design choices", M4), which read as the host holding the GPU idle: a compute-bound cell of
# 8 big matmuls came out "launch overhead" first.
WARMUP_MARKER = "gpuprof_nb::profiler-warmup"
WARMUP_KERNELS = 4


class Sampler(Protocol):
    """What runs beside the profiled cell (capture/sampling.py, capture/utilisation.py).

    A sampler whose code runs on the cell's own thread (the signal line sampler's handler)
    names it in an `own_code` attribute: torch's `with_stack` recording sees those calls as
    Python events of the cell, and they are taken out of the trace."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]: ...


class ProfilerStoppedByCell(CaptureError):
    """The cell started and stopped a torch profiler of its own, which ended ours too."""


def profiler_running() -> bool:
    """Return True while any torch (autograd/Kineto) profiler is recording in this process."""
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except AttributeError:  # private API moved: fall back to the legacy module flag
        return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))


def profile_cell(
    run: Callable[[], object],
    *,
    runs: int = 1,
    stack: bool = False,
    memory: bool = False,
    cuda: bool = False,
    samplers: Sequence[tuple[str, Sampler]] = (),
) -> dict[str, Any]:
    """Return the Chrome trace (as a dict) of `runs` calls of `run` under torch.profiler.

    CPU activity always, CUDA activity when `cuda`; shapes recorded. `stack` records Python
    call stacks (torch 2.13 writes them only with the experimental config's verbose flag on),
    `memory` records allocator events. `samplers` run beside `run` (started after the
    profiler, stopped and joined before it stops, even when `run` raises); each (key,
    sampler)'s record, on the trace's clock, goes under gpuprof_nb's own key of the trace.
    With `runs > 1` each call is wrapped in a `ProfilerStep#i` annotation so the runs become
    steps; a single run gets no annotation of ours, so a training loop's own
    `ProfilerStep#`/`Optimizer.step#` annotations give the steps
    (use runs > 1 only for cells without `ProfilerStep#` annotations of their own; the magic
    always profiles one run).
    The profiler is stopped before this returns or raises, whatever `run` raised (including
    KeyboardInterrupt), and that exception propagates unchanged. A cell that runs its own
    profiler ends ours: ProfilerStoppedByCell then, and nothing is exported.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of user tracebacks
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if profiler_running():
        raise CaptureError(
            "a torch profiler is already recording in this process; stop it first "
            "(leave its `with profile(...)` block) or use --timing-only"
        )
    prof = _new_profiler(cuda=cuda, stack=stack, memory=memory)
    prof.__enter__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    stopped_by_cell = False
    try:
        if cuda:
            _warm_up_cuda_profiling()
        before, after = _mark_clock(bool(samplers))
        started = []
        try:
            for _, sampler in samplers:
                sampler.start()
                started.append(sampler)
            for i in range(runs):
                ctx = record_function(f"ProfilerStep#{i}") if runs > 1 else contextlib.nullcontext()
                with ctx:
                    run()
        finally:
            # Stopped and joined whatever the cell raised; stop() never raises.
            for sampler in reversed(started):
                sampler.stop()
        if cuda:
            # Kernels still queued when the profiler stops would be missing from the trace.
            torch.cuda.synchronize()
        # Kineto keeps one session per process: a `with profile()` inside the cell ends ours,
        # and exporting what is left crashes the process (torch 2.13 segfaults), so check.
        stopped_by_cell = not profiler_running()
    finally:
        _stop_profiler(prof)
    if stopped_by_cell:
        raise ProfilerStoppedByCell(
            "the cell runs a torch profiler of its own, which stopped ours (one profiler per "
            "process); use %%gpuprofile --timing-only for this cell, or export that "
            "profiler's trace and read it with gpuprof_nb.load_trace"
        )
    artifact = _export(prof)
    _tidy_artifact(artifact, samplers, cuda=cuda, stack=stack, mid_ns=(before + after) / 2)
    return artifact


def _new_profiler(*, cuda: bool, stack: bool, memory: bool) -> profile:
    """Return a torch profiler (not started) of CPU activity, CUDA activity when `cuda`,
    shapes, Python stacks when `stack` and allocator events when `memory`."""
    activities = [ProfilerActivity.CPU]
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    extra: dict[str, Any] = {}
    if stack:
        extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(verbose=True)
    return profile(
        activities=activities,
        record_shapes=True,
        profile_memory=memory,
        with_stack=stack,
        **extra,
    )


def _mark_clock(samplers: bool) -> tuple[int, int]:
    """With `samplers`, record the CLOCK_MARKER annotation between two perf_counter_ns
    stamps and return them: the samplers stamp perf_counter_ns, and this puts them on the
    trace's clock (the marker is removed from the trace afterwards). Without, two equal
    stamps and no marker."""
    # The first annotation of a session is slow to enter, the next ones far quicker
    # (benchmarks/RESULTS.md, "Measurements behind design choices", M5): one unstamped
    # first, so the stamped one is tight and its middle is where the stamps' middle is.
    before = after = time.perf_counter_ns()
    for _ in range(2 if samplers else 0):
        before = time.perf_counter_ns()
        with record_function(CLOCK_MARKER):
            pass
        after = time.perf_counter_ns()
    return before, after


def _stop_profiler(prof: profile) -> None:
    """Stop `prof`; a failure to stop it is raised only while its session was running."""
    running = profiler_running()
    try:
        prof.__exit__(None, None, None)  # type: ignore[no-untyped-call]
    except RuntimeError:
        # torch 2.11 raises "Can't disable Kineto profiler when it's not running" when
        # the cell's own profiler ended the session: that is said by profile_cell (or the
        # cell's own exception propagates), not this. A failure to stop our own running
        # session is raised.
        if running:
            raise


def _tidy_artifact(
    artifact: dict[str, Any],
    samplers: Sequence[tuple[str, Sampler]],
    *,
    cuda: bool,
    stack: bool,
    mid_ns: float,
) -> None:
    """Take what gpuprof_nb itself ran out of the exported trace (the samplers' own edits
    and code, the CUDA warm-up) and put the samplers' records in, on the trace's clock
    through the clock marker stamped at `mid_ns` (perf_counter_ns)."""
    for _, sampler in samplers:  # samplers that record into the trace itself tidy it up
        getattr(sampler, "edit_trace", lambda _: None)(artifact)
    if cuda:
        drop_warmup(artifact)
    if samplers:
        _add_samples(artifact, samplers, mid_ns)
        if stack:
            drop_python_calls(
                artifact,
                [code for _, sampler in samplers for code in getattr(sampler, "own_code", ())],
            )


# Kineto's float timestamps carry nanosecond digits: a call's end may pass its caller's by
# that rounding.
_NESTING_SLACK_US = 1e-3


def _warm_up_cuda_profiling() -> None:
    """A few tiny kernels, waited for, under WARMUP_MARKER (see there). A failure there is
    the GPU's state before the cell ran (an earlier sticky CUDA error, no memory left), and
    is said so rather than passed off as the cell's."""
    try:
        with record_function(WARMUP_MARKER):
            t = torch.zeros(1, device="cuda")
            for _ in range(WARMUP_KERNELS - 1):
                t.add_(1)
            del t  # freed inside the marker, so its memory events go with it
            torch.cuda.synchronize()
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError and CUDA errors
        raise CaptureError(
            f"the GPU failed a 4-byte warm-up before the cell ran ({exc}); the device is in "
            "a bad state (an earlier CUDA error sticks to the process: restart the kernel) "
            "or out of memory"
        ) from exc


def drop_warmup(artifact: dict[str, Any]) -> int:
    """Take the profiler warm-up (WARMUP_MARKER) out of the artifact's trace: every event
    that ended by the marker's end goes (the warm-up waited for its kernels, so they ended
    before it), and events that span it (enclosing Python calls under --stack) start at
    the cut, so the trace's window begins there. Return how many events went."""
    events = artifact.get("traceEvents")
    if not isinstance(events, list):
        return 0
    ends = [
        e["ts"] + e["dur"]
        for e in events
        if isinstance(e, dict)
        and e.get("name") == WARMUP_MARKER
        and e.get("cat") == "user_annotation"
        and isinstance(e.get("ts"), int | float)
        and isinstance(e.get("dur"), int | float)
    ]
    if not ends:
        return 0
    cut = max(ends)

    def before(e: Any) -> bool:
        if not isinstance(e, dict):
            return False
        ts = e.get("ts")
        if not isinstance(ts, int | float) or e.get("ph") == "M":
            return False
        dur = e.get("dur")
        end = ts + dur if isinstance(dur, int | float) else ts
        return bool(end <= cut)

    kept = [e for e in events if not before(e)]
    for e in kept:
        if not isinstance(e, dict) or e.get("ph") == "M":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if isinstance(ts, int | float) and ts < cut and isinstance(dur, int | float):
            e["ts"], e["dur"] = cut, ts + dur - cut
    artifact["traceEvents"] = kept
    return len(events) - len(kept)


def drop_python_calls(artifact: dict[str, Any], codes: Iterable[CodeType]) -> int:
    """Take the `python_function` events of `codes` (gpuprof_nb's own code that ran on the
    cell's thread) out of the artifact's trace, with every Python event they enclose on
    their thread; return how many events went."""
    # torch names a call "FILE(FIRST LINE): FUNCTION", FILE shortened by the sys.path entry
    # it lies under, so the file is matched as a tail of the code's own path.
    wanted: dict[tuple[int, str], list[str]] = {}
    for c in codes:
        wanted.setdefault((c.co_firstlineno, c.co_name), []).append(
            c.co_filename.replace("\\", "/")
        )
    events = artifact.get("traceEvents")
    if not wanted or not isinstance(events, list):
        return 0

    def is_ours(name: Any) -> bool:
        parts = profiler_frame_parts(name) if isinstance(name, str) else None
        if parts is None:
            return False
        file, line, function = parts
        paths = wanted.get((line, function))
        short = file.replace("\\", "/")
        return paths is not None and any(p == short or p.endswith("/" + short) for p in paths)

    def python_span(e: Any) -> tuple[Any, float, float] | None:
        if not (isinstance(e, dict) and e.get("cat") == "python_function"):
            return None
        ts, dur = e.get("ts"), e.get("dur")
        if not (isinstance(ts, int | float) and isinstance(dur, int | float)):
            return None
        return (e.get("pid"), e.get("tid")), float(ts), float(ts) + float(dur)

    spans: dict[Any, list[tuple[float, float]]] = {}
    for e in events:
        span = python_span(e)
        if span is not None and is_ours(e.get("name")):
            spans.setdefault(span[0], []).append((span[1], span[2]))
    if not spans:
        return 0
    # Per thread: the outermost spans, in order (a handler re-entered by a late signal
    # lies inside the outer call).
    outer: dict[Any, tuple[list[float], list[float]]] = {}
    for thread, found in spans.items():
        starts: list[float] = []
        ends: list[float] = []
        for lo, hi in sorted(found):
            if ends and lo <= ends[-1] + _NESTING_SLACK_US:
                ends[-1] = max(ends[-1], hi)
            else:
                starts.append(lo)
                ends.append(hi)
        outer[thread] = (starts, ends)

    def inside(e: Any) -> bool:
        span = python_span(e)
        if span is None or span[0] not in outer:
            return False
        starts, ends = outer[span[0]]
        at = bisect.bisect_right(starts, span[1] + _NESTING_SLACK_US) - 1
        return at >= 0 and span[2] <= ends[at] + _NESTING_SLACK_US

    kept = [e for e in events if not inside(e)]
    artifact["traceEvents"] = kept
    return len(events) - len(kept)


def _add_samples(
    artifact: dict[str, Any], samplers: Sequence[tuple[str, Sampler]], mid_ns: float
) -> None:
    """Put each sampler's record under gpuprof_nb's key of the artifact, on the trace's
    clock through the clock marker (which is taken out of the trace); without the marker,
    a note says the samples could not be placed."""
    events = artifact.get("traceEvents")
    if not isinstance(events, list):
        events = []
    marks = [e for e in events if isinstance(e, dict) and e.get("name") == CLOCK_MARKER]
    own = artifact.setdefault(KEY, {})
    if not marks or not all(
        isinstance(m.get(k), (int, float)) for m in marks for k in ("ts", "dur")
    ):
        own["sampling_error"] = "the profiler did not record the clock marker"
        return
    artifact["traceEvents"] = [
        e for e in events if not (isinstance(e, dict) and e.get("name") == CLOCK_MARKER)
    ]
    last = max(marks, key=lambda e: e["ts"] if isinstance(e.get("ts"), (int, float)) else 0)
    mid_us = last["ts"] + last["dur"] / 2

    def to_trace_us(ns: int) -> float:
        return float(mid_us + (ns - mid_ns) / 1000.0)

    for key, sampler in samplers:
        own[key] = sampler.record(to_trace_us)


def _parse_export(raw: bytes) -> dict[str, Any]:
    """The exported trace's JSON -> a dict: msgspec where it is installed (faster than the
    standard library's reader: benchmarks/RESULTS.md, "Measurements behind design choices",
    M6); the standard library where msgspec refuses the text: Kineto writes raw control
    characters in some names (strict=False reads them), NaN, or bytes that are not UTF-8
    (replaced)."""
    if msgspec is not None:
        try:
            data = msgspec.json.decode(raw)
        except (msgspec.DecodeError, ValueError):  # ValueError: not UTF-8
            pass
        else:
            if isinstance(data, dict):
                return data
    parsed: dict[str, Any] = json.loads(raw.decode("utf-8", errors="replace"), strict=False)
    return parsed


# A "name" field as Kineto writes it: alone on its line, its text copied without escaping.
_NAME_LINE = re.compile(rb'^([ \t]*"name": ")(.*)("[ \t]*,?[ \t]*\r?)$', re.MULTILINE)


def repair_names(raw: bytes) -> bytes:
    """Return Kineto's export with the quotes inside names escaped. Kineto writes a
    record_function label as is, so `say "hi"` makes the file invalid JSON; it writes one
    field per line, so each name line is escaped again whole."""

    def escape(m: re.Match[bytes]) -> bytes:
        inner = m.group(2)
        if b'"' not in inner and b"\\" not in inner:
            return m.group(0)
        fixed = inner.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
        return m.group(1) + fixed + m.group(3)

    return _NAME_LINE.sub(escape, raw)


def restore_labels(data: dict[str, Any], prof: Any, *, repaired: bool = False) -> int:
    """Put back the record_function labels Kineto altered, from the profiler's own events
    (matched by External id): it turns a backslash into '/', and a label with a tab, a
    control character or any non-ASCII character into "unknown". Looked up only when a
    label shows such a change (or the file needed repair_names); return how many labels
    were put back. (Newlines Kineto drops from a label cannot be seen, and stay dropped.)"""
    events = data.get("traceEvents")
    if not isinstance(events, list):
        return 0
    labels = [e for e in events if isinstance(e, dict) and e.get("cat") == "user_annotation"]
    suspect = [
        e
        for e in labels
        if isinstance(e.get("name"), str) and (e["name"] == "unknown" or "/" in e["name"])
    ]
    if not suspect and not repaired:
        return 0
    try:
        names = {
            e.correlation_id(): e.name()
            for e in prof.profiler.kineto_results.events()
            if e.is_user_annotation()
        }
    except (AttributeError, RuntimeError):  # another torch's event API: keep Kineto's names
        return 0
    restored = 0
    for e in suspect or labels:
        args = e.get("args")
        original = names.get(args.get("External id")) if isinstance(args, dict) else None
        if isinstance(original, str) and original != e.get("name"):
            e["name"] = original
            restored += 1
    return restored


def _export(prof: profile) -> dict[str, Any]:
    """Return the profiler's Chrome trace as a dict, through a temporary file (deleted)."""
    fd, path = tempfile.mkstemp(prefix="gpuprof_", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, "rb") as fh:
            raw = fh.read()
        try:
            data = _parse_export(raw)
            repaired = False
        except ValueError:
            data = _parse_export(repair_names(raw))
            repaired = True
        restore_labels(data, prof, repaired=repaired)
        return data
    except (OSError, ValueError, RuntimeError) as exc:
        raise CaptureError(
            f"could not export the profiler trace through {path}: {exc}; "
            "check free space in the temp directory, or use --timing-only"
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
