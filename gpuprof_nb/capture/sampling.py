"""A statistical sampler of the Python line the cell is running, beside the profiled run.

torch.profiler's Python events (`--stack`) name functions, not the line running inside them:
all of a cell's own code is one `<module>` frame. So while the profiled run goes, the stack of
the thread running the cell is sampled every few milliseconds, from the cell's own frame
inwards, with the line of each frame, and stamped with `time.perf_counter_ns()`. The stamps
go onto the trace's clock through a marker the profiler records (capture/profiler.py), so
each sample falls inside the trace's gaps and ops.

Two ways to take a sample:
- "signal" (the default where it can run: POSIX, the cell on the main thread, SIGALRM and
  the real-time interval timer unused): the kernel's interval timer sends SIGALRM every
  5 ms and the handler, run by the cell's own thread between two bytecodes, reads the
  frame it interrupted. No lock is waited for. A C call that blocks (a GPU sync in
  `.item()`, a long op) delays the handler until it returns, while the frame still shows
  the line that made the call, so each sample stands for the time since the one before.
- "thread" (elsewhere): a daemon thread wakes every 1 ms and reads the cell thread's frame
  from `sys._current_frames()`. It needs the GIL to look, and a cell that calls many small
  torch ops (each releases the GIL and takes it straight back) can keep it waiting for
  milliseconds; its samples then land mostly on those calls' lines. Each sample stands for
  the time halfway to its neighbours, and a late sample is counted.

Why not pyinstrument (5.1.3, measured beside the profiled run: benchmarks/RESULTS.md,
section 11): it samples from a profile function it installs on the cell's thread with
`PyEval_SetProfile`, the per-thread hook torch's `with_stack` recording uses, so while it runs
torch records no Python events on that thread (none inside the cell's run, against tens of
thousands without it on the training-loop cell). It samples only at a function's call or
return, so a loop that calls nothing goes almost unsampled (a handful of samples a second of
the pure-Python loop, against this sampler's one every period), and it keeps each sample's
time since the one before, not a timestamp to place it in the trace. Its cost was not the
reason: beside the profiled run it cost about what the signal sampler does, and on its own,
without torch.profiler, it added more than the signal sampler on every cell, the most on the
pure-Python loop (section 11 has the numbers; not the +200% an earlier version of this
docstring claimed).
"""

from __future__ import annotations

import linecache
import signal
import sys
import threading
import time
from collections.abc import Callable
from operator import itemgetter
from types import CodeType, FrameType
from typing import Any

# How often the sampler looks (seconds): the signal sampler every 5 ms (200 samples a
# second), because on the benchmark machine, a 2-core VM, each SIGALRM costs a training loop
# of small ops time even with an empty handler (the control row of benchmarks/RESULTS.md,
# section 11), and every 3 ms the sampler added more to that loop than the 3% goal
# (benchmarks/RESULTS.md, "Measurements behind design choices", M17; section 11 measures
# the 5 ms period); the sampling thread, whose wake-ups cost less, every 1 ms. And the
# switch interval while the thread samples.
SIGNAL_PERIOD_S = 0.005
THREAD_PERIOD_S = 0.001
SWITCH_INTERVAL_S = 0.0005
# A sample due more than this many periods ago is late.
LATE_PERIODS = 3
# Deepest stack kept (frames nearest the cell kept; deeper library frames cut).
MAX_DEPTH = 128
# Longest line text kept.
MAX_TEXT = 120


