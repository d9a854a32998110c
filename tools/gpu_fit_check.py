"""Issue 37's GPU check: will it fit, on CUDA snapshots (about a minute on an H100).

For an MLP and a small transformer language model, one Adam training step each:
1. records the step at batch b/2 and b as `%%memsnap --fit batch_size` does (a warm-up at
   b/2 first), with the step record; checks that the categories add up to the snapshot's peak
   and compares that peak with torch.cuda.max_memory_allocated() of the same step;
2. predicts the peak at 2b and 4b, then measures both: the snapshot's peak (a recorded step
   after a warm-up step at that size) and max_memory_allocated() of a plain step (peak stats
   reset after a warm-up step);
3. plans checkpointing under 85% of the peak at b, applies the plan for one step and measures
   it the same two ways;
4. for the MLP, runs the same through the real `%%memsnap --fit batch_size --budget ... --apply`
   in an IPython shell (when IPython is installed).
Writes OUT/fit_check.json and OUT/fit_check.md, and the transformer's snapshots at b/2, b and
2b as OUT/gpu_fit_b{N}.pickle (the lead copies them to tests/data/gpu; tests/analysis/
test_fit.py checks them offline when they are there).

Without CUDA it runs the same on the CPU fallback with smaller sizes, and the
max_memory_allocated() columns are left empty: a rehearsal of the script, nothing more.

Run: KINETO_LOG_LEVEL=6 python tools/gpu_fit_check.py OUT
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("MPLBACKEND", "Agg")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from gpuprof_nb.analysis.fit import fit_batch_size, memory_by_category  # noqa: E402
from gpuprof_nb.analysis.plan import plan_checkpointing  # noqa: E402
from gpuprof_nb.analysis.report import analyze_memory  # noqa: E402
from gpuprof_nb.capture.batches import checkpoint_applied, record_batch_sizes  # noqa: E402
from gpuprof_nb.capture.memory import record_memory  # noqa: E402
from gpuprof_nb.io.snapshot import save_snapshot, snapshot_from_dict  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")


class Tiny(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.emb = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        out: torch.Tensor = self.head(h)
        return out


def workloads() -> dict[str, dict[str, Any]]:
    """name -> model, batch maker, loss, batch size b (smaller on the CPU rehearsal)."""
    width, vocab, d, seq = (1024, 8192, 256, 128) if CUDA else (256, 256, 32, 16)
    mlp = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(4)],
        torch.nn.Linear(width, 10),
    )
    return {
        "mlp": {
            "model": mlp,
            "batch": lambda b: (
                torch.randn(b, width, device=DEV),
                torch.randint(0, 10, (b,), device=DEV),
            ),
            "loss": torch.nn.functional.cross_entropy,
            "b": 4096 if CUDA else 64,
        },
        "transformer": {
            "model": Tiny(vocab, d, 4),
            "batch": lambda b: (
                torch.randint(0, vocab, (b, seq), device=DEV),
                torch.randint(0, vocab, (b, seq), device=DEV),
            ),
            "loss": lambda out, y: torch.nn.functional.cross_entropy(
                out.reshape(-1, vocab), y.reshape(-1)
            ),
            "b": 16 if CUDA else 4,
        },
    }


def max_allocated(step: Any) -> int | None:
    """torch.cuda.max_memory_allocated() over one step (after a warm-up step at that size:
    the peak stats are reset between them); None on the CPU."""
    if not CUDA:
        step()
        return None
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def check(name: str, w: dict[str, Any], out: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = w["model"].to(DEV)
    opt = torch.optim.Adam(model.parameters())
    ns: dict[str, Any] = {"model": model, "opt": opt, "batch_size": w["b"]}

    def step() -> None:
        x, y = w["batch"](ns["batch_size"])
        opt.zero_grad(set_to_none=True)
        w["loss"](model(x), y).backward()
        opt.step()

    b = w["b"]
    t0 = time.perf_counter()
    runs = record_batch_sizes(step, ns, "batch_size")
    main = snapshot_from_dict(runs.main.snapshot)
    other = snapshot_from_dict(runs.other.snapshot)
    fit = fit_batch_size(main, b, other, runs.other_batch_size, variable="batch_size")
    report = analyze_memory(main)
    cats = memory_by_category(main)
    ns["batch_size"] = b
    row: dict[str, Any] = {
        "batch_size": b,
        "other_batch_size": runs.other_batch_size,
        "peak_snapshot": report.peak_bytes,
        "peak_max_allocated": max_allocated(step),
        "categories": cats.as_dict() if cats else None,
        "categories_sum": cats.total_bytes if cats else None,
        "method": cats.method if cats else None,
        "fit_error_on_other_run": fit.relative_error,
        "matched_share": fit.matched_share,
        "predictions": [],
    }
    if name == "transformer":
        save_snapshot(main, out / f"gpu_fit_b{b}.pickle")
        save_snapshot(other, out / f"gpu_fit_b{runs.other_batch_size}.pickle")
    for k in (2, 4):
        size = k * b
        ns["batch_size"] = size
        step()  # warm-up at the new size, as a training loop would be
        recorded = snapshot_from_dict(record_memory(step, namespace=ns).snapshot)
        if name == "transformer" and k == 2:
            save_snapshot(recorded, out / f"gpu_fit_b{size}.pickle")
        measured = analyze_memory(recorded).peak_bytes
        p = fit.predict(size)
        row["predictions"].append(
            {
                "batch_size": size,
                "predicted": p.peak_bytes,
                "low": p.low_bytes,
                "high": p.high_bytes,
                "measured_snapshot": measured,
                "error_vs_snapshot": p.peak_bytes / measured - 1,
                "measured_max_allocated": max_allocated(step),
            }
        )
        m = row["predictions"][-1]["measured_max_allocated"]
        row["predictions"][-1]["error_vs_max_allocated"] = p.peak_bytes / m - 1 if m else None
    ns["batch_size"] = b
    budget = int(report.peak_bytes * 0.85)
    plan = plan_checkpointing(main, budget, fit=fit)
    with checkpoint_applied(model, plan.paths):
        step()
        applied = analyze_memory(snapshot_from_dict(record_memory(step, namespace=ns).snapshot))
        applied_max = max_allocated(step)
    row["plan"] = {
        "budget": budget,
        "modules": list(plan.paths),
        "predicted": plan.predicted_peak_bytes,
        "fits_predicted": plan.fits,
        "measured_snapshot": applied.peak_bytes,
        "measured_max_allocated": applied_max,
        "within_budget_snapshot": applied.peak_bytes <= budget,
        "within_budget_max_allocated": None if applied_max is None else applied_max <= budget,
        "recompute_us": plan.recompute_us,
    }
    row["seconds"] = time.perf_counter() - t0
    return row


MAGIC_SETUP = """\
import torch
DEV = {dev!r}
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear({w}, {w}), torch.nn.GELU())
                              for _ in range(4)], torch.nn.Linear({w}, 10)).to(DEV)
