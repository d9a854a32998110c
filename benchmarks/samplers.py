"""Comparison 11: what the samplers beside the profiled run cost, and what the hotspots cost.

Beside the one run `%%gpuprofile` makes under torch.profiler ("the profiled run"), the
UtilisationSampler always samples the machine (a daemon thread, every 20 ms by default:
`PERIOD_S` in gpuprof_nb/capture/utilisation.py), and with `--stack` the LineSampler samples
the cell's Python line (SIGALRM every 5 ms on the main thread by default, a thread
elsewhere). Both are measured the way the magic runs them:
`profile_cell(run, runs=1, stack=True, cuda=False, samplers=...)` (with `--stack`;
`stack=False` in the default-mode block below), `run` exec'ing the cell's compiled code
object in a namespace, as a notebook cell runs, with

- no samplers (the reference);
- the line sampler alone, signal mode (the default) and thread mode;
- the utilisation sampler alone, every 20 ms (the default) and every 10 ms;
- both, as the magic makes them (`UtilisationSampler(cuda=False)`, `LineSampler(code)`);
- two controls that sample nothing: a thread that only wakes every 10 ms (what a second
  Python thread alone changes), and SIGALRM every 1 ms with an empty handler (what
  delivering the signal costs, apart from taking the sample);
- pyinstrument's sampler, `pyinstrument.Profiler(interval=0.001)` and `(interval=0.003)` in
  its default async mode, started and stopped around the run through the same
  start()/stop()/record() shape (left out, with a note, where pyinstrument is not
  installed; `make bench` installs pyinstrument 5.1.3 into the venv it runs),

on three cells of ~150 ms: a small torch MLP training loop (forward, backward, SGD step), a
pure-Python loop, and a per-sample loop of tiny torch ops mixed with Python. Each cell's
calls come in three blocks of rounds:

- the *judged* block: no samplers, the line sampler the targets judge (signal mode; thread
  mode where signal mode is impossible), the utilisation sampler every 20 ms and both, in
  many rounds (JUDGED_ROUNDS in a full run): the judged targets and the line sampler on top
  of the utilisation sampler (both vs the utilisation sampler alone) come from it;
- the *informational* block: no samplers again and every other variant (the thread-mode
  line sampler, the utilisation sampler every 10 ms, the controls, pyinstrument), in fewer
  rounds (INFO_ROUNDS);
- the *default mode* block: no samplers and the utilisation sampler every 20 ms, each call
  with `stack=False`, as `%%gpuprofile` without `--stack` (the magic's default) makes it, in
  DEFAULT_ROUNDS rounds: the utilisation sampler's targets come from it. The magic runs the
  utilisation sampler on every cell; without `--stack` it runs alone and the profiled run
  is shorter (no Python stack recording) while the sampler's work is the same, so this is
  the stricter test of its relative cost; and in the judged block the utilisation
  sampler's wall-time row has a standard error (±0.8% in 19 rounds) of the order of its
  1% goal, which the default block's many rounds bring down. The judged block's
  utilisation rows (with `--stack`) stay as informational ones.

The informational and default-mode rounds are spread evenly among the judged ones, so all
three blocks see the machine over the same stretch of time; within a round the block's
variants run in a new random order (seeded, so no variant always follows the same one; an
untimed gc.collect() before each call), after one untimed call of each variant per cell
(and one of each default-mode variant in default mode), and each overhead is the median
over the block's rounds of each round's ratio to the no-sampler call of the same round of
the same block. Each call is timed twice with perf_counter_ns: the run inside the
profiler (wrapping `run`: what the targets judge) and the whole `profile_cell` call
(profiler start and stop, the samplers' start and stop, the trace's export, the samples'
record). Each call also counts the `python_function` events (torch's `with_stack=True`
recording; none in default mode) in the exported trace, and those inside the event torch
records for the run wrapper (the cell's run).

What pyinstrument 5.1.3 hooks (read from its source: `pyinstrument/stack_sampler.py`,
`low_level/stat_profile.c`): it has no timer of its own. `Profiler.start()` calls
`setstatprofile`, which installs a C profile function with `PyEval_SetProfile` on the
calling thread only; CPython calls it on every call and return of a Python function and of
a C function (and on exceptions). The function reads a clock on every such event
(`clock_gettime(CLOCK_MONOTONIC)`; `CLOCK_MONOTONIC_COARSE` only where that clock's
resolution is no more than the interval: 4 ms on the benchmark machine, so neither the 1 ms
nor the 3 ms variant uses it), checks the async context variable, and once the interval has
passed since the last sample calls back into Python (`StackSampler._sample`), which builds
the whole stack as strings. So a stretch of code that calls nothing (a loop of arithmetic)
is sampled only at the next call or return after it, and `stop()` installs NULL
(`PyEval_SetProfile(NULL, NULL)`). torch.profiler's `with_stack=True` recording keeps its
Python events through the same per-thread slot, which its `PythonTracer`
(torch/csrc/autograd/profiler_python.cpp; `PythonTracer::setprofileAllThreads` in
libtorch_python.so) fills on every thread with `_PyEval_SetProfile` when the profiler
starts: the python_function counts show what pyinstrument's start() and stop() do to it
on the cell's thread. A second run without torch.profiler at all (the run bare, with none,
the line sampler and pyinstrument, interleaved the same way in the informational block's
number of rounds) separates pyinstrument's own cost from what it changes in torch's
recording.

Then the hotspots' cost on the largest shared trace with python_function events: load_trace,
compute_hotspots, the full analyze (with hotspots, and with compute_hotspots replaced by one
returning None) and the displayed bundle, (analyze + display) / load per run.
"""

from __future__ import annotations

import gc
import math
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from fractions import Fraction
from functools import partial
from pathlib import Path
from types import CodeType
from typing import Any

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.measure import pct, precision, ratios

