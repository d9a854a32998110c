"""Comparison 3: trace analysis, end to end.

gpuprof_nb as a user gets it from a trace file (`load_trace`, then `analyze`, diagnosis
included, then the displayed bundle of every tab) vs HolisticTraceAnalysis (in its own venv:
`TraceAnalysis` + kernel, idle-time and temporal breakdowns) vs the floor, plain `json.load`,
on every real trace in ../shared/traces and on a large trace made by replicating a real
one. Each approach runs in its own child process (benchmarks/child.py) so peak memory
is measured per approach.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import statistics
from pathlib import Path
from typing import Any

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.measure import (
    Outcome,
    fmt_s,
    hotspot_lines,
    measure_interleaved,
    run_child,
    run_script,
    this_python,
)

REPO = Path(__file__).resolve().parent.parent
# The real trace replicated into the large one: the biggest in the shared set (V100 DDP,
# NCCL, ~28k [memory] events), so the large trace has every event class a user's would.
BIG_SOURCE = "hta/tests/data/df_index_resolver/df_index_resolver.json.gz"
# Arguments that hold ids which must stay unique per copy (flows link runtime -> kernel).
_ID_ARGS = ("correlation", "External id", "external id", "Ev Idx")
# A step annotation's name: each copy's steps are numbered after the previous copy's, as in
# one longer recording (the same number in two copies would make one step span both).
_STEP = re.compile(r"ProfilerStep#(\d+)$")


def real_traces(traces_dir: Path) -> list[Path]:
    """Every trace file under traces_dir (export_memory_timeline output is not a trace)."""
    found = [
        p
        for p in sorted(traces_dir.rglob("*"))
        if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
    ]
    return found


def decompressed_bytes(path: Path) -> int:
    """Size in bytes of the JSON text (gzip inflated)."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    if not gz:
        return path.stat().st_size
    total = 0
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            total += len(chunk)
    return total


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def _max_id(events: list[dict[str, Any]]) -> int:
    top = 0
    for ev in events:
        value = ev.get("id")
        if isinstance(value, int):
            top = max(top, value)
        args = ev.get("args")
        if isinstance(args, dict):
            for key in _ID_ARGS:
                value = args.get(key)
                if isinstance(value, int):
                    top = max(top, value)
    return top


def replicate_trace(source: Path, dest: Path, target_bytes: int) -> Path:
    """Write `dest` (about `target_bytes` in all): the events of `source` repeated, each
    copy shifted after the previous one in time, with flow ids, correlation and External
    ids offset per copy and its `ProfilerStep#N` steps numbered after the previous copy's
    (a longer run of the same job), until the file reaches `target_bytes`. Metadata events
    and top-level keys appear once. Reuses `dest` when it already exists with the right
    size."""
    stamp = dest.with_suffix(dest.suffix + ".done")
    # The stamp names how the copy was made: a file from an older recipe is made again.
    recipe = f"{target_bytes} steps renumbered"
    if dest.exists() and stamp.exists() and stamp.read_text().strip() == recipe:
        return dest
    doc = _load(source)
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") != "M"]
    starts = [e["ts"] for e in timed if isinstance(e.get("ts"), (int, float))]
    ends = [
        e["ts"] + e.get("dur", 0)
        for e in timed
        if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur", 0), (int, float))
    ]
    span = int(max(ends) - min(starts)) + 1000
    id_step = _max_id(timed) + 1
    steps = [
        int(m.group(1))
        for e in timed
        if isinstance(e.get("name"), str) and (m := _STEP.match(e["name"]))
    ]
    step_step = max(steps) - min(steps) + 1 if steps else 0
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        head = json.dumps(top)[:-1]
        out.write(head + (", " if top else "") + '"traceEvents": [\n')
        out.write(",\n".join(json.dumps(e) for e in meta))
        sep = ",\n" if meta else "\n"  # no comma before the first element of the array
        written = out.tell()
        copy = 0
        # Stop at the event that reaches the target, so small targets (smoke tests) stay small.
        while written < target_bytes:
            shift_ts, shift_id, shift_step = copy * span, copy * id_step, copy * step_step
            for ev in timed:
                ev2 = dict(ev)
                step = _STEP.match(ev2["name"]) if isinstance(ev2.get("name"), str) else None
                if step is not None and shift_step:
                    ev2["name"] = f"ProfilerStep#{int(step.group(1)) + shift_step}"
                if isinstance(ev2.get("ts"), (int, float)):
                    ev2["ts"] = ev2["ts"] + shift_ts
                if isinstance(ev2.get("id"), int):
                    ev2["id"] = ev2["id"] + shift_id
                args = ev2.get("args")
                if isinstance(args, dict):
                    args2 = dict(args)
                    for key in _ID_ARGS:
                        if isinstance(args2.get(key), int) and args2[key] >= 0:
                            args2[key] = args2[key] + shift_id
                    ev2["args"] = args2
                text = sep + json.dumps(ev2)
                sep = ",\n"
                out.write(text)
                written += len(text)
                if written >= target_bytes:
                    break
            copy += 1
        out.write("\n]}\n")
    os.replace(tmp, dest)
    stamp.write_text(recipe)
    return dest


