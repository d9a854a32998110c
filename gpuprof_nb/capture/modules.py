"""nn.Module paths around every forward call of the profiled run, as ranges in the trace.

While the profiled run goes, global forward pre/post hooks
(`torch.nn.modules.module.register_module_forward_pre_hook` / `..._forward_hook`) open and
close one range per module call, named `nn.Module: <path>` with the module's path in the
model (`model.encoder.layers.3.attn`). The root's name is the user's variable that holds it
(else its class name); a child's is its attribute name in the module that called it.

Why these hooks and this range: the hooks run only inside `Module.__call__`, so a cell that
calls no module pays nothing; and the range is torch's `_RecordFunctionFast`, several times
cheaper a call under the profiler than `record_function` (benchmarks/RESULTS.md,
"Measurements behind design choices", M15; section 13 measures what the ranges add to a
training step). Kineto writes those ranges as `cpu_op` events; `edit_trace` turns them into
`user_annotation` ones, so every op table, rule and the timeline go on seeing torch ops
only. Backward needs no hook: each backward op carries the autograd sequence number of the
forward op that made it, which analysis/modules.py follows back to the forward's module.

Under torch.compile the hooks do nothing while Dynamo traces (the module's code becomes the
graph), so a compiled module shows as one range around its compiled call. The recorder keeps
a short summary under gpuprof_nb's own key of the trace (`io/modules.py` reads it): that
modules were recorded (so "no module ran" is told apart from "not recorded"), how many
calls, and the shape of each root module's first input (batch size, tokens).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

# Every module range's name starts with this (analysis/modules.py reads the path after it).
MODULE_PREFIX = "nn.Module: "
# torch warns on every call of a torch.compile'd module while global hooks are on (they fire
# once more for the OptimizedModule wrapper, which the tree shows as the root): not the
# user's concern during our run.
_COMPILED_HOOKS_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"
# Distinct paths kept at most (a model building modules on the fly would grow without end).
MAX_PATHS = 20_000

_fast_range: Any = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)


def _is_compiling() -> Callable[[], bool]:
    compiler = getattr(torch, "compiler", None)
    found = getattr(compiler, "is_compiling", None)
    if callable(found):
        return found  # type: ignore[no-any-return]
    return lambda: False


class _Range:
    """record_function's enter/exit where torch lacks _RecordFunctionFast (a user_annotation
    already, so edit_trace finds nothing to change)."""

    __slots__ = ("handle", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.handle: Any = None

    def __enter__(self) -> None:
        self.handle = torch.ops.profiler._record_function_enter_new(self.name, None)

    def __exit__(self, *exc: object) -> None:
        torch.ops.profiler._record_function_exit._RecordFunction(self.handle)


class ModuleRecorder:
    """Records a range per nn.Module forward call while started (a Sampler of
    capture/profiler.py: `start()`, `stop()`, `record(to_trace_us)`, `edit_trace(artifact)`).

    `namespace` is where the root modules' names are looked up (the notebook's user
    namespace): a variable bound to the module names it; else its class name does.
    `stop()` is idempotent, never raises, removes the hooks and closes ranges a module that
    raised left open."""

    def __init__(self, namespace: Mapping[str, Any] | None = None) -> None:
        self._namespace = namespace if namespace is not None else {}
        self._local = threading.local()
        self._roots: dict[int, str] = {}
        self._full: dict[int, str] = {}
        self._below: dict[int, dict[int, str]] = {}
        # (parent path, id(module)) -> (path, range name); the modules are kept alive while
        # we run, so an id cannot be reused by another module meanwhile.
        self._paths: dict[tuple[str, int], tuple[str, str]] = {}
        self._keep: list[nn.Module] = []
        self._types: dict[str, str] = {}
        self._calls = 0
        self._root_info: dict[str, dict[str, Any]] = {}
        self._handles: list[Any] = []
        self._filter: Any = None
        self._started = self._stopped = False
        self._compiling = _is_compiling()
        self._range: Any = _fast_range if _fast_range is not None else _Range
        self._open: list[list[tuple[nn.Module, str, Any]]] = []
        self._error = ""

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError("this ModuleRecorder was already started; make a new one")
        self._started = True
        roots: dict[int, str] = {}
        for name in sorted(self._namespace, key=lambda n: (len(n), n)):
            if name.startswith("_"):
                continue
            value = self._namespace.get(name)
            if isinstance(value, nn.Module):
                roots.setdefault(id(value), name)
        self._roots = roots
        # Every submodule of those, by its full path: a module called with no module around
        # it (activation checkpointing recomputes a block from inside backward) still gets
        # the path it has in the model.
        full: dict[int, str] = {}
        for key, name in roots.items():
            module = self._namespace.get(name)
            try:
                for sub, child in module.named_modules():  # type: ignore[union-attr]
                    if sub:
                        full.setdefault(id(child), f"{name}.{sub}")
            except Exception:  # noqa: BLE001, S112 - a module that cannot list its children
                continue
            full.setdefault(key, name)
        self._full = full
        warnings.filterwarnings("ignore", message=_COMPILED_HOOKS_WARNING)
        self._filter = warnings.filters[0]
        register = nn.modules.module
        self._handles.append(register.register_module_forward_pre_hook(self._pre))
        try:
            post = register.register_module_forward_hook(self._post, always_call=True)
        except TypeError:  # torch before 2.1: no always_call (stop() closes what is left)
            post = register.register_module_forward_hook(self._post)
        self._handles.append(post)

    def stop(self) -> None:
        if not self._started or self._stopped:
            return
        self._stopped = True
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:  # noqa: BLE001, S112 - stop() never raises
                continue
        if self._filter is not None:
            try:
                filters: Any = warnings.filters
                filters.remove(self._filter)
                warnings._filters_mutated()  # type: ignore[attr-defined]
            except (ValueError, AttributeError):
                pass
        # Ranges a module that raised left open (always_call closes them on torch >= 2.1).
        for stack in self._open:
            while stack:
                _, _, rng = stack.pop()
                try:
                    rng.__exit__(None, None, None)
                except Exception:  # noqa: BLE001, S112
                    continue

    def _stack(self) -> list[tuple[nn.Module, str, Any]]:
        """This thread's open module calls: (module, path, range), innermost last."""
        stack: list[tuple[nn.Module, str, Any]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
            self._open.append(stack)
        return stack

    def _pre(self, module: nn.Module, args: Any) -> None:
        if self._compiling():
            return
        stack = self._stack()
        parent = stack[-1][1] if stack else ""
        key = (parent, id(module))
        named = self._paths.get(key)
        if named is None:
            path = self._name(module, stack[-1][0] if stack else None, parent)
            named = (path, MODULE_PREFIX + path)
            if len(self._paths) < MAX_PATHS:
                self._paths[key] = named
                self._keep.append(module)
                self._types.setdefault(path, type(module).__name__)
        if not stack:
            self._note_root(named[0], module, args)
        rng = self._range(named[1])
        rng.__enter__()
        stack.append((module, named[0], rng))
        self._calls += 1

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._compiling():
            return
        stack = self._stack()
        if not stack:
            return
        if stack[-1][0] is not module and not any(m is module for m, _, _ in stack):
            return
        # Close up to this module's own range (ranges of callees that raised and were caught
        # end here too).
        while stack:
            m, _, rng = stack.pop()
            rng.__exit__(None, None, None)
            if m is module:
                break

    def _name(self, module: nn.Module, caller: nn.Module | None, parent: str) -> str:
        """The path of `module` called from `caller` (whose path is `parent`): its attribute
        name in the caller, else its path below the caller (a block of a ModuleList the
        caller loops over: `layers.3`), else its class name."""
        if caller is None:
            return self._full.get(id(module)) or type(module).__name__
        for name, child in caller._modules.items():
            if child is module:
                return f"{parent}.{name}"
        full = self._full.get(id(module))
        if full is not None and full.startswith(parent + "."):
            return full
        below = self._below.get(id(caller))
        if below is None:
            # Once per caller: every module under it, by identity.
            try:
                below = {id(m): n for n, m in caller.named_modules() if n}
            except Exception:  # noqa: BLE001 - a module whose named_modules fails
                below = {}
            self._below[id(caller)] = below
            self._keep.append(caller)
        found = below.get(id(module))
        return f"{parent}.{found}" if found else f"{parent}.{type(module).__name__}"

    def _note_root(self, path: str, module: nn.Module, args: Any) -> None:
        info = self._root_info.get(path)
        if info is None:
            info = self._root_info[path] = {"path": path, "class": type(module).__name__}
            info["calls"] = 0
            tensor = _first_tensor(args)
            if tensor is not None:
                shape = [int(s) for s in tensor.shape]
                info["input_shape"] = shape
                info["input_dtype"] = str(tensor.dtype).replace("torch.", "")
        info["calls"] += 1

    # -- the artifact ----------------------------------------------------------------------

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]:
        """Return {"recorded": True, "prefix", "calls", "roots": [{"path", "class", "calls",
        "input_shape", "input_dtype"}], "types": {path: class}} (the clock is not needed: the
        ranges are in the trace itself)."""
        entry: dict[str, Any] = {
            "recorded": True,
            "prefix": MODULE_PREFIX,
            "calls": self._calls,
            "roots": list(self._root_info.values()),
            "types": dict(self._types),
        }
        if len(self._paths) >= MAX_PATHS:
            entry["note"] = f"more than {MAX_PATHS:,} distinct module paths: later ones not cached"
        return entry

    def edit_trace(self, artifact: dict[str, Any]) -> None:
        """Turn the module ranges Kineto wrote as `cpu_op` into `user_annotation` events."""
        events = artifact.get("traceEvents")
        if not isinstance(events, list):
            return
        for e in events:
            if (
                isinstance(e, dict)
                and e.get("cat") == "cpu_op"
                and str(e.get("name", "")).startswith(MODULE_PREFIX)
            ):
                e["cat"] = "user_annotation"


def _first_tensor(args: Any) -> torch.Tensor | None:
    for a in args if isinstance(args, tuple) else (args,):
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, list | tuple):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return b
        if isinstance(a, Mapping):
            for b in a.values():
                if isinstance(b, torch.Tensor):
                    return b
    return None
