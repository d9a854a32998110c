"""Exact line events for the user's own code, beside the profiled run (`%%gpuprofile --stack`).

A statistical sampler (capture/sampling.py) sees the cell only where CPython checks for
signals: on a backward jump (a loop's head) and on calls. So in a loop whose body calls
nothing that blocks, the samples land on the `for` line, not on the line doing the work.
This tracer does not sample: it is told, by the interpreter, each time a line of the user's
own code starts, and stamps it with `time.perf_counter_ns()`, the clock the samplers share
(capture/profiler.py puts it on the trace's clock). Each stamp opens a stretch of time that
belongs to that line, with the stack of frames from the cell's own frame in to it, until the
next stamp; so the time between two torch ops (the idle gaps) goes to the line that was
running, whatever the interpreter was doing then.

Only the user's code is watched: the cell, the code it defines, functions defined in other
cells, and files outside site-packages and the standard library (sources.frame_kind).
Library code pays at most one cheap call per function:
- Python 3.12+ ("monitoring"): `sys.monitoring` LINE, PY_RETURN and PY_YIELD events are
  switched on for the user's code objects only (`set_local_events`); a global PY_START
  event finds the user's functions as they are first called and is switched off
  (`DISABLE`) for every code object after its first call.
- Python 3.10/3.11 ("settrace"): `sys.settrace` with a global function that gives a local
  tracer to the user's frames only; library frames get that one call event.

Code whose events would cost more than a few percent is traced in bursts: a tight loop (a
line every couple of microseconds) and, with settrace, code that calls many library
functions (each call passes through the global function; a training loop's torch modules
and optimizer). Every burst (BURST_NS) is costed from its events and library calls; past
MAX_COST_SHARE of it, the events go off for long enough to bring the run's share down to
QUIET_TARGET_SHARE, and a one-shot SIGALRM turns them on again. The quiet stretch is shared
among the lines in the proportions the burst before it measured (the entry says how much
time was shared out so). Without SIGALRM (off the main thread, the timer in use) the events
stay on.

The entry it records has the line sampler's shape (io/samples.py), with mode "exact": each
time opens a stretch that lasts until the next one (the last until `end_us`); an empty stack
is time outside the cell.
"""

from __future__ import annotations

import bisect
import linecache
import os
import signal
import sys
import time
from _thread import get_ident as _get_ident
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

from gpuprof_nb.capture.sampling import MAX_DEPTH, MAX_TEXT, signal_sampling_possible
from gpuprof_nb.model.frames import frame_kind

# Events looked at before the rate is checked, and the mean time between them under which
# they go quiet. A line event costs a fraction of a microsecond with settrace (Python 3.11),
# less with sys.monitoring: a line every few microseconds makes that a large share of the
# run (benchmarks/RESULTS.md, "Measurements behind design choices", M16; section 16
# measures the recorder's cost as shipped, and without the back-off).
BURST_EVENTS = 256
# A burst lasts this long (checked at the next new line); the events and library calls in it
# are costed at COST_NS each (line event, library call), from what each was measured to cost
# on the benchmark machine (M16): with settrace, a line event, and each library call (its
# frame made for the tracer, the global function, a check at each of its lines: a torch
# training loop ran measurably slower with a global function that does nothing); with
# sys.monitoring a line event costs less, and its library calls nothing after their first.
BURST_NS = 1_000_000
COST_NS = {"settrace": (250, 350), "monitoring": (100, 0)}
# Past this share of a burst the events go quiet, for long enough that the run pays
# QUIET_TARGET_SHARE in all (wake-up included), within QUIET_MIN_S..QUIET_MAX_S: short
# enough that a loop's end is placed within milliseconds, long against the wake-up signal
# (tens of microseconds: M16).
MAX_COST_SHARE = 0.025
QUIET_TARGET_SHARE = 0.003
QUIET_MIN_S = 0.002
QUIET_MAX_S = 0.01
# The stretches just before a quiet one whose stacks it is shared among: the loop's own
# lines, not a slower line that led into it.
MIX_SEGMENTS = 64
# A stretch this long (ns) or longer is checked for time the thread waited for a core while
# other processes ran (SCHEDSTAT's run delay): that time is not the line's. A preemption
# lasts a scheduler slice (milliseconds), so it makes its stretch at least this long.
LONG_NS = 500_000
SCHEDSTAT = "/proc/thread-self/schedstat"
# At a wake-up, how far up from the interrupted frame a frame of the user's is looked for.
WAKE_DEPTH = 4
# sys.monitoring tool ids tried, in order (PROFILER_ID first).
TOOL_IDS = (2, 3, 4, 5)
TOOL_NAME = "gpuprof_nb line tracer"
# Stack ids with a meaning of their own in the raw record: time outside the cell, and a
# quiet stretch shared out at record().
OUTSIDE = -1
QUIET = -2

