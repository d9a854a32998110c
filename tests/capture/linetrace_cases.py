"""Planted cells for the exact line tracer (capture/linetrace.py), with the standard library
only: test_linetrace.py runs them in this interpreter, and runs this file as a script under
every other Python found (3.12+ takes the sys.monitoring road, 3.10/3.11 sys.settrace), which
need neither torch nor numpy nor pytest. `python linetrace_cases.py` runs them all and
prints one line per case."""

from __future__ import annotations

import heapq
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

if __name__ == "__main__" and "gpuprof_nb" not in sys.modules:
    # Run as a script under another Python, which has no numpy: the package's own modules
    # that the tracer needs are standard library only, its __init__ is not (it registers the
    # results' displays), so the package is entered without it.
    import types
    from pathlib import Path

    _package = types.ModuleType("gpuprof_nb")
    _package.__path__ = [str(Path(__file__).resolve().parents[2] / "gpuprof_nb")]
    sys.modules["gpuprof_nb"] = _package

from gpuprof_nb.capture.linetrace import LineTracer, default_engine  # noqa: E402
from gpuprof_nb.io.samples import samples_of

# A notebook cell's file name, so the labels and the user/library split are a cell's.
CELL = "<ipython-input-7-0a1b2c3d>"
OTHER_CELL = "<ipython-input-3-4e5f6a7b>"


def traced(
    body: str, namespace: dict[str, Any] | None = None, **kw: Any
) -> tuple[LineTracer, dict[str, Any]]:
    """Run `body` as a cell under the tracer; return the tracer and its record read back."""
    code = compile(body, CELL, "exec")
    tracer = LineTracer(code, **kw)
    ns = dict(namespace or {})
    with tracer:
        exec(code, ns)
    entry = tracer.record(lambda ns_: ns_ / 1000)
    parsed = samples_of({"gpuprof_nb": {"samples": entry}})
    assert parsed is not None and parsed.mode == "exact", entry.get("mode")
    return tracer, entry


def time_by_stack(entry: dict[str, Any]) -> Counter[tuple[tuple[str, int], ...]]:
    """Microseconds per stack, each stack as ((function, line), ...) from the cell inward;
    time outside the cell under ()."""
    ts = [*entry["ts_us"], entry["end_us"]]
    frames = entry["frames"]
    out: Counter[tuple[tuple[str, int], ...]] = Counter()
    for i, sid in enumerate(entry["stack_of"]):
        key = tuple((frames[f][2], frames[f][1]) for f in entry["stacks"][sid])
        out[key] += ts[i + 1] - ts[i]
    return out


def time_by_line(entry: dict[str, Any]) -> Counter[tuple[str, int]]:
    """Microseconds per innermost (function, line), outside the cell left out."""
    out: Counter[tuple[str, int]] = Counter()
    for stack, us in time_by_stack(entry).items():
        if stack:
            out[stack[-1]] += us
    return out


def share(counter: Counter[Any], key: Any) -> float:
    total = sum(counter.values())
    return counter[key] / total if total else 0.0


def nothing_left_behind(handler: Any) -> None:
    assert sys.gettrace() is None
    assert signal.getsignal(signal.SIGALRM) == handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    if hasattr(sys, "monitoring"):
        assert all(sys.monitoring.get_tool(t) is None for t in (2, 3, 4, 5))


def case_per_sample_loop() -> None:
    """The issue's per-sample loop: the body line holds the work, not the `for` line."""
    rows = [[float(j) for j in range(64)] for _ in range(1500)]
    handler = signal.getsignal(signal.SIGALRM)
    tracer, entry = traced(
        "out = []\nfor row in xs:\n    out.append(float(sum(row)) * 2.0 + sum(range(300)))\n",
        {"xs": rows},
    )
    lines = time_by_line(entry)
    assert lines.most_common(1)[0][0] == ("<module>", 3), lines
    assert share(lines, ("<module>", 3)) > 0.6, lines
    assert tracer.error is None
    nothing_left_behind(handler)


def case_sleep_in_loop() -> None:
    """A sleep inside `for _ in range(3):`: the sleep's line, every time, and its time whole."""
    _, entry = traced(
        "y = 0\nfor _ in range(3):\n    time.sleep(0.02)\n    y = y + 1\n", {"time": time}
    )
    lines = time_by_line(entry)
    assert lines.most_common(1)[0][0] == ("<module>", 3), lines
    assert lines[("<module>", 3)] > 3 * 20_000 * 0.95
    assert share(lines, ("<module>", 3)) > 0.95, lines


