"""A training step's structure, recorded beside its memory history (model/step.py).

While the cell runs, global hooks (removed afterwards, also when the cell raises) see every
nn.Module forward call (its path under the model, when it began and returned, its wall
time, the storages it returned), every optimizer step, and the moment backward reaches each
model output (a gradient hook on the output). Parameters, buffers, gradients and optimizer
state are tagged by their storage's address at the start, around each optimizer step and at
the end. Nothing here changes what the cell allocates.

Positions are allocation counts (model/step.py): on CUDA the allocator's own counter
(`allocation.all.allocated`); on the CPU a zero-length `record_function` marker that the CPU
fallback (capture/memory.py) turns into the count of allocations before it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

MARK = "gpuprof_nb.step.mark#"


def _leaf_tensors(value: Any) -> list[torch.Tensor]:
    """Tensors inside a module's output (tuples, lists, dicts, dataclass-like outputs)."""
    from torch.utils._pytree import tree_leaves

    try:
        leaves = tree_leaves(value)
    except Exception:  # an output pytree cannot walk: only a bare tensor is looked at
        leaves = [value]
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _in_backward() -> bool:
    """Whether the autograd engine is running this code: a module called from backward is
    activation checkpointing recomputing its forward, not a call of the step. On CUDA that
    runs on the engine's device thread, where these hooks must not act (registering gradient
    hooks there broke backward: run_backward "returned NULL without setting an exception",
    seen on an H100 with torch 2.11)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


class StepRecorder:
    """Records one cell's module calls, optimizer steps and tagged storages (see the module
    docstring). Use `with recorder.installed():` around the runs, then `record(positions)`.
    """

    def __init__(
        self, device: torch.device | str, namespace: Mapping[str, Any] | None = None
    ) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.namespace = namespace if namespace is not None else {}
        self._positions: list[int] = []  # per marker: position (CPU: filled in later)
        self._base = 0
        self._calls: list[list[Any]] = []
        self._stack: list[tuple[int, Any]] = []  # (call index, module) of open calls
        self._roots: list[tuple[str, str]] = []
        self._root_index: dict[int, int] = {}
        self._paths: dict[int, dict[int, str]] = {}  # root id -> module id -> path
        self._models: dict[int, torch.nn.Module] = {}
        self._optimizers: dict[int, torch.optim.Optimizer] = {}
        self._tags: list[tuple[int, int, str, int]] = []
        self._tagged: dict[tuple[int, str], Any] = {}
        self._final: dict[int, int] | None = None  # storages seen by the scan at the end
        self._backward: list[int] = []  # per root call: marker, -1 until reached
        self._steps: list[list[int]] = []
        self._timers: list[Any] = []  # per call: (start, end) CUDA events or ns
        self._handles: list[Any] = []
        self._grad_handles: list[Any] = []
        self.problems: list[str] = []
        self.enabled = True

    # -- positions -----------------------------------------------------------------------

    def _allocations(self) -> int:
        stats = torch.cuda.memory_stats_as_nested_dict(self.device)
        return int(stats["allocation"]["all"]["allocated"])

    def mark(self) -> int:
        """Return a new marker's id: its position is the allocations made so far."""
        k = len(self._positions)
        if self.cuda:
            self._positions.append(self._allocations() - self._base)
        else:
            self._positions.append(-1)
            with torch.profiler.record_function(f"{MARK}{k}"):
                pass
        return k

    # -- tags ----------------------------------------------------------------------------

    def _tag(self, tensor: Any, category: str, at: int) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device != self.device:
            return
        try:
            storage = tensor.untyped_storage()
            ptr, size = int(storage.data_ptr()), int(storage.nbytes())
        except (RuntimeError, NotImplementedError):  # fake, meta or sparse tensors
            return
        if not ptr or not size:
            return
        if self._final is not None:
            self._final[ptr] = size
        # One tag per tensor and category is enough: a storage does not move, so the tag
        # names the block at that address for the tensor's whole life. A later tensor at
        # the same address (a new gradient) is another object, and is tagged again.
        seen = self._tagged.get((ptr, category))
        if seen is not None and seen() is tensor:
            return
        try:
            self._tagged[(ptr, category)] = weakref.ref(tensor)
        except TypeError:
            pass
        self._tags.append((ptr, size, category, at))

    def _tag_module(self, module: torch.nn.Module, at: int) -> None:
        for p in module.parameters():
            self._tag(p, "parameter", at)
            if p.grad is not None:
                self._tag(p.grad, "gradient", at)
        for b in module.buffers():
            self._tag(b, "buffer", at)

    def _tag_optimizer(self, optimizer: torch.optim.Optimizer, at: int) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._tag(p, "parameter", at)
                if p.grad is not None:
                    self._tag(p.grad, "gradient", at)
        for state in optimizer.state.values():
            if isinstance(state, Mapping):
                for value in state.values():
                    self._tag(value, "optimizer_state", at)

    def _scan_namespace(self) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
        modules, optimizers = [], []
        for value in list(self.namespace.values()):
            if isinstance(value, torch.nn.Module):
                modules.append(value)
            elif isinstance(value, torch.optim.Optimizer):
                optimizers.append(value)
        return modules, optimizers

    def _tag_everything(self, used: Iterable[Any] = (), *, final: bool = False) -> None:
        """Tag the namespace's modules and optimizers, then `used`; with `final` (at the
        end) what `used` holds is what `alive_at_end` reports."""
        at = self.mark()
        modules, optimizers = self._scan_namespace()
        for obj in [*modules, *optimizers]:
            self._tag_object(obj, at)
        if final:
            self._final = {}
        for obj in used:
            self._tag_object(obj, at)

    def _tag_object(self, obj: Any, at: int) -> None:
        if isinstance(obj, torch.nn.Module):
            self._tag_module(obj, at)
        elif isinstance(obj, torch.optim.Optimizer):
            self._tag_optimizer(obj, at)

    # -- hooks ---------------------------------------------------------------------------

    def _guarded(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """A hook that never breaks the user's step: a failure is noted and recording of
        that detail stops."""

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                hook(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - reported in the notes
                if len(self.problems) < 3:
                    self.problems.append(f"{type(exc).__name__}: {exc}")
            return None

        return run

    def _root_of(self, module: torch.nn.Module) -> int:
        key = id(module)
        index = self._root_index.get(key)
        if index is None:
            name = next(
                (
                    k
                    for k, v in self.namespace.items()
                    if v is module and not k.startswith("_") and k.isidentifier()
                ),
                "",
            )
            index = len(self._roots)
            self._roots.append((name, type(module).__name__))
            self._root_index[key] = index
            self._paths[key] = {id(m): path for path, m in module.named_modules()}
            self._models[key] = module
        return index

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if _in_backward():
            return
        if self._stack:
            root_call = self._calls[self._stack[0][0]]
            root = root_call[0]
            root_module = self._stack[0][1]
            path = self._paths[id(root_module)].get(id(module), f"<{type(module).__name__}>")
        else:
            root = self._root_of(module)
            path = ""
        at = self.mark()
        if not self._stack:
            self._tag_module(module, at)
            self._backward.append(-1)
        index = len(self._calls)
        self._calls.append(
            [root, path, type(module).__name__, len(self._stack), at, -1, None, [], None]
        )
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            self._timers.append([start, None])
        else:
            self._timers.append([time.perf_counter_ns(), None])
        self._stack.append((index, module))

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _in_backward() or not self._stack or self._stack[-1][1] is not module:
            return
        index, _ = self._stack.pop()
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record()
            self._timers[index][1] = end
        else:
            self._timers[index][1] = time.perf_counter_ns()
        call = self._calls[index]
        call[5] = self.mark()
        tensors = _leaf_tensors(output)
        outputs = []
        for t in tensors:
            if t.device == self.device:
                try:
                    storage = t.untyped_storage()
                    outputs.append([int(storage.data_ptr()), int(storage.nbytes())])
                except (RuntimeError, NotImplementedError):
                    continue
        call[7] = outputs
        if call[3] == 0 and torch.is_grad_enabled():
            slot = len(self._backward) - 1
            for t in tensors:
                if t.requires_grad and t.grad_fn is not None:
                    self._grad_handles.append(
                        t.register_hook(self._reached(slot))  # type: ignore[no-untyped-call]
                    )

    def _reached(self, slot: int) -> Callable[[Any], None]:
        def hook(grad: Any) -> None:
            try:
                if self._backward[slot] < 0:
                    self._backward[slot] = self.mark()
            except Exception as exc:  # noqa: BLE001 - reported in the notes
                self.problems.append(f"{type(exc).__name__}: {exc}")

        return hook

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizers[id(optimizer)] = optimizer
        at = self.mark()
        self._steps.append([at, -1])
        self._tag_optimizer(optimizer, at)

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        at = self.mark()
        if self._steps and self._steps[-1][1] < 0:
            self._steps[-1][1] = at
        self._tag_optimizer(optimizer, at)

    # -- install / record ----------------------------------------------------------------

    def install(self) -> None:
        """Start recording: take the starting tags and register the global hooks."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        if self.cuda:
            try:
                self._base = self._allocations()
            except Exception as exc:  # noqa: BLE001 - no allocator statistics: no record
                self.problems.append(f"the allocator's counters ({type(exc).__name__}: {exc})")
                self.enabled = False
                return
        self._tag_everything()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._guarded(self._pre)),
            nn_module.register_module_forward_hook(self._guarded(self._post), always_call=True),
            optim_module.register_optimizer_step_pre_hook(self._guarded(self._step_pre)),
            optim_module.register_optimizer_step_post_hook(self._guarded(self._step_post)),
        ]

    def remove(self) -> None:
        """Stop recording: remove every hook and take the tags at the end. Safe to call
        twice, and after a run that raised."""
        for handle in self._handles + self._grad_handles:
            handle.remove()
        self._handles, self._grad_handles = [], []
        self._stack.clear()
        if self._positions and self.enabled:
            try:
                self._tag_everything(
                    [*self._models.values(), *self._optimizers.values()], final=True
                )
            except Exception as exc:  # noqa: BLE001 - reported in the notes
                self.problems.append(f"{type(exc).__name__}: {exc}")
        if self.cuda and self.enabled:
            try:
                self._positions.append(self._allocations() - self._base)
            except Exception as exc:  # noqa: BLE001 - reported in the notes
                self.problems.append(f"{type(exc).__name__}: {exc}")
                self.enabled = False

    def alive_at_end(self) -> dict[int, int]:
        """Storages (address -> bytes) of the modules' and optimizers' tensors at the end."""
        return dict(self._final or {})

    @property
    def marker_count(self) -> int:
        return len(self._positions)

    def _forward_us(self, index: int) -> float | None:
        start, end = self._timers[index]
        if end is None:
            return None
        if self.cuda:
            try:
                us: float = float(start.elapsed_time(end)) * 1000.0
                return us
            except RuntimeError:
                return None
        return float(end - start) / 1000.0

    def record(self, cpu_positions: Mapping[int, int] | None = None) -> dict[str, Any] | None:
        """Return the step record as the dict kept in the snapshot (io/steprecord.py), None
        when recording could not start. On the CPU, `cpu_positions` maps each marker id
        to the allocations before it."""
        if not self.enabled:
            return None
        if self.cuda:
            torch.cuda.synchronize(self.device)
            positions = list(self._positions)
            allocations = positions[-1] if positions else 0
        else:
            found = cpu_positions or {}
            positions = []
            last = 0
            for k in range(len(self._positions)):
                # A marker the profiler did not keep sits where the one before it was.
                last = found.get(k, last)
                positions.append(last)
            allocations = max(found.values(), default=0)

        def pos(marker: int) -> int:
            return positions[marker] if 0 <= marker < len(positions) else -1

        calls = []
        for i, c in enumerate(self._calls):
            calls.append([c[0], c[1], c[2], c[3], pos(c[4]), pos(c[5]), self._forward_us(i), c[7]])
        return {
            "roots": [list(r) for r in self._roots],
            "calls": calls,
            "backward": [pos(b) for b in self._backward],
            "optimizer_steps": [[pos(a), pos(b)] for a, b in self._steps],
            "tags": [[a, s, c, pos(m)] for a, s, c, m in self._tags],
            "allocations": allocations,
            "device": str(self.device),
        }

    def notes(self) -> tuple[str, ...]:
        if not self.problems:
            return ()
        return (
            "Recording the step's modules and optimizer steps failed in part ("
            + "; ".join(self.problems)
            + "); memory by category may be incomplete.",
        )
