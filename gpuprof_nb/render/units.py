"""Number formatting shared by the text and HTML renderings, so both show the same digits."""

from __future__ import annotations

import math

from gpuprof_nb.model.units import fmt_bytes

__all__ = ["fmt_bytes", "fmt_num", "fmt_pct", "fmt_rate", "fmt_us"]


def fmt_us(us: float | None) -> str:
    """Format a duration given in microseconds: '812 us', '3.41 ms', '2.07 s'."""
    # `us != us` only for NaN: the isinstance test then runs for NaN alone (tables format
    # thousands of durations).
    if us is None or (us != us and isinstance(us, float)):
        return "n/a"
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:.3g} s" if a < 1e7 else f"{us / 1e6:.1f} s"
    if a >= 1e3:
        return f"{us / 1e3:.3g} ms" if a < 1e5 else f"{us / 1e3:.0f} ms"
    if a >= 1:
        return f"{us:.3g} us"
    if a == 0:
        return "0 us"
    return f"{us * 1e3:.3g} ns"


def fmt_pct(fraction: float | None) -> str:
    """Format a fraction (0.25) as a percentage ('25.0%')."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return "n/a"
    return f"{fraction * 100:.1f}%"


def fmt_num(x: float | None, digits: int = 3) -> str:
    """Format a plain number with `digits` significant digits; integers stay whole."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15):
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def fmt_rate(per_s: float | None, unit: str) -> str:
    """Format a rate with SI prefixes: fmt_rate(3.2e12, 'FLOP/s') -> '3.2 TFLOP/s'."""
    if per_s is None or (isinstance(per_s, float) and math.isnan(per_s)):
        return "n/a"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(per_s) >= scale:
            return f"{per_s / scale:.3g} {prefix}{unit}"
    return f"{per_s:.3g} {unit}"