TITLE = "11. Samplers beside the profiled run"
# The largest shared trace with python_function events (with_stack=True).
HOTSPOT_TRACE = "tracelens/tests/traces/mi300/resnet_act_checkpoint.json.gz"
# Length of each cell's run inside the profiler (s) in a full run: long enough for the
# sampling periods to repeat many times, short enough that exporting the profiler's trace
# (seconds for the tiny-ops cell, whose trace holds every op) keeps the rounds affordable.
TARGET_S = 0.15
# The goals, as fractions of the profiled run.
LINE_GOAL = 0.03
UTIL_GOAL = 0.01
# Rounds per cell in a full run (--quick: max(repeats, 1) of each). The section's time is
# the profiled calls' (each exports the trace: ~6.2 s a call on the tiny-ops cell, ~1.7 s on
# the MLP cell, ~0.15 s on the pure-Python cell, whatever the variant); a bare call is one
# ~150 ms run without the export. Before the split, all 10 variants ran in 11 rounds:
#   10 x 11 = 110 profiled calls per cell, and 5 bare variants x 11 = 55 bare calls.
# Now the judged block has 4 variants (none, the judged line sampler, the utilisation
# sampler every 20 ms, both) and the informational block 7 (none again, the thread-mode
# line sampler, the utilisation sampler every 10 ms, the two controls, the two pyinstrument
# variants):
#   4 x 19 + 7 x 5 = 76 + 35 = 111 profiled calls per cell (+1 call, ~+1%),
#   and 5 bare variants x 5 = 25 bare calls (-30 calls of ~150 ms, ~-5 s per cell);
# the 10 untimed first calls per cell are unchanged. The judged rows' standard error falls
# by sqrt(11 / 19) = 0.76 (e.g. +-2.6% -> +-2.0%), the informational rows' grows by
# sqrt(11 / 5) = 1.48. (Without SIGALRM or pyinstrument the blocks lose those variants.)
# Those 111 calls take ~15 min in all (111 x (6.2 + 1.7 + 0.15) s = ~894 s).
# The default-mode block adds 2 variants (none, the utilisation sampler every 20 ms) x 41
# rounds = 82 profiled calls per cell with stack=False, plus 2 untimed first calls (12
# untimed calls per cell in all). Without --stack a call measured ~6.0 s on the tiny-ops
# cell, ~1.0 s on the MLP cell and ~0.13 s on the pure-Python cell:
#   82 x (6.0 + 1.0 + 0.13) s = ~585 s, ~10 min more (~8 min of it the tiny-ops cell's),
#   193 profiled calls per cell in all (4 x 19 + 7 x 5 + 2 x 41), ~25 min.
# Its rows' standard error is sqrt(19 / 41) = 0.68 of a judged row's with the same noise
# (e.g. +-0.8% -> +-0.5%): the utilisation sampler's 1% goal is judged on it.
JUDGED_ROUNDS = 19
INFO_ROUNDS = 5
DEFAULT_ROUNDS = 41

SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 256), torch.nn.ReLU(),
    torch.nn.Linear(256, 256), torch.nn.ReLU(),
    torch.nn.Linear(256, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn(64, 256)
y = torch.randint(0, 10, (64,))
data = torch.randn(4096, 16)
w = torch.randn(16)
"""

# name -> (cell body with {n}, n in quick mode, first guess of n in a full run).
CELLS = {
    "torch MLP training loop (256 wide, batch 64, SGD)": (
        "for step in range({n}):\n"
        "    opt.zero_grad(set_to_none=True)\n"
        "    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n"
        "    opt.step()\n",
        2,
        20,
    ),
    "pure-Python loop": (
        "total = 0\nfor i in range({n}):\n    total += i * i % 7\n",
        20_000,
        500_000,
    ),
    "per-sample loop of tiny torch ops": (
        "out = []\n"
        "for i in range({n}):\n"
        "    row = data[i % 4096]\n"
        "    s = float((row * w).sum())\n"
        "    if s > 0:\n"
        "        out.append(round(s * s, 3))\n",
        40,
        1_000,
    ),
}

NONE = "none"
LINE_SIGNAL = "line sampler, signal mode (5 ms)"
LINE_THREAD = "line sampler, thread mode (1 ms)"
UTIL_10 = "utilisation sampler (10 ms)"
UTIL_20 = "utilisation sampler (20 ms)"
BOTH = "both, as the magic makes them"
IDLE = "control: a thread that wakes every 10 ms and does nothing"
ALARM = "control: SIGALRM every 1 ms, empty handler"
PYI_1 = "pyinstrument Profiler (1 ms)"
PYI_3 = "pyinstrument Profiler (3 ms)"
PYI_INTERVALS = {PYI_1: 0.001, PYI_3: 0.003}
# Measured again with the run bare (no torch.profiler), where present.
BARE = (NONE, LINE_SIGNAL, LINE_THREAD, PYI_1, PYI_3)
# Shown in the python_function table, where present.
PYFUNC = (NONE, LINE_SIGNAL, LINE_THREAD, BOTH, PYI_1, PYI_3)
# The name of the function `_call` runs the cell in (found in the trace by it).
RUN_WRAPPER = "bench_cell_run"
# The three blocks of rounds of each cell (see the module's docstring).
JUDGED_BLOCK = "judged"
INFO_BLOCK = "informational"
DEFAULT_BLOCK = "default mode"


def _stack(block: str) -> bool:
    """Whether the block's calls record Python stacks (`profile_cell(stack=...)`): all but
    the default-mode block's, which are profiled as `%%gpuprofile` without --stack."""
    return block != DEFAULT_BLOCK


def _blocks(labels: Iterable[str]) -> dict[str, list[str]]:
    """Split the variants into the judged block (none, the line sampler the targets judge:
    signal mode, thread mode where signal mode is impossible; the utilisation sampler every
    20 ms; both), the informational block (none again, and every other variant) and, where
    the utilisation sampler every 20 ms is among them, the default-mode block (none and it,
    profiled with stack=False)."""
    labels = list(labels)
    line = LINE_SIGNAL if LINE_SIGNAL in labels else LINE_THREAD
    judged = [v for v in (NONE, line, UTIL_20, BOTH) if v in labels]
    blocks = {JUDGED_BLOCK: judged, INFO_BLOCK: [NONE, *(v for v in labels if v not in judged)]}
    if UTIL_20 in labels:
        blocks[DEFAULT_BLOCK] = [NONE, UTIL_20]
    return blocks


def _schedule(judged_rounds: int, info_rounds: int, default_rounds: int) -> list[str]:
    """The order of the blocks' rounds: the informational and the default-mode rounds spread
    evenly among the judged ones (so all blocks see the machine over the same stretch of
    time). Each block's k-th of n rounds sits at (k + 1/2) / n of the stretch; rounds at the
    same point go judged, informational, default mode."""
    counts = (
        (JUDGED_BLOCK, judged_rounds),
        (INFO_BLOCK, info_rounds),
        (DEFAULT_BLOCK, default_rounds),
    )
    spots = sorted(
        (Fraction(2 * k + 1, 2 * n), rank, block)
        for rank, (block, n) in enumerate(counts)
        for k in range(n)
    )
    return [block for _, _, block in spots]


def _round_counts(cfg: BenchConfig) -> tuple[int, int, int]:
    """(rounds of the judged block, of the informational block and of the bare runs, of the
    default-mode block)."""
    if cfg.quick:
        return max(cfg.repeats, 1), max(cfg.repeats, 1), max(cfg.repeats, 1)
    return (
        max(cfg.repeats, JUDGED_ROUNDS),
        max(cfg.repeats, INFO_ROUNDS),
        max(cfg.repeats, DEFAULT_ROUNDS),
    )


class _IdleThread:
    """Control: a second Python thread beside the run, without sampling anything."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.01):
            pass

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]:
        return {}


class _EmptyAlarm:
    """Control: the signal sampler's interval timer and signal, with a handler that does
    nothing (what delivering the signal costs, apart from the sample)."""

    def __init__(self, period_s: float = 0.001) -> None:
        self.period_s = period_s
        self._old: Any = None

    def start(self) -> None:
        self._old = signal.signal(signal.SIGALRM, lambda signum, frame: None)
        signal.setitimer(signal.ITIMER_REAL, self.period_s, self.period_s)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        signal.signal(signal.SIGALRM, self._old)

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]:
        return {}


class _Pyinstrument:
    """pyinstrument's sampler beside the run: `pyinstrument.Profiler(interval=...)` (default
    async mode), started and stopped like the line sampler; what it hooks: see the module.
    record() gives its session's sample count (it keeps no timestamps)."""

    def __init__(self, interval_s: float) -> None:
        from pyinstrument import Profiler

        self._profiler = Profiler(interval=interval_s)
        self._samples = 0
        self._error: str | None = None

    def start(self) -> None:
        self._profiler.start()

    def stop(self) -> None:
        if not self._profiler.is_running:
            return
        try:
            self._samples = self._profiler.stop().sample_count
        except Exception as exc:  # noqa: BLE001 - profile_cell's samplers never raise on stop
            self._error = f"stopping: {type(exc).__name__}: {exc}"

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]:
        entry: dict[str, Any] = {"sample_count": self._samples}
        if self._error:
            entry["error"] = self._error
        return entry


