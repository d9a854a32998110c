"""Comparison 10: `%%gpuprofile` on a real training cell, in a real Jupyter kernel.

A small real training loop on the CPU, or on the GPU with `--device cuda` (an MLP, a batch
of random data, cross-entropy and an Adam step, a few steps per cell) runs under
`%%gpuprofile -o r`, its report displayed, as a user runs it, in one ipykernel driven with
jupyter_client (overhead.py's `Kernel`). What the magic adds AFTER the profiled run is
measured stage by stage, from inside the kernel:

- profiled run: the cell's code inside torch.profiler's `with` block (from the end of
  `profile.__enter__` to the start of `profile.__exit__`);
- export: from the end of the profiled run to the start of the trace's load, in four parts:
  stopping the profiler (`profile.__exit__`), writing the trace (`export_chrome_trace`),
  reading it back (the rest of gpuprof_nb's `_export`: reading and parsing the file) and
  the rest (cutting the warm-up out of the trace, placing the samplers' records);
- load: `trace_from_dict` / `load_trace` (gpuprof_nb.io.trace);
- analyze: `gpuprof_nb.analysis.report.analyze`;
- display: the report's `_repr_mimebundle_` (the HTML and text of every tab);
- other: the rest, up to IPython's post_run_cell event (the step count, the device's
  ceilings, handing the bundle to ipykernel).

The timing hooks are installed in the kernel after one untimed call (so every module the
magic imports lazily is loaded): torch.profiler.profile's `__enter__`/`__exit__` and
ProfileReport's `_repr_mimebundle_` are wrapped on their classes, and `trace_from_dict`,
`load_trace` and `analyze` are replaced in every gpuprof_nb module that holds them (the
module the magic imports them from at call time, and any module that imported them at
load), so the hooks do not depend on where in the magic those calls are made.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.overhead import Kernel

# (batch, features in, hidden, classes, steps per cell): a 3-layer MLP, ~40 ms per step on
# one core of the reference machine; --quick shrinks it to milliseconds.
MODEL_FULL = (256, 512, 1024, 10, 4)
MODEL_QUICK = (32, 64, 64, 10, 2)
# On a GPU (`--device cuda`): wider and longer, so the cell's run is tens of milliseconds on an
# H100 (fp32, about 5 ms a step) as the CPU cell is on a core.
MODEL_CUDA = (2048, 1024, 4096, 10, 10)

SETUP = """
import torch
torch.set_num_threads({threads})
torch.manual_seed(0)
dev = torch.device({device!r})
model = torch.nn.Sequential(
    torch.nn.Linear({features}, {hidden}), torch.nn.ReLU(),
    torch.nn.Linear({hidden}, {hidden}), torch.nn.ReLU(),
    torch.nn.Linear({hidden}, {classes}),
).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn({batch}, {features}, device=dev)
y = torch.randint(0, {classes}, ({batch},), device=dev)
"""

CELL = """for step in range({steps}):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
"""

# Runs in the kernel once, after a first untimed call of the magic: records, per cell, the
# start and end of each hooked stage (perf_counter_ns), and the cell's own start and end
# (pre_run_cell / post_run_cell).
HOOKS = """
import gc as _bench_gc, sys as _bench_sys, time as _bench_time, functools as _bench_ft
_bench_now = _bench_time.perf_counter_ns
_bench_cells = []
_bench_cur = None

def _bench_pre(info):
    global _bench_cur
    _bench_cur = {"start": _bench_now(), "events": [], "active": set()}

def _bench_post(result):
    global _bench_cur
    if _bench_cur is not None:
        _bench_cur["end"] = _bench_now()
        _bench_cells.append({"start": _bench_cur["start"], "end": _bench_cur["end"],
                             "events": _bench_cur["events"]})
    _bench_cur = None

def _bench_timed(stage, fn):
    @_bench_ft.wraps(fn)
    def wrapper(*args, **kwargs):
        cur = _bench_cur
        if cur is None or stage in cur["active"]:  # not in a timed cell, or nested
            return fn(*args, **kwargs)
        cur["active"].add(stage)
        t0 = _bench_now()
        try:
            return fn(*args, **kwargs)
        finally:
            cur["active"].discard(stage)
            cur["events"].append((stage, t0, _bench_now()))
    wrapper._bench_original = fn
    return wrapper

def _bench_patch_functions(module_name, names, stage):
    source = _bench_sys.modules[module_name]
    patched = 0
    for name in names:
        original = getattr(source, name, None)
        if original is None:
            continue
        original = getattr(original, "_bench_original", original)
        wrapper = _bench_timed(stage, original)
        for mod_name, mod in list(_bench_sys.modules.items()):
            if mod is None or not (mod_name == "gpuprof_nb" or mod_name.startswith("gpuprof_nb.")):
                continue
            held = vars(mod).get(name)
            if held is original or getattr(held, "_bench_original", None) is original:
                setattr(mod, name, wrapper)
                patched += 1
    return patched

