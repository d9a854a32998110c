"""How a byte count is written, the one implementation every layer uses (render's tables,
the results' notes, the CLI): binary prefixes, three significant digits."""

from __future__ import annotations

__all__ = ["fmt_bytes"]


def fmt_bytes(n: float | None) -> str:
    """Format a byte count with binary prefixes: '512 B', '1.5 KiB', '3.00 GiB'."""
    if n is None:
        return "n/a"
    a = abs(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if a >= scale:
            return f"{n / scale:.3g} {unit}" if a < 1000 * scale else f"{n / scale:.0f} {unit}"
    return f"{int(n)} B"
