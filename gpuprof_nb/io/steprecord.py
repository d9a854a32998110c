"""The step record (model/step.py) as it is kept in a snapshot dict: under gpuprof_nb's own
top-level key, `{"gpuprof_nb": {"step": {...}}}`, which PyTorch's memory_viz ignores. Plain
lists and numbers only, so a pickle of it loads through the restricted unpickler."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof_nb.errors import SnapshotFormatError
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.model.step import (
    MAX_BATCH_SIZE,
    TAG_CATEGORIES,
    ModuleCall,
    RootModule,
    StepRecord,
    Tag,
)

STEP_KEY = "step"


# Positions are allocation counts (-1: the event did not happen); addresses and sizes are
# bytes. Nothing real reaches 2**63 (torch's own counters are 64-bit).
_MAX_INT = 2**63


def _int(value: Any, what: str, where: str, low: int = 0, high: int = _MAX_INT) -> int:
    """Return `value` as an int within [low, high] (a float with an integral value is one:
    the format allows it); SnapshotFormatError naming the field otherwise (a bool, a
    string, NaN, out of range)."""
    if type(value) is not int and not (
        type(value) is float and math.isfinite(value) and value.is_integer()
    ):
        raise SnapshotFormatError(f"{where}: {what} is {describe(value)}, expected an integer")
    number = int(value)
    if not low <= number < high:
        bound = f"{low} or more" if high == _MAX_INT else f"{low} to {high - 1:,}"
        raise SnapshotFormatError(
            f"{where}: {what} is {describe(number)}, expected {bound}"
            f"{' (-1: it did not happen)' if low == -1 else ''}"
        )
    return number


def _list(value: Any, what: str, where: str) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)):
        raise SnapshotFormatError(f"{where}: {what} is {describe(value)}, expected a list")
    return value


def _pair(value: Any, what: str, where: str) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise SnapshotFormatError(f"{where}: {what} is {describe(value)}, expected [a, b]")
    return value


def _text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise SnapshotFormatError(f"{where}: {what} is {describe(value)}, expected a string")
    return value


def _forward_us(value: Any, at: str) -> float:
    """A call's wall time: microseconds >= 0, or None (unknown: NaN)."""
    if value is None:
        return math.nan
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise SnapshotFormatError(
            f"{at}: the forward time is {describe(value)}, expected microseconds >= 0 or None"
        )
    return float(value)


def _call(c: Any, n_roots: int, at: str) -> ModuleCall:
    if not isinstance(c, (list, tuple)) or len(c) != 8:
        raise SnapshotFormatError(
            f"{at} is not [root, path, type, depth, enter, exit, us, outputs]"
        )
    root = _int(c[0], "root", at)
    if root >= n_roots:
        raise SnapshotFormatError(f"{at}: root {root} is not one of the {n_roots} roots")
    enter = _int(c[4], "enter", at, low=-1)
    leave = _int(c[5], "exit", at, low=-1)
    if leave != -1 and leave < enter:
        raise SnapshotFormatError(
            f"{at}: the call returns (position {leave}) before it began ({enter})"
        )
    outputs = []
    for j, o in enumerate(_list(c[7], "outputs", at)):
        pair = _pair(o, f"output {j}", at)
        outputs.append((_int(pair[0], "output address", at), _int(pair[1], "output size", at)))
    return ModuleCall(
        root=root,
        path=_text(c[1], "path", at),
        type_name=_text(c[2], "type", at),
        depth=_int(c[3], "depth", at),
        enter=enter,
        exit=leave,
        forward_us=_forward_us(c[6], at),
        outputs=tuple(outputs),
    )


def step_record_of(extra: Mapping[str, Any], where: str) -> StepRecord | None:
    """Return the step record kept under gpuprof_nb's key, None when there is none.
    Raises SnapshotFormatError naming the field when one is malformed: a wrong type, a
    negative size or position, a call that returns before it begins, a batch size of 0."""
    raw = extra.get(STEP_KEY)
    if raw is None:
        return None
    here = f"{where}: gpuprof_nb.step"
    if not isinstance(raw, Mapping):
        raise SnapshotFormatError(f"{here} is {describe(raw)}, expected a dict")
    roots = []
    for i, r in enumerate(_list(raw.get("roots", []), "roots", here)):
        pair = _pair(r, f"roots[{i}]", here)
        roots.append(
            RootModule(
                _text(pair[0], f"roots[{i}] name", here), _text(pair[1], f"roots[{i}] type", here)
            )
        )
    calls = [
        _call(c, len(roots), f"{here}.calls[{i}]")
        for i, c in enumerate(_list(raw.get("calls", []), "calls", here))
    ]
    tags = []
    for i, t in enumerate(_list(raw.get("tags", []), "tags", here)):
        at = f"{here}.tags[{i}]"
        if (
            not isinstance(t, (list, tuple))
            or len(t) != 4
            or not isinstance(t[2], str)
            or t[2] not in TAG_CATEGORIES
        ):
            raise SnapshotFormatError(
                f"{at} is not [address, size, category, position] with a category of "
                f"{', '.join(TAG_CATEGORIES)}"
            )
        tags.append(
            Tag(
                _int(t[0], "address", at),
                _int(t[1], "size", at),
                t[2],
                _int(t[3], "position", at, low=-1),
            )
        )
    steps = []
    for i, s in enumerate(_list(raw.get("optimizer_steps", []), "optimizer_steps", here)):
        pair = _pair(s, f"optimizer_steps[{i}]", here)
        start = _int(pair[0], "optimizer step start", here, low=-1)
        end = _int(pair[1], "optimizer step end", here, low=-1)
        if end != -1 and end < start:
            raise SnapshotFormatError(
                f"{here}: optimizer_steps[{i}] ends (position {end}) before it starts ({start})"
            )
        steps.append((start, end))
    batch = raw.get("batch_size")
    return StepRecord(
        roots=tuple(roots),
        calls=tuple(calls),
        backward=tuple(
            _int(b, "backward", here, low=-1)
            for b in _list(raw.get("backward", []), "backward", here)
        ),
        optimizer_steps=tuple(steps),
        tags=tuple(tags),
        allocations=_int(raw.get("allocations", 0), "allocations", here),
        device=_text(raw.get("device", "cpu"), "device", here),
        batch_size=(
            None
            if batch is None
            else _int(batch, "batch_size", here, low=1, high=MAX_BATCH_SIZE + 1)
        ),
        batch_variable=_text(raw.get("batch_variable", ""), "batch_variable", here),
    )


def step_record_items(extra: Mapping[str, Any]) -> int:
    """Return how many values the step record under gpuprof_nb's key unpickles into (its
    calls' fields and outputs, its tags' fields, its marks), counting list lengths only, for
    the snapshot's expansion check: a small pickle can repeat one call a million times by
    reference."""
    raw = extra.get(STEP_KEY)
    if not isinstance(raw, Mapping):
        return 0

    def length(value: Any) -> int:
        return len(value) if isinstance(value, (list, tuple)) else 0

    total = 0
    for key in ("roots", "backward", "optimizer_steps", "tags"):
        items = raw.get(key)
        if isinstance(items, (list, tuple)):
            total += len(items) + sum(length(x) for x in items)
    calls = raw.get("calls")
    if isinstance(calls, (list, tuple)):
        for c in calls:
            total += 1 + length(c)
            if length(c) == 8:
                total += length(c[7]) * 3
    return total


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
