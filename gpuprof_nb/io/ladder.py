"""The ladder report's file: JSON tagged `gpuprof_nb.ladder/1` holding every step time, so
numbers are recomputed, not copied, on load. Reading and writing the file and checking its
tag live here; the report's fields are built in results/ladder.py."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.guards import loads_json, open_for_writing, open_regular
from gpuprof_nb.model.arguments import describe

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
    """Write a ladder report's data (LadderReport.to_dict) as JSON; return the path. A path
    that is not a regular file (a FIFO, a directory) is refused before opening."""
    target = Path(path)
    text = json.dumps(data, indent=1, allow_nan=True)
    with open_for_writing(target, what="the ladder report", error=GpuprofError) as f:
        f.write(text.encode("utf-8", "surrogatepass"))
    return target


# Far more than a ladder report holds (a few kB per rung).
MAX_FILE_BYTES = 64 << 20


def read_ladder_json(path: str | Path) -> dict[str, Any]:
    """Return the data of a ladder report file, its format tag checked. Anything that is not
    a regular file of UTF-8 JSON (a FIFO, a binary or gzip file, JSON nested deeper than the
    format is) is a GpuprofError naming the file."""
    if not isinstance(path, (str, os.PathLike)):
        raise GpuprofError(
            f"ladder.load expects the path of a saved ladder report, got {describe(path)}"
        )
    what = "a ladder report written by LadderReport.save(path)"
    f, st = open_regular(path, what=what, error=GpuprofError)
    source = os.fsdecode(os.fspath(path))
    with f:
        if st.st_size > MAX_FILE_BYTES:
            raise GpuprofError(
                f"{source}: {st.st_size:,} bytes, far more than a ladder report holds; pass {what}"
            )
        try:
            raw = f.read()
        except OSError as exc:
            raise GpuprofError(f"{source}: cannot read the ladder report ({exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        kind = "a gzip file" if raw[:2] == b"\x1f\x8b" else "binary, not UTF-8 text"
        raise GpuprofError(f"{source}: not a ladder report ({kind}); pass {what}") from None
    data = loads_json(text, source, GpuprofError)
    check_format(data, source)
    return dict(data)
