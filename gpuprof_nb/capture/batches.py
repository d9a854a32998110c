"""What `%%memsnap --fit` needs from torch: the cell recorded at two batch sizes, the memory
the device (or the machine) has, and a checkpointing plan applied for one more run and
taken off again.

The batch size reaches the cell through a variable of the user's namespace: the cell must
read it (`x = torch.randn(batch_size, 512)`) and must not assign it, or the value set here
would be overwritten; `check_batch_variable` says so before anything runs. The variable is
put back afterwards, also when the cell raises.
"""

from __future__ import annotations

import ast
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpuprof_nb.capture.memory import MemoryCapture, record_memory
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.model.step import MAX_BATCH_SIZE


def check_batch_variable(source: str, name: str, namespace: dict[str, Any]) -> int:
    """Return the variable's value; raise ValueError saying what to change when it is not a
    positive int in the namespace, or the cell does not read it, or assigns it."""
    if not name.isidentifier():
        raise ValueError(f"{name!r} is not a variable name")
    if name not in namespace:
        raise ValueError(
            f"{name!r} is not defined: set it in an earlier cell (e.g. {name} = 64) and "
            "build the batch from it in this one"
        )
    value = namespace[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:
        raise ValueError(
            f"{name} is {describe(value)}; it must be a whole number >= 1 (at most "
            f"{MAX_BATCH_SIZE:,})"
        )
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return value  # the magic reports the syntax error itself when it compiles
    reads = stores = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name:
            if isinstance(node.ctx, ast.Load):
                reads = True
            else:
                stores = True
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            stores = True
    if stores:
        raise ValueError(
            f"the cell assigns {name}, so the sizes set for the fit would be overwritten: "
            f"move `{name} = ...` to an earlier cell"
        )
    if not reads:
        raise ValueError(
            f"the cell does not read {name}: build the batch from it in the cell (e.g. "
            f"x = torch.randn({name}, 512)), or the two runs would be the same"
        )
    return value


def other_batch_size(batch_size: int) -> int:
    """Return the second size to record: half (it fits if the first did), or 2 from 1."""
    return batch_size // 2 if batch_size >= 2 else 2


@dataclass(frozen=True, slots=True)
class BatchRuns:
    """The cell recorded at `other_batch_size`, then at `batch_size` (the report's own
    run), after one unrecorded warm-up run at `other_batch_size`."""

    main: MemoryCapture
    other: MemoryCapture
    batch_size: int
    other_batch_size: int
    variable: str


def record_batch_sizes(
    run: Callable[[], object],
    namespace: dict[str, Any],
    variable: str,
    *,
    other: int | None = None,
    record: Callable[..., MemoryCapture] = record_memory,
    **options: Any,
) -> BatchRuns:
    """Return the cell recorded at the other batch size and then at the variable's own,
    after one unrecorded run at the other size: a first step creates what later steps find
    (optimizer state, lazily built modules, the allocator's cache), and both recordings
    must be steps like the ones that follow. The variable is restored afterwards whatever
    happens; a CUDA out-of-memory error of the first recording is returned in its capture
    (the second is then not made)."""
    size = int(namespace[variable])
    second = other if other is not None else other_batch_size(size)
    try:
        namespace[variable] = second
        run()
        first = record(run, namespace=namespace, **options)
        if first.oom is not None:
            return BatchRuns(first, first, size, second, variable)
        namespace[variable] = size
        main = record(run, namespace=namespace, **options)
    finally:
        namespace[variable] = size
    _stamp(first, second, variable)
    _stamp(main, size, variable)
    return BatchRuns(main, first, size, second, variable)


def _stamp(capture: MemoryCapture, size: int, variable: str) -> None:
    step = capture.snapshot.get("gpuprof_nb", {}).get("step")
    if isinstance(step, dict):
        step["batch_size"] = size
        step["batch_variable"] = variable


def memory_capacity(device: str) -> tuple[int, str]:
    """Return the bytes a step on `device` ("cuda" or "cpu") may use, and in words where
    the figure comes from."""
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        held = torch.cuda.memory_reserved()
        return int(free + held), (
            f"free device memory now ({free:,} B of {total:,} B) plus what PyTorch's "
            f"allocator already holds ({held:,} B)"
        )
    import psutil

    available = int(psutil.virtual_memory().available)
    return available, (
        f"the CPU has no fixed capacity: this uses the machine's available RAM now "
        f"({available:,} B, psutil's virtual_memory().available), which other processes "
        "change; pass --budget to fix one"
    )


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


@contextlib.contextmanager
def checkpoint_applied(model: torch.nn.Module, paths: Sequence[str]) -> Iterator[None]:
    """Checkpoint the submodules at `paths` (non-reentrant torch.utils.checkpoint around
    their forward) inside the block; their own forward is put back afterwards."""
    patched: list[tuple[torch.nn.Module, bool, Any]] = []
    try:
        for path in paths:
            module = model.get_submodule(path)
            had = "forward" in module.__dict__
            patched.append((module, had, module.__dict__.get("forward")))
            module.forward = _checkpointed(module.forward)
        yield
    finally:
        for module, had, own in reversed(patched):
            if had:
                module.forward = own
            else:
                del module.forward