def pyinstrument_version() -> str | None:
    """pyinstrument's version where it can be imported, else None (its variants left out)."""
    try:
        import pyinstrument
    except ImportError:
        return None
    return str(getattr(pyinstrument, "__version__", "unknown version"))


def _variants() -> dict[str, Callable[[CodeType], list[tuple[str, Any]]]]:
    from gpuprof_nb.capture.sampling import LineSampler, signal_sampling_possible
    from gpuprof_nb.capture.utilisation import UtilisationSampler

    variants: dict[str, Callable[[CodeType], list[tuple[str, Any]]]] = {
        NONE: lambda code: [],
        LINE_SIGNAL: lambda code: [("samples", LineSampler(code, mode="signal"))],
        LINE_THREAD: lambda code: [("samples", LineSampler(code, mode="thread"))],
        UTIL_10: lambda code: [("utilisation", UtilisationSampler(cuda=False, period_s=0.01))],
        UTIL_20: lambda code: [("utilisation", UtilisationSampler(cuda=False, period_s=0.02))],
        BOTH: lambda code: [
            ("utilisation", UtilisationSampler(cuda=False)),
            ("samples", LineSampler(code)),
        ],
        IDLE: lambda code: [("control", _IdleThread())],
        ALARM: lambda code: [("control", _EmptyAlarm())],
    }
    if not signal_sampling_possible():  # not the main thread, or SIGALRM taken
        del variants[LINE_SIGNAL], variants[ALARM]
    if pyinstrument_version() is not None:
        for label, interval in PYI_INTERVALS.items():
            variants[label] = partial(_pyinstrument_samplers, interval)
    return variants


def _pyinstrument_samplers(interval_s: float, code: CodeType) -> list[tuple[str, Any]]:
    return [("pyinstrument", _Pyinstrument(interval_s))]


def _python_functions(events: Any) -> tuple[int, int]:
    """(python_function events in the trace, those inside the run wrapper's own event: the
    cell's run; 0 where torch recorded no event for the wrapper)."""
    found = (
        [e for e in events if isinstance(e, dict) and e.get("cat") == "python_function"]
        if isinstance(events, list)
        else []
    )
    inside = 0
    wrappers = [
        e
        for e in found
        if str(e.get("name", "")).endswith(f": {RUN_WRAPPER}")
        and isinstance(e.get("ts"), (int, float))
        and isinstance(e.get("dur"), (int, float))
    ]
    if wrappers:
        w = wrappers[0]
        start, end = w["ts"], w["ts"] + w["dur"]
        inside = sum(
            1
            for e in found
            if e is not w
            and e.get("tid") == w.get("tid")
            and isinstance(e.get("ts"), (int, float))
            and start <= e["ts"] <= end
        )
    return len(found), inside


def _sample_count(record: Any) -> int | None:
    """How many samples a sampler's record holds (None: not a record of samples)."""
    if not isinstance(record, dict):
        return None
    if "ts_us" in record:
        return len(record.get("ts_us") or ())
    count = record.get("sample_count")
    return count if isinstance(count, int) else None


