"""Progress on a terminal for the command line: a bar over a known number of tasks (a run's
ranks) and a ticking line for one long task (loading a 1 GB trace), both on stderr and only
when stderr is a terminal, so CI logs and pipes get none of it."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from gpuprof_nb.render.progress import Progress

# Seconds between redraws of a ticking line, and the bar's width in characters.
TICK_S = 0.25
BAR_WIDTH = 24


def stderr_is_terminal(stream: TextIO | None = None) -> bool:
    """Whether `stream` (default stderr) is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


class TerminalProgress(Progress):
    """Progress (render/progress.py) drawn as one bar line on a terminal: `N/total unit`,
    the last outcome; shown only when `enabled` and the stream is a terminal."""

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        what: str = "ranks",
        unit: str = "ranks",
    ) -> None:
        self.total = max(total, 1)
        self.what = what
        self.unit = unit
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and stderr_is_terminal(self.stream)
        self._bar = self._label = self._box = self._handle = None
        self._drawn = False

    def _draw(self, label: str) -> None:
        filled = int(BAR_WIDTH * min(self.done, self.total) / self.total)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        line = f"{self.what} [{bar}] {self.done}/{self.total} {self.unit}  {label}"
        self.stream.write("\r\x1b[K" + line[:200])
        self.stream.flush()
        self._drawn = True

    def start(self, label: str) -> None:
        if self.enabled:
            self._draw(label)

    def finish(self, outcome: str) -> None:
        self.done += 1
        if self.enabled:
            self._draw(outcome)

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


class Activity:
    """A context manager that ticks `label ... 3.2 s` on a terminal while one long task runs
    (a thread redraws it every TICK_S) and leaves `label: done in 4.1 s`; silent when not
    `enabled` or not on a terminal."""

    def __init__(self, label: str, *, enabled: bool = True, stream: TextIO | None = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and stderr_is_terminal(self.stream)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            elapsed = time.perf_counter() - self._start
            self.stream.write(f"\r\x1b[K{self.label} ... {elapsed:.1f} s")
            self.stream.flush()

    def __enter__(self) -> Activity:
        self._start = time.perf_counter()
        if self.enabled:
            self.stream.write(f"{self.label} ...")
            self.stream.flush()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.enabled:
            elapsed = time.perf_counter() - self._start
            how = "done" if kind is None else "failed"
            self.stream.write(f"\r\x1b[K{self.label}: {how} in {elapsed:.1f} s\n")
            self.stream.flush()
