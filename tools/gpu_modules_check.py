"""Issue 35's GPU checks in one short script (under 2 minutes on an H100): per-module device
time, MFU against measured ceilings, and kernels replayed from CUDA graphs.

Run on a CUDA machine:  KINETO_LOG_LEVEL=6 python tools/gpu_modules_check.py OUT
Without CUDA it runs the module checks on the CPU (a rehearsal) and skips the rest, saying
so. It writes OUT/results.json and OUT/results.md (every check, its numbers and pass/fail)
and OUT/traces/<case>.json.gz (fixtures for tests/data/gpu: chosen by hand, see
tests/data/gpu/README.md). Exit status 0 when every check that ran passed, 1 otherwise.

Checks:
1. modules_transformer, modules_cnn: a small transformer and a CNN, one training step each
   through the real `%%gpuprofile` (warm-up, timed runs, profiled run with module ranges):
   - every kernel's device time is charged to exactly one module (or to none), and each
     module's own device time equals a brute-force walk of the raw trace (kernel -> its
     launch call by correlation id -> the innermost module range open on that thread);
   - the roots' device time plus what no module holds is the trace's kernel time;
   - backward device time lands in the modules with weights (autograd runs backward on its
     own thread on CUDA: the sequence numbers tie it back).
2. mfu_bf16_matmuls: 16 bf16 4096x4096 matmuls under `%%gpuprofile`, against the ceilings
   `measure_ceilings()` measures on this GPU: the report's FLOPs equal the hand count
   (16 * 2 * 4096**3) and its MFU equals hand FLOPs / median run time / measured bf16 peak.
3. cuda_graphs: a small MLP compiled with mode="reduce-overhead" (CUDA graphs) under
   `%%gpuprofile`: the graph launches and the kernels they replayed are found, every
   replayed kernel is charged to a launch, and the launches to an op or module.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("MPLBACKEND", "Agg")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 8, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))

class Transformer(nn.Module):
    def __init__(self, vocab=4096, d=256, n=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, vocab)
    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(64, 10)
    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))

model = Transformer().to(DEV)
ids = torch.randint(0, 4096, (8, 128), device=DEV)
opt = torch.optim.AdamW(model.parameters(), fused=DEV == "cuda")
cnn = CNN().to(DEV)
images = torch.randn(32, 3, 64, 64, device=DEV)
"""

CASES = {
    "modules_transformer": (
        "loss = nn.functional.cross_entropy(model(ids).view(-1, 4096), ids.view(-1))\n"
        "loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)"
    ),
    "modules_cnn": "cnn(images).sum().backward()",
}


def _shell() -> Any:
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "gpuprof_nb")
    return shell


def _profile(shell: Any, cell: str, out: Path, name: str, line: str = "") -> Any:
    path = out / "traces" / f"{name}.json.gz"
    shell.run_cell_magic("gpuprofile", f"-o _r --quiet --trace {path} {line}", cell)
    return shell.user_ns["_r"], path


