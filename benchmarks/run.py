"""Run every comparison and write benchmarks/RESULTS.md (`make bench`).

    python benchmarks/run.py [--quick]
                             [--only overhead,accuracy,traces,json,snapshots,notebook,findings,
                                     compare,runs,stragglers,training,samplers,fit,modules,hostile,
                                     timeline,lines,gcpause]
                             [--repeats N] [--big-trace-mb N] [--big-snapshot-mb N]
                             [--traces-dir DIR] [--hta-python PATH] [--out PATH]
                             [--cache-dir DIR] [--cap-gb N]

Traces come from ../shared/traces (override with --traces-dir or GPUPROF_TRACES_DIR).
HolisticTraceAnalysis runs from its own venv (benchmarks/.cache/venv-bench, made by
`make bench`; override with --hta-python or GPUPROF_HTA_PYTHON); the test venv never needs it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.config import BenchConfig, Section, Target  # noqa: E402

CACHE = REPO / "benchmarks" / ".cache"
DEFAULT_HTA_PYTHON = CACHE / "venv-bench" / "bin" / "python"
# Comparison name -> module with `run(cfg) -> Section`, in the order.
COMPARISONS = {
    "overhead": "benchmarks.overhead",
    "accuracy": "benchmarks.accuracy",
    "traces": "benchmarks.trace_analysis",
    "json": "benchmarks.json_choice",
    "snapshots": "benchmarks.snapshot_analysis",
    "notebook": "benchmarks.notebook_weight",
    "findings": "benchmarks.first_finding",
    "compare": "benchmarks.compare_noise",
    "runs": "benchmarks.distributed_runs",
    "stragglers": "benchmarks.stragglers",
    "training": "benchmarks.training_cell",
    "samplers": "benchmarks.samplers",
    "fit": "benchmarks.fit_prediction",
    "modules": "benchmarks.module_hooks",
    "hostile": "benchmarks.hostile_inputs",
    "timeline": "benchmarks.timeline_analyses",
    "lines": "benchmarks.linetrace",
    "gcpause": "benchmarks.gc_pause",
}
# Each comparison's section title in RESULTS.md (what --reuse finds there).
TITLES = {
    "overhead": "1. Overhead on the same cell",
    "accuracy": "2. Timing accuracy",
    "traces": "3. Trace analysis",
    "json": "JSON library choice",
    "snapshots": "4. Snapshot analysis",
    "notebook": "5. Notebook weight",
    "findings": "6. First finding under load",
    "compare": "7. Before/after verdict and noise",
    "runs": "8. Distributed runs",
    "stragglers": "9. Stragglers named",
    "training": "10. %%gpuprofile on a real training cell",
    "samplers": "11. Samplers beside the profiled run",
    "fit": "12. Will it fit on a million-entry snapshot",
    "modules": "13. Module ranges beside the profiled run",
    "hostile": "14. Hostile inputs",
    "timeline": "15. Timeline analyses (issue 38)",
    "lines": "16. Exact line events against the line sampler",
    "gcpause": "17. The garbage collector paused while loading",
}
# Sections written by hand, not by a comparison: kept as the --out file holds them whenever
# this script rewrites it, after the comparisons.
HAND_WRITTEN = ("Measurements behind design choices",)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="gpuprof_nb benchmarks -> RESULTS.md")
    parser.add_argument(
        "--quick", action="store_true", help="tiny inputs, one run each (what the smoke tests use)"
    )
    parser.add_argument(
        "--only",
        default=",".join(COMPARISONS),
        help=f"comma-separated subset of {', '.join(COMPARISONS)}",
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs per measurement")
    parser.add_argument(
        "--big-trace-mb",
        type=int,
        default=None,
        help="size of the replicated trace in MiB (0 skips it; default 1024)",
    )
    parser.add_argument(
        "--big-snapshot-mb",
        type=int,
        default=None,
        help="size of the synthetic snapshot in MiB (0 skips it; default 1024)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads in the measured shell (default 1: stable on a shared machine)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where comparison 10's training cell runs (cuda: on a GPU "
        "machine, with --out elsewhere than RESULTS.md)",
    )
    parser.add_argument(
        "--cap-gb",
        type=float,
        default=12.0,
        help="kill any measured child process tree above this many GiB",
    )
    parser.add_argument(
        "--traces-dir",
        default=os.environ.get("GPUPROF_TRACES_DIR", str(REPO.parent / "shared" / "traces")),
    )
    parser.add_argument(
        "--hta-python", default=os.environ.get("GPUPROF_HTA_PYTHON", str(DEFAULT_HTA_PYTHON))
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS.md"))
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="fill the comparisons not run now (--only) from the last run's "
        "saved sections (benchmarks/.cache), else from the sections of "
        "the --out file, each marked with when and how it was measured",
    )
    parser.add_argument(
        "--cache-dir",
        default=str(CACHE),
        help="where generated inputs go (default benchmarks/.cache, ignored)",
    )
    return parser.parse_args(argv)


def make_config(args: argparse.Namespace) -> BenchConfig:
    quick = args.quick
    return BenchConfig(
        traces_dir=Path(args.traces_dir),
        cache_dir=Path(args.cache_dir),
        hta_python=args.hta_python if Path(args.hta_python).exists() else None,
        repeats=args.repeats or (1 if quick else 3),
        big_repeats=1,
        big_trace_mb=args.big_trace_mb if args.big_trace_mb is not None else (2 if quick else 1024),
        big_snapshot_mb=(
            args.big_snapshot_mb if args.big_snapshot_mb is not None else (1 if quick else 1024)
        ),
        cap_bytes=int(args.cap_gb * 2**30),
        quick=quick,
        threads=args.threads,
        device=args.device,
    )


def _version(module: str, python: str | None = None) -> str:
    if python is None:
        try:
            return str(importlib.import_module(module).__version__)
        except (ImportError, AttributeError):
            return "not installed"
    code = (
        "import importlib.metadata as m, sys\n"
        "try: print(m.version(sys.argv[1]))\n"
        "except m.PackageNotFoundError: print('not installed')"
    )
    try:
        out = subprocess.run(
            [python, "-c", code, module], capture_output=True, text=True, timeout=60
        )
        return out.stdout.strip() or "not installed"
    except (OSError, subprocess.SubprocessError):
        return "not installed"


def _shown(path: Path) -> str:
    """A path as RESULTS.md shows it: relative to the repository root (`../shared/traces`),
    so the file says nothing about the machine's own folders."""
    try:
        return os.path.relpath(path.resolve(), REPO)
    except ValueError:  # another drive on Windows
        return str(path)