class LineSampler:
    """Samples the stack of the calling thread below the frame running `cell_code`.

    `start()` on the thread that will run the cell, `stop()` after (idempotent, never
    raises, puts back what it changed), then `record(to_trace_us)` for the artifact entry
    (see io/samples.py). Samples taken while no frame of `cell_code` is on the stack (before
    the cell starts, after it ends) are dropped. `mode` forces "signal" or "thread"; by
    default the signal sampler runs wherever it can (see the module)."""

    def __init__(
        self, cell_code: CodeType, *, period_s: float | None = None, mode: str | None = None
    ) -> None:
        if mode not in (None, "signal", "thread"):
            raise ValueError(f"mode must be 'signal' or 'thread', got {mode!r}")
        self.cell_code = cell_code
        self.mode = mode or ("signal" if signal_sampling_possible() else "thread")
        # The handler runs on the cell's thread, where torch's with_stack recording sees it:
        # the profiler takes its calls out of the trace (capture/profiler.py).
        self.own_code: tuple[CodeType, ...] = (
            (LineSampler._on_signal.__code__,) if self.mode == "signal" else ()
        )
        self.period_s = period_s or (SIGNAL_PERIOD_S if self.mode == "signal" else THREAD_PERIOD_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running = False
        self._in_handler = False
        self._target = 0
        self._old_switch: float | None = None
        self._old_handler: Any = None
        # (code, line) pairs of a stack, interned: stack key -> stack id.
        self._stack_ids: dict[tuple[tuple[CodeType, int], ...], int] = {}
        self._ts: list[int] = []
        self._of: list[int] = []
        self._late = 0
        self._start_ns = 0
        self._end_ns = 0
        self.error: str | None = None

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._target = threading.get_ident()
        self._start_ns = time.perf_counter_ns()
        if self.mode == "signal":
            self._old_handler = signal.signal(signal.SIGALRM, self._on_signal)
            # Restart the system calls the signal interrupts where the kernel can.
            signal.siginterrupt(signal.SIGALRM, False)
            signal.setitimer(signal.ITIMER_REAL, self.period_s, self.period_s)
            return
        self._old_switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._old_switch, SWITCH_INTERVAL_S))
        self._thread = threading.Thread(
            target=self._loop, name="gpuprof_nb line sampler", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        try:
            if self.mode == "signal":
                signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
                # Ignoring the signal discards one still pending, which the default action
                # would turn into the end of the process.
                signal.signal(signal.SIGALRM, signal.SIG_IGN)
                signal.signal(signal.SIGALRM, self._old_handler)
            else:
                self._stop.set()
                if self._thread is not None:
                    self._thread.join(timeout=5.0)
                    self._thread = None
                if self._old_switch is not None:
                    sys.setswitchinterval(self._old_switch)
                    self._old_switch = None
        except Exception as exc:  # noqa: BLE001 - never over the cell's own outcome
            self.error = f"stopping: {type(exc).__name__}: {exc}"
        self._end_ns = time.perf_counter_ns()

    def __enter__(self) -> LineSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _keep(self, frame: FrameType, now: int) -> None:
        key = _stack_key(frame, self.cell_code)
        if key is None:
            return
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self._stack_ids)
        self._ts.append(now)
        self._of.append(sid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A signal that comes while this handler runs (a slow sample on a loaded machine)
        # calls it again inside itself: that sample is dropped, so samples stay in time order.
        # The flag goes up before the clock is read: a signal handled right after that read
        # (Python runs pending handlers after a call returns) would otherwise record a later
        # time first, and the samples would go back in time (seen on an H100 machine's first
        # profiled cell: the whole sample set was then rejected by the reader).
        if self._in_handler:
            return
        self._in_handler = True
        now = time.perf_counter_ns()
        try:
            if frame is not None and self._running:
                self._keep(frame, now)
        except Exception as exc:  # noqa: BLE001 - never into the user's cell; noted instead
            self.error = f"{type(exc).__name__}: {exc}"
            signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
        finally:
            self._in_handler = False

    def _loop(self) -> None:
        try:
            self._sample_until_stopped()
        except Exception as exc:  # noqa: BLE001 - never into the user's cell; noted instead
            self.error = f"{type(exc).__name__}: {exc}"

    def _sample_until_stopped(self) -> None:
        period_ns = int(self.period_s * 1e9)
        late_ns = LATE_PERIODS * period_ns
        target = self._target
        frames_of = sys._current_frames
        clock = time.perf_counter_ns
        due = clock() + period_ns
        wait = self._stop.wait
        while not wait(self.period_s):
            frame = frames_of().get(target)
            now = clock()
            if now - due > late_ns:
                self._late += 1
            due = now + period_ns
            if frame is not None:
                self._keep(frame, now)

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]:
        """Return the samples as the JSON-able entry io/samples.py reads: frames as
        [file, line, function, text], stacks as frame indices (outermost first), sample
        times on the trace clock (us), and how they were taken (`mode`)."""
        frame_ids: dict[tuple[CodeType, int], int] = {}
        frames: list[list[Any]] = []
        stacks: list[list[int]] = []
        for key in self._stack_ids:  # insertion order: stack id order
            stack = []
            for code, line in key:
                fid = frame_ids.get((code, line))
                if fid is None:
                    fid = frame_ids[(code, line)] = len(frames)
                    text = linecache.getline(code.co_filename, line).strip()[:MAX_TEXT]
                    name = getattr(code, "co_qualname", code.co_name)
                    frames.append([code.co_filename, line, name, text])
                stack.append(fid)
            stacks.append(stack)
        order = sorted(zip(self._ts, self._of, strict=True), key=itemgetter(0))
        entry: dict[str, Any] = {
            "mode": self.mode,
            "period_us": self.period_s * 1e6,
            "start_us": to_trace_us(self._start_ns),
            "end_us": to_trace_us(self._end_ns or time.perf_counter_ns()),
            "frames": frames,
            "stacks": stacks,
            # In time order whatever order they were taken in (the reader requires it).
            "ts_us": [round(to_trace_us(t), 3) for t, _ in order],
            "stack_of": [sid for _, sid in order],
            "late": self._late,
        }
        if self.error:
            entry["error"] = self.error
        return entry


def signal_sampling_possible() -> bool:
    """Whether the signal sampler can run here: a POSIX interval timer, the main thread
    (only it may set handlers), and SIGALRM and the real-time timer free for us."""
    if (
        not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        return False
    try:
        return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None) and signal.getitimer(
            signal.ITIMER_REAL
        ) == (0.0, 0.0)
    except (OSError, ValueError):
        return False


def _stack_key(frame: FrameType, code: CodeType) -> tuple[tuple[CodeType, int], ...] | None:
    """Return the (code, line) pairs from the outermost frame running `code` in to `frame`,
    or None when no frame runs `code` (the cell has not started or has ended)."""
    chain: list[tuple[CodeType, int]] = []
    f: FrameType | None = frame
    while f is not None:
        chain.append((f.f_code, f.f_lineno or 0))
        if f.f_code is code:
            break
        f = f.f_back
    else:
        return None
    chain.reverse()
    if len(chain) > MAX_DEPTH:
        chain = chain[:MAX_DEPTH]
    return tuple(chain)