def case_functions_of_other_cells_through_a_library() -> None:
    """A function another cell defined, called through a standard-library frame: its own
    lines, below the cell's calling line, with the library frame between."""
    ns: dict[str, Any] = {"heapq": heapq}
    exec(
        compile(
            "def weight(v):\n    s = 0\n    for q in range(2000):\n        s += q * v\n"
            "    return s\n",
            OTHER_CELL,
            "exec",
        ),
        ns,
    )
    _, entry = traced("top = heapq.nlargest(3, range(60), key=weight)\ndone = 1\n", ns)
    stacks = time_by_stack(entry)
    inner = [s for s in stacks if s and s[-1][0] == "weight"]
    assert inner, stacks
    for stack in inner:
        assert stack[0] == ("<module>", 1), stack
        assert stack[1][0] == "nlargest", stack  # the library frame between
    lines = time_by_line(entry)
    in_weight = sum(us for (fn, _), us in lines.items() if fn == "weight")
    assert in_weight > 0.8 * sum(lines.values()), lines


def case_return_goes_back_to_the_calling_line() -> None:
    """After a user function returns, the rest of the calling line is that line's: here a
    sleep on the same line, after the call."""
    ns: dict[str, Any] = {"time": time}
    exec(compile("def quick():\n    return 1\n", OTHER_CELL, "exec"), ns)
    _, entry = traced(
        "a = quick() + time.sleep(0.03) if False else quick(); time.sleep(0.03)\n", ns
    )
    lines = time_by_line(entry)
    assert share(lines, ("<module>", 1)) > 0.95, lines


def case_exception_caught_by_the_cell() -> None:
    """A user function raises; the cell catches it and sleeps in its handler: the handler's
    line gets the sleep."""
    ns: dict[str, Any] = {"time": time}
    exec(compile("def bad():\n    raise KeyError('x')\n", OTHER_CELL, "exec"), ns)
    _, entry = traced("try:\n    bad()\nexcept KeyError:\n    time.sleep(0.03)\nz = 1\n", ns)
    lines = time_by_line(entry)
    assert lines.most_common(1)[0][0] == ("<module>", 4), lines


def case_generator_of_the_user() -> None:
    """A user generator consumed by the cell: its lines are its own, below the cell's."""
    ns: dict[str, Any] = {"time": time}
    exec(
        compile(
            "def slow_rows(n):\n    for i in range(n):\n        time.sleep(0.005)\n"
            "        yield i\n",
            OTHER_CELL,
            "exec",
        ),
        ns,
    )
    _, entry = traced("total = 0\nfor r in slow_rows(6):\n    total += r\n", ns)
    lines = time_by_line(entry)
    assert lines.most_common(1)[0][0] == ("slow_rows", 3), lines
    assert share(lines, ("slow_rows", 3)) > 0.9, lines


def case_tight_loop_goes_quiet() -> None:
    """A loop of a line every fraction of a microsecond is traced in bursts: far fewer events
    than iterations, the quiet time shared out between the loop's two lines (each takes a
    real part of an iteration: about half each, measured with every event on)."""
    if threading.current_thread() is not threading.main_thread():
        return
    body = "total = 0\nfor i in range(400_000):\n    total += i * i % 7\n"
    tracer, entry = traced(body)
    assert entry["shared_us"] > 0
    assert entry["events"] < 200_000, entry["events"]
    lines = time_by_line(entry)
    assert share(lines, ("<module>", 2)) + share(lines, ("<module>", 3)) > 0.95, lines
    assert min(share(lines, ("<module>", 2)), share(lines, ("<module>", 3))) > 0.2, lines
    # Without back-off every line event is taken.
    _, full = traced(body, backoff=False)
    assert full["shared_us"] == 0 and full["events"] >= 400_000


def case_a_sleep_after_a_tight_loop_keeps_its_time() -> None:
    """A tight loop goes quiet; the sleep after it is found at the wake-up (the signal
    interrupts the sleep, whose line the cell's frame shows): at most QUIET_MAX_S of the
    sleep can be shared out as the loop's."""
    if threading.current_thread() is not threading.main_thread():
        return
    from gpuprof_nb.capture import linetrace

    _, entry = traced(
        "total = 0\nfor i in range(300_000):\n    total += i * i % 7\ntime.sleep(0.06)\n",
        {"time": time},
    )
    lines = time_by_line(entry)
    assert entry["shared_us"] > 0
    assert lines[("<module>", 4)] >= 60_000 - linetrace.QUIET_MAX_S * 1e6 - 1_000, lines