def _bench_patch_method(cls, name, stage):
    original = getattr(cls, name)
    original = getattr(original, "_bench_original", original)
    setattr(cls, name, _bench_timed(stage, original))

get_ipython().events.register("pre_run_cell", _bench_pre)
get_ipython().events.register("post_run_cell", _bench_post)
import torch.profiler as _bench_tp
import gpuprof_nb.io.trace, gpuprof_nb.analysis.report, gpuprof_nb.results.report
_bench_patch_method(_bench_tp.profile, "__enter__", "profiler enter")
_bench_patch_method(_bench_tp.profile, "__exit__", "profiler exit")
_bench_patch_method(gpuprof_nb.results.report.ProfileReport, "_repr_mimebundle_", "display")
_bench_patch_method(_bench_tp.profile, "export_chrome_trace", "write trace")
import gpuprof_nb.capture.profiler
_bench_patched = {
    "load": _bench_patch_functions("gpuprof_nb.io.trace", ["trace_from_dict", "load_trace"],
                                   "load"),
    "analyze": _bench_patch_functions("gpuprof_nb.analysis.report", ["analyze"], "analyze"),
    "export": _bench_patch_functions("gpuprof_nb.capture.profiler", ["_export"], "export fn"),
}
"""

# Stages after the profiled run, in the order they happen; "other" is the rest of the cell.
AFTER = ("export", "load", "analyze", "display", "other")
# The parts of the export stage, with what the table calls them.
EXPORT_PARTS = {
    "stop": "stopping the profiler (`profile.__exit__`)",
    "write": "writing the trace (`export_chrome_trace`)",
    "read": "reading it back (file read and JSON parse)",
    "rest": "the rest (warm-up cut, samplers' records)",
}


@dataclass
class Call:
    """One call of the magic: the seconds of each stage (NaN where its hook did not fire)."""

    before_s: float  # pre_run_cell to the profiler's start: the warm-up and timed runs
    profiled_s: float
    stages: dict[str, float]
    export_parts: dict[str, float]

    @property
    def after_s(self) -> float:
        return sum(v for v in self.stages.values() if not math.isnan(v))


def _call(cell: dict[str, Any]) -> Call:
    """Turn one cell's recorded events (stage, start ns, end ns) into stage seconds."""
    first: dict[str, tuple[int, int]] = {}
    total: dict[str, float] = {}
    for stage, t0, t1 in cell["events"]:
        first.setdefault(stage, (t0, t1))
        total[stage] = total.get(stage, 0.0) + (t1 - t0) / 1e9
    if "profiler enter" not in first or "profiler exit" not in first:
        raise RuntimeError(
            "the magic's profiled run was not seen (no torch.profiler "
            f"enter/exit in the cell); events: {sorted(first)}"
        )
    run_start = first["profiler enter"][1]
    run_end = first["profiler exit"][0]
    nan = float("nan")
    stages = {
        "export": (first["load"][0] - run_end) / 1e9 if "load" in first else nan,
        "load": total.get("load", nan),
        "analyze": total.get("analyze", nan),
        "display": total.get("display", nan),
    }
    after = (cell["end"] - run_end) / 1e9
    stages["other"] = after - sum(v for v in stages.values() if not math.isnan(v))
    write = total.get("write trace", nan)
    parts = {
        "stop": total["profiler exit"],
        "write": write,
        "read": total.get("export fn", nan) - write,
    }
    parts["rest"] = stages["export"] - sum(v for v in parts.values() if not math.isnan(v))
    return Call(
        before_s=(first["profiler enter"][0] - cell["start"]) / 1e9,
        profiled_s=(run_end - run_start) / 1e9,
        stages=stages,
        export_parts=parts,
    )


def _model(cfg: BenchConfig) -> tuple[int, int, int, int, int]:
    if cfg.quick:
        return MODEL_QUICK
    return MODEL_CUDA if cfg.device == "cuda" else MODEL_FULL


def measure(kernel: Kernel, cfg: BenchConfig, rounds: int) -> tuple[list[Call], dict[str, int]]:
    """Set up the model, call the magic once untimed, hook the stages, then `rounds` timed
    calls (an untimed gc.collect() before each); return the calls and what was patched."""
    batch, features, hidden, classes, steps = _model(cfg)
    kernel.run(
        SETUP.format(
            threads=cfg.threads,
            batch=batch,
            features=features,
            hidden=hidden,
            classes=classes,
            device=cfg.device,
        )
    )
    kernel.run("get_ipython().run_line_magic('load_ext', 'gpuprof_nb')\n")
    cell = "%%gpuprofile -o r\n" + CELL.format(steps=steps)
    kernel.run(cell)  # untimed: imports, allocator, profiler start-up, the render layer
    kernel.run(HOOKS, silent=True)
    patched = kernel.value("_bench_patched")
    for _ in range(rounds):
        kernel.run("_bench_gc.collect()", silent=True)
        kernel.run(cell)
    save = os.environ.get("GPUPROF_BENCH_SAVE_TRACE")
    if save:  # the last call's trace, for a look at what the stages handled (gpu_check.sh)
        kernel.run(f"r.save({save!r})", silent=True)
    cells = kernel.value("_bench_cells")
    if len(cells) != rounds:
        raise RuntimeError(f"the kernel logged {len(cells)} cells, {rounds} were run")
    return [_call(c) for c in cells], patched