Stack = tuple[tuple[CodeType, int], ...]

# Whether each file seen holds the user's code, across runs (bounded).
_USER_FILES: dict[str, bool] = {}
_MAX_FILES = 50_000


def _is_user_file(filename: str) -> bool:
    return frame_kind(filename) == "user"


def _monitoring() -> Any:
    """sys.monitoring (Python 3.12+; typed loosely: the type checker runs on 3.11)."""
    return sys.monitoring  # type: ignore[attr-defined,unused-ignore]


def default_engine() -> str | None:
    """Return the engine this interpreter offers ("monitoring" on 3.12+, "settrace" before),
    or None where neither is free: another tool holds sys.settrace (a debugger, coverage),
    or every sys.monitoring tool id is taken."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        if any(monitoring.get_tool(t) is None for t in TOOL_IDS):
            return "monitoring"
        return None
    return "settrace" if sys.gettrace() is None else None


class LineTracer:
    """Exact per-line time for the user's code below the frame running `cell_code`.

    `start()` on the thread that will run the cell, `stop()` after (idempotent, never
    raises, puts back what it changed), then `record(to_trace_us)` for the artifact entry.
    `engine` forces "monitoring" or "settrace" (default: default_engine()); `backoff=False`
    keeps the events on in tight loops. `is_user(filename)` says whose code a file holds
    (default: sources.frame_kind says "user"); the cell's own file is always the user's."""

    def __init__(
        self,
        cell_code: CodeType,
        *,
        engine: str | None = None,
        backoff: bool = True,
        is_user: Callable[[str], bool] | None = None,
    ) -> None:
        engine = engine or default_engine()
        if engine not in ("monitoring", "settrace"):
            raise ValueError(f"no line-event engine here (got {engine!r})")
        if engine == "monitoring" and not hasattr(sys, "monitoring"):
            raise ValueError("sys.monitoring needs Python 3.12 or later")
        self.cell_code = cell_code
        self.engine = engine
        self.mode = "exact"
        self._backoff_wanted = backoff
        self._is_user_file = is_user or _is_user_file
        self._user: dict[CodeType, bool] = {}
        self._tracked: list[CodeType] = []
        # The signal handler runs on the cell's thread, where torch's with_stack recording
        # sees it: the profiler takes its calls out of the trace (capture/profiler.py).
        self.own_code: tuple[CodeType, ...] = (LineTracer._wake.__code__,)
        self._running = False
        self._backoff = False
        self._thread = 0
        self._tool: int | None = None
        self._old_handler: Any = None
        # The context of the latest event: its frame (settrace) or code (monitoring), and
        # {line: stack id} for lines of that frame under its callers.
        self._frame: FrameType | None = None
        self._code: CodeType | None = None
        self._lines: dict[int, int] = {}
        self._prefix: Stack = ()
        self._contexts: dict[tuple[Stack, int], tuple[CodeType, dict[int, int]]] = {}
        self._stacks: list[Stack] = []
        self._last = OUTSIDE
        self._ts: list[int] = []
        self._of: list[int] = []
        # Per quiet stretch: its index in the record and when the burst before it began.
        self._quiet: dict[int, int] = {}
        self._quiet_now = False
        self._count = 0
        self._calls = 0
        self._burst_start = 0
        self._events = 0
        # The time this thread waited for a core (Linux schedstat), per stretch index.
        self._delay_fd: int | None = None
        self._delay_seen = 0
        self._lost: dict[int, int] = {}
        self._start_ns = 0
        self._end_ns = 0
        self.error: str | None = None

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._thread = _get_ident()
        self._open_delay()
        self._start_ns = self._burst_start = time.perf_counter_ns()
        self._backoff = self._backoff_wanted and signal_sampling_possible()
        if self._backoff:
            self._old_handler = signal.signal(signal.SIGALRM, self._wake)
            signal.siginterrupt(signal.SIGALRM, False)
        if self.engine == "monitoring":
            self._start_monitoring()
        else:
            sys.settrace(self._global)

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._end_ns = time.perf_counter_ns()
        if self._ts and self._end_ns - self._ts[-1] >= LONG_NS:
            self._check_lost(self._end_ns)
        if self._delay_fd is not None:
            os.close(self._delay_fd)
            self._delay_fd = None
        try:
            if self.engine == "monitoring":
                self._stop_monitoring()
            else:
                sys.settrace(None)
        except Exception as exc:  # noqa: BLE001 - never over the cell's own outcome
            self.error = f"stopping: {type(exc).__name__}: {exc}"
        if self._backoff:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
                # Ignoring the signal discards one still pending, which the default action
                # would turn into the end of the process.
                signal.signal(signal.SIGALRM, signal.SIG_IGN)
                signal.signal(signal.SIGALRM, self._old_handler)
            except Exception as exc:  # noqa: BLE001
                self.error = f"stopping the wake-up timer: {type(exc).__name__}: {exc}"

    def __enter__(self) -> LineTracer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_monitoring(self) -> None:
        mon = _monitoring()
        tool = next((t for t in TOOL_IDS if mon.get_tool(t) is None), None)
        if tool is None:
            raise RuntimeError("every sys.monitoring tool id is taken")
        mon.use_tool_id(tool, TOOL_NAME)
        self._tool = tool
        ev = mon.events
        mon.register_callback(tool, ev.LINE, self._mon_line)
        mon.register_callback(tool, ev.PY_RETURN, self._mon_leave)
        mon.register_callback(tool, ev.PY_YIELD, self._mon_leave)
        mon.register_callback(tool, ev.PY_START, self._mon_start)
        # PY_START was switched off (DISABLE) for every code object an earlier run met;
        # this turns it on again, so the user's functions are found whatever ran before.
        mon.restart_events()
        for code in _nested_codes(self.cell_code):
            self._user[code] = True
            self._track(code)
        mon.set_events(tool, ev.PY_START)

    def _stop_monitoring(self) -> None:
        mon = _monitoring()
        tool = self._tool
        if tool is None:
            return
        self._tool = None
        mon.set_events(tool, 0)
        for code in self._tracked:
            mon.set_local_events(tool, code, 0)
        for event in (mon.events.LINE, mon.events.PY_RETURN, mon.events.PY_YIELD):
            mon.register_callback(tool, event, None)
        mon.register_callback(tool, mon.events.PY_START, None)
        mon.free_tool_id(tool)

    def _local_events(self) -> int:
        ev = _monitoring().events
        return int(ev.LINE | ev.PY_RETURN | ev.PY_YIELD)

    def _track(self, code: CodeType) -> None:
        self._tracked.append(code)
        if not self._quiet_now and self._tool is not None:
            _monitoring().set_local_events(self._tool, code, self._local_events())

    def _user_code(self, code: CodeType) -> bool:
        got = self._user.get(code)
        if got is None:
            filename = code.co_filename
            if filename == self.cell_code.co_filename:
                got = True
            elif self._is_user_file is _is_user_file:
                # The file's kind, judged once per process: a training loop meets hundreds
                # of library code objects, each new to every run's tracer.
                got = _USER_FILES.get(filename)
                if got is None:
                    if len(_USER_FILES) >= _MAX_FILES:
                        _USER_FILES.clear()
                    got = _USER_FILES[filename] = _is_user_file(filename)
            else:
                got = self._is_user_file(filename)
            self._user[code] = got
        return got

    # -- events ----------------------------------------------------------------------------

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        """settrace's global function: a local tracer for the user's frames only; the
        library calls it sees are counted (each costs the run, see _check_cost)."""
        code = frame.f_code
        got = self._user.get(code)
        if got is None:
            got = self._user_code(code)
        if got:
            return self._local
        self._calls += 1
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            if frame is not self._frame:
                self._enter(frame)
            line = frame.f_lineno
            sid = self._lines.get(line)
            if sid is None:
                sid = self._new_stack(line)
            self._count += 1
            if sid != self._last:
                self._last = sid
                now = time.perf_counter_ns()
                ts = self._ts
                if ts and now - ts[-1] >= LONG_NS:
                    self._check_lost(now)
                ts.append(now)
                self._of.append(sid)
                if now - self._burst_start >= BURST_NS:
                    self._check_cost(now)
            elif self._count >= BURST_EVENTS:
                self._check_cost(time.perf_counter_ns())
        elif event == "return":
            self._leave(frame)
        return self._local

    def _mon_start(self, code: CodeType, offset: int) -> Any:
        if self._user_code(code) and code not in self._tracked:
            self._track(code)
        return _monitoring().DISABLE

    def _mon_line(self, code: CodeType, line: int) -> Any:
        # sys.monitoring's events fire on every thread: only the cell's counts.
        if _get_ident() != self._thread:
            return None
        if code is not self._code:
            self._enter(sys._getframe(1))
        sid = self._lines.get(line)
        if sid is None:
            sid = self._new_stack(line)
        self._count += 1
        if sid != self._last:
            self._last = sid
            now = time.perf_counter_ns()
            ts = self._ts
            if ts and now - ts[-1] >= LONG_NS:
                self._check_lost(now)
            ts.append(now)
            self._of.append(sid)
            if now - self._burst_start >= BURST_NS:
                self._check_cost(now)
        elif self._count >= BURST_EVENTS:
            self._check_cost(time.perf_counter_ns())

    def _mon_leave(self, code: CodeType, offset: int, value: object) -> Any:
        if _get_ident() != self._thread:
            return None
        self._leave(sys._getframe(1))

    def _enter(self, frame: FrameType) -> None:
        """Make `frame` (a user frame, now running) the context of the events that follow."""
        prefix = _chain(frame.f_back, self.cell_code) if frame.f_code is not self.cell_code else ()
        self._frame = frame
        self._code = frame.f_code
        if prefix is None:  # not below the cell: every line of it is outside the cell
            self._lines = _Always(OUTSIDE)
            return
        key = (prefix, id(frame.f_code))
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = (frame.f_code, {})
        self._lines = ctx[1]
        self._prefix = prefix

    def _new_stack(self, line: int) -> int:
        code = self._code
        if code is None:
            return OUTSIDE
        stack = (*self._prefix, (code, line))
        if len(stack) > MAX_DEPTH:
            stack = stack[:MAX_DEPTH]
        sid = len(self._stacks)
        self._stacks.append(stack)
        self._lines[line] = sid
        return sid

    def _leave(self, frame: FrameType) -> None:
        """A user frame returns or yields: the time goes to the user frame it returns to,
        at the line that called it; or outside, when the cell's own frame ends."""
        now = time.perf_counter_ns()
        up = None if frame.f_code is self.cell_code else frame.f_back
        while up is not None and not self._user_code(up.f_code):
            up = up.f_back
        if up is None:
            self._mark(now, OUTSIDE)
            self._frame = self._code = None
            return
        self._enter(up)
        line = up.f_lineno
        sid = self._lines.get(line)
        if sid is None:
            sid = self._new_stack(line)
        self._mark(now, sid)

    def _mark(self, now: int, sid: int) -> None:
        if sid != self._last:
            self._last = sid
            if self._ts and now - self._ts[-1] >= LONG_NS:
                self._check_lost(now)
            self._ts.append(now)
            self._of.append(sid)

    # -- time other work took --------------------------------------------------------------

    def _open_delay(self) -> None:
        """Open this thread's scheduler statistics (Linux): the time it has waited for a
        core while ready to run, read again at the end of each long stretch."""
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return
        try:
            self._delay_fd = fd
            self._delay_seen = self._read_delay()
        except (OSError, ValueError, IndexError):
            os.close(fd)
            self._delay_fd = None

    def _read_delay(self) -> int:
        assert self._delay_fd is not None
        return int(os.pread(self._delay_fd, 128, 0).split()[1])

    def _check_lost(self, now: int) -> None:
        """A stretch ends that lasted LONG_NS or more: the time the thread waited for a core
        since the last look (other processes had the CPU) is charged to it, up to its
        length. A wait that long ends a stretch of its own, so it lands in the right one."""
        if self._delay_fd is None or not self._ts:
            return
        try:
            delay = self._read_delay()
        except (OSError, ValueError, IndexError):
            return
        lost = delay - self._delay_seen
        self._delay_seen = delay
        if lost > 0:
            i = len(self._ts) - 1
            self._lost[i] = self._lost.get(i, 0) + min(lost, now - self._ts[i])

    # -- tight loops -----------------------------------------------------------------------

    def _check_cost(self, now: int) -> None:
        """At the end of a burst (BURST_NS, or BURST_EVENTS events on one line): what the
        events and the library calls since its start cost, by the measured cost of each;
        past MAX_COST_SHARE of the burst, the events go quiet long enough to bring the run's
        share down to QUIET_TARGET_SHARE (QUIET_MIN_S to QUIET_MAX_S)."""
        elapsed = now - self._burst_start
        event_ns, call_ns = COST_NS[self.engine]
        cost = self._count * event_ns + self._calls * call_ns
        self._events += self._count
        self._count = self._calls = 0
        if elapsed > 0 and cost > MAX_COST_SHARE * elapsed and self._backoff and self._running:
            share = cost / elapsed
            quiet_s = elapsed * (share / QUIET_TARGET_SHARE - 1) / 1e9
            self._go_quiet(now, min(max(quiet_s, QUIET_MIN_S), QUIET_MAX_S))
        else:
            self._burst_start = now

    def _go_quiet(self, now: int, quiet_s: float) -> None:
        if self._ts and now - self._ts[-1] >= LONG_NS:
            self._check_lost(now)
        self._quiet[len(self._ts)] = self._burst_start
        self._ts.append(now)
        self._of.append(QUIET)
        self._last = QUIET
        self._quiet_now = True
        if self.engine == "monitoring":
            if self._tool is not None:
                for code in self._tracked:
                    _monitoring().set_local_events(self._tool, code, 0)
        else:
            sys.settrace(None)
        signal.setitimer(signal.ITIMER_REAL, quiet_s)

    def _wake(self, signum: int, frame: FrameType | None) -> None:
        """The one-shot timer after a quiet stretch: events on again. When the interrupted
        frame, or one of the WAKE_DEPTH frames around it, is the user's, the time from now
        is its line's (a sleep that followed a tight loop is the sleep's from here on);
        otherwise the quiet stretch goes on to the next line event. Walking a deep stack
        makes every frame on it an object, which made each wake far dearer on a training
        loop (benchmarks/RESULTS.md, "Measurements behind design choices", M16)."""
        if not (self._running and self._quiet_now):
            return
        now = time.perf_counter_ns()
        self._quiet_now = False
        self._burst_start = now
        self._count = self._calls = 0
        try:
            if self.engine == "monitoring":
                if self._tool is not None:
                    events = self._local_events()
                    for code in self._tracked:
                        _monitoring().set_local_events(self._tool, code, events)
            else:
                sys.settrace(self._global)
            inner = frame
            depth = 0
            while inner is not None and depth < WAKE_DEPTH and not self._user_code(inner.f_code):
                inner = inner.f_back
                depth += 1
            if inner is None or not self._user_code(inner.f_code):
                return
            if self.engine == "settrace" and inner.f_trace is None:
                # Began while the events were off: it has no local tracer yet.
                inner.f_trace = self._local
            self._enter(inner)
            line = inner.f_lineno
            sid = self._lines.get(line)
            if sid is None:
                sid = self._new_stack(line)
            self._mark(now, sid)
        except Exception as exc:  # noqa: BLE001 - never into the user's cell; noted instead
            self.error = f"{type(exc).__name__}: {exc}"

    # -- the record ------------------------------------------------------------------------

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]:
        """Return the line events as the JSON-able entry io/samples.py reads (mode "exact":
        each time opens a stretch of its stack that lasts until the next time)."""
        end = self._end_ns or time.perf_counter_ns()
        ts, of, shared_ns = _share_quiet(self._ts, self._of, self._quiet, end)
        lost = _spread_lost(self._ts, self._lost, ts, end)
        frame_ids: dict[tuple[CodeType, int], int] = {}
        frames: list[list[Any]] = []
        stacks: list[list[int]] = []
        used = sorted(set(of))
        new_id = {}
        for sid in used:
            new_id[sid] = len(stacks)
            if sid == OUTSIDE:
                stacks.append([])
                continue
            stack = []
            for code, line in self._stacks[sid]:
                fid = frame_ids.get((code, line))
                if fid is None:
                    fid = frame_ids[(code, line)] = len(frames)
                    text = linecache.getline(code.co_filename, line).strip()[:MAX_TEXT]
                    name = getattr(code, "co_qualname", code.co_name)
                    frames.append([code.co_filename, line, name, text])
                stack.append(fid)
            stacks.append(stack)
        entry: dict[str, Any] = {
            "mode": "exact",
            "engine": self.engine,
            "period_us": 0.0,
            "start_us": to_trace_us(self._start_ns),
            "end_us": to_trace_us(end),
            "frames": frames,
            "stacks": stacks,
            "ts_us": [round(to_trace_us(t), 3) for t in ts],
            "stack_of": [new_id[s] for s in of],
            "late": 0,
            "events": self._events + self._count,
            "shared_us": round(shared_ns / 1000, 3),
            # [stretch index, us]: time in it the thread waited for a core (other work).
            "lost_us": [[i, round(ns / 1000, 3)] for i, ns in lost if ns >= 1000],
        }
        if self.error:
            entry["error"] = self.error
        return entry