def _call(
    code: CodeType, ns: dict[str, Any], samplers: list[tuple[str, Any]], stack: bool = True
) -> tuple[int, int, dict[str, Any], tuple[int, int], int]:
    """One profile_cell call as the magic makes it (`stack`: with --stack, else as its
    default mode); return (ns of the run inside the profiler, ns of the whole call, what the
    samplers recorded, the python_function events in the trace and inside the cell's run,
    ns the cell's thread spent off the CPU during the run)."""
    from gpuprof_nb.capture.profiler import profile_cell
    from gpuprof_nb.io.cells import KEY

    box: list[int] = []
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns

    def bench_cell_run() -> None:  # named so: RUN_WRAPPER
        c0 = cpu_clock()
        t0 = clock()
        exec(code, ns)  # noqa: S102 - the benchmark's own cell, as a notebook runs it
        took = clock() - t0
        box.append(took)
        # The cell's thread off the CPU: waiting for the GIL, or for a core.
        box.append(took - (cpu_clock() - c0))

    gc.collect()
    t0 = clock()
    artifact = profile_cell(bench_cell_run, runs=1, stack=stack, cuda=False, samplers=samplers)
    outer = clock() - t0
    own = artifact.get(KEY, {})
    return (
        box[0],
        outer,
        {key: own.get(key) for key, _ in samplers},
        _python_functions(artifact.get("traceEvents")),
        box[1],
    )


def _bare_call(
    code: CodeType, ns: dict[str, Any], samplers: list[tuple[str, Any]]
) -> tuple[int, dict[str, Any]]:
    """The cell run bare (no torch.profiler), the samplers started before it and stopped
    after; return (ns of the run, what the samplers recorded)."""
    clock = time.perf_counter_ns
    gc.collect()
    started = []
    try:
        for _, sampler in samplers:
            sampler.start()
            started.append(sampler)
        t0 = clock()
        exec(code, ns)  # noqa: S102 - the benchmark's own cell, as a notebook runs it
        took = clock() - t0
    finally:
        for sampler in reversed(started):
            sampler.stop()
    return took, {key: sampler.record(lambda t: t / 1000.0) for key, sampler in samplers}


def _sized(body: str, n: int, ns: dict[str, Any], target_s: float) -> tuple[int, CodeType]:
    """Return (n, code) with n chosen so the run inside the profiler (no samplers) takes
    about target_s."""
    for _ in range(3):
        code = compile(body.format(n=n), "<bench-cell>", "exec")
        took = min(_call(code, ns, [])[0] for _ in range(2)) / 1e9
        if abs(took / target_s - 1) < 0.15:
            break
        n = max(1, round(n * target_s / max(took, 1e-6)))
    return n, compile(body.format(n=n), "<bench-cell>", "exec")


