"""The notebook-cell names gpuprof_nb keeps with a trace or snapshot it recorded: under its
own top-level key, `{"gpuprof_nb": {"cells": {file name: execution number}}}`, which other
tools ignore. They let a report loaded later still say `In [12]` (analysis/sources.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KEY = "gpuprof_nb"


def cells_of(top: Mapping[str, Any]) -> dict[str, int]:
    """Return the {file name: execution number} map stored in a trace's or snapshot's
    top-level dict, keeping only well-formed entries (empty when there is none)."""
    own = top.get(KEY)
    cells = own.get("cells") if isinstance(own, Mapping) else None
    if not isinstance(cells, Mapping):
        return {}
    return {k: v for k, v in cells.items() if isinstance(k, str) and type(v) is int and v >= 0}
