"""Comparison 12: exact line events (capture/linetrace.py) against the line sampler
(capture/sampling.py, SIGALRM every 5 ms), the two ways `%%gpuprofile --stack` can read the
cell's lines. Issue 32's questions:

- the right line: planted cells (the issue's per-sample loop, whose work is one line below
  `for row in xs:`, and a sleep inside `for _ in range(3):`) profiled many times with each,
  counting the runs whose top hotspot is the planted line;
- what each costs: the profiled run (the cell's run inside torch.profiler with
  `with_stack=True`, as the magic makes it: `profile_cell(run, stack=True, samplers=...)`)
  with nothing recording lines, with the sampler and with the tracer, on a torch training
  loop, the issue's per-sample loop, a per-sample loop of tiny torch ops and a tight
  pure-Python loop; the tracer also without its back-off in tight loops (every line event
  taken), to show what the back-off buys.

Rounds interleave the variants in a new random order (seeded) after one untimed call of
each, an untimed gc.collect() before each call; each overhead is the median over rounds of
that round's ratio to the call without line recording (or to the sampler's call), ± the
median's standard error.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.measure import pct, ratios

TITLE = "16. Exact line events against the line sampler"
# Issue 32's goals for the tracer's cost, as fractions of the profiled run.
TRAINING_GOAL = 0.03
PER_SAMPLE_GOAL = 0.15
ROUNDS = 21
RIGHT_LINE_RUNS = 10

SETUP = """
import time, torch
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
xs = torch.randn(2000, 64)
data = torch.randn(4096, 16)
w = torch.randn(16)
"""

TRAINING = "torch MLP training loop (256 wide, batch 64, SGD)"
PER_SAMPLE = "the issue's per-sample loop"
TINY_OPS = "per-sample loop of tiny torch ops"
TIGHT = "tight pure-Python loop"
SLEEP = "sleep inside for _ in range(3)"

# name -> (cell body with {n}, n in quick mode, n in a full run, the planted line or 0).
# The right-line runs use RIGHT_N where given: the cells were short (a few ms), and a
# short cell is where the sampler, one sample every 5 ms, has the least to go on.
CELLS: dict[str, tuple[str, int, int, int]] = {
    TRAINING: (
        "for step in range({n}):\n"
        "    opt.zero_grad(set_to_none=True)\n"
        "    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n"
        "    opt.step()\n",
        2,
        60,
        0,
    ),
    PER_SAMPLE: (
        "out = []\nfor row in xs[:{n}]:\n"
        "    out.append(float(row.sum()) * 2.0 + sum(range(300)))\n",
        40,
        2000,
        3,
    ),
    TINY_OPS: (
        "out = []\n"
        "for i in range({n}):\n"
        "    row = data[i % 4096]\n"
        "    s = float((row * w).sum())\n"
        "    if s > 0:\n"
        "        out.append(round(s * s, 3))\n",
        40,
        600,
        0,
    ),
    TIGHT: ("total = 0\nfor i in range({n}):\n    total += i * i % 7\n", 20_000, 400_000, 0),
    SLEEP: (
        "y = x.sum()\nfor _ in range(3):\n    time.sleep({n} / 1000)\n    y = y + x.sum()\n",
        2,
        20,
        3,
    ),
}
# The cells whose cost is measured (the sleep cell's is the sleep's).
TIMED = (TRAINING, PER_SAMPLE, TINY_OPS, TIGHT)
RIGHT_N = {PER_SAMPLE: 400}
PLANTED = tuple(name for name, (_, _, _, line) in CELLS.items() if line)

NONE = "none"
SAMPLER = "line sampler (SIGALRM, 5 ms)"
TRACER = "exact line events"
TRACER_FULL = "exact line events, no back-off"


def _recorders() -> dict[str, Callable[[CodeType], Any]]:
    from gpuprof_nb.capture.linetrace import LineTracer, default_engine
    from gpuprof_nb.capture.sampling import LineSampler

    out: dict[str, Callable[[CodeType], Any]] = {
        NONE: lambda code: None,
        SAMPLER: LineSampler,
    }
    if default_engine() is not None:
        out[TRACER] = LineTracer
        out[TRACER_FULL] = lambda code: LineTracer(code, backoff=False)
    return out


def _profiled(
    code: CodeType, ns: dict[str, Any], recorder: Any
) -> tuple[tuple[int, int], dict[str, Any]]:
    """One profiled run as the magic makes it: ((wall ns, the cell thread's CPU ns) of the
    run inside the profiler, the artifact)."""
    from gpuprof_nb.capture.profiler import profile_cell

    box: list[tuple[int, int]] = []

    def run() -> None:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        exec(code, ns)
        box.append((time.perf_counter_ns() - t0, time.thread_time_ns() - c0))

    samplers = [("samples", recorder)] if recorder is not None else []
    artifact = profile_cell(run, runs=1, stack=True, cuda=False, samplers=samplers)
    return box[0], artifact


def _top_line(artifact: dict[str, Any]) -> tuple[int, str]:
    """(line number, label) of the top hotspot line, (0, why) when there is none."""
    from gpuprof_nb.analysis.report import analyze
    from gpuprof_nb.io.trace import trace_from_dict

    report = analyze(trace_from_dict(artifact, "bench"))
    h = report.hotspots
    if h is None or not h.lines:
        return 0, "no hotspots"
    top = h.lines[0]
    return (top.line if h.granularity == "line" else 0), top.label


def _code(name: str, n: int) -> CodeType:
    body = CELLS[name][0].format(n=n)
    # A notebook cell's file name: the cell's code is the user's.
    return compile(body, f"<ipython-input-{list(CELLS).index(name) + 1}-0a1b2c3d>", "exec")


def measure(cfg: BenchConfig) -> dict[str, Any]:
    """Every number of the section, as plain data."""
    import torch

    torch.set_num_threads(cfg.threads)
    ns: dict[str, Any] = {}
    exec(SETUP, ns)
    recorders = _recorders()
    rounds = max(cfg.repeats, 1) if cfg.quick else max(cfg.repeats, ROUNDS)
    right_runs = max(cfg.repeats, 1) if cfg.quick else RIGHT_LINE_RUNS
    rng = random.Random(12)
    cells: dict[str, Any] = {}
    for name in TIMED:
        _, quick_n, full_n, _ = CELLS[name]
        code = _code(name, quick_n if cfg.quick else full_n)
        times: dict[str, list[tuple[int, int]]] = {label: [] for label in recorders}
        for make in recorders.values():  # one untimed call of each
            _profiled(code, ns, make(code))
        for _ in range(rounds):
            order = list(recorders)
            rng.shuffle(order)
            for label in order:
                gc.collect()
                inner, _ = _profiled(code, ns, recorders[label](code))
                times[label].append(inner)
        cells[name] = times
    right: dict[str, dict[str, list[str]]] = {}
    kernel = None if cfg.quick else _right_in_a_kernel(cfg)
    for name in PLANTED if kernel is None else ():
        _, quick_n, full_n, line = CELLS[name]
        code = _code(name, quick_n if cfg.quick else RIGHT_N.get(name, full_n))
        right[name] = {}
        for label in (SAMPLER, TRACER):
            if label not in recorders:
                continue
            tops = []
            for _ in range(right_runs):
                gc.collect()
                _, artifact = _profiled(code, ns, recorders[label](code))
                got, top = _top_line(artifact)
                tops.append(f"{'right' if got == line else 'wrong'}: {top}")
            right[name][label] = tops
    return {
        "cells": cells,
        "right": kernel if kernel is not None else right,
        "where": "a Jupyter kernel" if kernel is not None else "this process",
        "rounds": rounds,
        "right_runs": right_runs,
    }


KERNEL_SETUP = """
import json, time, torch
torch.set_num_threads({threads})
%load_ext gpuprof_nb
import gpuprof_nb.capture.samplers as _session
from gpuprof_nb.capture.sampling import LineSampler
_exact = _session.line_recorder
x = torch.randn(64, 64)
xs = torch.randn(2000, 64)
"""


def _right_in_a_kernel(cfg: BenchConfig) -> dict[str, dict[str, list[str]]] | None:
    """The planted cells run RIGHT_LINE_RUNS times each under `%%gpuprofile --stack` in a
    real Jupyter kernel (nbclient), with the sampler and with line events (the magic's
    line_recorder swapped in the kernel): {cell: {variant: ["right: label", ...]}}; None
    where nbclient or a kernel is not at hand."""
    import json

    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        return None
    cells = [nbformat.v4.new_code_cell(KERNEL_SETUP.format(threads=cfg.threads))]
    for label, swap in (
        (SAMPLER, "_session.line_recorder = LineSampler"),
        (TRACER, "_session.line_recorder = _exact"),
    ):
        cells.append(nbformat.v4.new_code_cell(swap))
        for name in PLANTED:
            body, _, full_n, line = CELLS[name]
            n = RIGHT_N.get(name, full_n)
            for _ in range(RIGHT_LINE_RUNS):
                cells.append(
                    nbformat.v4.new_code_cell(
                        "%%gpuprofile --stack -o _r --quiet\n" + body.format(n=n)
                    )
                )
                cells.append(
                    nbformat.v4.new_code_cell(
                        "_h = _r.hotspots\n_top = _h.lines[0] if _h and _h.lines else None\n"
                        f"print(json.dumps([{name!r}, {label!r}, {line}, "
                        "_top.line if _top and _h.granularity == 'line' else 0, "
                        "_top.label if _top else 'no hotspots']))"
                    )
                )
    nb = nbformat.v4.new_notebook(cells=cells)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    except Exception:  # noqa: BLE001 - no kernel here: measured in this process instead
        return None
    out: dict[str, dict[str, list[str]]] = {}
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            text = o.get("text", "") if o.get("name") == "stdout" else ""
            if text.startswith("["):
                name, label, want, got, top = json.loads(text)
                verdict = "right" if got == want else "wrong"
                out.setdefault(name, {}).setdefault(label, []).append(f"{verdict}: {top}")
    return out


def render(cfg: BenchConfig, data: dict[str, Any]) -> Section:
    from gpuprof_nb.capture.linetrace import default_engine

    cells, right = data["cells"], data["right"]
    hooks = {"monitoring": "sys.monitoring", "settrace": "sys.settrace"}
    engine = hooks.get(default_engine() or "", "none (another tool holds the hook)")
    lines = [
        f"Python {sys.version.split()[0]}: exact line events through {engine}"
        f"; torch threads: {cfg.threads}. Each call: `profile_cell(run, runs=1, stack=True, "
        "cuda=False, samplers=[('samples', recorder)])` as `%%gpuprofile --stack` makes it "
        "(no utilisation sampler: it runs alike under both), `run` exec'ing the cell's code "
        f"object; {data['rounds']} rounds of every variant per cell, interleaved in a "
        "random order (seeded), one untimed call of each first, an untimed gc.collect() "
        "before each call. *vs none*: the median over rounds of each round's ratio of the "
        "profiled run to the one without line recording, ± its standard error; *vs the "
        "sampler*: the same against the sampler's run of the round.",
        "",
        "| cell | variant | cell thread CPU | vs none | vs the sampler | wall | vs none (wall) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, times in cells.items():
        cpu = {label: [c for _, c in v] for label, v in times.items()}
        wall = {label: [w for w, _ in v] for label, v in times.items()}
        for label in times:
            vs_none = "-" if label == NONE else pct(ratios(cpu[label], cpu[NONE]))
            vs_sampler = "-" if label in (NONE, SAMPLER) else pct(ratios(cpu[label], cpu[SAMPLER]))
            wall_vs = "-" if label == NONE else pct(ratios(wall[label], wall[NONE]))
            lines.append(
                f"| {name} | {label} | {statistics.median(cpu[label]) / 1e6:.1f} ms "
                f"| {vs_none} | {vs_sampler} | {statistics.median(wall[label]) / 1e6:.1f} ms "
                f"| {wall_vs} |"
            )
    lines += [
        "",
        "The targets are judged on the cell thread's CPU time (`time.thread_time_ns()` around "
        "the run; torch runs one intra-op thread, so the ops' work is on that thread too): "
        "what a line recorder adds is work on that thread (its callbacks, its signal "
        "handler), and CPU time measures that work whatever else runs on the machine, where "
        "the wall time of a run on this shared 2-core VM moves by tens of percent when "
        "other processes take the cores (see the load average above). The wall-time columns "
        "are shown for reference.",
    ]
    lines += [
        "",
        f"The right line: each planted cell profiled {data['right_runs']} times with each "
        f"in {data['where']}, the top hotspot line against the planted one (the work line of "
        f"the per-sample loop over {RIGHT_N[PER_SAMPLE]} rows, line 3; the sleep's line, "
        "line 3). The sampler takes one sample every 5 ms, handled where the interpreter "
        "next checks for signals (a call, a loop's backward jump): a cell of a few "
        "milliseconds gives it no sample or a few (with none, the hotspots fall back to "
        "the profiler's function events, 'line unknown'); line events do not depend on "
        "either:",
        "",
        "| cell | variant | top line right | top lines seen |",
        "|---|---|---|---|",
    ]
    right_counts: dict[tuple[str, str], tuple[int, int]] = {}
    for name, by in right.items():
        for label, tops in by.items():
            ok = sum(t.startswith("right") for t in tops)
            right_counts[(name, label)] = (ok, len(tops))
            seen = sorted({t.split(": ", 1)[1] for t in tops})
            lines.append(f"| {name} | {label} | {ok} of {len(tops)} | {'; '.join(seen)[:160]} |")
    targets = []

    def cpu_of(cell: str, label: str) -> list[int]:
        return [c for _, c in cells.get(cell, {}).get(label, [])]

    def cost(label: str, cell: str) -> float | None:
        if not cpu_of(cell, label):
            return None
        return statistics.median(ratios(cpu_of(cell, label), cpu_of(cell, NONE)))

    def vs_sampler(label: str, cell: str) -> float | None:
        if not cpu_of(cell, label) or not cpu_of(cell, SAMPLER):
            return None
        return statistics.median(ratios(cpu_of(cell, label), cpu_of(cell, SAMPLER)))

    for cell, goal in ((TRAINING, TRAINING_GOAL), (PER_SAMPLE, PER_SAMPLE_GOAL)):
        got = cost(TRACER, cell)
        against = vs_sampler(TRACER, cell)
        sampler = cost(SAMPLER, cell)
        measured = (
            "not measured"
            if got is None
            else f"{got:+.1%} vs none ({against:+.1%} vs the sampler, whose own is {sampler:+.1%})"
        )
        if cfg.quick and got is not None:
            measured += "; quick run, not judged"
        targets.append(
            Target(
                f"exact line events: CPU added to the profiled run, {cell}",
                measured,
                f"at most {goal:.0%}",
                None if got is None or cfg.quick else got <= goal,
            )
        )
    for label in (TRACER_FULL, TRACER, SAMPLER):
        got = cost(label, TIGHT)
        if got is not None:
            targets.append(
                Target(
                    f"{label}: CPU added to the profiled run, {TIGHT}",
                    f"{got:+.1%}",
                    "informational (no goal set)",
                    None,
                )
            )
    for name in PLANTED:
        for label in (TRACER, SAMPLER):
            if (name, label) in right_counts:
                ok, n = right_counts[(name, label)]
                targets.append(
                    Target(
                        f"{label}: top hotspot is the planted line, {name}",
                        f"{ok} of {n}",
                        f"{n} of {n}" if label == TRACER else "informational (today's sampler)",
                        (None if cfg.quick else ok == n) if label == TRACER else None,
                    )
                )
    return Section(TITLE, "\n".join(lines), tuple(targets))


def run(cfg: BenchConfig) -> Section:
    return render(cfg, measure(cfg))
