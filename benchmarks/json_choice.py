"""Which JSON library the trace loader uses, chosen on measurements (issue 7, comparison 3).

On the same real traces, in one process, interleaved round by round (so machine drift hits
every approach alike), each approach going from the file on disk to its result:
- `json.load` (the floor of comparison 3): every event becomes a dict;
- `orjson.loads` (when importable; not a dependency): the same dicts, a faster parser;
- `msgspec.json.decode` untyped: the same dicts again;
- `msgspec` typed: events decoded into structs holding only the fields the loader reads
  (the loader's own struct type), the rest of each event skipped unbuilt;
- gpuprof_nb `load_trace`: the whole model (ops, kernels, runtime calls, memory events),
  with msgspec (what users get) and without it (the standard-library reader it falls back to).
"""

from __future__ import annotations

import gzip
import json
import statistics
import typing
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.config import BenchConfig, Section
from benchmarks.measure import fmt_s, interleaved
from benchmarks.trace_analysis import decompressed_bytes, real_traces

MIN_BYTES = 20 * 2**20  # traces this big or bigger are measured (the largest few)
MAX_TRACES = 3
QUICK_MIN_BYTES = 64 * 2**10


def _raw_text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _json_load(path: Path) -> Any:
    opener: Any = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as fh:
        return json.load(fh)


def _approaches() -> dict[str, Callable[[Path], Any] | None]:
    """Label -> function of the trace path (None where the library is not installed)."""
    from gpuprof_nb.io.trace import load as trace_load

    out: dict[str, Callable[[Path], Any] | None] = {"json.load": _json_load}
    try:
        import orjson

        out["orjson.loads"] = lambda p: orjson.loads(_raw_text(p))
    except ImportError:
        out["orjson.loads"] = None
    decoder = trace_load.EVENT_DECODER
    if decoder is None:
        out["msgspec untyped"] = out["msgspec typed structs"] = None
    else:
        import msgspec

        event_type = typing.get_args(decoder.type)[0]  # the loader's own event struct
        doc_type = msgspec.defstruct("Doc", [("traceEvents", list[event_type], [])])
        typed = msgspec.json.Decoder(doc_type)
        untyped = msgspec.json.Decoder()
        out["msgspec untyped"] = lambda p: untyped.decode(_raw_text(p))
        out["msgspec typed structs"] = lambda p: typed.decode(_raw_text(p))
    out["gpuprof_nb load_trace"] = trace_load.load_trace

    def without_msgspec(path: Path) -> Any:
        saved = trace_load.EVENT_DECODER
        trace_load.EVENT_DECODER = None
        try:
            return trace_load.load_trace(path)
        finally:
            trace_load.EVENT_DECODER = saved

    out["load_trace without msgspec"] = without_msgspec
    return out


def _pick_traces(cfg: BenchConfig) -> list[tuple[Path, int]]:
    sized = [(p, decompressed_bytes(p)) for p in real_traces(cfg.traces_dir)]
    sized = [(p, n) for p, n in sized if n > 0]
    sized.sort(key=lambda pn: (-pn[1], str(pn[0])))
    if cfg.quick:  # the smallest trace (of some substance): seconds, for the smoke test
        small = sorted((pn for pn in sized if pn[1] >= QUICK_MIN_BYTES), key=lambda pn: pn[1])
        return small[:1] or sized[-1:]
    big = [pn for pn in sized if pn[1] >= MIN_BYTES][:MAX_TRACES]
    return big or sized[:1]


def run(cfg: BenchConfig) -> Section:
    """Time every approach on the largest real traces; return the RESULTS.md section."""
    approaches = _approaches()
    repeats = max(cfg.repeats, 1) if cfg.quick else max(cfg.repeats, 5)
    labels = list(approaches)
    lines = [
        f"From the file on disk to the result, in one process, {repeats} interleaved "
        f"round{'s' if repeats > 1 else ''}; each cell: median (min) and the median as a "
        "multiple of `json.load`'s. "
        "msgspec typed = events decoded into the loader's own structs (only the fields it "
        "reads); `load_trace` builds the whole model (ops, kernels, runtime calls, memory "
        "events) on top of that.",
        "",
        "| trace | JSON size | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    ratios: dict[str, list[float]] = {k: [] for k in labels}
    picked = _pick_traces(cfg)
    for path, size in picked:
        available = {k: fn for k, fn in approaches.items() if fn is not None}
        times = interleaved({k: partial(fn, path) for k, fn in available.items()}, repeats)
        floor = statistics.median(times["json.load"])
        cells = []
        for label in labels:
            if label not in times:
                cells.append("not installed")
                continue
            med = statistics.median(times[label])
            ratios[label].append(med / floor)
            cells.append(f"{fmt_s(med)} ({fmt_s(min(times[label]))}) {med / floor:.2f}x")
        name = path.relative_to(cfg.traces_dir) if path.is_relative_to(cfg.traces_dir) else path
        lines.append(f"| `{name}` | {size / 2**20:.1f} MB | " + " | ".join(cells) + " |")
    lines.append("")
    if picked and ratios["gpuprof_nb load_trace"]:

        def worst(label: str) -> str:
            return f"{max(ratios[label]):.2f}x" if ratios[label] else "not measured"

        lines.append(
            f"- Worst ratio to `json.load` over these traces: `load_trace` "
            f"{worst('gpuprof_nb load_trace')} (whole model built; without msgspec "
            f"{worst('load_trace without msgspec')}); parsing alone: orjson "
            f"{worst('orjson.loads')}, msgspec untyped {worst('msgspec untyped')}, msgspec "
            f"typed structs {worst('msgspec typed structs')}. The parsers that build a dict "
            "per event (json, orjson, untyped msgspec) are the ones to compare with the typed "
            "decode; the loader decodes batches of whole events into the typed structs and "
            "keeps the standard-library reader for what msgspec refuses (NaN, bad JSON) and "
            "for exact error messages."
        )
    return Section(title="JSON library choice", markdown="\n".join(lines))