opt = torch.optim.Adam(model.parameters())
batch_size = {b}
"""
MAGIC_CELL = """\
x = torch.randn(batch_size, {w}, device=DEV)
y = torch.randint(0, 10, (batch_size,), device=DEV)
opt.zero_grad(set_to_none=True)
torch.nn.functional.cross_entropy(model(x), y).backward()
opt.step()
"""


def through_the_magic() -> dict[str, Any]:
    try:
        from IPython.testing.globalipapp import start_ipython
    except ImportError as exc:
        return {"skipped": f"IPython is not installed ({exc})"}
    w, b = (1024, 4096) if CUDA else (256, 64)
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpuprof_nb")
    ip.run_cell(MAGIC_SETUP.format(dev=str(DEV), w=w, b=b))
    ip.run_cell_magic("memsnap", "--fit batch_size --quiet -o probe", MAGIC_CELL.format(w=w))
    budget = int(ip.user_ns["probe"].peak_bytes * 0.85)
    ip.run_cell_magic(
        "memsnap",
        f"--fit batch_size --budget {budget} --apply --quiet -o mem",
        MAGIC_CELL.format(w=w),
    )
    mem = ip.user_ns["mem"]
    ip.user_ns["batch_size"] = 2 * b
    ip.run_cell(MAGIC_CELL.format(w=w))  # a warm-up step at 2b
    ip.run_cell_magic("memsnap", "--quiet -o at2b", MAGIC_CELL.format(w=w))
    text = mem.text()
    return {
        "batch_size": b,
        "peak": mem.peak_bytes,
        "categories_sum": mem.memory_by_category.total_bytes,
        "allocator_overhead": mem.memory_by_category.allocator_overhead_bytes,
        "predicted_2b": mem.predict(2 * b).peak_bytes,
        "measured_2b": ip.user_ns["at2b"].peak_bytes,
        "budget": budget,
        "plan_modules": list(mem.plan.paths) if mem.plan else None,
        "plan_predicted": mem.plan.predicted_peak_bytes if mem.plan else None,
        "plan_measured": mem.plan.measured_peak_bytes if mem.plan else None,
        "largest_batch": mem.largest_batch(),
        "budget_source": mem.budget_source,
        "tabs_shown": [t for t in ("-- By category --", "-- Will it fit --") if t in text],
    }


def markdown(results: dict[str, Any]) -> str:
    mib = 2**20
    lines = [
        f"# Will it fit on {results['device']} (torch {results['torch']})",
        "",
        "| model | b | peak (snapshot) | max_memory_allocated | categories sum |",
        "|---|---|---|---|---|",
    ]
    for name, r in results["models"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:80]} | | | |")
            continue
        mx = r["peak_max_allocated"]
        lines.append(
            f"| {name} | {r['batch_size']} | {r['peak_snapshot'] / mib:.2f} MiB | "
            + (f"{mx / mib:.2f} MiB" if mx else "-")
            + f" | {(r['categories_sum'] or 0) / mib:.2f} MiB |"
        )
    lines += [
        "",
        "| model | B | predicted | interval | snapshot | error | max_allocated | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["models"].items():
        for p in r.get("predictions", []):
            mx = p["measured_max_allocated"]
            lines.append(
                f"| {name} | {p['batch_size']} | {p['predicted'] / mib:.2f} MiB | "
                f"{p['low'] / mib:.2f}-{p['high'] / mib:.2f} | {p['measured_snapshot'] / mib:.2f} "
                f"MiB | {p['error_vs_snapshot'] * 100:+.2f}% | "
                + (
                    f"{mx / mib:.2f} MiB | {p['error_vs_max_allocated'] * 100:+.2f}% |"
                    if mx
                    else "- | - |"
                )
            )
    lines += [
        "",
        "| model | budget | modules | predicted | snapshot | max_allocated |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results["models"].items():
        p = r.get("plan")
        if p:
            mx = p["measured_max_allocated"]
            lines.append(
                f"| {name} | {p['budget'] / mib:.2f} MiB | {', '.join(p['modules'])} | "
                f"{p['predicted'] / mib:.2f} MiB | {p['measured_snapshot'] / mib:.2f} MiB | "
                + (f"{mx / mib:.2f} MiB |" if mx else "- |")
            )
    lines += ["", "Through the magic: `" + json.dumps(results.get("magic")) + "`", ""]
    return "\n".join(lines)


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if CUDA else "cpu (rehearsal: no CUDA)",
        "torch": torch.__version__,
        "models": {},
    }
    for name, w in workloads().items():
        try:
            results["models"][name] = check(name, w, out)
        except Exception as exc:  # one failing model must not lose the other's numbers
            results["models"][name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        (out / "fit_check.json").write_text(json.dumps(results, indent=1))
    try:
        results["magic"] = through_the_magic()
    except Exception as exc:
        results["magic"] = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    results["seconds"] = time.perf_counter() - t0
    (out / "fit_check.json").write_text(json.dumps(results, indent=1))
    (out / "fit_check.md").write_text(markdown(results))
    print(markdown(results))
    print(f"{results['seconds']:.1f} s; wrote {out / 'fit_check.json'}")
    failed = [n for n, r in results["models"].items() if "error" in r]
    return 1 if failed or "error" in results.get("magic", {}) else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/gpu-fit")))
