"""Hostile step records: the `gpuprof_nb.step` entry %%memsnap keeps in a snapshot (the
modules' calls, backward, optimizer steps, tags and the batch size will-it-fit reads), edited
field by field: wrong types, lists where a string belongs (nested deeper than repr can go),
negative sizes and positions, calls that return before they begin, batch sizes of 0 and
10**18, and one call repeated two million times by reference in a 10 MB pickle. Each must be
SnapshotFormatError naming the field, within the harness's limits (harness.py): the bomb must
be refused before it is built, so the child runs with 500 MB to spare."""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path
from typing import Any

from harness import Case

FIT = Path(__file__).parents[1] / "data" / "fit" / "tiny_b8.pickle"
PRELUDE = "from gpuprof_nb import load_snapshot, analyze_memory\n"


def _deep(depth: int) -> list[Any]:
    top: list[Any] = []
    here = top
    for _ in range(depth):
        inner: list[Any] = []
        here.append(inner)
        here = inner
    return top


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.pickle"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)  # pickling a list nested 5,000 deep
    try:
        path.write_bytes(pickle.dumps(data, protocol=4))
    finally:
        sys.setrecursionlimit(limit)
    return str(path)


def test_step_records_are_read_strictly(hostile, tmp_path: Path) -> None:
    base = pickle.loads(FIT.read_bytes())
    step = base["gpuprof_nb"]["step"]
    call = step["calls"][1]
    tag = step["tags"][0]

    def edited(**fields: Any) -> dict[str, Any]:
        data = copy.deepcopy(base)
        data["gpuprof_nb"]["step"].update(fields)
        return data

    def with_call(index: int, value: Any) -> dict[str, Any]:
        changed = list(call)
        changed[index] = value
        return edited(calls=[step["calls"][0], changed, *step["calls"][2:]])

    deep = _deep(5_000)
    refused = {
        "root-name-deep": edited(roots=[[deep, "Tiny"]]),
        "root-number": edited(roots=[5]),
        "call-path-deep": with_call(1, deep),
        "call-path-number": with_call(1, 5),
        "call-type-none": with_call(2, None),
        "call-depth-negative": with_call(3, -5),
        "call-root-absent": with_call(0, 7),
        "call-enter-after-exit": with_call(4, 10**6),
        "call-enter-below-minus-one": with_call(4, -10),
        "call-forward-negative": with_call(6, -5.0),
        "call-forward-inf": with_call(6, float("inf")),
        "call-forward-text": with_call(6, "5"),
        "call-outputs-numbers": with_call(7, [1, 2]),
        "call-outputs-short": with_call(7, [[1]]),
        "call-output-size-negative": with_call(7, [[4096, -16384]]),
        "call-short": edited(calls=[call[:5]]),
        "optimizer-numbers": edited(optimizer_steps=[1, 2]),
        "optimizer-short": edited(optimizer_steps=[[1]]),
        "optimizer-reversed": edited(optimizer_steps=[[396, 126]]),
        "backward-negative": edited(backward=[-4]),
        "backward-text": edited(backward=["4"]),
        "tag-category-list": edited(tags=[[1, 2, [1], 3]]),
        "tag-size-negative": edited(tags=[[tag[0], -tag[1], tag[2], tag[3]]]),
        "tag-position-negative": edited(tags=[[tag[0], tag[1], tag[2], -7]]),
        "tag-address-nan": edited(tags=[[float("nan"), tag[1], tag[2], tag[3]]]),
        "batch-zero": edited(batch_size=0),
        "batch-negative": edited(batch_size=-8),
        "batch-huge": edited(batch_size=10**18),
        "batch-bool": edited(batch_size=True),
        "batch-text": edited(batch_size="8"),
        "allocations-negative": edited(allocations=-1),
        "device-deep": edited(device=deep),
        "variable-deep": edited(batch_variable=deep),
        "step-list": {**copy.deepcopy(base), "gpuprof_nb": {"step": [1, 2]}},
        "calls-dict": edited(calls={"a": 1}),
        # One call, one tag, one output repeated by reference: ~5 bytes of pickle each.
        "calls-repeated": edited(calls=[call] * 2_000_000),
        "tags-repeated": edited(tags=[tag] * 2_000_000),
        "outputs-repeated": with_call(7, [[4096, 16384]] * 2_000_000),
    }
    cases = [
        Case(
            name,
            f"result = analyze_memory(load_snapshot({_write(tmp_path, name, data)!r}))",
            "refuse",
            words="gpuprof_nb.step" if "repeated" not in name else "more than",
        )
        for name, data in refused.items()
    ]
    cases.append(
        Case(
            "as-recorded",
            f"result = analyze_memory(load_snapshot({str(FIT)!r}))",
            "accept",
            check="result.fit is not None and result.snapshot.step.batch_size == 8",
        )
    )
    cases.append(
        Case(
            "integral-float-position",
            f"result = load_snapshot({_write(tmp_path, 'float', with_call(5, 40.0))!r})",
            "accept",
            check="result.step.calls[1].exit == 40",
        )
    )
    hostile(cases, prelude=PRELUDE, memory_mb=500)