def machine_lines(cfg: BenchConfig) -> list[str]:
    """Machine and versions, so anyone can tell whether their numbers are comparable."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    import torch

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)"
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return [
        f"- load average at the end (1 / 5 / 15 min): {load} on {os.cpu_count()} CPUs "
        "(other work on the machine shows up as noise and as contention in long timings)",
        f"- machine: {platform.system()} {platform.release()}, {cpu}, "
        f"{os.cpu_count()} CPUs, {mem:.0f} GiB RAM; GPU: {cuda}",
        f"- python {platform.python_version()}; torch {torch.__version__}; "
        f"gpuprof_nb {_version('gpuprof_nb')}; IPython {_version('IPython')}; "
        f"numpy {_version('numpy')}",
        f"- HolisticTraceAnalysis {_version('HolisticTraceAnalysis', cfg.hta_python)} "
        f"(pandas {_version('pandas', cfg.hta_python)}; orjson "
        f"{_version('orjson', cfg.hta_python)}) in `{cfg.hta_python}`"
        if cfg.hta_python
        else "- HolisticTraceAnalysis: not available",
        f"- traces: `{_shown(cfg.traces_dir)}`; repeats per measurement: {cfg.repeats} "
        f"(large inputs: {cfg.big_repeats}); memory cap per child: "
        f"{cfg.cap_bytes / 2**30:.0f} GiB",
    ]


def stamp_section(section: Section, command: str) -> Section:
    """Prefix the section with when, how and under what machine load it was measured."""
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    when = f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    head = f"_Measured {when} by `{command}`; load average (1/5/15 min) at the end: {load}._"
    return Section(section.title, head + "\n\n" + section.markdown, section.targets)


def save_section(path: Path, section: Section) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "title": section.title,
                "markdown": section.markdown,
                "targets": [[t.name, t.measured, t.goal, t.met] for t in section.targets],
            }
        )
    )


def load_section(path: Path) -> Section:
    data = json.loads(path.read_text())
    return Section(data["title"], data["markdown"], tuple(Target(*t) for t in data["targets"]))


def _mark(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not judged"}[met]


_MARKS = {"met": True, "**missed**": False, "not judged": None}


def sections_in_results(text: str) -> dict[str, Section]:
    """Return the sections of an earlier RESULTS.md by title, each with its rows of the
    Targets table: what `--reuse` keeps when the saved sections of that run are not on this
    machine (benchmarks/.cache is not in the repository, so a fresh clone has none)."""
    targets: dict[str, list[Target]] = {}
    bodies: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            if current != "Targets":
                bodies[current] = []
            continue
        if current == "Targets":
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and cells[4] in _MARKS:
                title, name, goal, measured, mark = cells
                targets.setdefault(title, []).append(Target(name, measured, goal, _MARKS[mark]))
        elif current is not None:
            bodies[current].append(line)
    return {
        title: Section(title, "\n".join(body).strip("\n"), tuple(targets.get(title, ())))
        for title, body in bodies.items()
    }


def hand_written_sections(text: str) -> list[Section]:
    """Return the HAND_WRITTEN sections of an earlier RESULTS.md, as they are."""
    found = sections_in_results(text)
    return [found[title] for title in HAND_WRITTEN if title in found]


def render_results(
    cfg: BenchConfig, sections: list[Section], command: str, elapsed_s: float
) -> str:
    """RESULTS.md: header, machine, the target summary, then each comparison."""
    targets: list[tuple[str, Target]] = [(s.title, t) for s in sections for t in s.targets]
    hand = [f'"{s.title}"' for s in sections if s.title in HAND_WRITTEN]
    kept = (
        f", but for the hand-written section {', '.join(hand)} at the end, which it keeps as it is"
        if hand
        else ""
    )
    how = (
        "Measured on a GPU machine: `STEPS=bench bash tools/gpu_check.sh OUT` runs "
        "`benchmarks/run.py --only training --device cuda` there (docs/gpu-results.md)."
        if cfg.device == "cuda"
        else "Reproduce all of it with `make bench` (which runs `python benchmarks/run.py "
        "--hta-python benchmarks/.cache/venv-bench/bin/python`); a run with `--only ... "
        "--reuse` measures some comparisons again and keeps the others from earlier runs."
    )
    out = [
        "# gpuprof_nb benchmark results",
        "",
        "Generated by `benchmarks/run.py`; do not edit by hand" + kept + ". " + how,
        "",
        f"- command that last wrote this file: `{command}`",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; this invocation took "
        f"{elapsed_s:.0f} s (each section says when and by which command it was measured)",
        *machine_lines(cfg),
        "",
        "## Targets",
        "",
        "| comparison | target | goal | measured | status |",
        "|---|---|---|---|---|",
    ]
    for title, t in targets:
        out.append(f"| {title} | {t.name} | {t.goal} | {t.measured} | {_mark(t.met)} |")
    for section in sections:
        out += ["", f"## {section.title}", "", section.markdown.rstrip()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = make_config(args)
    cfg.cache_dir.mkdir(parents=True, exist_ok=True)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("--device cuda: torch sees no CUDA device here", file=sys.stderr)
            return 2
    unknown = [name for name in chosen if name not in COMPARISONS]
    if unknown:
        print(f"unknown comparison(s) {unknown}; choose from {list(COMPARISONS)}", file=sys.stderr)
        return 2
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    os.environ.setdefault("MPLBACKEND", "Agg")
    start = time.perf_counter()
    command = "python benchmarks/run.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    saved = cfg.cache_dir / "sections"
    previous = Path(args.out).read_text() if Path(args.out).exists() else ""
    earlier = sections_in_results(previous) if args.reuse else {}
    sections: list[Section] = []
    for name in COMPARISONS:
        if name not in chosen:
            if args.reuse and (saved / f"{name}.json").exists():
                sections.append(load_section(saved / f"{name}.json"))
            elif args.reuse and TITLES[name] in earlier:
                sections.append(earlier[TITLES[name]])
            continue
        t0 = time.perf_counter()
        print(f"[bench] {name} ...", flush=True)
        module = importlib.import_module(COMPARISONS[name])
        try:
            section = module.run(cfg)
        except Exception as exc:  # noqa: BLE001 - one broken comparison must not hide the rest
            import traceback

            where = traceback.extract_tb(exc.__traceback__)[-1]
            print(traceback.format_exc(), file=sys.stderr)
            section = Section(
                name,
                f"This comparison failed: `{type(exc).__name__}: {exc}` "
                f"(at `{Path(where.filename).name}:{where.lineno}`)",
                (Target(name, f"failed: {exc}", "runs", False),),
            )
        section = stamp_section(section, command.strip())
        sections.append(section)
        if not cfg.quick:
            save_section(saved / f"{name}.json", section)
        print(f"[bench] {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
    sections += hand_written_sections(previous)
    text = render_results(cfg, sections, command.strip(), time.perf_counter() - start)
    Path(args.out).write_text(text)
    print(f"[bench] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