class _Always(dict):  # type: ignore[type-arg]
    """A {line: stack id} map that gives one id for every line (frames outside the cell)."""

    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def get(self, key: Any, default: Any = None) -> Any:
        return self.value


def _share_quiet(
    ts: list[int], of: list[int], quiet: dict[int, int], end: int
) -> tuple[list[int], list[int], int]:
    """Replace each quiet stretch by stretches of the stacks the burst before it measured
    (its last MIX_SEGMENTS stretches), in the same proportions; return the times, the stack
    ids and the time shared out (ns)."""
    if not quiet:
        return list(ts), list(of), 0
    out_ts: list[int] = []
    out_of: list[int] = []
    shared = 0
    n = len(ts)
    for i in range(n):
        if of[i] != QUIET:
            out_ts.append(ts[i])
            out_of.append(of[i])
            continue
        lo, hi = ts[i], ts[i + 1] if i + 1 < n else end
        mix: dict[int, int] = {}
        begin = quiet[i]
        for j in range(i - 1, max(i - MIX_SEGMENTS, 0) - 1, -1):
            a, b = ts[j], ts[j + 1]
            if b <= begin:
                break
            if of[j] >= 0:
                mix[of[j]] = mix.get(of[j], 0) + b - max(a, begin)
        total = sum(mix.values())
        if total <= 0:
            before = next((of[j] for j in range(i - 1, -1, -1) if of[j] != QUIET), OUTSIDE)
            mix, total = {before: 1}, 1
        shared += hi - lo
        at = lo
        for sid in sorted(mix, key=lambda s: (-mix[s], s)):
            out_ts.append(at)
            out_of.append(sid)
            at += (hi - lo) * mix[sid] // total
    # Neighbours with one stack merge (a burst's stack continued by its share).
    merged_ts: list[int] = []
    merged_of: list[int] = []
    for t, s in zip(out_ts, out_of, strict=True):
        if merged_of and merged_of[-1] == s:
            continue
        merged_ts.append(t)
        merged_of.append(s)
    return merged_ts, merged_of, shared


