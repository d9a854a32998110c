"""What no result may say, checked in one place: every share in 0..1, a breakdown that adds up
to its span, busy time within its window, no "N% of a step" above 100, a utilisation series
within the machine. The result dataclasses call `check_share` (and kin) where their numbers
are made, so an impossible number fails where it is built, with its name, instead of
reaching a report; `impossible(result)` walks a whole result for the tests that sweep every
real trace and snapshot."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

# Rounding slack: sums of float microseconds and ratios of them.
TOLERANCE = 1e-6
# Field names that hold a share (0..1) of something; `fraction_of_roof` and
# `fraction_of_bandwidth` are achieved / attainable, which a datasheet can understate: not
# shares.
_SHARE_NAME = re.compile(r"(?:^|_)(?:share|fraction)$|^busy_fraction$")
_NOT_SHARES = frozenset({"fraction_of_roof", "fraction_of_bandwidth"})
# "N% of a step", "N% of the step", "(N% of a step)".
_OF_A_STEP = re.compile(r"(\d+(?:\.\d+)?)% of (?:a|the|each) step")


class ImpossibleValue(ValueError):
    """A result was built with a number it cannot hold (a bug in the analysis, not in the
    input): named with the field and the value."""


# A share above 1 by no more than this is rounding (sums of many float microseconds): it is
# read as 1. More is a bug, and check_share says so.
ROUNDING = 1e-3


def rounded_share(value: float) -> float:
    """`value` with rounding at the ends of 0..1 taken off (what lies further out is kept,
    for check_share to refuse)."""
    if -ROUNDING <= value < 0:
        return 0.0
    if 1 < value <= 1 + ROUNDING:
        return 1.0
    return value


def check_share(owner: str, name: str, value: float | None) -> None:
    """Raise ImpossibleValue unless `value` (a share) is None or in 0..1."""
    if value is None:
        return
    if not (math.isfinite(value) and -TOLERANCE <= value <= 1 + TOLERANCE):
        raise ImpossibleValue(f"{owner}.{name} = {value!r}: a share must lie in 0..1")


def check_within(owner: str, name: str, part: float, whole: float, whole_name: str) -> None:
    """Raise ImpossibleValue unless 0 <= part <= whole (within rounding)."""
    slack = TOLERANCE * max(1.0, abs(whole))
    if not (math.isfinite(part) and -slack <= part <= whole + slack):
        raise ImpossibleValue(f"{owner}.{name} = {part!r} is outside 0..{whole_name} ({whole!r})")


def check_sum(owner: str, parts: Mapping[str, float], whole: float, whole_name: str) -> None:
    """Raise ImpossibleValue unless the parts (each >= 0) add up to `whole`."""
    slack = 1e-3 + TOLERANCE * abs(whole)
    for name, value in parts.items():
        if value < -slack:
            raise ImpossibleValue(f"{owner}.{name} = {value!r} is negative")
    total = sum(parts.values())
    if abs(total - whole) > slack:
        raise ImpossibleValue(
            f"{owner}: {' + '.join(parts)} = {total!r}, not {whole_name} ({whole!r})"
        )


def step_percents(text: str) -> list[float]:
    """The "N% of a step" figures a text states."""
    return [float(m.group(1)) for m in _OF_A_STEP.finditer(text)]


def impossible(result: Any, where: str = "") -> list[str]:
    """Return every impossible number found in `result` and what it holds (dataclasses,
    tuples, mappings), each as "path: what"; empty when all is well."""
    return list(_walk(result, where or type(result).__name__, set()))


def _walk(obj: Any, path: str, seen: set[int]) -> Iterator[str]:
    if id(obj) in seen:
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        seen.add(id(obj))
        yield from _own(obj, path)
        for f in dataclasses.fields(obj):
            yield from _walk(getattr(obj, f.name), f"{path}.{f.name}", seen)
    elif isinstance(obj, (tuple, list)):
        seen.add(id(obj))
        for i, item in enumerate(obj):
            yield from _walk(item, f"{path}[{i}]", seen)
    elif isinstance(obj, Mapping):
        seen.add(id(obj))
        for key, value in obj.items():
            if isinstance(key, str) and _SHARE_NAME.search(key) and key not in _NOT_SHARES:
                if isinstance(value, (int, float)) and not -TOLERANCE <= value <= 1 + TOLERANCE:
                    yield f"{path}[{key!r}] = {value!r}: a share outside 0..1"
            yield from _walk(value, f"{path}[{key!r}]", seen)


def _own(obj: Any, path: str) -> Iterator[str]:
    """The checks on one dataclass's own fields."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if (
            _SHARE_NAME.search(f.name)
            and f.name not in _NOT_SHARES
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not (math.isfinite(value) and -TOLERANCE <= value <= 1 + TOLERANCE)
        ):
            yield f"{path}.{f.name} = {value!r}: a share outside 0..1"
    names = {f.name for f in dataclasses.fields(obj)}
    for busy, window in (("busy_us", "window_us"), ("busy_us", "span_us")):
        if busy in names and window in names:
            b, w = getattr(obj, busy), getattr(obj, window)
            if isinstance(b, (int, float)) and isinstance(w, (int, float)):
                if b > w * (1 + TOLERANCE) + 1e-3 or b < -1e-3:
                    yield f"{path}: {busy} {b!r} outside 0..{window} {w!r}"
    if "title" in names and isinstance(obj.title, str):
        for pct in step_percents(obj.title):
            if pct > 100:
                yield f"{path}.title says {pct:g}% of a step: {obj.title[:120]!r}"
    if "verdict" in names and isinstance(obj.verdict, str):
        for pct in step_percents(obj.verdict):
            if pct > 100:
                yield f"{path}.verdict says {pct:g}% of a step"
    if hasattr(obj, "us_by_category") and "span_us" in names:
        parts = obj.us_by_category()
        total = sum(parts.values())
        if abs(total - obj.span_us) > 1e-3 + TOLERANCE * abs(obj.span_us):
            yield f"{path}: the categories add up to {total!r}, not span_us {obj.span_us!r}"
        for key, value in parts.items():
            if value < -1e-3:
                yield f"{path}: {key} is negative ({value!r})"
    if {"idle_us", "idle_charged_us", "lines"} <= names:  # Hotspots
        if obj.idle_charged_us > obj.idle_us * (1 + TOLERANCE) + 1e-3:
            yield f"{path}: idle_charged_us {obj.idle_charged_us!r} > idle_us {obj.idle_us!r}"
        host = sum(line.host_us for line in obj.lines)
        if host > obj.host_us * (1 + TOLERANCE) + 1e-3:
            yield f"{path}: its lines hold {host!r} us of host time, more than {obj.host_us!r}"
    if {"ts_us", "series", "period_ms"} <= names:  # Utilisation
        cores = [s for s in obj.series if re.fullmatch(r"cpu\d+", s.name)]
        for s in obj.series:
            top = max(s.values, default=0.0)
            if s.unit == "%" and top > 100 + 1e-6:
                yield f"{path}: {s.name} reaches {top!r}%"
            if s.unit == "cores" and cores and top > len(cores) + 1e-6:
                yield f"{path}: {s.name} reaches {top!r} cores on a {len(cores)}-core machine"
    if {"sample_x", "site_bytes", "peak_bytes", "peak_index", "first_index"} <= names:
        yield from _memory_area(obj, path)


def _memory_area(tl: Any, path: str) -> Iterator[str]:
    """A memory timeline's drawn area (each column's level held until the next sample)
    reaches its peak: some column of positive width stacks up to peak_bytes."""
    x = [float(v) for v in tl.sample_x]
    if tl.peak_index < tl.first_index or len(x) < 2:
        return
    rows = [list(map(float, r)) for r in tl.site_bytes]
    totals = [float(sum(col)) for col in zip(*rows, strict=True)] if rows else [0.0] * len(x)
    widest = max(
        (totals[j] for j in range(len(x) - 1) if x[j + 1] > x[j]),
        default=0.0,
    )
    if abs(widest - float(tl.peak_bytes)) > 0.5:
        yield f"{path}: the area reaches {widest:.0f} bytes, the peak is {tl.peak_bytes}"
