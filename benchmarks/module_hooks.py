"""What the nn.Module ranges (capture/modules.py) add to a profiled training step on the CPU.

`python benchmarks/run.py --only modules --reuse` measures it into RESULTS.md (section 13);
`python benchmarks/module_hooks.py [--rounds N] [--layers L]` prints the section alone.
Variants, interleaved round by round in a shuffled (seeded)
order, one untimed call of each first and `gc.collect()` before each call:

- a training step (forward, cross-entropy, backward, SGD step) of an L-layer transformer
  (24 by default) inside `profile_cell`, without and with the module recorder: the
  target, at most +2% on the profiled run;
- the same step with the recorder's hooks installed and no profiler running
  (informational: the ranges cost next to nothing when no profiler records them);
- a step of the same size made of plain tensor ops, no nn.Module called, without and with
  the recorder inside `profile_cell`: nothing recorded, nothing added.

Each "vs none" is the median over rounds of that round's ratio to the variant without the
recorder, with the standard error of that median (benchmarks/measure.precision).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.measure import precision, ratios  # noqa: E402
from gpuprof_nb.capture.modules import MODULE_PREFIX, ModuleRecorder  # noqa: E402
from gpuprof_nb.capture.profiler import profile_cell  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, layers: int, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def training_step(layers: int) -> tuple[Callable[[], None], dict[str, object]]:
    torch.manual_seed(0)
    vocab, d = 1000, 128
    model = Transformer(layers, vocab, d)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (8, 64))

    def step() -> None:
        loss = loss_fn(model(ids).view(-1, vocab), ids.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step, {"model": model, "loss_fn": loss_fn, "opt": opt}


def plain_step(layers: int) -> Callable[[], None]:
    """The same matmul work with plain tensors: no nn.Module is called."""
    torch.manual_seed(0)
    d = 128
    ws = [torch.randn(d, 4 * d, requires_grad=True) for _ in range(layers)]
    vs = [torch.randn(4 * d, d, requires_grad=True) for _ in range(layers)]
    x0 = torch.randn(512, d)

    def step() -> None:
        x = x0
        for w, v in zip(ws, vs, strict=True):
            x = x + torch.nn.functional.gelu(x @ w) @ v
        x.pow(2).mean().backward()
        for p in (*ws, *vs):
            p.grad = None

    return step


def profiled(
    step: Callable[[], None], namespace: dict[str, object] | None
) -> tuple[float, float, int]:
    """Seconds of the run inside the profiler (wall, and the thread's CPU time), and the
    module ranges its trace holds."""
    box: list[float] = []

    def run() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        box.extend((time.perf_counter() - t0, time.thread_time() - c0))

    samplers = [] if namespace is None else [("modules", ModuleRecorder(namespace))]
    artifact = profile_cell(run, cuda=False, samplers=samplers)
    ranges = sum(
        1
        for e in artifact["traceEvents"]
        if isinstance(e, dict) and str(e.get("name", "")).startswith(MODULE_PREFIX)
    )
    return box[0], box[1], ranges


def bare(step: Callable[[], None], namespace: dict[str, object] | None) -> tuple[float, float, int]:
    recorder = ModuleRecorder(namespace) if namespace is not None else None
    if recorder is not None:
        recorder.start()
    try:
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        return time.perf_counter() - t0, time.thread_time() - c0, 0
    finally:
        if recorder is not None:
            recorder.stop()


def per_call_us(calls: int = 20_000, rounds: int = 7) -> dict[str, float]:
    """Thread CPU microseconds one module call costs inside the profiler, without and with
    the recorder (nn.Identity called `calls` times; best of `rounds`), and the difference:
    what the hooks and the range add per call."""
    ident = nn.Identity()
    x = torch.zeros(1)

    def loop() -> None:
        for _ in range(calls):
            ident(x)

    best: dict[str, float] = {}
    for name, ns in (("without", None), ("with", {"ident": ident})):
        times = []
        for _ in range(rounds):
            gc.collect()
            _, cpu, _ = profiled(loop, ns)
            times.append(cpu)
        best[name] = min(times) / calls * 1e6
    best["added"] = best["with"] - best["without"]
    return best


def measure(rounds: int, layers: int, seed: int = 0) -> list[dict[str, object]]:
    torch.set_num_threads(1)
    step, ns = training_step(layers)
    plain = plain_step(layers)
    variants: dict[str, Callable[[], tuple[float, float, int]]] = {
        "step: profiled, no ranges": lambda: profiled(step, None),
        "step: profiled, module ranges": lambda: profiled(step, ns),
        "step: no profiler, no hooks": lambda: bare(step, None),
        "step: no profiler, hooks on": lambda: bare(step, ns),
        "no module: profiled, no ranges": lambda: profiled(plain, None),
        "no module: profiled, recorder on": lambda: profiled(plain, {}),
    }
    baseline = {
        "step: profiled, module ranges": "step: profiled, no ranges",
        "step: no profiler, hooks on": "step: no profiler, no hooks",
        "no module: profiled, recorder on": "no module: profiled, no ranges",
    }
    for fn in variants.values():  # one untimed call each
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    ranges: dict[str, list[int]] = {k: [] for k in variants}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            gc.collect()
            t, c, n = variants[name]()
            times[name].append(t)
            cpu[name].append(c)
            ranges[name].append(n)
    rows = []
    for name in variants:
        row: dict[str, object] = {
            "variant": name,
            "median_ms": statistics.median(times[name]) * 1e3,
            "cpu_ms": statistics.median(cpu[name]) * 1e3,
            "ranges": statistics.median(ranges[name]),
        }
        ref = baseline.get(name)
        if ref is not None:
            for key, series in (("vs_none", times), ("cpu_vs_none", cpu)):
                per_round = ratios(series[name], series[ref])
                row[key] = statistics.median(per_round)
                row[key + "_se"] = precision(per_round)
        rows.append(row)
    return rows


def markdown(
    rows: list[dict[str, object]],
    rounds: int,
    layers: int,
    command: str,
    call: dict[str, float] | None = None,
) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    lines = [
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__} (1 thread), load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}.",
        "",
        f"A training step of a {layers}-layer transformer (d 128, 4 heads, batch 8 x 64 "
        "tokens, cross-entropy, SGD) and the same matmul work in plain tensor ops (no "
        f"module called), {rounds} interleaved rounds (see benchmarks/module_hooks.py).",
        "",
        "| variant | median run (wall) | vs none | thread CPU time | vs none | module ranges "
        "in the trace |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = f"{r['vs_none']:+.1%} (± {r['vs_none_se']:.1%})" if "vs_none" in r else "-"
        cvs = (
            f"{r['cpu_vs_none']:+.1%} (± {r['cpu_vs_none_se']:.1%})" if "cpu_vs_none" in r else "-"
        )
        lines.append(
            f"| {r['variant']} | {r['median_ms']:.1f} ms | {vs} | {r['cpu_ms']:.1f} ms | {cvs} "
            f"| {r['ranges']:.0f} |"
        )
    lines += [
        "",
        "*Thread CPU time* (`time.thread_time`) is the cell thread's own CPU time during the "
        "run: what the hooks add is work on that thread, and unlike wall time it does not "
        "move when other work on this shared machine takes the core (the wall column's "
        "standard error shows how much it does).",
        "",
    ]
    if call is not None:
        step = next(r for r in rows if r["variant"] == "step: profiled, no ranges")
        calls = next(r for r in rows if r["variant"] == "step: profiled, module ranges")
        added_ms = call["added"] * float(calls["ranges"]) / 1e3  # type: ignore[arg-type]
        lines += [
            "Per module call, inside the profiler (an `nn.Identity` called 20,000 times, thread "
            "CPU time, best of 7): "
            f"{call['without']:.2f} us without the recorder, {call['with']:.2f} us with it, "
            f"{call['added']:.2f} us added. The step's {calls['ranges']:.0f} module calls "
            f"then add {added_ms:.2f} ms to its {step['cpu_ms']:.1f} ms of thread CPU time: "
            f"{added_ms / float(step['cpu_ms']):+.2%}.",  # type: ignore[arg-type]
            "",
        ]
    return "\n".join(lines)


TITLE = "13. Module ranges beside the profiled run"
GOAL = "at most 2%"


def run(cfg: Any) -> Any:
    """The RESULTS.md section (benchmarks/run.py): quick runs shrink to 2 layers, 2 rounds."""
    from benchmarks.config import Section, Target

    rounds, layers = (2, 2) if cfg.quick else (31, 24)
    rows = measure(rounds, layers)
    call = per_call_us(calls=2000 if cfg.quick else 20_000, rounds=2 if cfg.quick else 7)
    text = markdown(rows, rounds, layers, "", call)
    by = {r["variant"]: r for r in rows}
    step = by["step: profiled, module ranges"]
    plain = by["no module: profiled, recorder on"]
    base = by["step: profiled, no ranges"]
    per_call_share = call["added"] * float(step["ranges"]) / 1e3 / float(base["cpu_ms"])  # type: ignore[arg-type]
    judged = float(step["cpu_vs_none"])  # type: ignore[arg-type]
    targets = (
        Target(
            f"module ranges on a {layers}-layer training step, profiled: thread CPU time added "
            "(median of round ratios)",
            f"{judged:+.1%} (± {float(step['cpu_vs_none_se']):.1%}); from the per-call cost: "  # type: ignore[arg-type]
            f"{per_call_share:+.2%}",
            GOAL + " (the per-call cost, and the round median not above it by over 2 standard "
            "errors)",
            None
            if cfg.quick
            else per_call_share <= 0.02 and judged - 2 * float(step["cpu_vs_none_se"]) <= 0.02,  # type: ignore[arg-type]
        ),
        Target(
            "no module called, recorder on: thread CPU time added",
            f"{float(plain['cpu_vs_none']):+.1%} (± {float(plain['cpu_vs_none_se']):.1%}); "  # type: ignore[arg-type]
            f"{plain['ranges']:.0f} ranges recorded",
            "nothing (within the standard error), no range",
            None
            if cfg.quick
            else float(plain["cpu_vs_none"]) <= 2 * float(plain["cpu_vs_none_se"])  # type: ignore[arg-type]
            and plain["ranges"] == 0,
        ),
    )
    return Section(TITLE, text, targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args(argv)
    rows = measure(args.rounds, args.layers)
    call = per_call_us()
    command = "python benchmarks/module_hooks.py " + " ".join(argv or sys.argv[1:])
    print(f"## {TITLE}\n")
    print(markdown(rows, args.rounds, args.layers, command.strip(), call))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
