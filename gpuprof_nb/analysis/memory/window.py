"""The --window option's text: 'START:END' in the timeline's unit."""

from __future__ import annotations

import math


def parse_window(text: str) -> tuple[float | None, float | None]:
    """Return (start, end) from 'START:END' (either side may be empty). Raises ValueError."""
    if ":" not in text:
        raise ValueError(f"window {text!r} is not START:END (e.g. 120:480, :300, 50:)")
    a, b = text.split(":", 1)
    try:
        start = float(a) if a.strip() else None
        end = float(b) if b.strip() else None
    except ValueError:
        raise ValueError(
            f"window {text!r}: START and END must be numbers "
            "(ms, or history entries when the snapshot has no times)"
        ) from None
    for v in (start, end):
        if v is not None and not math.isfinite(v):
            raise ValueError(f"window {text!r}: bounds must be finite numbers")
    if start is not None and end is not None and end < start:
        raise ValueError(f"window {text!r}: END is before START")
    return start, end
