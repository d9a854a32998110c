"""The step record (model/step.py) as it is kept in a snapshot dict: under gpuprof_nb's own
top-level key, `{"gpuprof_nb": {"step": {...}}}`, which PyTorch's memory_viz ignores. Plain
lists and numbers only, so a pickle of it loads through the restricted unpickler."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof_nb.errors import SnapshotFormatError
from gpuprof_nb.model.step import TAG_CATEGORIES, ModuleCall, RootModule, StepRecord, Tag

STEP_KEY = "step"


def _int(value: Any, what: str, where: str) -> int:
    if type(value) is not int and not (isinstance(value, float) and value.is_integer()):
        raise SnapshotFormatError(f"{where}: {what} is {value!r}, expected an integer")
    return int(value)


def _list(value: Any, what: str, where: str) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)):
        raise SnapshotFormatError(f"{where}: {what} is a {type(value).__name__}, expected a list")
    return value


def step_record_of(extra: Mapping[str, Any], where: str) -> StepRecord | None:
    """Return the step record kept under gpuprof_nb's key, None when there is none.
    Raises SnapshotFormatError naming the field when one is malformed."""
    raw = extra.get(STEP_KEY)
    if raw is None:
        return None
    here = f"{where}: gpuprof_nb.step"
    if not isinstance(raw, Mapping):
        raise SnapshotFormatError(f"{here} is a {type(raw).__name__}, expected a dict")
    roots = tuple(
        RootModule(str(r[0]), str(r[1]))
        for r in _list(raw.get("roots", []), "roots", here)
        if isinstance(r, (list, tuple)) and len(r) == 2
    )
    calls = []
    for i, c in enumerate(_list(raw.get("calls", []), "calls", here)):
        at = f"{here}.calls[{i}]"
        if not isinstance(c, (list, tuple)) or len(c) != 8:
            raise SnapshotFormatError(
                f"{at} is not [root, path, type, depth, enter, exit, us, outputs]"
            )
        root = _int(c[0], "root", at)
        if not 0 <= root < len(roots):
            raise SnapshotFormatError(f"{at}: root {root} is not one of the {len(roots)} roots")
        us = c[6]
        forward_us = float(us) if isinstance(us, (int, float)) and math.isfinite(us) else math.nan
        outputs = tuple(
            (_int(o[0], "output address", at), _int(o[1], "output size", at))
            for o in _list(c[7], "outputs", at)
        )
        calls.append(
            ModuleCall(
                root=root,
                path=str(c[1]),
                type_name=str(c[2]),
                depth=_int(c[3], "depth", at),
                enter=_int(c[4], "enter", at),
                exit=_int(c[5], "exit", at),
                forward_us=forward_us,
                outputs=outputs,
            )
        )
    tags = []
    for i, t in enumerate(_list(raw.get("tags", []), "tags", here)):
        at = f"{here}.tags[{i}]"
        if not isinstance(t, (list, tuple)) or len(t) != 4 or t[2] not in TAG_CATEGORIES:
            raise SnapshotFormatError(
                f"{at} is not [address, size, category, position] with a category of "
                f"{', '.join(TAG_CATEGORIES)}"
            )
        tags.append(
            Tag(_int(t[0], "address", at), _int(t[1], "size", at), t[2], _int(t[3], "position", at))
        )
    steps = tuple(
        (_int(s[0], "optimizer step start", here), _int(s[1], "optimizer step end", here))
        for s in _list(raw.get("optimizer_steps", []), "optimizer_steps", here)
    )
    batch = raw.get("batch_size")
    return StepRecord(
        roots=roots,
        calls=tuple(calls),
        backward=tuple(
            _int(b, "backward", here) for b in _list(raw.get("backward", []), "backward", here)
        ),
        optimizer_steps=steps,
        tags=tuple(tags),
        allocations=_int(raw.get("allocations", 0), "allocations", here),
        device=str(raw.get("device", "cpu")),
        batch_size=None if batch is None else _int(batch, "batch_size", here),
        batch_variable=str(raw.get("batch_variable", "")),
    )


def step_record_to_dict(record: StepRecord) -> dict[str, Any]:
    """Return the record as the plain dict `step_record_of` reads."""
    return {
        "roots": [[r.name, r.type_name] for r in record.roots],
        "calls": [
            [
                c.root,
                c.path,
                c.type_name,
                c.depth,
                c.enter,
                c.exit,
                None if math.isnan(c.forward_us) else c.forward_us,
                [list(o) for o in c.outputs],
            ]
            for c in record.calls
        ],
        "backward": list(record.backward),
        "optimizer_steps": [list(s) for s in record.optimizer_steps],
        "tags": [[t.address, t.size, t.category, t.at] for t in record.tags],
        "allocations": record.allocations,
        "device": record.device,
        "batch_size": record.batch_size,
        "batch_variable": record.batch_variable,
    }
