"""Comparison 17: what pausing the cyclic garbage collector while a trace loads saves
(`gpuprof_nb.gcpause.gc_paused`, around load_trace, analyze and the displayed bundle).

Each variant loads the same trace in its own child process (run_script), rounds alternating:
- *paused* (as shipped): the young generations collected first, the collector off while the
  loader builds its objects, then those objects moved to the oldest generation
  (gc.freeze(), gc.unfreeze()) and the collector on again;
- *on*: no pause at all, the collector running its automatic collections through the load;
- *paused, left young*: the same pause without the move, so the fresh objects stay in the
  youngest generation.
After the load each child makes 20,000 small lists, the next work any program does: the
first automatic collections after a pause that left the objects young walk every one of them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.measure import fmt_s, run_script
from benchmarks.trace_analysis import decompressed_bytes, real_traces

REPO = Path(__file__).resolve().parents[1]
TITLE = "17. The garbage collector paused while loading"
VARIANTS = ("paused", "on", "paused, left young")
# Traces this size or more (JSON text) are measured; the largest few of them.
MIN_BYTES = 20 * 2**20
MAX_TRACES = 2

_CHILD = r"""
import contextlib, gc, json, sys, time
sys.path.insert(0, {repo!r})
import gpuprof_nb.io.trace as trace_io

variant = {variant!r}

@contextlib.contextmanager
def left_young():
    was = gc.isenabled()
    if was:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

if variant == "on":
    trace_io.gc_paused = contextlib.nullcontext
elif variant == "paused, left young":
    trace_io.gc_paused = left_young
gc.collect()
clock = time.process_time  # CPU time: what other work on a shared machine does not add
t0 = clock()
trace = trace_io.load_trace({path!r})
t1 = clock()
after = [[] for _ in range(20_000)]
t2 = clock()
print(json.dumps({{"load": t1 - t0, "after": t2 - t1, "objects": len(gc.get_objects())}}))
"""


def _pick(cfg: BenchConfig) -> list[Path]:
    traces = real_traces(cfg.traces_dir) if cfg.traces_dir.is_dir() else []
    sized = sorted(((decompressed_bytes(p), p) for p in traces), key=lambda sp: -sp[0])
    if cfg.quick:
        return [p for _, p in sized[-1:]]
    picked = [p for size, p in sized if size >= MIN_BYTES][:MAX_TRACES]
    big = cfg.cache_dir.glob(f"big_trace_*_{cfg.big_trace_mb}mb.json")
    return picked + sorted(big)[:1]


def run(cfg: BenchConfig) -> Section:
    rounds = 1 if cfg.quick else max(cfg.repeats, 5)
    rows, targets = [], []
    for path in _pick(cfg):
        big = path.is_relative_to(cfg.cache_dir)
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for _ in range(cfg.big_repeats if big else rounds):
            for variant in VARIANTS:
                code = _CHILD.format(repo=str(REPO), path=str(path), variant=variant)
                runs[variant].append(run_script(code, cap_bytes=cfg.cap_bytes, timeout_s=1800))

        def med(variant: str, key: str, runs: dict[str, list[dict[str, float]]] = runs) -> float:
            return statistics.median(r[key] for r in runs[variant])

        name = path.name if big else path.relative_to(cfg.traces_dir).as_posix()
        size = decompressed_bytes(path) / 2**20
        cells = [f"{fmt_s(med(v, 'load'))} + {fmt_s(med(v, 'after'))}" for v in VARIANTS]
        young_extra = med("paused, left young", "after") - med("paused", "after")
        rows.append(
            f"| `{name}` | {size:.0f} MB | {med('paused', 'objects') / 1e6:.2f} M | "
            + " | ".join(cells)
            + f" | {med('on', 'load') / med('paused', 'load'):.2f}x | "
            f"{fmt_s(young_extra)} ({young_extra / med('paused', 'load'):.0%} of the load) |"
        )
        targets.append(
            Target(
                f"17. GC pause: load with the collector on / paused, `{path.name}`",
                f"{med('on', 'load') / med('paused', 'load'):.2f}x",
                "> 1x (the pause pays)",
                med("on", "load") > med("paused", "load"),
            )
        )
    markdown = "\n".join(
        [
            "Each variant in its own child process, rounds alternating, "
            f"{rounds} rounds ({cfg.big_repeats} for the replicated trace, when "
            "`benchmarks/.cache` has one), medians of CPU time (`time.process_time`: other work on "
            "a shared machine stretches wall-clock times). *load* is `load_trace(path)`; "
            "*after* is the next 20,000 small allocations (`[[] for _ in range(20_000)]`), "
            "where the collections that a pause leaving the objects young puts off fall. "
            "*Paused* is `gpuprof_nb.gcpause.gc_paused` as shipped; *on* loads without any pause; "
            "*paused, left young* pauses without moving the new objects to the oldest "
            "generation on the way out. Objects: `len(gc.get_objects())` after the load.",
            "",
            "| trace | JSON size | objects | paused: load + after | on | paused, left young "
            "| load on / paused | left young costs after the load |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    return Section(TITLE, markdown, tuple(targets))