def replicate_in_child(source: Path, dest: Path, target_bytes: int) -> Path:
    """replicate_trace in a child process, so this process never holds the parsed source
    (a large parent RSS would be inherited by the measured children at fork)."""
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from benchmarks.trace_analysis import replicate_trace;"
        "replicate_trace(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))"
    )
    run_script(code, str(REPO), str(source), str(dest), str(target_bytes))
    return dest


def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b and a == a else float("nan")


def _time_ratio(a: Outcome, b: Outcome) -> float:
    """a's time over b's: the median over rounds of each round's ratio (the two ran one after
    the other in each round, so a slow spell of the machine cancels out of the ratio); NaN
    when either failed."""
    if not (a.ok and b.ok):
        return float("nan")
    return statistics.median(
        _ratio(x.seconds, y.seconds) for x, y in zip(a.runs, b.runs, strict=False)
    )


def _fmt_mb(n: int | float) -> str:
    return f"{n / 2**20:.0f} MB" if n >= 10 * 2**20 else f"{n / 2**20:.1f} MB"


def _cell(outcome: Outcome, what: str = "time") -> str:
    if not outcome.ok:
        return f"failed: {outcome.error}" if what == "time" else "-"
    if what == "time":
        return fmt_s(outcome.median_seconds)
    return _fmt_mb(outcome.peak_rss_bytes)


# Traces judged against the targets (>= 5 MB) get at least this many runs per approach.
JUDGED_BYTES = 5 * 2**20
JUDGED_REPEATS = 5
# Goals of issue 18, judged on traces of JSON_BYTES or more: gpuprof_nb end to end at least
# SPEEDUP times faster than HTA (BIG_SPEEDUP on the large replicated trace), and what comes
# after the load (analysis + display) no longer than the load.
SPEEDUP = 5.0
BIG_SPEEDUP = 10.0
AFTER_LOAD_GOAL = 1.0
FLOOR_GOAL = 3.0
MEMORY_GOAL = 3.0
# gpuprof_nb's stages (child.py's gpuprof-trace mode), in order.
LOAD = "load"


def _compare_one(
    cfg: BenchConfig, path: Path, hta_python: str | None, repeats: int
) -> dict[str, Any]:
    size = decompressed_bytes(path)
    row: dict[str, Any] = {"path": path, "bytes": size}
    approaches = [
        ("json.load", this_python(), "json-floor"),
        ("gpuprof_nb", this_python(), "gpuprof-trace"),
    ]
    if hta_python:
        approaches.append(("HTA", hta_python, "hta-trace"))
        # For reference only: what a faster JSON parser (orjson, in the bench venv) needs.
        approaches.append(("orjson", hta_python, "orjson-floor"))
    outcomes = measure_interleaved(approaches, str(path), repeats=repeats, cap_bytes=cfg.cap_bytes)
    row["floor"] = outcomes["json.load"]
    row["ours"] = outcomes["gpuprof_nb"]
    if hta_python:
        row["hta"] = outcomes["HTA"]
        row["orjson"] = outcomes["orjson"]
    else:
        row["hta"] = Outcome("HTA", error="HTA venv not available (see make bench)")
        row["orjson"] = Outcome("orjson", error="bench venv not available")
    return row


