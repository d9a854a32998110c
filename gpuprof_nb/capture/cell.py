"""Running a notebook cell for the magics, the way IPython would run it.

Both `%%gpuprofile` and `%%memsnap` (session/profile.py, session/memsnap.py) take the cell
through here:
- `CellCompiler` transforms it as IPython does (input transformers, then the shell's AST
  transformers), compiles it, registers its lines so tracebacks show `Cell In[n]` and the
  user's lines, and keeps compiled cells for re-runs;
- `CellRunner` runs the compiled cell in the user namespace and holds the one restore rule:
  grad mode and autocast (enabled and dtype, per device) are put back as they were found,
  before each run and once more at the end, whether the cell returned or raised;
- `block_builder` gives the timing a cell compiled inside a loop, for back-to-back runs.

The shell is used through its own methods only (no IPython import here): `transform_cell`,
`transform_ast`, `compile`, `ast_transformers`, `user_ns`, `execution_count`.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import linecache
import sys
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

# Entries kept in each per-shell cache (compiled cells, parsed option lines): a notebook
# re-runs a handful of cells; beyond that the oldest entry goes.
CACHE_SIZE = 64

# Length of name_key's digest form: the prefix and a SHA-1 in hex.
_NAME_KEY_LENGTH = len("%%gpuprofile cell ") + 40


def remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Store key -> value, dropping the oldest entry when a new key finds the cache full."""
    if key not in cache and len(cache) >= CACHE_SIZE:
        del cache[next(iter(cache))]
    cache[key] = value