def brute_force_own_device(path: Path) -> tuple[dict[str, float], float]:
    """Per module path, the device time of kernels whose launch call (same correlation) ran
    while that module was the innermost module range on the launching thread; and the time
    of kernels launched in no module. Forward only: backward kernels (launched from the
    autograd thread, inside no module range) count as "in no module" here."""
    events = json.load(gzip.open(path))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    ranges = [e for e in spans if str(e.get("name", "")).startswith("nn.Module: ")]
    calls = {
        e["args"]["correlation"]: e
        for e in spans
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    own: dict[str, float] = defaultdict(float)
    outside = 0.0
    for k in spans:
        if k.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        call = calls.get(k["args"].get("correlation"))
        around = (
            [
                m
                for m in ranges
                if (m["pid"], m["tid"]) == (call["pid"], call["tid"])
                and m["ts"] <= call["ts"] < m["ts"] + m["dur"]
            ]
            if call
            else []
        )
        if around:
            own[min(around, key=lambda m: m["dur"])["name"][len("nn.Module: ") :]] += k["dur"]
        else:
            outside += k["dur"]
    return dict(own), outside


def check_modules(shell: Any, out: Path, name: str, cuda: bool) -> dict[str, Any]:
    report, path = _profile(shell, CASES[name], out, name)
    mb = report.modules
    kernel_us = sum(k.dur_us for k in report.trace.kernels)
    result: dict[str, Any] = {
        "device": "cuda" if cuda else "cpu (rehearsal)",
        "modules": len(mb.rows),
        "on_device": mb.on_device,
        "kernel_us": kernel_us,
        "outside_us": mb.outside_us,
        "notes": list(mb.notes),
        "top": [(r.path, r.self_time_us, r.share) for r in mb.top(5)],
    }
    problems = []
    if not mb.rows:
        problems.append("no module rows")
    if cuda:
        roots = sum(r.device_us for r in mb.roots)
        if abs(roots + mb.outside_us - kernel_us) > 1e-6 * max(kernel_us, 1.0):
            problems.append(f"roots {roots} + outside {mb.outside_us} != kernels {kernel_us}")
        brute, _ = brute_force_own_device(path)
        # The brute force sees forward kernels only (backward is launched from autograd's
        # own thread, in no module range): compare each module's own forward device time.
        for r in mb.rows:
            kids = [c for c in mb.rows if c.parent == r.path]
            fwd_own = r.forward_device_us - sum(c.forward_device_us for c in kids)
            want = brute.get(r.path, 0.0)
            if abs(fwd_own - want) > 0.01 + 1e-6 * want:
                problems.append(f"{r.path}: forward own device {fwd_own} vs brute force {want}")
        result["forward_rows_checked"] = len(mb.rows)
        weighted = [r for r in mb.rows if r.module_type in ("Linear", "Conv2d", "Embedding")]
        missing = [r.path for r in weighted if r.backward_device_us <= 0]
        if missing:
            problems.append(f"no backward device time in {missing}")
        result["backward_device_us"] = sum(r.backward_device_us for r in mb.roots)
        result["mfu"] = report.mfu.mfu if report.mfu else None
    else:
        roots = sum(r.host_us for r in mb.roots)
        if abs(roots + mb.outside_us - mb.total_us) > 1e-6 * max(mb.total_us, 1.0):
            problems.append("roots + outside != total")
    result["trace"] = str(path)
    result["problems"] = problems
    result["passed"] = not problems
    return result


def check_mfu(shell: Any, out: Path) -> dict[str, Any]:
    import torch

    from gpuprof_nb.capture.device import measure_ceilings

    t0 = time.perf_counter()
    spec = measure_ceilings("cuda", matmul_size=8192, repeat=3)
    seconds = time.perf_counter() - t0
    n, count = 4096, 16
    shell.run_cell(
        f"A = torch.randn({n}, {n}, device='cuda', dtype=torch.bfloat16)\n"
        f"B = torch.randn({n}, {n}, device='cuda', dtype=torch.bfloat16)"
    )
    report, path = _profile(
        shell, f"for _ in range({count}):\n    C = A @ B", out, "mfu_bf16_matmuls"
    )
    m = report.mfu
    flops = count * 2 * n**3
    timing = report.timing
    hand = (
        flops / (timing.median_us * 1e-6) / spec.bf16_flops_per_s if spec.bf16_flops_per_s else None
    )
    problems = []
    if m is None:
        problems.append("no MFU")
    else:
        if m.model_flops_per_step != flops:
            problems.append(f"FLOPs {m.model_flops_per_step} != hand count {flops}")
        if m.roof != "bf16":
            problems.append(f"peak not a bf16 one: {m.roof}, {m.peak_source}")
        if hand is not None and hand > 1.0:
            # The cell beat the measured ceiling: MFU falls back to the datasheet's peak.
            from gpuprof_nb.model.device import lookup_device_spec

            sheet = lookup_device_spec(spec.name, spec.memory_bytes)
            peak = sheet.bf16_flops_per_s if sheet else None
            hand = flops / (timing.median_us * 1e-6) / peak if peak else None
            if m.measured_peak:
                problems.append("MFU above 1 against the measured peak, yet kept it")
        elif not m.measured_peak:
            problems.append(f"peak not the measured one: {m.peak_source}")
        if m.mfu is None or hand is None or abs(m.mfu - hand) > 1e-6 * hand:
            problems.append(f"MFU {m.mfu} != hand {hand}")
    torch.cuda.synchronize()
    return {
        "measured_bf16_flops_per_s": spec.bf16_flops_per_s,
        "measure_ceilings_s": seconds,
        "flops": flops,
        "median_run_us": timing.median_us,
        "mfu": m.mfu if m else None,
        "hand_mfu": hand,
        "trace": str(path),
        "problems": problems,
        "passed": not problems,
    }


def check_cuda_graphs(shell: Any, out: Path) -> dict[str, Any]:
    shell.run_cell(
        "mlp = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)]).to(DEV)\n"
        "cmlp = torch.compile(mlp, mode='reduce-overhead')\n"
        "xg = torch.randn(64, 512, device=DEV)\n"
        "with torch.no_grad():\n    for _ in range(3): cmlp(xg)"
    )
    report, path = _profile(
        shell, "with torch.no_grad():\n    for _ in range(20): y = cmlp(xg)", out, "cuda_graphs"
    )
    g = report.graph_replays
    problems = []
    if g is None:
        problems.append("no CUDA graph launch found in the trace")
        rows: list[Any] = []
    else:
        rows = [
            {
                "launched_from": r.launched_from,
                "module": r.module,
                "launches": r.launches,
                "kernels": r.kernels,
                "device_us": r.device_us,
            }
            for r in g.rows
        ]
        if g.kernels == 0:
            problems.append("graph launches replayed no kernel (correlation ids do not match?)")
        if any(r.launched_from == "(no op)" and not r.module for r in g.rows):
            problems.append("a launch is charged to neither an op, an annotation nor a module")
    return {
        "launches": g.launches if g else 0,
        "kernels": g.kernels if g else 0,
        "device_us": g.device_us if g else 0.0,
        "outside_ops_us": g.outside_ops_us if g else 0.0,
        "unattributed_in_top_ops_us": report.ops.unattributed_device_us if report.ops else None,
        "rows": rows,
        "trace": str(path),
        "problems": problems,
        "passed": not problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="issue 35's GPU checks")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    out: Path = args.out
    (out / "traces").mkdir(parents=True, exist_ok=True)
    import torch

    cuda = torch.cuda.is_available()
    shell = _shell()
    shell.run_cell(SETUP)
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else None,
    }
    checks = [
        ("modules_transformer", lambda: check_modules(shell, out, "modules_transformer", cuda)),
        ("modules_cnn", lambda: check_modules(shell, out, "modules_cnn", cuda)),
        ("mfu_bf16_matmuls", (lambda: check_mfu(shell, out)) if cuda else None),
        ("cuda_graphs", (lambda: check_cuda_graphs(shell, out)) if cuda else None),
    ]
    ok = True
    for name, run in checks:
        t0 = time.perf_counter()
        if run is None:
            results[name] = {"skipped": "no CUDA device: this check needs one"}
            continue
        try:
            results[name] = run()
        except Exception as exc:  # noqa: BLE001 - recorded, and the other checks go on
            results[name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
                "passed": False,
            }
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        ok = ok and bool(results[name].get("passed", False))
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    lines = [
        f"# gpu_modules_check ({results['gpu'] or 'CPU rehearsal'}, torch {results['torch']})",
        "",
    ]
    for name, _ in checks:
        r = results[name]
        status = "skipped" if "skipped" in r else "PASS" if r.get("passed") else "FAIL"
        lines.append(
            f"- **{name}**: {status}"
            + (
                f" - {r.get('skipped') or r.get('error') or '; '.join(r.get('problems', []))}"
                if status != "PASS"
                else ""
            )
        )
        for key in (
            "mfu",
            "hand_mfu",
            "measured_bf16_flops_per_s",
            "kernel_us",
            "outside_us",
            "backward_device_us",
            "launches",
            "kernels",
            "device_us",
            "outside_ops_us",
            "seconds",
        ):
            if key in r:
                lines.append(f"  - {key}: {r[key]}")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