def case_library_calls_in_a_loop_are_costed() -> None:
    """A loop whose lines call library code (the standard library's, as torch's would be):
    with settrace each call passes through the global function, so the loop is traced in
    bursts; the lines still come out right."""
    import json

    if threading.current_thread() is not threading.main_thread():
        return
    body = (
        "acc = 0\nfor i in range(3000):\n    s = json.dumps({'a': i, 'b': [i, i]})\n"
        "    acc += len(json.loads(s))\n"
    )
    tracer, entry = traced(body, {"json": json})
    lines = time_by_line(entry)
    assert share(lines, ("<module>", 3)) + share(lines, ("<module>", 4)) > 0.9, lines
    if tracer.engine == "settrace":
        assert entry["shared_us"] > 0


def case_the_cell_raises() -> None:
    """The cell's exception propagates; the tracer stops and leaves nothing behind."""
    handler = signal.getsignal(signal.SIGALRM)
    code = compile("x = 1\nraise KeyError('planted')\n", CELL, "exec")
    tracer = LineTracer(code)
    try:
        with tracer:
            exec(code, {})
    except KeyError as exc:
        assert exc.args == ("planted",)
    else:
        raise AssertionError("the cell's exception was lost")
    nothing_left_behind(handler)
    entry = tracer.record(lambda n: n / 1000)
    assert time_by_line(entry)[("<module>", 2)] >= 0


def case_time_waiting_for_a_core_is_no_lines() -> None:
    """The scheduler's run delay (here a file the cell writes, standing in for
    /proc/thread-self/schedstat) grows by 6 ms inside a 20 ms stretch of line 1: that stretch
    keeps 6 ms as lost, which the analysis takes out of the line's time."""
    import os
    import tempfile

    from gpuprof_nb.capture import linetrace

    fd, path = tempfile.mkstemp()
    os.close(fd)

    # Compiled as library code (not this file's), so no line event of its own ends the
    # stretch of the cell's line that calls it.
    delay = eval(  # noqa: S307 - a fixed expression
        compile("lambda ns: open(path, 'w').write(f'123 {ns:<20d} 7\\n')", "<library>", "eval"),
        {"path": path},
    )
    delay(1_000_000)
    old = linetrace.SCHEDSTAT
    linetrace.SCHEDSTAT = path
    try:
        _, entry = traced(
            "delay(7_000_000); time.sleep(0.02)\ntime.sleep(0.01)\nz = 1\n",
            {"time": time, "delay": delay},
        )
    finally:
        linetrace.SCHEDSTAT = old
        os.unlink(path)
    parsed = samples_of({"gpuprof_nb": {"samples": entry}})
    assert parsed is not None
    frames = entry["frames"]
    by_line = {
        frames[entry["stacks"][sid][-1]][1]: lost
        for sid, lost in zip(entry["stack_of"], parsed.lost_us, strict=True)
        if entry["stacks"][sid]
    }
    assert abs(by_line[1] - 6000) < 1e-6, by_line
    assert by_line.get(2, 0.0) == 0.0


def case_another_thread_running_user_code_is_left_out() -> None:
    """A user function run on another thread while the cell sleeps: its lines are not the
    cell's (sys.monitoring's events fire on every thread)."""
    ns: dict[str, Any] = {"time": time, "threading": threading}
    exec(
        compile(
            "def busy():\n    end = time.perf_counter() + 0.05\n"
            "    while time.perf_counter() < end:\n        pass\n",
            OTHER_CELL,
            "exec",
        ),
        ns,
    )
    _, entry = traced(
        "t = threading.Thread(target=busy)\nt.start()\ntime.sleep(0.06)\nt.join()\n", ns
    )
    stacks = time_by_stack(entry)
    assert not any(s and s[-1][0] == "busy" for s in stacks), stacks
    lines = time_by_line(entry)
    assert lines.most_common(1)[0][0] == ("<module>", 3), lines


def case_engine_matches_the_interpreter() -> None:
    expected = "monitoring" if sys.version_info >= (3, 12) else "settrace"
    assert default_engine() == expected
    code = compile("pass", CELL, "exec")
    assert LineTracer(code).engine == expected


CASES: dict[str, Callable[[], None]] = {
    name.removeprefix("case_"): fn
    for name, fn in sorted(globals().items())
    if name.startswith("case_")
}


if __name__ == "__main__":
    for name, fn in CASES.items():
        fn()
        print(f"ok {name} ({default_engine()}, Python {sys.version.split()[0]})")