class CellCompiler:
    """Compiles cells for one shell, as IPython's run_cell would, with a cache for re-runs."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._code_cache: dict[Any, tuple[str, Any, str, Any, Any]] = {}
        # The compiler last asked, and whether it names a cell without its execution number.
        self._names_probe: tuple[Any, bool] = (None, False)

    def compile(self, cell: str) -> tuple[Any, str]:
        """Return the cell's code object and its transformed source; a SyntaxError (or an
        AST transformer's InputRejected) propagates before anything runs. The source is
        registered under the code's file name so tracebacks show the user's lines.

        A cell run again reuses its transformed source and code object (IPython's transform
        and the compile cost tens of microseconds a cell: benchmarks/RESULTS.md,
        "Measurements behind design choices", M9): the cache key holds everything they depend
        on: the cell text, the compiler's __future__ flags, the input transformers and the AST
        transformers in place. One-line cells are transformed every time (IPython's
        automagic/autocall rewrite them depending on the user's variables)."""
        ip = self.shell
        tm = ip.input_transformer_manager
        key = (
            cell,
            ip.compile.flags,
            *map(id, tm.cleanup_transforms),
            None,
            *map(id, tm.line_transforms),
            None,
            *map(id, tm.token_transformers),
            None,
            *map(id, ip.input_transformers_post),
            None,
            *map(id, ip.ast_transformers),
        )
        hit = self._code_cache.get(key)
        if hit is None:
            source = ip.transform_cell(cell)
            name_key = name_key_of(cell)
            filename = self._register(source, name_key)
            code = ip.compile(self.tree(source, filename), filename, "exec")
            if len(source.splitlines()) > 1 and not ip.input_transformers_post:
                # Several lines: IPython's namespace-dependent rewrites never apply.
                remember(self._code_cache, key, self._cached(source, code, name_key))
            return code, source
        source, code, name_key, entry, compiler = hit
        filename = code.co_filename
        numbers = getattr(compiler, "_filename_map", None)
        if (
            compiler is ip.compile
            and type(numbers) is dict
            and linecache.cache.get(filename) is entry
            and self._names_fixed(compiler, source, name_key)
        ):
            # The compiler names the cell as last time and its lines are still registered:
            # only the name's execution number (traceback's `Cell In[n]`) is new. What
            # compile.cache would do, without hashing the name again (ipykernel hashes it in
            # pure Python: benchmarks/RESULTS.md, "Measurements behind design choices", M10).
            numbers[filename] = self.execution_number()
            return code, source
        # Registered again under this execution's name, as IPython does for every cell, so a
        # traceback says `Cell In[n]` with this cell's number.
        filename = self._register(source, name_key)
        if code.co_filename != filename:
            code = _renamed(code, filename)
        remember(self._code_cache, key, self._cached(source, code, name_key))
        return code, source

    def cell_numbers(self, filenames: Iterable[str]) -> dict[str, int]:
        """Return {file name: execution number} for those of `filenames` that are cells this
        shell ran (its compiler's map; empty for a compiler without one), so reports can
        name them `In [n]` instead of by their hashed file names."""
        numbers = getattr(self.shell.compile, "_filename_map", None)
        if not isinstance(numbers, dict):
            return {}
        return {f: n for f in set(filenames) if type(n := numbers.get(f)) is int}

    def tree(self, source: str, filename: str) -> Any:
        """Return the cell's source parsed with the compiler's flags, and passed through the
        shell's AST transformers as run_cell passes it (the source itself when there are
        none: compiling text costs the same and skips building a tree)."""
        ip = self.shell
        if not ip.ast_transformers:
            return source
        return ip.transform_ast(ip.compile.ast_parse(source, filename))

    def _cached(self, source: str, code: Any, name_key: str) -> tuple[Any, ...]:
        """What the code cache keeps for a cell: its transformed source, code, name key, the
        linecache entry its registration made and the compiler that made it."""
        return (source, code, name_key, linecache.cache.get(code.co_filename), self.shell.compile)

    def _register(self, source: str, name_key: str) -> str:
        """Register the cell's lines in linecache under this execution's name; return it."""
        ip = self.shell
        return str(ip.compile.cache(source, self.execution_number(), raw_code=name_key))

    def execution_number(self) -> int:
        """Return the number of the notebook cell running the magic (its `In [n]`): the
        number the shell's compiler gave the file of the innermost cell on the call stack.
        Not `shell.execution_count`, which IPython 9 moves to the next number before the
        cell runs (8 after it). Without a cell on the stack (a magic called from code),
        the shell's count."""
        ip = self.shell
        numbers = getattr(ip.compile, "_filename_map", None)
        if isinstance(numbers, dict) and numbers:
            frame: FrameType | None = sys._getframe(1)
            while frame is not None:
                number = numbers.get(frame.f_code.co_filename)
                if type(number) is int:
                    return number
                frame = frame.f_back
        return int(ip.execution_count)

    def _names_fixed(self, compiler: Any, source: str, name_key: str) -> bool:
        """Whether `compiler` names a cell by its text alone, not its execution number too
        (asked once per compiler: IPython's names hold the number, ipykernel's do not)."""
        known, fixed = self._names_probe
        if known is not compiler:
            try:
                fixed = compiler.get_code_name(name_key, source, 1) == compiler.get_code_name(
                    name_key, source, 2
                )
            except Exception:  # noqa: BLE001 - an unknown compiler: register every run
                fixed = False
            self._names_probe = (compiler, fixed)
        return fixed


def name_key_of(cell: str) -> str:
    """Return what the magics give IPython as the cell's raw code when they register the cell
    for tracebacks: a digest of it. IPython's compiler names a cell by its transformed source
    and ignores this; ipykernel's names it by a pure-Python hash of this text, slow on a long
    cell (benchmarks/RESULTS.md, "Measurements behind design choices", M10), which it has
    already paid once for the whole cell. Distinct cells still get distinct names, and a
    cell the same name each time (a cell shorter than a digest key is its own key, so the
    two kinds never meet)."""
    if len(cell) < _NAME_KEY_LENGTH:
        return cell
    return "%%gpuprofile cell " + hashlib.sha1(cell.encode("utf-8", "surrogatepass")).hexdigest()


def _renamed(code: Any, filename: str) -> Any:
    """Return `code` with its file name (and that of every function, class or comprehension
    compiled inside it) set to `filename`."""
    consts = tuple(
        _renamed(c, filename) if isinstance(c, type(code)) else c for c in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


class CellRunner:
    """Runs a compiled cell in the user namespace. `restore_modes` puts back the grad and
    autocast modes (enabled and dtype, per device) found when the runner was made; the
    magics call it before every run or block of runs (outside any timed span), so a run that
    changed them (or raised half-way through a `with` block) does not change the next, and
    once more at the end, in a `finally`. It says whether anything had changed, so the
    timing knows not to chain runs of such a cell in blocks."""

    def __init__(self, code: Any, namespace: dict[str, Any]) -> None:
        import torch

        self.code = code
        self.namespace = namespace
        self._torch = torch
        self.devices = autocast_devices(torch)
        self.modes = self._read_modes()

    def __call__(self) -> None:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in user tracebacks
        exec(self.code, self.namespace)

    def _read_modes(self) -> list[Any]:
        """Return [grad enabled, then (autocast enabled, autocast dtype) per device]."""
        torch = self._torch
        modes = [torch.is_grad_enabled()]
        for dev in self.devices:
            modes.append(torch.is_autocast_enabled(dev))
            modes.append(torch.get_autocast_dtype(dev))
        return modes

    def restore_modes(self) -> bool:
        """Put back the modes found before the first run; return True if they had changed.
        Called around every run, so it reads (cheap) before it writes."""
        if self._read_modes() == self.modes:
            return False
        torch = self._torch
        torch.set_grad_enabled(self.modes[0])
        for i, dev in enumerate(self.devices):
            torch.set_autocast_enabled(dev, self.modes[1 + 2 * i])
            torch.set_autocast_dtype(dev, self.modes[2 + 2 * i])
        return True


_AUTOCAST_DEVICES = ("cpu", "cuda")


@functools.cache
def autocast_devices(torch: Any) -> tuple[str, ...]:
    """Return the devices whose autocast state this torch build can read (probed once per
    process: the build does not change while it runs, and every cell would pay for it)."""
    readable = []
    for dev in _AUTOCAST_DEVICES:
        try:
            torch.is_autocast_enabled(dev)
            torch.get_autocast_dtype(dev)
        except (RuntimeError, TypeError, AttributeError):
            continue
        readable.append(dev)
    return tuple(readable)


def block_builder(
    compiler: CellCompiler, source: str, code: Any
) -> Callable[[int], Callable[[], object] | None]:
    """Return run_block for time_cell: n -> a callable running the cell n times in one exec,
    its statements compiled inside `for [None][0] in (None,) * n:` (no exec, frame or call
    per run, which show in the time of a cell of a few microseconds and which timeit does not
    pay either: benchmarks/RESULTS.md, "Measurements behind design choices", M11; the
    target stores into a throwaway list, so no name lands in the user's namespace). Same
    file name and line numbers as the cell, and the same AST transformers, so errors read
    the same. None where the cell cannot sit in a loop (`from __future__` must come first;
    a comment-only cell)."""
    ip = compiler.shell
    namespace = ip.user_ns
    filename = code.co_filename

    def build(number: int) -> Callable[[], object] | None:
        try:
            tree = compiler.tree(source, filename)
            if isinstance(tree, str):
                tree = ip.compile.ast_parse(tree, filename)
            body = tree.body
            if not body or any(
                isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in body
            ):
                return None
            first = body[0]
            holder = ast.List(elts=[ast.Constant(None)], ctx=ast.Load())
            target = ast.Subscript(value=holder, slice=ast.Constant(0), ctx=ast.Store())
            nones = ast.Tuple(elts=[ast.Constant(None)], ctx=ast.Load())
            times = ast.BinOp(left=nones, op=ast.Mult(), right=ast.Constant(number))
            loop = ast.For(target=target, iter=times, body=body, orelse=[])
            for node in (
                loop,
                target,
                holder,
                *holder.elts,
                target.slice,
                times,
                *nones.elts,
                nones,
                times.right,
            ):
                ast.copy_location(node, first)
            module = ast.Module(body=[loop], type_ignores=[])
            looped = compile(module, filename, "exec", ip.compile.flags, True)
        except (SyntaxError, ValueError):
            return None
        return functools.partial(exec, looped, namespace)

    return build
