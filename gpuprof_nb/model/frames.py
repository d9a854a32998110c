"""How torch.profiler names a Python call: a `python_function` event's name is
`path/file.py(123): function` (the line where the function starts), a built-in call
`<built-in method ...>`. The capture reads it to cut its own calls out of a trace and to
rebuild CPU stacks; the analysis reads it to name lines (analysis/sources.py)."""

from __future__ import annotations

import re

_PROFILER_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")


def profiler_frame_parts(name: str) -> tuple[str, int, str] | None:
    """Return (file, line, function) of a python_function event name, or None for a
    built-in call (`<built-in method ...>`)."""
    m = _PROFILER_FRAME.match(name)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def profiler_frame_file(name: str) -> str | None:
    """Return the file of a python_function event name, or None for a built-in call."""
    parts = profiler_frame_parts(name)
    return parts[0] if parts else None
