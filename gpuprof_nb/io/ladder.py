"""The ladder report's file: JSON tagged `gpuprof_nb.ladder/1` holding every step time, so
numbers are recomputed, not copied, on load. Reading and writing the file and checking its
tag live here; the report's fields are built in results/ladder.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import GpuprofError

FORMAT = "gpuprof_nb.ladder/1"


def check_format(data: Any, where: str) -> None:
    """Raise GpuprofError unless `data` is a dict tagged with this file format."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
        raise GpuprofError(
            f"{where}: not a gpuprof_nb ladder report (format {found!r}, expected {FORMAT!r}); "
            "save one with LadderReport.save(path)"
        )


def write_ladder_json(data: Mapping[str, Any], path: str | Path) -> Path:
    """Write a ladder report's data (LadderReport.to_dict) as JSON; return the path."""
    target = Path(path)
    target.write_text(json.dumps(data, indent=1, allow_nan=True))
    return target


def read_ladder_json(path: str | Path) -> dict[str, Any]:
    """Return the data of a ladder report file, its format tag checked."""
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise GpuprofError(f"{source}: cannot read the ladder report ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuprofError(
            f"{source}: not JSON ({exc.msg} at line {exc.lineno}); expected a file written by "
            "LadderReport.save"
        ) from None
    check_format(data, str(source))
    return dict(data)