def measure_cells(
    cfg: BenchConfig, judged_rounds: int, info_rounds: int, default_rounds: int
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per cell: n; per block (judged, informational, default mode; `_blocks`), its rounds,
    whether its calls recorded stacks (`stack`: False in default mode) and per variant the
    inner and outer ns of each round, the samples per second of each sampler (key -> list),
    the python_function counts of each round (in the trace, inside the run) and the ns the
    cell's thread spent off the CPU; then, for the BARE variants, the ns of the run without
    torch.profiler in `info_rounds` rounds and their samples per second; plus the samplers'
    notes and errors (the first of each cell and variant, with how many of its calls noted
    something; the default-mode block's under "<cell> (default mode)")."""
    import torch

    torch.set_num_threads(cfg.threads)
    variants = _variants()
    blocks = _blocks(variants)
    if default_rounds < 1:  # not measured: the utilisation targets say so
        blocks.pop(DEFAULT_BLOCK, None)
    if DEFAULT_BLOCK not in blocks:
        default_rounds = 0
    block_rounds = {
        JUDGED_BLOCK: judged_rounds,
        INFO_BLOCK: info_rounds,
        DEFAULT_BLOCK: default_rounds,
    }
    noted: dict[tuple[str, str], list[Any]] = {}  # (cell, variant) -> [first note, calls]
    calls: dict[tuple[str, str], int] = {}  # (cell, variant) -> timed calls
    rng = random.Random(0)
    results: dict[str, dict[str, Any]] = {}
    for name, (body, quick_n, first_n) in CELLS.items():
        ns: dict[str, Any] = {"__name__": "__main__"}
        exec(compile(SETUP, "<bench-setup>", "exec"), ns)  # noqa: S102
        if cfg.quick:
            n, code = quick_n, compile(body.format(n=quick_n), "<bench-cell>", "exec")
        else:
            n, code = _sized(body, first_n, ns, TARGET_S)
        for make in variants.values():  # untimed: each sampler's first use
            _call(code, ns, make(code))
        for label in blocks.get(DEFAULT_BLOCK, ()):  # untimed: the first in default mode
            _call(code, ns, variants[label](code), stack=False)
        measured = {
            block: {
                "rounds": block_rounds[block],
                "stack": _stack(block),
                **{
                    key: {v: ([] if key != "rates" else {}) for v in labels}
                    for key in ("inner", "outer", "rates", "pyfunc", "off_cpu")
                },
            }
            for block, labels in blocks.items()
        }

        def note(
            label: str,
            records: dict[str, Any],
            took_ns: int,
            into: dict[str, dict[str, list[float]]],
            cell: str = name,
        ) -> None:
            calls[(cell, label)] = calls.get((cell, label), 0) + 1
            said: list[str] = []
            for key, record in records.items():
                count = _sample_count(record)
                if count is None:
                    continue
                into[label].setdefault(key, []).append(count / (took_ns / 1e9))
                for field in ("error", "notes"):
                    value = record.get(field)
                    said += [value] if isinstance(value, str) else list(value or ())
            if said:
                entry = noted.setdefault((cell, label), [said[0], 0])
                entry[1] += 1

        order = {block: list(labels) for block, labels in blocks.items()}
        for block in _schedule(judged_rounds, info_rounds, default_rounds):
            labels, data = order[block], measured[block]
            cell = name if block != DEFAULT_BLOCK else f"{name} ({DEFAULT_BLOCK})"
            rng.shuffle(labels)
            for label in labels:
                t_in, t_out, records, counts, off = _call(
                    code, ns, variants[label](code), stack=_stack(block)
                )
                data["inner"][label].append(t_in)
                data["off_cpu"][label].append(off)
                data["outer"][label].append(t_out)
                data["pyfunc"][label].append(counts)
                note(label, records, t_in, data["rates"], cell)
        bare_labels = [v for v in BARE if v in variants]
        for label in bare_labels:  # untimed first call of each, as above
            _bare_call(code, ns, variants[label](code))
        bare: dict[str, list[int]] = {v: [] for v in bare_labels}
        bare_rates: dict[str, dict[str, list[float]]] = {v: {} for v in bare_labels}
        for _ in range(info_rounds):
            rng.shuffle(bare_labels)
            for label in bare_labels:
                took, records = _bare_call(code, ns, variants[label](code))
                bare[label].append(took)
                note(label, records, took, bare_rates, f"{name} (bare run)")
        results[name] = {
            "n": n,
            "blocks": measured,
            "bare": bare,
            "bare_rates": bare_rates,
            "bare_rounds": info_rounds,
        }
    notes = [
        f"{cell}, {label} ({count} of {calls[(cell, label)]} calls; the first said): {text}"
        for (cell, label), (text, count) in noted.items()
    ]
    return results, notes


def _measured(c: dict[str, Any]) -> list[str]:
    """Every variant measured in cell results `c` (all blocks), none first."""
    return list(dict.fromkeys(label for block in c["blocks"].values() for label in block["inner"]))


def _block_of(c: dict[str, Any], label: str) -> dict[str, Any]:
    """The block of cell results `c` that measured `label` (none: the judged block's)."""
    judged = c["blocks"][JUDGED_BLOCK]
    return judged if label in judged["inner"] else c["blocks"][INFO_BLOCK]


def _inside(c: dict[str, Any], label: str) -> float:
    """python_function events inside the cell's run with `label`, median over its block's
    rounds (none: the judged block's)."""
    return float(statistics.median(i for _, i in _block_of(c, label)["pyfunc"][label]))


def _off_cpu_added(block: dict[str, Any], label: str) -> list[float]:
    """Round by round in one block: the cell thread's time off the CPU with `label` less
    without a sampler, over the run without a sampler."""
    return [
        (off - ref_off) / ref
        for off, ref_off, ref in zip(
            block["off_cpu"][label], block["off_cpu"][NONE], block["inner"][NONE], strict=True
        )
    ]


def _pct_across(values: list[float], reference: list[float]) -> str:
    """(1 + median of values) / (1 + median of reference) - 1, ± the two medians' standard
    errors combined to first order: two variants measured in different blocks, each as its
    rounds' ratios to the run without a sampler of the same round."""
    a, b = statistics.median(values), statistics.median(reference)
    ratio = (1 + a) / (1 + b) - 1
    err = math.hypot(precision(values) / (1 + b), precision(reference) * (1 + a) / (1 + b) ** 2)
    return f"{ratio:+.1%}" + (f" (± {err:.1%})" if not math.isnan(err) else "")


def _ms(ns_values: list[int]) -> str:
    return f"{statistics.median(ns_values) / 1e6:.1f} ms"


def _iqrpct(values: list[int]) -> str:
    if len(values) < 4:
        return "-"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{(q3 - q1) / statistics.median(values):.1%}"


def measure_hotspots(cfg: BenchConfig, rounds: int) -> dict[str, Any] | None:
    """load / compute_hotspots / analyze (with and without hotspots) / display on the
    hotspot trace, `rounds` runs after an untimed one; None when the trace is absent."""
    path = cfg.traces_dir / HOTSPOT_TRACE
    if not path.is_file():
        return None
    import gpuprof_nb.analysis.report as report_mod
    from benchmarks.child import _import_display_layer
    from gpuprof_nb.analysis.hotspots import compute_hotspots
    from gpuprof_nb.analysis.timeline import device_timeline
    from gpuprof_nb.io.trace import load_trace

    _import_display_layer()
    clock = time.perf_counter_ns
    original = report_mod.compute_hotspots

    def timed(fn: Callable[[], Any]) -> tuple[Any, int]:
        gc.collect()
        t0 = clock()
        value = fn()
        return value, clock() - t0

    def analyze_display(trace: Any, with_hotspots: bool) -> tuple[int, int, bool]:
        report_mod.compute_hotspots = original if with_hotspots else (lambda *a: None)
        try:
            report, t_analyze = timed(lambda: report_mod.analyze(trace))
        finally:
            report_mod.compute_hotspots = original
        _, t_display = timed(report._repr_mimebundle_)
        return t_analyze, t_display, report.hotspots is not None

    out: dict[str, Any] = {
        "path": path,
        "bytes": _json_bytes(path),
        "load": [],
        "hotspots": [],
        "with": [],
        "without": [],
    }
    for r in range(rounds + 1):
        trace, t_load = timed(lambda: load_trace(path))
        timeline = device_timeline(trace)
        found, t_hot = timed(partial(compute_hotspots, trace, timeline))
        order = (True, False) if r % 2 == 0 else (False, True)
        stages = {w: analyze_display(trace, w) for w in order}
        if r == 0:  # untimed: first display, lazy imports
            out["events"] = found.samples if found is not None else 0
            out["granularity"] = found.granularity if found is not None else "-"
            continue
        out["load"].append(t_load)
        out["hotspots"].append(t_hot)
        out["with"].append(stages[True])
        out["without"].append(stages[False])
        out["shown"] = stages[True][2]
    return out


def _json_bytes(path: Path) -> int:
    import gzip

    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), b""))
    return path.stat().st_size


def _machine_line() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            virtual = " hypervisor" in fh.read()
    except OSError:
        virtual = False
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    kind = "a shared virtual machine" if virtual else "this machine"
    return (
        f"Measured on {kind} with {os.cpu_count()} CPUs (load average 1/5/15 min at the "
        f"end of the cell rounds: {load}): other work on it shows up as noise, of the "
        "order of the 1-3% being judged; the noise floor column gives the spread of the "
        "reference runs (interquartile range, % of their median), and each overhead is "
        "the median over rounds of that round's ratio, ± the standard error of that "
        "median."
    )


def run(cfg: BenchConfig) -> Section:
    """Measure the samplers on the cells and the hotspots on the trace; return the section."""
    judged_rounds, info_rounds, default_rounds = _round_counts(cfg)
    cells, notes = measure_cells(cfg, judged_rounds, info_rounds, default_rounds)
    machine = _machine_line()
    hot = measure_hotspots(cfg, max(cfg.repeats, 1) if cfg.quick else max(cfg.repeats, 7))
    return _section(cfg, cells, notes, hot, machine)


