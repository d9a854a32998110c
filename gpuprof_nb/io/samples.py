"""The line sampler's stacks kept with a trace gpuprof_nb recorded, under its own top-level
key: `{"gpuprof_nb": {"samples": {...}}}` (capture/sampling.py writes the entry). Read into
model.samples.StackSamples; a malformed entry is a TraceFormatError naming the field."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.cells import KEY
from gpuprof_nb.model.frames import Frame
from gpuprof_nb.model.samples import StackSamples

WHERE = f"{KEY}.samples"


def samples_of(top: Mapping[str, Any], source: str = "trace") -> StackSamples | None:
    """Return the samples stored in a trace's top-level dict, None when there are none."""
    own = top.get(KEY)
    entry = own.get("samples") if isinstance(own, Mapping) else None
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        _bad(source, "", f"is a {type(entry).__name__}, not an object")
    frames = tuple(_frame(source, i, f) for i, f in enumerate(_list(source, entry, "frames")))
    stacks = []
    for k, stack in enumerate(_list(source, entry, "stacks")):
        if (
            not isinstance(stack, Sequence)
            or isinstance(stack, str)
            or not all(type(i) is int and 0 <= i < len(frames) for i in stack)
        ):
            _bad(source, f".stacks[{k}]", f"must list frame indices below {len(frames)}")
        stacks.append(tuple(stack))
    ts = _list(source, entry, "ts_us")
    of = _list(source, entry, "stack_of")
    if len(ts) != len(of):
        _bad(source, ".stack_of", f"has {len(of)} entries for {len(ts)} times")
    if not all(_number(t) for t in ts):
        _bad(source, ".ts_us", "must hold finite numbers")
    if not all(type(s) is int and 0 <= s < len(stacks) for s in of):
        _bad(source, ".stack_of", f"must hold stack indices below {len(stacks)}")
    times = tuple(float(t) for t in ts)
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        _bad(source, ".ts_us", "must not decrease")
    numbers: dict[str, float] = {}
    for name in ("period_us", "start_us", "end_us"):
        value = entry.get(name)
        if not _number(value):
            _bad(source, f".{name}", f"must be a finite number, got {value!r}")
        numbers[name] = float(value)  # type: ignore[arg-type]
    late = entry.get("late", 0)
    mode = entry.get("mode", "thread")
    if mode not in ("signal", "thread", "exact"):
        _bad(source, ".mode", f"must be 'signal', 'thread' or 'exact', got {mode!r}")
    engine = entry.get("engine", "")
    events = entry.get("events", 0)
    shared = entry.get("shared_us", 0.0)
    if not _number(shared) or not 0 <= shared <= max(numbers["end_us"] - numbers["start_us"], 0):
        _bad(source, ".shared_us", f"must be a time within the sampled span, got {shared!r}")
    lost = _lost(source, entry.get("lost_us", []), times, numbers["end_us"])
    return StackSamples(
        frames=frames,
        stacks=tuple(stacks),
        ts_us=times,
        stack_of=tuple(of),
        period_us=numbers["period_us"],
        start_us=numbers["start_us"],
        end_us=numbers["end_us"],
        late=late if type(late) is int else 0,
        mode=mode,
        engine=engine if engine in ("monitoring", "settrace") else "",
        events=events if type(events) is int and events >= 0 else 0,
        shared_us=float(shared),
        lost_us=lost,
    )


def _lost(source: str, raw: Any, times: tuple[float, ...], end: float) -> tuple[float, ...]:
    """[[stretch index, us], ...] -> one value per stretch (empty when none), each within
    its stretch."""
    if not isinstance(raw, list):
        _bad(source, ".lost_us", f"must be a list of [index, us] pairs, got {type(raw).__name__}")
    if not raw:
        return ()
    out = [0.0] * len(times)
    bounds = (*times, max(end, times[-1] if times else end))
    for k, pair in enumerate(raw):
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and type(pair[0]) is int
            and 0 <= pair[0] < len(times)
            and _number(pair[1])
            and 0 <= pair[1] <= bounds[pair[0] + 1] - bounds[pair[0]] + 1e-3
        ):
            _bad(source, f".lost_us[{k}]", "must be [stretch index, us within that stretch]")
        out[pair[0]] += float(pair[1])
    return tuple(out)


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _list(source: str, entry: Mapping[str, Any], name: str) -> Sequence[Any]:
    value = entry.get(name)
    if not isinstance(value, list):
        _bad(source, f".{name}", f"must be a list, got {type(value).__name__}")
    return value


def _frame(source: str, i: int, raw: Any) -> Frame:
    if not (
        isinstance(raw, list)
        and len(raw) == 4
        and isinstance(raw[0], str)
        and type(raw[1]) is int
        and isinstance(raw[2], str)
        and isinstance(raw[3], str)
    ):
        _bad(source, f".frames[{i}]", f"must be [file, line, function, text], got {raw!r:.80}")
    return Frame(raw[0], raw[1], raw[2], raw[3])


def _bad(source: str, where: str, what: str) -> NoReturn:
    raise TraceFormatError(f"{source}: {WHERE}{where} {what}")
