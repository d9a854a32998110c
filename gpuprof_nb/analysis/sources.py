"""Names of source lines as users wrote them: `In [12], line 4` for a notebook cell,
`train.py:123 step` for a file.

Jupyter runs each cell from a file named by a hash (ipykernel: `/tmp/ipykernel_<pid>/
117277944.py`; IPython: `<ipython-input-12-0a1b2c>`), which means nothing to the person who
wrote the cell. The magics record which execution number each such file holds (the shell's
compiler keeps that map) and hand it to the analyses as `cells`: {file name: number}.

Frames rebuilt from torch.profiler events (the CPU memory fallback, `python_function`
events) carry the line where a function starts, not the line running inside it: a function
is named with the line it is defined at, a cell's own top-level code with "line unknown"
and the reason (FUNCTIONS_ONLY).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from gpuprof_nb.model.frames import (
    IPYTHON_INPUT,
    KNOWN_PACKAGES,
    FrameKind,
    frame_kind,
    is_cell_file,
    profiler_frame_file,
    profiler_frame_parts,
)

__all__ = [
    "KNOWN_PACKAGES",
    "FrameKind",
    "cell_number",
    "frame_kind",
    "is_cell_file",
    "profiler_frame_file",
    "profiler_frame_label",
    "profiler_frame_parts",
    "source_label",
]

MODULE = "<module>"
# Why a frame rebuilt from profiler events has no line: said in its label.
FUNCTIONS_ONLY = "profiler events name functions only"


def cell_number(filename: str, cells: Mapping[str, int]) -> int | None:
    """Return the execution number of the notebook cell run from `filename`, or None."""
    number = cells.get(filename)
    if number is not None:
        return number
    m = IPYTHON_INPUT.match(filename)
    return int(m.group(1)) if m else None


# Cached: one file name is shared by every frame of that file, and a label is asked for
# per frame (a name of megabytes in a crafted file would otherwise be scanned that often).
@functools.lru_cache(maxsize=4096)
def _short(filename: str) -> str:
    return _part(filename.replace("\\", "/").rsplit("/", 1)[-1])


# A label names a place for people: a file or function name longer than this (only a
# damaged or crafted file holds one) is cut in the label, never in the frame it names.
LABEL_PART_CHARS = 300


def _part(name: str) -> str:
    if len(name) <= LABEL_PART_CHARS:
        return name
    return f"{name[:LABEL_PART_CHARS]}… [{len(name) - LABEL_PART_CHARS:,} more characters]"


def source_label(
    filename: str, line: int, function: str, cells: Mapping[str, int], *, first_line: bool = False
) -> str:
    """Return how users name this frame: `In [12], line 4` (`..., line 4 in step` inside a
    function the cell defined), a cell whose number is not known by its file
    (`cell 117277944.py, line 4`), else `train.py:123 step`. `first_line`: the frame comes
    from profiler events, whose line is where its function starts (see the module): it is
    named `..., step (defined at line 120)`."""
    function = _part(function)
    number = cell_number(filename, cells)
    if number is not None:
        where = f"In [{number}]"
    elif is_cell_file(filename):
        where = f"cell {_short(filename)}"
    else:
        where = ""
    if where:
        if first_line:
            if function == MODULE or line <= 0:
                inside = "" if function == MODULE else f" in {function}"
                return f"{where}, line unknown{inside} ({FUNCTIONS_ONLY})"
            return f"{where}, {function} (defined at line {line})"
        inside = "" if function == MODULE else f" in {function}"
        return f"{where}, line {line}{inside}" if line > 0 else f"{where}, line unknown{inside}"
    if first_line and function == MODULE:
        return f"{_short(filename)} (line unknown: {FUNCTIONS_ONLY}) {function}"
    if line <= 0:
        return f"{_short(filename)} (line unknown) {function}"
    if first_line:
        return f"{_short(filename)}, {function} (defined at line {line})"
    return f"{_short(filename)}:{line} {function}"


def profiler_frame_label(name: str, cells: Mapping[str, int]) -> str:
    """Return the user's name for a torch.profiler python_function event name
    (`path(line): function`); other names (built-in calls) come back unchanged."""
    parts = profiler_frame_parts(name)
    if parts is None:
        return name
    return source_label(*parts, cells, first_line=True)