def _section(
    cfg: BenchConfig,
    cells: dict[str, dict[str, Any]],
    notes: list[str],
    hot: dict[str, Any] | None,
    machine: str,
) -> Section:
    med = statistics.median
    signal_ok = hasattr(signal, "setitimer")
    first = next(iter(cells.values()))
    judged, info = first["blocks"][JUDGED_BLOCK], first["blocks"][INFO_BLOCK]
    default = first["blocks"].get(DEFAULT_BLOCK)
    if default is not None:
        default_text = (
            f"and the *{DEFAULT_BLOCK}* block ({'; '.join(default['inner'])}, each call with "
            "`stack=False`, as `%%gpuprofile` without `--stack`, the magic's default, makes "
            f"it) in {default['rounds']} rounds, the informational and default-mode rounds "
            "spread evenly among the judged ones; the *rounds* column gives each row's. The "
            "utilisation sampler's targets are judged on the default-mode block: the magic "
            "runs it on every cell, and without `--stack` it runs alone beside a shorter "
            "profiled run (no Python stack recording) while its own work is the same, so "
            "this is the stricter test of its relative cost; and in the judged block its "
            "wall-time row's standard error (±0.8% in 19 rounds in the runs before this "
            "block; this run's are in the table) is of the order of its 1% goal. Its "
            "judged-block rows (with `--stack`) are informational."
        )
    else:
        default_text = (
            "spread evenly among the judged ones; the *rounds* column gives each row's. The "
            f"*{DEFAULT_BLOCK}* block (none and {UTIL_20} with `stack=False`, as "
            "`%%gpuprofile` without `--stack` makes it), on which the utilisation sampler's "
            "targets are judged, was not measured here."
        )
    lines = [
        "Each sampler beside the profiled run, as `%%gpuprofile --stack` runs it: "
        "`profile_cell(run, runs=1, stack=True, cuda=False, samplers=...)`, `run` exec'ing "
        "the cell's compiled code object in a namespace as a notebook cell runs (torch "
        f"threads: {cfg.threads}), with two controls that sample nothing; and the "
        "utilisation sampler also as `%%gpuprofile` runs it by default, without `--stack` "
        "(`stack=False`). Each cell's calls come in three blocks of rounds: the *judged* "
        f"block ({'; '.join(judged['inner'])}: the line sampler's target, and the line "
        f"sampler on top of the utilisation sampler) in {judged['rounds']} rounds, the "
        "*informational* block (none again and every other variant) in "
        f"{info['rounds']} rounds, " + default_text + " In every round the order of the "
        "block's variants is shuffled (seeded), an untimed `gc.collect()` runs before each "
        "call, one untimed call of each variant comes first (and of each default-mode "
        "variant in default mode), and each *vs none* is the "
        "median over the block's rounds of each round's ratio to the call without a sampler "
        "of the same round of the same block. *Profiled run* = the run inside the profiler "
        "(timed by wrapping `run`), what the targets judge; *profile_cell call* = the whole "
        "call (profiler start and stop, the samplers' start and stop, the trace's export, "
        "the samples' record). Samples/s = samples recorded over the profiled run's time "
        "(line sampler: only samples taken while the cell runs are kept; utilisation: "
        "intervals recorded).",
        "",
        machine,
        "",
        "| cell | variant | profiled run | vs none | cell thread off the CPU, added "
        "| profile_cell call | vs none | samples/s | noise floor | rounds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    worst: dict[Any, tuple[float, str]] = {}
    for name, c in cells.items():
        for block_name, block in c["blocks"].items():
            inner, outer, rates = block["inner"], block["outer"], block["rates"]
            for label in inner:
                if label == NONE:
                    ratio_in = ratio_out = off = "-"
                else:
                    # The default-mode block's entries apart: UTIL_20 is in two blocks.
                    key = (DEFAULT_BLOCK, label) if block_name == DEFAULT_BLOCK else label
                    r_in = ratios(inner[label], inner[NONE])
                    ratio_in = pct(r_in)
                    ratio_out = pct(ratios(outer[label], outer[NONE]))
                    if med(r_in) > worst.get(key, (-math.inf, ""))[0]:
                        worst[key] = (med(r_in), name)
                    r_off = _off_cpu_added(block, label)
                    off = pct(r_off)
                    if med(r_off) > worst.get(("off", key), (-math.inf, ""))[0]:
                        worst[("off", key)] = (med(r_off), name)
                rate = ", ".join(f"{key} {med(v):.0f}" for key, v in rates[label].items()) or "-"
                lines.append(
                    f"| {name} (n={c['n']:,}) | {label} | {_ms(inner[label])} | {ratio_in} "
                    f"| {off} | {_ms(outer[label])} | {ratio_out} | {rate} "
                    f"| {_iqrpct(inner[NONE]) if label == NONE else ''} "
                    f"| {len(inner[label])} ({block_name}) |"
                )
    on_top = {
        name: ratios(
            c["blocks"][JUDGED_BLOCK]["inner"][BOTH], c["blocks"][JUDGED_BLOCK]["inner"][UTIL_20]
        )
        for name, c in cells.items()
    }
    for name, values in on_top.items():
        if med(values) > worst.get("on top", (-math.inf, ""))[0]:
            worst["on top"] = (med(values), name)
    lines += [
        "",
        "The controls sample nothing: the idle thread shows what a second Python thread "
        "alone changes in the profiled run (the thread-mode line sampler's and the "
        "utilisation sampler's rows include it), and the empty SIGALRM handler shows what "
        "delivering the signal every 1 ms costs apart from taking the sample (the "
        "signal-mode rows include it). A negative overhead means the runs were faster with "
        "it than without.",
        "",
        "*Cell thread off the CPU, added*: during the profiled run, the time the cell's "
        "thread was not running (its wall time less its own CPU time, `time.thread_time_ns`: "
        "waiting for the GIL or for a core), less the same in the run without a sampler of "
        "the same round of the same block, as a share of that run. A sampler thread on the "
        "other core takes time from the cell only by holding the GIL the cell needs (or by "
        "taking its core), and "
        "this measures exactly that, without the run-to-run spread of the wall-time column "
        "(whose standard error here is of the order of the 1% goal, and in which a second "
        "live thread alone can speed the cell's thread up or slow it down, as the idle-"
        "thread control shows).",
        "",
        "What `--stack`'s line sampler adds in the magic, where the utilisation sampler "
        "always runs (both as the magic makes them vs the utilisation sampler alone, "
        f"20 ms, round by round in the judged block's {judged['rounds']} rounds): "
        + "; ".join(f"{name} {pct(values)}" for name, values in on_top.items())
        + ".",
    ]
    if notes:
        lines += ["", "What the samplers noted: " + "; ".join(notes[:8]) + "."]
    if not signal_ok or LINE_SIGNAL not in _measured(first):
        lines += [
            "",
            "The signal sampler could not run here (no SIGALRM interval timer, or "
            "not the main thread): the magic falls back to thread mode.",
        ]
    lines += ["", *_pyinstrument_lines(cells)]
    lines += ["", *_hotspot_lines(cfg, hot)]
    targets = _targets(worst, hot, cfg.quick) + _pyinstrument_targets(cells, worst)
    return Section(TITLE, "\n".join(lines), targets)


INFO = "informational (no goal set)"


def _pyinstrument_lines(cells: dict[str, dict[str, Any]]) -> list[str]:
    """pyinstrument's part of the section: what it does to torch's python_function events,
    how it compares with the line sampler, and what it costs without torch.profiler."""
    first = next(iter(cells.values()))
    if PYI_1 not in _measured(first):
        return [
            "pyinstrument is not installed here (`make bench` installs pyinstrument 5.1.3 "
            "into the venv it runs): its variants are left out."
        ]
    med = statistics.median
    line_ref = LINE_SIGNAL if LINE_SIGNAL in _measured(first) else LINE_THREAD
    out = [
        f"pyinstrument {pyinstrument_version()}: `pyinstrument.Profiler(interval=...)` in its "
        "default async mode, started after the profiler and stopped before it, like the "
        "samplers; its samples/s = its session's sample count over the run. It has no timer "
        "of its own: it installs a C profile function on the cell's thread "
        "(`PyEval_SetProfile`), which reads the clock at every call and return of a Python or "
        "C function and takes a sample at the first one after the interval has passed (a "
        "stretch of code that calls nothing is sampled only at its next call or return). "
        "torch.profiler's `with_stack=True` recording keeps its Python events through the "
        "same per-thread profile function, set on every thread when the profiler starts.",
        "",
        "python_function events (torch's `with_stack` recording) in each profiled run's "
        "exported trace, and of them those inside the cell's run (nested in the event of the "
        "function that runs the cell), median over the rounds of the variant's block "
        "(none: the judged block's):",
        "",
        "| cell | variant | python_function events in the trace | inside the cell's run |",
        "|---|---|---|---|",
    ]
    for name, c in cells.items():
        for label in (v for v in PYFUNC if v in _measured(c)):
            counts = _block_of(c, label)["pyfunc"][label]
            out.append(
                f"| {name} | {label} | {med([t for t, _ in counts]):,.0f} "
                f"| {med([i for _, i in counts]):,.0f} |"
            )
    said = []
    for name, c in cells.items():
        ref = _inside(c, NONE)
        got = {label: _inside(c, label) for label in PYI_INTERVALS}
        said.append(
            f"{name}: "
            + ", ".join(f"{label} {value:,.0f}" for label, value in got.items())
            + f" of {ref:,.0f} without a sampler"
        )
    out += [
        "",
        "Inside the cell's run torch recorded, with pyinstrument running: " + "; ".join(said) + ".",
    ]
    if all(
        _inside(c, label) == 0 < _inside(c, NONE) for c in cells.values() for label in PYI_INTERVALS
    ):
        out += [
            "",
            "So while pyinstrument runs, torch records no Python event on the "
            "cell's thread: pyinstrument's start() puts its profile function in place of "
            "torch's there and its stop() leaves none, so the events left in the trace "
            "are those from before it started. Its profiled-run "
            "rows above are therefore not its cost alone: with it, the run no longer pays "
            "for torch's own Python recording, and the trace has no Python events for "
            "the hotspots to read.",
        ]

    def against_line(c: dict[str, Any], label: str) -> str:
        block, ref_block = _block_of(c, label), _block_of(c, line_ref)
        return _pct_across(
            ratios(block["inner"][label], block["inner"][NONE]),
            ratios(ref_block["inner"][line_ref], ref_block["inner"][NONE]),
        )

    out += [
        "",
        f"pyinstrument against the {line_ref}, the profiled run: measured in "
        "different blocks, so each against the run without a sampler of its own rounds, "
        "(1 + pyinstrument's median) / (1 + the line sampler's median) - 1, ± the two "
        "standard errors combined: "
        + "; ".join(
            f"{name}: " + ", ".join(f"{label} {against_line(c, label)}" for label in PYI_INTERVALS)
            for name, c in cells.items()
        )
        + ".",
    ]
    bare_labels = [v for v in BARE if v in first["bare"]]
    out += [
        "",
        "Without torch.profiler: the cell run bare (`exec` of its code object, the samplers "
        "started before and stopped after), with none, the line sampler and pyinstrument, "
        f"{first['bare_rounds']} interleaved rounds (the informational block's count; "
        "shuffled, seeded) after one untimed call of each, an "
        "untimed `gc.collect()` before each; what each sampler costs on its own:",
        "",
        f"| cell | variant | run | vs none | vs the {line_ref} | samples/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in cells.items():
        bare, rates = c["bare"], c["bare_rates"]
        for label in bare_labels:
            vs_none = "-" if label == NONE else pct(ratios(bare[label], bare[NONE]))
            vs_line = (
                pct(ratios(bare[label], bare[line_ref]))
                if label in PYI_INTERVALS and line_ref in bare
                else "-"
            )
            rate = ", ".join(f"{key} {med(v):.0f}" for key, v in rates[label].items()) or "-"
            out.append(
                f"| {name} | {label} | {_ms(bare[label])} | {vs_none} | {vs_line} | {rate} |"
            )
    return out


def _pyinstrument_targets(
    cells: dict[str, dict[str, Any]], worst: dict[str, tuple[float, str]]
) -> tuple[Target, ...]:
    """Informational rows for pyinstrument (no goal): the profiled run, the bare run, and
    the python_function events left inside the cell's run."""
    first = next(iter(cells.values()))
    if PYI_1 not in _measured(first):
        return (
            Target(
                "pyinstrument Profiler: added to the profiled run",
                "not measured (pyinstrument not installed)",
                INFO,
                None,
            ),
        )
    med = statistics.median
    out = []
    for label in PYI_INTERVALS:
        value, cell = worst[label]
        out.append(
            Target(
                f"{label}: added to the profiled run (worst cell)",
                f"{value:+.1%} ({cell})",
                INFO,
                None,
            )
        )
    for label in PYI_INTERVALS:
        value, cell = max(
            (med(ratios(c["bare"][label], c["bare"][NONE])), name) for name, c in cells.items()
        )
        out.append(
            Target(
                f"{label}, without torch.profiler: added to the bare run (worst cell)",
                f"{value:+.1%} ({cell})",
                INFO,
                None,
            )
        )
    line_ref = LINE_SIGNAL if LINE_SIGNAL in _measured(first) else LINE_THREAD
    ref, name = max((_inside(c, NONE), name) for name, c in cells.items())
    c = cells[name]
    out.append(
        Target(
            "python_function events inside the cell's run, of those without a sampler (the "
            "cell with the most)",
            f"{PYI_1} {_inside(c, PYI_1):,.0f}, {line_ref} {_inside(c, line_ref):,.0f}, of "
            f"{ref:,.0f} ({name})",
            INFO,
            None,
        )
    )
    return tuple(out)


def _after_load(hot: dict[str, Any], variant: str) -> float:
    """(analyze + display) / load: the median over runs of each run's ratio."""
    return statistics.median(
        (a + d) / load for (a, d, _), load in zip(hot[variant], hot["load"], strict=True)
    )


def _hotspot_lines(cfg: BenchConfig, hot: dict[str, Any] | None) -> list[str]:
    if hot is None:
        return [f"Hotspots: `{HOTSPOT_TRACE}` not found under `{cfg.traces_dir}`; skipped."]
    med = statistics.median
    load = hot["load"]
    with_a = [a for a, _, _ in hot["with"]]
    with_d = [d for _, d, _ in hot["with"]]
    wo_a = [a for a, _, _ in hot["without"]]
    wo_d = [d for _, d, _ in hot["without"]]
    after_with, after_wo = _after_load(hot, "with"), _after_load(hot, "without")

    def ms(values: list[int]) -> str:
        return f"{med(values) / 1e6:.0f} ms"

    return [
        f"Hotspots on `{HOTSPOT_TRACE}` ({hot['bytes'] / 2**20:.0f} MB of JSON, "
        f"{hot['events']:,} python_function events on its main thread, "
        f"{hot['granularity']} granularity), in this process: {len(load)} runs after an "
        "untimed one, an untimed `gc.collect()` before each stage; *without* replaces "
        "`analysis.report.compute_hotspots` with a function returning None (no Hotspots "
        "tab); (analyze + display) / load is the median over runs of each run's ratio. "
        f"compute_hotspots alone: min {min(hot['hotspots']) / 1e6:.0f} ms, median "
        f"{ms(hot['hotspots'])}.",
        "",
        "| variant | load | analyze | display | (analyze + display) / load |",
        "|---|---|---|---|---|",
        f"| with hotspots (as analyze runs) | {ms(load)} | {ms(with_a)} | {ms(with_d)} "
        f"| {after_with:.2f}x |",
        f"| without hotspots | {ms(load)} | {ms(wo_a)} | {ms(wo_d)} | {after_wo:.2f}x |",
        "",
        f"Hotspots add {(med(with_a) + med(with_d) - med(wo_a) - med(wo_d)) / 1e6:.0f} ms "
        f"to analyze + display, {after_with - after_wo:+.2f}x of the load.",
    ]


# Appended to the utilisation sampler's judged targets: measured in the default-mode block.
DEFAULT_MODE = " — default mode, no --stack"


def _targets(
    worst: dict[Any, tuple[float, str]], hot: dict[str, Any] | None, quick: bool
) -> tuple[Target, ...]:
    """The issue's goals (a) and (b) on the worst cell, and (c) on the hotspot trace; a
    --quick run's cells last milliseconds, so its overheads are shown, not judged. The line
    sampler's goal is judged on the judged block, the utilisation sampler's on the
    default-mode block (its judged-block rows, with --stack, are informational)."""
    line_label = LINE_SIGNAL if LINE_SIGNAL in worst else LINE_THREAD
    util, util_off = (DEFAULT_BLOCK, UTIL_20), ("off", (DEFAULT_BLOCK, UTIL_20))
    targets = []
    for label, name, goal in (
        (line_label, f"{line_label}: added to the profiled run (worst cell)", LINE_GOAL),
        (
            util,
            "utilisation sampler (20 ms, the default): added to the profiled run "
            f"(worst cell){DEFAULT_MODE}",
            UTIL_GOAL,
        ),
        (
            util_off,
            "utilisation sampler (20 ms, the default): cell thread kept off the "
            f"CPU, added to the profiled run (worst cell){DEFAULT_MODE}",
            UTIL_GOAL,
        ),
    ):
        if label in worst:
            value, cell = worst[label]
            targets.append(
                Target(
                    name,
                    f"{value:+.1%} ({cell})" + ("; quick run, not judged" if quick else ""),
                    f"under {goal:.0%}",
                    None if quick else value < goal,
                )
            )
        else:
            targets.append(Target(name, "not measured", f"under {goal:.0%}", None))
    for label, name in (
        (
            UTIL_20,
            "utilisation sampler (20 ms) with --stack (judged block): added to the "
            "profiled run (worst cell)",
        ),
        (
            ("off", UTIL_20),
            "utilisation sampler (20 ms) with --stack (judged block): cell "
            "thread kept off the CPU, added to the profiled run (worst "
            "cell)",
        ),
        (
            BOTH,
            "both samplers as the magic makes them (--stack): added to the profiled "
            "run (worst cell)",
        ),
        (
            "on top",
            "line sampler on top of the utilisation sampler (what --stack adds "
            "in the magic, worst cell)",
        ),
    ):
        if label in worst:
            value, cell = worst[label]
            targets.append(
                Target(name, f"{value:+.1%} ({cell})", "informational (no goal set)", None)
            )
    name = "hotspots trace: (analysis + display) / load, hotspots included"
    if hot is None:
        targets.append(Target(name, "trace not found; skipped", "<= 1x the load", None))
    else:
        after = _after_load(hot, "with")
        targets.append(
            Target(
                name, f"{after:.2f}x ({Path(HOTSPOT_TRACE).name})", "<= 1x the load", after <= 1.0
            )
        )
    return tuple(targets)