def run(cfg: BenchConfig) -> Section:
    """Measure the magic on the training cell; return the RESULTS.md section."""
    rounds = max(cfg.repeats, 1) if cfg.quick else max(cfg.repeats, 7)
    kernel = Kernel()
    try:
        calls, patched = measure(kernel, cfg, rounds)
    finally:
        kernel.close()
    return _section(cfg, calls, patched)


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def _share(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{statistics.median(values):.1%}" if values else "-"


def _section(cfg: BenchConfig, calls: list[Call], patched: dict[str, int]) -> Section:
    med = statistics.median
    batch, features, hidden, classes, steps = _model(cfg)
    if cfg.device == "cuda":
        import torch

        where = f"on the GPU ({torch.cuda.get_device_name(0)}, fp32; torch threads: {cfg.threads})"
    else:
        where = f"on the CPU (torch threads: {cfg.threads})"

    def stage_med(name: str) -> float:
        values = [c.stages[name] for c in calls if not math.isnan(c.stages[name])]
        return med(values) if values else float("nan")

    profiled = med(c.profiled_s for c in calls)
    after = med(c.after_s for c in calls)
    share = med(c.after_s / c.profiled_s for c in calls)
    lines = [
        f"A real training cell {where}: a 3-layer MLP "
        f"({features} -> {hidden} -> {hidden} -> {classes}, ReLU), a batch of {batch} random "
        f"samples, cross-entropy and an Adam step, {steps} steps per run of the cell, under "
        "`%%gpuprofile -o r` with its report displayed, in a real Jupyter kernel (ipykernel, "
        f"driven with jupyter_client); {len(calls)} calls after an untimed one, an untimed "
        "`gc.collect()` before each. Stages are timed inside the kernel by hooks on what the "
        "magic calls: profiled run = the cell's code inside torch.profiler's `with` block; "
        "export = from its end to the start of the load (stopping the profiler, "
        "`export_chrome_trace`, reading the trace back, cutting the warm-up out); "
        "load = `trace_from_dict` / `load_trace`; analyze = `analysis.report.analyze` "
        "(diagnosis included); display = "
        "the report's `_repr_mimebundle_` (HTML and text of every tab); other = the rest, up "
        "to IPython's post_run_cell (step count, device ceilings, handing the bundle to "
        "ipykernel). Times are medians over the calls; shares are the median over calls of "
        "each call's stage time over its profiled run.",
        "",
        "| stage | median time | share of the profiled run |",
        "|---|---|---|",
        f"| warm-up and timed runs (before the profiler starts) | "
        f"{_ms(med(c.before_s for c in calls))} | - |",
        f"| profiled run | {_ms(profiled)} | 100% |",
    ]
    for name in AFTER:
        lines.append(
            f"| {name} | {_ms(stage_med(name))} "
            f"| {_share([c.stages[name] / c.profiled_s for c in calls])} |"
        )
        if name != "export":
            continue
        for part, label in EXPORT_PARTS.items():
            values = [c.export_parts[part] for c in calls if not math.isnan(c.export_parts[part])]
            lines.append(
                f"| &nbsp;&nbsp;of which {label} | "
                f"{_ms(med(values) if values else float('nan'))} | "
                f"{_share([c.export_parts[part] / c.profiled_s for c in calls])} |"
            )
    lines.append(f"| **after the profiled run, in all** | {_ms(after)} | {share:.1%} |")
    missing = [name for name in ("load", "analyze") if not patched.get(name)]
    missing += [
        name
        for name in ("export", "load", "analyze", "display")
        if all(math.isnan(c.stages[name]) for c in calls) and name not in missing
    ]
    if missing:
        lines += [
            "",
            "Not seen in the magic's calls (their time is counted in other): "
            + ", ".join(missing)
            + ".",
        ]
    lines += [
        "",
        "Per call (ms): "
        + "; ".join(f"run {c.profiled_s * 1e3:.0f}, after {c.after_s * 1e3:.0f}" for c in calls)
        + ".",
    ]
    target = Target(
        "what the magic adds after the profiled run, share of that run",
        f"{share:.1%} ({_ms(after)} after a {_ms(profiled)} profiled run; largest stage: "
        + max(AFTER, key=lambda n: -1.0 if math.isnan(stage_med(n)) else stage_med(n))
        + ")",
        "informational (no goal set)",
        None,
    )
    return Section("10. %%gpuprofile on a real training cell", "\n".join(lines), (target,))