def _name(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return path.name


def run(cfg: BenchConfig) -> Section:
    """Measure every trace; return the RESULTS.md section and the targets it checks."""
    traces = real_traces(cfg.traces_dir) if cfg.traces_dir.is_dir() else []
    if cfg.quick:
        traces = sorted(traces, key=lambda p: p.stat().st_size)[:2]
    hta_python = cfg.hta_python if cfg.hta_python and Path(cfg.hta_python).exists() else None
    judged_repeats = cfg.repeats if cfg.quick else max(cfg.repeats, JUDGED_REPEATS)
    rows = [
        _compare_one(
            cfg,
            p,
            hta_python,
            judged_repeats if decompressed_bytes(p) >= JUDGED_BYTES else cfg.repeats,
        )
        for p in traces
    ]
    for row in rows:
        row["big"] = False

    big_rows: list[dict[str, Any]] = []
    source = cfg.traces_dir / BIG_SOURCE
    if not source.exists() and traces:
        # Another trace set (--traces-dir): replicate its largest trace instead.
        source = max(traces, key=lambda p: p.stat().st_size)
    if source.exists() and cfg.big_trace_mb > 0:
        dest = cfg.cache_dir / f"big_trace_{source.name.split('.')[0]}_{cfg.big_trace_mb}mb.json"
        replicate_in_child(source, dest, cfg.big_trace_mb * 2**20)
        big = _compare_one(cfg, dest, hta_python, cfg.big_repeats)
        big["big"] = True
        big_rows.append(big)

    lines = [
        "Each approach runs in its own child process; time is the work only (imports "
        "excluded, the ones the first display makes lazily among them), the median of the "
        "runs, which take turns (one run of each approach per "
        f"round; {judged_repeats} rounds for traces of 5 MB or more, the ones the targets "
        f"judge, {cfg.repeats} for smaller ones, {cfg.big_repeats} for the large trace); the "
        "ratios (HTA / ours, ours / floor) are the median over rounds of each round's ratio; "
        "peak memory is the child's whole process tree, "
        "and (added) is the peak minus the RSS after imports, the part the trace costs.",
        "gpuprof_nb = end to end, what a user gets from a trace file: "
        "`gpuprof_nb.io.trace.load_trace(path)` (load) + `gpuprof_nb.analysis.report."
        "analyze(trace)` (analyze: the ops, kernels and summary tables, the device timeline "
        "and its idle breakdown, the roofline and the diagnosis) + "
        "`report._repr_mimebundle_()` (display: the HTML and text of every tab); "
        "HTA = `TraceAnalysis(...)` + `get_gpu_kernel_breakdown` + `get_idle_time_breakdown` "
        "+ `get_temporal_breakdown` (no per-operator table, no diagnosis, nothing rendered: "
        "HTA does less work); floor = `json.load` of the same file; orjson = `orjson.loads` "
        "of the same bytes (not used by gpuprof_nb; shown for what a faster parser would "
        "allow).",
        "",
        "| trace | JSON size | json.load | orjson | gpuprof_nb | HTA | HTA / ours | ours / floor "
        "| peak ours (added) | added / JSON size | peak HTA | peak floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows + big_rows:
        ours, hta, floor = row["ours"], row["hta"], row["floor"]
        speedup = _time_ratio(hta, ours)
        vs_floor = _time_ratio(ours, floor)
        added = ours.peak_rss_bytes - ours.baseline_rss_bytes
        mem_ratio = _ratio(added, row["bytes"]) if ours.ok else float("nan")
        row.update(
            speedup=speedup,
            vs_floor=vs_floor,
            mem_ratio=mem_ratio,
            after_load=_after_load_ratio(ours),
        )
        lines.append(
            f"| `{_name(row['path'], cfg.traces_dir)}` | {_fmt_mb(row['bytes'])} "
            f"| {_cell(floor)} | {_cell(row['orjson'])} | {_cell(ours)} | {_cell(hta)} "
            f"| {_x(speedup)} | {_x(vs_floor)} "
            f"| {_cell(ours, 'mem')} (+{_fmt_mb(max(added, 0))}) | {_x(mem_ratio)} "
            f"| {_cell(hta, 'mem')} "
            f"| {_cell(floor, 'mem')} |"
        )
    stage_lines = _stage_table(rows + big_rows, cfg)
    targets = _targets(rows, big_rows)
    gap_lines = _gap_notes(cfg, rows, big_rows, targets)
    body = "\n".join(lines + [""] + stage_lines + [""] + gap_lines)
    return Section("3. Trace analysis", body, tuple(targets))


def _after_stages(outcome: Outcome) -> list[str]:
    """gpuprof_nb's stages after the load (analyze, display), in the order they ran."""
    if not outcome.ok:
        return []
    return [n for n in outcome.runs[0].stages if n != LOAD]


def _after_load_ratio(outcome: Outcome) -> float:
    """(analysis + display) / load: the median over runs of each run's ratio (both from the
    same run, so a slow spell of the machine cancels out); NaN without a load stage."""
    if not outcome.ok or LOAD not in outcome.runs[0].stages:
        return float("nan")
    after = _after_stages(outcome)
    return statistics.median(
        _ratio(sum(r.stages.get(n, 0.0) for n in after), r.stages[LOAD]) for r in outcome.runs
    )


def _speed_goal(row: dict[str, Any]) -> float:
    return BIG_SPEEDUP if row.get("big") else SPEEDUP


def _stages_text(outcome: Outcome) -> str:
    if not outcome.ok:
        return "-"
    return ", ".join(f"{n} {fmt_s(outcome.median_stage(n))}" for n in outcome.runs[0].stages)


def _misses(row: dict[str, Any]) -> list[str]:
    """The per-trace goals a judged trace misses, each with its number."""
    out = []
    goal = _speed_goal(row)
    if row["speedup"] == row["speedup"] and row["speedup"] < goal:
        out.append(f"{row['speedup']:.2f}x faster than HTA (goal >= {goal:.0f}x)")
    if row["after_load"] == row["after_load"] and row["after_load"] > AFTER_LOAD_GOAL:
        out.append(f"analysis + display {row['after_load']:.2f}x the load (goal <= 1x)")
    if row["vs_floor"] == row["vs_floor"] and row["vs_floor"] > FLOOR_GOAL:
        out.append(f"{row['vs_floor']:.2f}x json.load (goal <= {FLOOR_GOAL:.0f}x)")
    if row["mem_ratio"] == row["mem_ratio"] and row["mem_ratio"] > MEMORY_GOAL:
        out.append(f"memory added {row['mem_ratio']:.2f}x the JSON (goal <= {MEMORY_GOAL:.0f}x)")
    return out


def _gap_notes(
    cfg: BenchConfig,
    rows: list[dict[str, Any]],
    big_rows: list[dict[str, Any]],
    targets: list[Target],
) -> list[str]:
    """The missed targets: for each judged trace that misses one, its numbers and where
    gpuprof_nb spends its time (stage medians), then the hotspots of the largest real trace."""
    missed = [t for t in targets if t.met is False]
    if not missed:
        unjudged = [t.name for t in targets if t.met is None]
        if unjudged:
            return ["Not judged (no input for them): " + "; ".join(unjudged) + "."]
        return ["All trace-analysis targets met."]
    out = [
        "### Missed targets: where the time goes",
        "",
        "Missed: " + "; ".join(f"{t.name} ({t.measured})" for t in missed) + ".",
        "",
    ]
    judged = [r for r in rows + big_rows if r["bytes"] >= JUDGED_BYTES and r["ours"].ok]
    for row in sorted(judged, key=lambda r: r["bytes"]):
        misses = _misses(row)
        if not misses:
            continue
        ours, hta, floor = row["ours"], row["hta"], row["floor"]
        text = (
            f"- `{_name(row['path'], cfg.traces_dir)}` ({_fmt_mb(row['bytes'])}): "
            + "; ".join(misses)
            + f". gpuprof_nb {fmt_s(ours.median_seconds)} ({_stages_text(ours)})"
        )
        if hta.ok:
            goal = _speed_goal(row)
            rounds = sorted(
                _ratio(h.seconds, o.seconds) for h, o in zip(hta.runs, ours.runs, strict=False)
            )
            text += (
                f"; HTA {fmt_s(hta.median_seconds)} ({_stages_text(hta)}), so "
                f"{goal:.0f}x means at most {fmt_s(hta.median_seconds / goal)}; "
                "HTA / ours per round: " + ", ".join(f"{x:.2f}x" for x in rounds)
            )
        if floor.ok:
            text += f"; json.load alone {fmt_s(floor.median_seconds)}"
        out.append(text + ".")
    real = [r for r in rows if r["ours"].ok]
    if real:
        biggest = max(real, key=lambda r: r["bytes"])
        try:
            prof = run_child(
                this_python(),
                "gpuprof-trace",
                str(biggest["path"]),
                cap_bytes=cfg.cap_bytes,
                profile=True,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            out.append(f"- (profiling failed: {exc})")
        else:
            out += [
                "",
                f"Hotspots of gpuprof_nb on `{_name(biggest['path'], cfg.traces_dir)}` "
                "(cProfile over load, analyze and display, own time; inflated by the "
                "profiler):",
                "",
                *hotspot_lines(prof),
            ]
    return out


def _x(value: float) -> str:
    return "-" if value != value else f"{value:.2f}x"


def _stage_table(rows: list[dict[str, Any]], cfg: BenchConfig) -> list[str]:
    """Where the time goes, per stage (median seconds), on every trace the targets judge
    (JSON of 5 MB or more, the large one included); on the largest inputs when none is."""
    shown = [r for r in rows if r["bytes"] >= JUDGED_BYTES]
    where = "on every trace of 5 MB or more"
    if not shown:  # only small traces (a --quick run): show where the time goes anyway
        shown = sorted(rows, key=lambda r: r["bytes"], reverse=True)[:3]
        where = "on the largest inputs (none is 5 MB or more)"
    shown = sorted(shown, key=lambda r: r["bytes"])
    after = next((_after_stages(r["ours"]) for r in shown if r["ours"].ok), ["analyze", "display"])
    out = [
        f"Where the time goes (median per stage) {where}; "
        "(" + " + ".join(after) + ") / load is the median over runs of each run's ratio:",
        "",
        "| trace | JSON size | gpuprof_nb "
        + " | ".join([LOAD, *after])
        + " | ("
        + " + ".join(after)
        + ") / load | HTA stages |",
        "|---|---|" + "---|" * (len(after) + 1) + "---|---|",
    ]
    for row in shown:
        ours, hta = row["ours"], row["hta"]
        if ours.ok:
            cells = [fmt_s(ours.median_stage(n)) for n in [LOAD, *after]]
        else:
            cells = [f"failed: {ours.error}"] + ["-"] * len(after)
        out.append(
            f"| `{_name(row['path'], cfg.traces_dir)}` | {_fmt_mb(row['bytes'])} | "
            + " | ".join(cells)
            + f" | {_x(row.get('after_load', float('nan')))} "
            f"| {_stages_text(hta) if hta.ok else '-'} |"
        )
    return out


def _targets(rows: list[dict[str, Any]], big_rows: list[dict[str, Any]]) -> list[Target]:
    targets: list[Target] = []
    everything = rows + big_rows
    failed = [r for r in everything if not r["ours"].ok]
    targets.append(
        Target(
            "every real trace analysed",
            f"{len(everything) - len(failed)}/{len(everything)} analysed"
            + (f"; failed: {', '.join(r['path'].name for r in failed)}" if failed else ""),
            "all",
            not failed if everything else None,  # no traces found: nothing to judge
        )
    )
    # Ratios on tiny traces are dominated by fixed costs; judge them on traces of >= 5 MB.
    sized = [r for r in everything if r["bytes"] >= JUDGED_BYTES and r["ours"].ok]
    name = "end-to-end speed vs HTA (traces >= 5 MB, worst)"
    speedups = [r for r in sized if r["speedup"] == r["speedup"]]
    if speedups:
        worst = min(speedups, key=lambda r: r["speedup"])
        targets.append(
            Target(
                name,
                f"{worst['speedup']:.2f}x faster ({_name(worst['path'], worst['path'].parent)})",
                f">= {SPEEDUP:.0f}x",
                worst["speedup"] >= SPEEDUP,
            )
        )
    else:
        targets.append(
            Target(name, "no trace of 5 MB or more analysed by both", f">= {SPEEDUP:.0f}x", None)
        )
    for row in big_rows:
        big_name = f"end-to-end speed vs HTA on the large trace ({_fmt_mb(row['bytes'])})"
        if row["speedup"] == row["speedup"]:
            targets.append(
                Target(
                    big_name,
                    f"{row['speedup']:.2f}x faster",
                    f">= {BIG_SPEEDUP:.0f}x",
                    row["speedup"] >= BIG_SPEEDUP,
                )
            )
        else:
            why = row["ours"].error if not row["ours"].ok else row["hta"].error
            targets.append(
                Target(big_name, f"not measured by both: {why}", f">= {BIG_SPEEDUP:.0f}x", None)
            )
    name = "analysis + display vs load time (traces >= 5 MB, worst)"
    shares = [r for r in sized if r["after_load"] == r["after_load"]]
    if shares:
        worst = max(shares, key=lambda r: r["after_load"])
        targets.append(
            Target(
                name,
                f"{worst['after_load']:.2f}x the load "
                f"({_name(worst['path'], worst['path'].parent)})",
                "<= 1x (no longer than the load)",
                worst["after_load"] <= AFTER_LOAD_GOAL,
            )
        )
    else:
        targets.append(
            Target(
                name, "no trace of 5 MB or more analysed", "<= 1x (no longer than the load)", None
            )
        )
    floors = [r["vs_floor"] for r in sized if r["vs_floor"] == r["vs_floor"]]
    if floors:
        worst_floor = max(floors)
        targets.append(
            Target(
                "time vs json.load floor (traces >= 5 MB, worst)",
                f"{worst_floor:.2f}x the floor",
                f"<= {FLOOR_GOAL:.0f}x",
                worst_floor <= FLOOR_GOAL,
            )
        )
    mems = [r["mem_ratio"] for r in sized if r["mem_ratio"] == r["mem_ratio"]]
    if mems:
        worst_mem = max(mems)
        targets.append(
            Target(
                "peak memory added vs JSON size (traces >= 5 MB, worst)",
                f"{worst_mem:.2f}x",
                f"<= {MEMORY_GOAL:.0f}x",
                worst_mem <= MEMORY_GOAL,
            )
        )
    for row in big_rows:
        ours = row["ours"]
        targets.append(
            Target(
                f"large trace ({_fmt_mb(row['bytes'])}) analysed within the memory cap",
                f"peak {_fmt_mb(ours.peak_rss_bytes)}, {fmt_s(ours.median_seconds)}"
                if ours.ok
                else f"failed: {ours.error}",
                "no OOM on 24 GB",
                ours.ok,
            )
        )
    return targets
