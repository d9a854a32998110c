"""What the nn.Module ranges (capture/modules.py) add to a profiled training step on the CPU.

`python benchmarks/module_hooks.py [--rounds N] [--layers L]` prints a markdown section
(RESULTS.md, section 12). Variants, interleaved round by round in a shuffled (seeded)
order, one untimed call of each first and `gc.collect()` before each call:

- a training step (forward, cross-entropy, backward, SGD step) of an L-layer transformer
  (24 by default) inside `profile_cell`, without and with the module recorder: the
  target, at most +2% on the profiled run;
- the same step with the recorder's hooks installed and no profiler running
  (informational: the ranges cost next to nothing when no profiler records them);
- a step of the same size made of plain tensor ops, no nn.Module called, without and with
  the recorder inside `profile_cell`: nothing recorded, nothing added.

Each "vs none" is the median over rounds of that round's ratio to the variant without the
recorder, with the standard error of that median (1.2533 * sd / sqrt(n)).
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

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

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
                ratios = [a / b for a, b in zip(series[name], series[ref], strict=True)]
                row[key] = statistics.median(ratios) - 1.0
                row[key + "_se"] = 1.2533 * statistics.stdev(ratios) / len(ratios) ** 0.5
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, object]], rounds: int, layers: int, command: str) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    lines = [
        "## 12. Module ranges beside the profiled run",
        "",
        f"_Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}`; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__} (1 thread), load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}._",
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args(argv)
    rows = measure(args.rounds, args.layers)
    command = "python benchmarks/module_hooks.py " + " ".join(argv or sys.argv[1:])
    print(markdown(rows, args.rounds, args.layers, command.strip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