def _spread_lost(
    raw_ts: list[int], lost: dict[int, int], ts: list[int], end: int
) -> list[tuple[int, int]]:
    """The lost time of each raw stretch, spread over the recorded stretches (a quiet one is
    split in several) in proportion to their overlap with it: [(index in ts, ns)]."""
    if not lost:
        return []
    bounds = [*ts, end]
    out: dict[int, float] = {}
    for i, ns in lost.items():
        a = raw_ts[i]
        b = raw_ts[i + 1] if i + 1 < len(raw_ts) else end
        if b <= a:
            continue
        k = max(bisect.bisect_right(ts, a) - 1, 0)
        while k < len(ts) and bounds[k] < b:
            overlap = min(bounds[k + 1], b) - max(bounds[k], a)
            if overlap > 0:
                out[k] = out.get(k, 0.0) + ns * overlap / (b - a)
            k += 1
    return sorted((k, round(v)) for k, v in out.items())


def _chain(frame: FrameType | None, code: CodeType) -> Stack | None:
    """Return the (code, line) pairs from the outermost frame running `code` in to `frame`,
    or None when no frame runs `code` (not below the cell)."""
    chain: list[tuple[CodeType, int]] = []
    f = frame
    while f is not None:
        chain.append((f.f_code, f.f_lineno or 0))
        if f.f_code is code:
            break
        f = f.f_back
    else:
        return None
    chain.reverse()
    return tuple(chain)


def _nested_codes(code: CodeType) -> Iterator[CodeType]:
    """The code object and every code object defined inside it (functions, classes,
    comprehensions), at any depth."""
    todo = [code]
    while todo:
        c = todo.pop()
        yield c
        todo.extend(k for k in c.co_consts if isinstance(k, CodeType))
