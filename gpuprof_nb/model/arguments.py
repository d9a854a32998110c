"""What the public functions accept: checks of argument types and ranges shared by every
front door (`analyze`, `analyze_memory`, `compare`, `analyze_run`, the ladder, ...), so a
wrong argument is a GpuprofError naming the argument, what it got and what it takes, never
a TypeError from deep inside, nor a value quietly coerced (a NaN threshold, a float count).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuprof_nb.errors import GpuprofError


def describe(value: Any, width: int = 60) -> str:
    """Return a short description of any value for a message: the repr of a small scalar,
    else its type and size. Never raises (the repr of a value nested a million deep, or of an
    int of 10,000 digits, does) and never returns more than about `width` characters."""
    kind = type(value).__name__
    try:
        if value is None or isinstance(value, (bool, float)):
            return repr(value)
        if isinstance(value, int):
            if value.bit_length() > 200:
                return f"an integer of {value.bit_length():,} bits"
            return repr(value)
        if isinstance(value, (str, bytes)):
            text = repr(value[:width])
            return text if len(value) <= width else f"{text[:-1]}… ({len(value):,} characters)"
        if isinstance(value, (list, tuple, dict, set, frozenset, Mapping)):
            return f"a {kind} of {len(value):,} items"
    except Exception:  # noqa: BLE001 - a description must never fail
        pass
    return f"a {kind}"


def check_number(
    value: Any,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    integer: bool = False,
    above: bool = False,
    hint: str = "",
) -> Any:
    """Return `value` when it is a real number (an int with `integer`; never a bool or a
    NaN) within [low, high] (above `low` with `above`); raise GpuprofError naming `name`
    otherwise. `hint` ends the message (what to pass)."""
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise GpuprofError(f"{name} must be {kind}, got {describe(value)}{_end(hint)}")
    if not integer and not math.isfinite(value):
        raise GpuprofError(f"{name} must be a finite number, got {describe(value)}{_end(hint)}")
    if low is not None and (value <= low if above else value < low):
        bound = f"above {low:g}" if above else f"{low:g} or more"
        raise GpuprofError(f"{name} must be {bound}, got {describe(value)}{_end(hint)}")
    if high is not None and value > high:
        raise GpuprofError(f"{name} must be at most {high:g}, got {describe(value)}{_end(hint)}")
    return value


def check_type(value: Any, types: Any, name: str, hint: str) -> None:
    """Raise GpuprofError unless `value` is an instance of `types`."""
    if not isinstance(value, types):
        raise GpuprofError(f"{name} must be {hint}, got {describe(value)}")


def _end(hint: str) -> str:
    return f"; {hint}" if hint else ""
