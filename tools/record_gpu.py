"""The GPU truth pass's recordings and figures, made on a CUDA machine in one go.

Runs the planted bottlenecks through the real `%%gpuprofile` (an in-process IPython shell with
the extension loaded), the memory cells through the real `%%memsnap`, and measures what the
docs report: `%%gpuprofile`'s timing against hand-written CUDA events, `measure_ceilings()`
against the datasheet row, the optimisation ladder on a small real model, and the kernels and
roofline of real GEMMs. It writes

    OUT/traces/<case>.json.gz       the saved trace of each planted cell
    OUT/snapshots/gpu_<case>.pickle each %%memsnap --save snapshot
    OUT/ladder.json                 the ladder report
    OUT/figures.json                every figure and each recording's findings, rewritten
                                    after each step (a step that fails is recorded with its
                                    error, and the rest go on: a GPU lease is short)

and copies nothing into tests/data itself: the recordings are chosen from OUT by hand (see
tests/data/gpu/README.md). Without CUDA it runs the same cells on CPU (a rehearsal of the
script, which is all it is good for there).

Run: KINETO_LOG_LEVEL=6 python tools/record_gpu.py OUT [--only NAME ...] [--skip-ladder]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("MPLBACKEND", "Agg")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# (name, the finding the cell plants, set-up code run first, %%gpuprofile options, cell).
# DEV is "cuda" (or "cpu" in a rehearsal). `cold_start` runs first, on a CUDA context that
# holds nothing yet (the device's name was read, which creates the context).
TRACE_CASES: list[tuple[str, str, str, str, str]] = [
    (
        "cold_start",
        "cold_start",
        "torch.backends.cudnn.benchmark = True",
        "--once",
        "net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), torch.nn.ReLU(),\n"
        "                          torch.nn.Conv2d(64, 64, 3)).to(DEV)\n"
        "img = torch.randn(32, 3, 128, 128, device=DEV)\n"
        "net(img).sum().backward()",
    ),
    (
        "dataloader",
        "dataloader",
        "class SlowDataset(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n"
        "        return 8\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.01)  # a heavy per-sample transform\n"
        "        return torch.randn(256)\n"
        "loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=2, num_workers=0)\n"
        "w = torch.randn(256, 256, device=DEV)",
        "",
        "for xb in loader:\n    (xb.to(DEV) @ w).relu().sum()",
    ),
    (
        "host_sync",
        "host_sync",
        "a = torch.randn(256, 256, device=DEV)",
        "",
        "total = 0.0\nfor _ in range(200):\n    total += (a @ a).relu().sum().item()",
    ),
    (
        "launch_overhead",
        "launch_overhead",
        "",
        "",
        "x = torch.ones(8, device=DEV)\nfor _ in range(1000):\n    x = x * 1.0001 + 0.0001",
    ),
    (
        "precision",
        "precision",
        "torch.backends.cuda.matmul.allow_tf32 = False\na32 = torch.randn(4096, 4096, device=DEV)",
        "",
        "for _ in range(8):\n    c32 = a32 @ a32",
    ),
    (
        "compute_bound",
        "compute_bound",
        "a16 = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)",
        "",
        "for _ in range(8):\n    c16 = a16 @ a16",
    ),
    (
        "memory_bound",
        "memory_bound",
        "big = torch.randn(32 * 2**20, device=DEV)",
        "",
        "x = big\nfor _ in range(12):\n    x = torch.sin(x) * 1.5 + 0.1",
    ),
    (
        "dtype_cast",
        "dtype_cast",
        "v = torch.randn(8 * 2**20, device=DEV)",
        "",
        "x = v\nfor _ in range(12):\n    x = x.to(torch.float64).to(torch.float32)",
    ),
    (
        "host_device_copy",
        "host_device_copy",
        "host = torch.randn(16 * 2**20)  # 64 MiB of pageable host memory",
        "",
        "for _ in range(6):\n    d = host.to(DEV)\n    d.mul_(2)",
    ),
    (
        "recompilation",
        "recompilation",
        "f = torch.compile(lambda t: (t.sin() * 2).sum(), dynamic=False)",
        "--once",
        "torch._dynamo.reset()\n"
        "for n in (64, 96, 128, 160):\n"
        "    f(torch.randn(n, 256, device=DEV))",
    ),
    (
        "python_overhead",
        "python_overhead",
        "t = torch.ones(4, device=DEV)",
        "",
        "acc = 0\n"
        "for _ in range(40):\n"
        "    for j in range(3000):\n"
        "        acc += j * j % 7\n"
        "    t = t + 1",
    ),
    (
        "memory_growth",
        "memory_growth",
        "wg = torch.randn(512, 512, device=DEV, requires_grad=True)\nkept = []",
        "--memory",
        "kept.clear()\n"
        "for _ in range(12):\n"
        "    xg = torch.randn(512, 512, device=DEV)\n"
        "    kept.append((xg @ wg).relu())",
    ),
]

# (name, the finding it plants or None, set-up, %%memsnap options, cell).
SNAPSHOT_CASES: list[tuple[str, str | None, str, str, str]] = [
    (
        "train",
        "peak_memory",
        "mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),\n"
        "                          torch.nn.Linear(4096, 1024)).to(DEV)\n"
        "opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)\n"
        "xb = torch.randn(256, 1024, device=DEV)",
        "",
        "loss = mlp(xb).pow(2).mean()\n"
        "loss.backward()\n"
        "opt.step()\n"
        "opt.zero_grad(set_to_none=True)",
    ),
    (
        "leak",
        "memory_growth",
        "leaked = []",
        "--repeat 4",
        "leaked.append(torch.randn(4 * 2**20, device=DEV))  # 16 MiB kept per run\n"
        "tmp = torch.randn(2**20, device=DEV) * 2",
    ),
    (
        "oom",
        "oom",
        "",
        "",
        "keep = torch.empty(2**20, device=DEV)\nhuge = torch.empty(2**45, device=DEV)  # 128 TiB",
    ),
    (
        "fragmented",
        "fragmentation",
        "",
        "",
        "blocks = [torch.empty(2**18 * s, device=DEV) for s in (6, 2) * 48]  # MiB\n"
        "del blocks[::2]  # the 6 MiB blocks go: holes between the 2 MiB ones that stay\n"
        "large = torch.empty(2**24, device=DEV)  # 64 MiB: fits none of the holes",
    ),
]


class Recorder:
    def __init__(self, out: Path) -> None:
        import torch
        from IPython.testing import globalipapp

        self.out = out
        self.torch = torch
        self.cuda = bool(torch.cuda.is_available())
        self.dev = "cuda" if self.cuda else "cpu"
        self.figures: dict[str, Any] = {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if self.cuda else "cpu",
            "python": sys.version.split()[0],
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "traces": {},
            "snapshots": {},
            "errors": {},
        }
        self.ip = globalipapp.start_ipython() or globalipapp.get_ipython()
        self.ip.run_line_magic("load_ext", "gpuprof_nb")
        self.fresh_namespace()
        (out / "traces").mkdir(parents=True, exist_ok=True)
        (out / "snapshots").mkdir(parents=True, exist_ok=True)

    def write(self) -> None:
        self.figures["written"] = time.strftime("%Y-%m-%d %H:%M:%S")
        (self.out / "figures.json").write_text(json.dumps(self.figures, indent=1, default=_plain))

    def step(self, name: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        self.fresh_namespace()
        print(f"[record_gpu] {name} ...", flush=True)
        try:
            return fn(*args)
        except BaseException as exc:  # noqa: BLE001 - one failed step must not end the lease
            self.figures["errors"][name] = traceback.format_exc()
            print(f"[record_gpu] {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
            if isinstance(exc, KeyboardInterrupt):
                raise
            return None
        finally:
            print(f"[record_gpu] {name} {time.perf_counter() - t0:.1f} s", flush=True)
            self.free()
            self.write()

    def fresh_namespace(self) -> None:
        """Each case starts from an empty namespace (what earlier cases left on the device
        would be in every snapshot and memory trace)."""
        self.ip.run_line_magic("reset", "-f")
        self.free()
        self.ip.run_cell(f"import time\nimport torch\nDEV = {self.dev!r}")

    def free(self) -> None:
        import gc

        gc.collect()
        if self.cuda and self.torch.cuda.is_initialized():
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def run(self, code: str) -> None:
        result = self.ip.run_cell(code)
        if result.error_in_exec is not None:
            raise result.error_in_exec
        if result.error_before_exec is not None:
            raise result.error_before_exec

    # --- traces ---------------------------------------------------------------------------

    def trace_case(self, name: str, planted: str, setup: str, options: str, cell: str) -> None:
        self.run(setup or "pass")
        self.ip.user_ns.pop("_r", None)
        self.ip.run_cell_magic("gpuprofile", f"-o _r --quiet {options}".strip(), cell)
        r = self.ip.user_ns.get("_r")
        if r is None:
            raise RuntimeError(f"{name}: %%gpuprofile stored no report")
        path = r.save(self.out / "traces" / f"{name}.json.gz")
        d = r.diagnosis
        t = r.timing
        self.figures["traces"][name] = {
            "planted": planted,
            "options": options,
            "cell": cell,
            "setup": setup,
            "bytes": path.stat().st_size,
            "first_finding": d.findings[0].kind if d and d.findings else None,
            "findings": [(f.kind, f.severity, round(f.share, 4)) for f in d.findings] if d else [],
            "verdict": d.verdict if d else None,
            "one_off": [(f.kind, round(f.share, 4)) for f in getattr(d, "one_off", ()) or ()]
            if d
            else [],
            "timing": dataclasses.asdict(t) if t is not None else None,
            "kernels": [dataclasses.asdict(k) for k in r.kernels.rows[:5]]
            if r.kernels is not None
            else None,
            "kernel_calls": r.kernels.calls if r.kernels is not None else None,
            "top_ops": [
                (o.name, o.calls, round(o.self_device_us, 1), round(o.self_cpu_us, 1))
                for o in r.ops.rows[:5]
            ]
            if r.ops is not None
            else None,
            "roofline": [dataclasses.asdict(p) for p in r.roofline.points[:4]]
            if r.roofline is not None
            else None,
            "notes": list(r.notes),
        }
        print(
            f"[record_gpu]   {name}: planted {planted}, first "
            f"{self.figures['traces'][name]['first_finding']}, {path.stat().st_size:,} B",
            flush=True,
        )
        self.run("_r = None")

    # --- snapshots ------------------------------------------------------------------------

    def snapshot_case(
        self, name: str, planted: str | None, setup: str, options: str, cell: str
    ) -> None:
        self.run(setup or "pass")
        path = self.out / "snapshots" / f"gpu_{name}.pickle"
        self.ip.user_ns.pop("_m", None)
        result = self.ip.run_cell(f"%%memsnap -o _m --quiet --save {path} {options}\n{cell}")
        raised = result.error_in_exec
        m = self.ip.user_ns.get("_m")
        if m is None:
            raise RuntimeError(f"{name}: %%memsnap stored no report ({raised!r})")
        kinds = [(f.kind, f.severity) for f in getattr(m, "findings", ())]
        entry: dict[str, Any] = {
            "planted": planted,
            "cell": cell,
            "setup": setup,
            "options": options,
            "raised": f"{type(raised).__name__}: {raised}"[:300] if raised else None,
            "bytes": path.stat().st_size if path.exists() else None,
            "findings": kinds,
            "repr": repr(m)[:2000],
        }
        timeline = getattr(m, "timeline", None)
        if timeline is not None:
            entry["peak_bytes"] = int(timeline.peak_bytes)
            entry["reserved_peak_bytes"] = timeline.reserved_peak_bytes
        self.figures["snapshots"][name] = entry
        print(f"[record_gpu]   {name}: findings {kinds}", flush=True)
        self.run("_m = None")

    # --- figures --------------------------------------------------------------------------

    def timing_against_events(self, rounds: int = 3) -> None:
        """%%gpuprofile's numbers against CUDA events written by hand around the same cell,
        on a long cell (one run per sample) and a short one (blocks of runs). Rounds of the
        two alternate, so a GPU clock that drifts between them (it did on an H100, by 6%)
        moves both alike; the hand-written timing is the loop a user writes, one code
        object: record, the cell `number` times, record, synchronize."""
        import textwrap

        torch = self.torch
        out = {}
        n = 4096 if self.cuda else 512  # a CPU rehearsal only checks the script
        for label, setup, cell in (
            (
                "bf16_4096_x20",
                f"tq = torch.randn({n}, {n}, device=DEV, dtype=torch.bfloat16)",
                "for _ in range(20):\n    tc = tq @ tq",
            ),
            ("fp32_256_x1", "tq = torch.randn(256, 256, device=DEV)", "tc = tq @ tq"),
        ):
            self.run(setup)
            ns = self.ip.user_ns
            magic_dev: list[float] = []
            magic_wall: list[float] = []
            hand_dev: list[float] = []
            hand_wall: list[float] = []
            numbers = []
            round_ratios = []
            for _round in range(rounds):
                first_magic, first_hand = len(magic_dev), len(hand_dev)
                self.ip.run_cell_magic("gpuprofile", "-o _t --quiet --repeat 5", cell)
                stats = ns["_t"].timing
                numbers.append(stats.number)
                magic_wall += list(stats.wall_us)
                magic_dev += list(stats.device_us or ())
                number = stats.number
                body = textwrap.indent(cell, "    ")
                src = (
                    "_w0 = _clock()\n"
                    + ("_s.record()\n" if self.cuda else "")
                    + f"for _k in range({number}):\n{body}\n"
                    + ("_e.record()\n_sync()\n" if self.cuda else "")
                    + "_w1 = _clock()\n"
                )
                code = compile(src, f"<hand timing {label}>", "exec")
                ns["_clock"] = time.perf_counter_ns
                ns["_sync"] = torch.cuda.synchronize if self.cuda else (lambda: None)
                for _ in range(5):
                    if self.cuda:
                        ns["_s"] = torch.cuda.Event(enable_timing=True)
                        ns["_e"] = torch.cuda.Event(enable_timing=True)
                    exec(code, ns)
                    hand_wall.append((ns["_w1"] - ns["_w0"]) / 1000.0 / number)
                    if self.cuda:
                        hand_dev.append(ns["_s"].elapsed_time(ns["_e"]) * 1000.0 / number)
                if self.cuda and magic_dev[first_magic:] and hand_dev[first_hand:]:
                    # paired: this round's magic median over this round's hand-written one
                    round_ratios.append(
                        statistics.median(magic_dev[first_magic:])
                        / statistics.median(hand_dev[first_hand:])
                    )
            entry: dict[str, Any] = {
                "numbers": numbers,
                "magic_wall_us": magic_wall,
                "magic_device_us": magic_dev,
                "hand_wall_us": hand_wall,
                "hand_device_us": hand_dev,
                "wall_ratio": statistics.median(magic_wall) / statistics.median(hand_wall),
            }
            if magic_dev and hand_dev:
                med = statistics.median(hand_dev)
                entry.update(
                    {
                        "magic_device_median_us": statistics.median(magic_dev),
                        "hand_device_median_us": med,
                        "device_ratio": statistics.median(magic_dev) / med,
                        # The profiled run is slower (the profiler's cost): were it among the
                        # timed samples, the largest would stand out.
                        "magic_device_max_over_hand_median": max(magic_dev) / med,
                        "rounds": rounds,
                        "round_ratios": round_ratios,
                        "round_ratio_median": statistics.median(round_ratios),
                    }
                )
            out[label] = entry
            print(
                f"[record_gpu]   timing {label}: "
                f"{ {k: v for k, v in entry.items() if 'ratio' in k or 'max' in k} }",
                flush=True,
            )
        self.figures["timing"] = out

    def ceilings(self) -> None:
        from gpuprof_nb.capture.device import measure_ceilings
        from gpuprof_nb.model.device import lookup_device_spec

        measured = measure_ceilings(cache=False)
        self.figures["ceilings"] = {"measured": measured}
        if self.cuda:
            props = self.torch.cuda.get_device_properties(0)
            sheet = lookup_device_spec(props.name, props.total_memory)
            self.figures["ceilings"]["datasheet"] = sheet
            self.figures["ceilings"]["sm_count"] = props.multi_processor_count
            self.figures["ceilings"]["capability"] = f"{props.major}.{props.minor}"
        print(f"[record_gpu]   ceilings: {measured}", flush=True)

    def memory_peak(self) -> None:
        """The history's peak against torch's own counter, on one training step."""
        torch = self.torch
        if not self.cuda:
            return
        self.run(
            "mlp2 = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(),\n"
            "    torch.nn.Linear(8192, 2048)).to(DEV)\n"
            "xb2 = torch.randn(512, 2048, device=DEV)"
        )
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.ip.run_cell("%%memsnap -o _p --quiet\nmlp2(xb2).pow(2).mean().backward()")
        m = self.ip.user_ns["_p"]
        self.figures["memory_peak"] = {
            "history_peak_bytes": int(m.timeline.peak_bytes),
            "torch_max_memory_allocated": int(torch.cuda.max_memory_allocated()),
        }
        self.run("_p = mlp2 = xb2 = None")

    def ladder(self) -> None:
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        import gpuprof_nb.ladder as ladder

        g = torch.Generator().manual_seed(0)
        inputs = torch.randn(16384, 256, generator=g)
        targets = (inputs[:, :8].sum(dim=1) > 0).long()

        def model_fn() -> nn.Module:
            return nn.Sequential(
                nn.Linear(256, 1024),
                nn.GELU(),
                nn.Linear(1024, 1024),
                nn.GELU(),
                nn.Linear(1024, 1024),
                nn.GELU(),
                nn.Linear(1024, 2),
            )

        t0 = time.perf_counter()
        report = ladder.run_ladder(
            model_fn,
            TensorDataset(inputs, targets),
            nn.functional.cross_entropy,
            lambda params: torch.optim.AdamW(params, lr=1e-3),
            steps=20,
            warmup=3,
            batch_size=512,
            target_effective_batch=1024,
            batch_sizes=[256, 1024, 4096],
            label="gpu truth pass",
        )
        report.save(self.out / "ladder.json")
        self.figures["ladder"] = {
            "seconds": time.perf_counter() - t0,
            "rungs": [(r.name, r.status, r.samples_per_s) for r in report.rungs],
            "recommendation": str(report.recommendation),
        }
        print(f"[record_gpu]   ladder: {self.figures['ladder']['rungs']}", flush=True)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: getattr(obj, f.name)
            for f in dataclasses.fields(obj)
            if not hasattr(getattr(obj, f.name), "shape")
        }
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--only", nargs="*", default=None, help="the cases or steps to run (default: all)"
    )
    parser.add_argument("--skip-ladder", action="store_true")
    parser.add_argument(
        "--timing-rounds",
        type=int,
        default=3,
        help="alternating rounds of the timing figure (default 3)",
    )
    args = parser.parse_args(argv)
    rec = Recorder(args.out)

    def wanted(name: str) -> bool:
        return args.only is None or name in args.only

    for case in TRACE_CASES:
        if wanted(case[0]):
            rec.step(f"trace {case[0]}", rec.trace_case, *case)
    for snap in SNAPSHOT_CASES:
        if wanted(snap[0]):
            rec.step(f"snapshot {snap[0]}", rec.snapshot_case, *snap)
    for name, fn in (
        ("timing", lambda: rec.timing_against_events(args.timing_rounds)),
        ("ceilings", rec.ceilings),
        ("memory_peak", rec.memory_peak),
    ):
        if wanted(name):
            rec.step(name, fn)
    if wanted("ladder") and not args.skip_ladder:
        rec.step("ladder", rec.ladder)
    rec.write()
    errors = rec.figures["errors"]
    print(
        f"[record_gpu] done: {len(rec.figures['traces'])} traces, "
        f"{len(rec.figures['snapshots'])} snapshots, {len(errors)} errors "
        f"({', '.join(errors) or 'none'})",
        flush=True,
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
