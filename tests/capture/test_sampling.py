"""The line sampler on its own, both ways of sampling: where the samples land, what it leaves
behind (handlers, timers, threads, the switch interval), and the entry it records."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter

import pytest

from gpuprof_nb.capture.sampling import LineSampler, signal_sampling_possible
from gpuprof_nb.io.samples import samples_of

CELL = "for _ in range(4):\n    spin(0.03)\n    time.sleep(0.01)\n"


def spin(seconds: float) -> int:
    acc = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        acc += 1
    return acc


def run_sampled(mode: str, body: str = CELL) -> LineSampler:
    code = compile(body, "<cell-under-test>", "exec")
    sampler = LineSampler(code, mode=mode)
    with sampler:
        exec(code, {"spin": spin, "time": time})
    return sampler


def lines_hit(sampler: LineSampler) -> Counter[tuple[str, int]]:
    entry = sampler.record(lambda ns: ns / 1000)
    frames = entry["frames"]
    hits: Counter[tuple[str, int]] = Counter()
    for sid in entry["stack_of"]:
        inner = frames[entry["stacks"][sid][-1]]
        hits[(inner[2], inner[1])] += 1
    return hits


def time_on_lines(sampler: LineSampler, mode: str) -> Counter[tuple[str, int]]:
    """The time (us) the samples stand for, by innermost line: a signal sample the time
    since the one before it, a thread sample the time halfway to its neighbours (a thread
    that holds the GIL delays the sampler, so thread samples there are fewer and each
    stands for more)."""
    entry = sampler.record(lambda ns: ns / 1000)
    frames, ts = entry["frames"], entry["ts_us"]
    bounds = [entry["start_us"], *ts, entry["end_us"]]
    out: Counter[tuple[str, int]] = Counter()
    for i, sid in enumerate(entry["stack_of"]):
        inner = frames[entry["stacks"][sid][-1]]
        if mode == "signal":
            us = bounds[i + 1] - bounds[i]
        else:
            us = (bounds[i + 2] - bounds[i]) / 2
        out[(inner[2], inner[1])] += us
    return out


@pytest.mark.parametrize("mode", ["signal", "thread"])
def test_samples_land_where_the_time_goes(mode: str) -> None:
    if mode == "signal" and not signal_sampling_possible():
        pytest.skip("no SIGALRM interval timer here")
    handler, switch = signal.getsignal(signal.SIGALRM), sys.getswitchinterval()
    sampler = run_sampled(mode)
    hits = lines_hit(sampler)
    # 120 ms spinning in `spin`, 40 ms asleep on line 3 of the cell: both are seen, and
    # spinning holds the most time.
    assert any(fn == "spin" for fn, _ in hits) and hits[("<module>", 3)] > 0, hits
    held = time_on_lines(sampler, mode)
    in_spin = sum(us for (fn, _), us in held.items() if fn == "spin")
    asleep = held[("<module>", 3)]
    assert in_spin > asleep > 0, held
    assert sampler.error is None
    # Nothing left behind.
    assert signal.getsignal(signal.SIGALRM) == handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert sys.getswitchinterval() == switch
    assert not [t for t in threading.enumerate() if t.name.startswith("gpuprof_nb")]


def test_signal_samples_see_python_between_tiny_torch_ops() -> None:
    """Each tiny torch op lets go of the GIL and takes it straight back, which starves a
    sampling thread; the signal sampler still sees the Python loop around them."""
    torch = pytest.importorskip("torch")
    if not signal_sampling_possible():
        pytest.skip("no SIGALRM interval timer here")
    body = "t = torch.ones(4)\nfor _ in range(60):\n    spin(0.001)\n    t = t + 1\n"
    code = compile(body, "<cell-under-test>", "exec")
    sampler = LineSampler(code, mode="signal")
    with sampler:
        exec(code, {"spin": spin, "torch": torch})
    hits = lines_hit(sampler)
    in_spin = sum(n for (fn, _), n in hits.items() if fn == "spin")
    assert in_spin > hits[("<module>", 4)], hits


def test_the_cell_exception_propagates_and_the_sampler_stops() -> None:
    code = compile("spin(0.005)\nraise KeyError('planted')\n", "<cell-under-test>", "exec")
    sampler = LineSampler(code)
    with pytest.raises(KeyError, match="planted"), sampler:
        exec(code, {"spin": spin})
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    sampler.stop()  # idempotent


def test_off_the_main_thread_it_samples_from_a_thread() -> None:
    modes = []
    worker = threading.Thread(
        target=lambda: modes.append(LineSampler(compile("pass", "<c>", "exec")).mode)
    )
    worker.start()
    worker.join()
    assert modes == ["thread"]


def test_a_busy_alarm_is_left_to_its_owner() -> None:
    if not hasattr(signal, "setitimer"):
        pytest.skip("no SIGALRM")
    old = signal.signal(signal.SIGALRM, lambda *a: None)
    try:
        assert LineSampler(compile("pass", "<c>", "exec")).mode == "thread"
    finally:
        signal.signal(signal.SIGALRM, old)


def test_the_record_reads_back() -> None:
    sampler = run_sampled(LineSampler(compile("pass", "<c>", "exec")).mode)
    entry = sampler.record(lambda ns: ns / 1000 - 5.0)
    samples = samples_of({"gpuprof_nb": {"samples": entry}})
    assert samples is not None and len(samples) == len(entry["ts_us"]) > 0
    assert samples.mode == sampler.mode
    assert samples.start_us <= samples.ts_us[0] and samples.ts_us[-1] <= samples.end_us
    texts = {f.text for f in samples.frames}
    # The cell's lines are in linecache only when registered; spin's are (a real file).
    assert texts & {"while time.perf_counter() < end:", "acc += 1"}, texts


def test_a_signal_inside_the_handler_is_dropped() -> None:
    """A second SIGALRM arriving while the handler runs calls it again from inside itself;
    that sample is dropped so the samples stay in time order (they were out of order on a
    loaded machine before)."""
    import inspect

    code = compile("pass", "<c>", "exec")
    sampler = LineSampler(code, mode="signal")
    sampler._running = True
    frame = inspect.currentframe()
    assert frame is not None
    sampler._in_handler = True
    sampler._on_signal(signal.SIGALRM, frame)
    assert sampler._ts == [] and sampler._in_handler
    sampler._in_handler = False
    sampler._on_signal(signal.SIGALRM, frame)  # not under the cell's code: dropped too
    assert sampler._ts == [] and not sampler._in_handler


def test_a_signal_right_after_the_clock_read_is_dropped(monkeypatch) -> None:
    """Python runs a pending handler right after a call returns: a signal handled just after
    the handler read the clock must not record a later time before the earlier one (on an
    H100 machine's first profiled cell the samples went back in time and the reader threw
    them all away)."""
    import gpuprof_nb.capture.sampling as sampling_mod

    code = compile("x = 1", "<c>", "exec")
    sampler = LineSampler(code, mode="signal")
    sampler._running = True
    namespace: dict = {}
    frames: list = []
    exec(
        compile("import sys\nframes.append(sys._getframe())", "<c>", "exec"),
        {"frames": frames},
        namespace,
    )
    frame = frames[0]
    frame_code = frame.f_code
    sampler.cell_code = frame_code  # the frame is "in the cell"
    clock = iter([200, 300, 400])
    nested = []

    def fake_clock() -> int:
        now = next(clock)
        if not nested:  # a signal handled as the clock call returns
            nested.append(True)
            sampler._on_signal(signal.SIGALRM, frame)
        return now

    monkeypatch.setattr(sampling_mod.time, "perf_counter_ns", fake_clock)
    sampler._on_signal(signal.SIGALRM, frame)
    monkeypatch.undo()
    assert sampler._ts == [200]  # the nested one was dropped


def test_the_record_is_in_time_order_whatever_the_order_taken() -> None:
    import inspect

    sampler = LineSampler(compile("pass", "<c>", "exec"), mode="thread")
    frame = inspect.currentframe()
    assert frame is not None
    sampler.cell_code = frame.f_code
    for now in (300, 100, 200):
        sampler._keep(frame, now)
    sampler._start_ns, sampler._end_ns = 50, 400
    entry = sampler.record(lambda ns: ns / 1000)
    assert entry["ts_us"] == [0.1, 0.2, 0.3]
    assert samples_of({"gpuprof_nb": {"samples": entry}}) is not None


def test_the_handler_is_taken_out_of_the_stack_trace() -> None:
    """torch's with_stack recording sees the signal handler run on the cell's thread; those
    calls are gpuprof_nb's, not the cell's, and are taken out of the trace, while the cell's
    own Python events stay (torch may shorten the file names: see the next test)."""
    torch = pytest.importorskip("torch")
    if not signal_sampling_possible():
        pytest.skip("no SIGALRM interval timer here")
    from gpuprof_nb.capture.profiler import profile_cell

    body = "x = torch.ones(8)\nfor _ in range(5):\n    spin(0.02)\n    x = x + 1\n"
    code = compile(body, "<cell-under-test>", "exec")
    sampler = LineSampler(code, mode="signal")
    artifact = profile_cell(
        lambda: exec(code, {"spin": spin, "torch": torch}),
        stack=True,
        samplers=[("samples", sampler)],
    )
    python = [e for e in artifact["traceEvents"] if e.get("cat") == "python_function"]
    names = [e["name"] for e in python]
    ours = {n.rsplit(": ", 1)[1] for n in names if "capture/sampling.py" in n.replace("\\", "/")}
    assert ours <= {"start", "stop"}, ours  # called by profile_cell, outside the cell's run
    assert sum(1 for n in names if n.endswith(": spin")) == 5
    assert len(artifact["gpuprof_nb"]["samples"]["ts_us"]) > 10


def test_dropping_own_calls_keeps_other_threads_and_neighbours() -> None:
    from gpuprof_nb.capture.profiler import drop_python_calls

    code = LineSampler._on_signal.__code__
    own = f"{code.co_filename}({code.co_firstlineno}): {code.co_name}"
    # torch shortens a file under a sys.path entry (as names are written once the package's
    # folder is on sys.path): the same handler.
    short = f"gpuprof_nb/capture/sampling.py({code.co_firstlineno}): {code.co_name}"
    elsewhere = f"other/capture/sampling.py({code.co_firstlineno}): {code.co_name}"

    def py(name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {
            "ph": "X",
            "cat": "python_function",
            "name": name,
            "ts": ts,
            "dur": dur,
            "pid": 7,
            "tid": tid,
        }

    events = [
        py("cell.py(1): <module>", 0.0, 100.0),
        py(own, 10.0, 5.0),
        py("x.py(3): inner", 11.0, 2.0),
        py(own, 12.0, 0.5),  # re-entered
        py("cell.py(9): work", 15.0, 3.0),  # right after the handler: kept
        py(own, 40.0, 2.0, tid=2),
        py("y.py(1): other", 40.5, 1.0, tid=1),  # other thread
        py(short, 60.0, 1.0),
        py(elsewhere, 70.0, 1.0),  # not our file: kept
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::add",
            "ts": 11.0,
            "dur": 1.0,
            "pid": 7,
            "tid": 1,
        },  # an op is never a Python call of ours
    ]
    artifact = {"traceEvents": list(events)}
    assert drop_python_calls(artifact, [code]) == 5
    assert [e["name"] for e in artifact["traceEvents"]] == [
        "cell.py(1): <module>",
        "cell.py(9): work",
        "y.py(1): other",
        elsewhere,
        "aten::add",
    ]
    assert drop_python_calls({"traceEvents": list(events)}, []) == 0
