"""The package's layers: model, io, results, analysis and the text/HTML render modules
import without torch, IPython and ipywidgets (run in a fresh interpreter where importing
them fails), and every import, inside functions too, points down the layers, with no
cycle anywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "gpuprof_nb"
BLOCKED = ("torch", "IPython", "ipywidgets")


def _modules() -> list[str]:
    # Globbed recursively, so modules added to model/ and analysis/ later are covered too,
    # those in sub-packages (analysis/memory/, analysis/rules/) included.
    names = [
        "gpuprof_nb",
        "gpuprof_nb.errors",
        "gpuprof_nb.io.trace",
        "gpuprof_nb.render.text",
        "gpuprof_nb.render.html",
        "gpuprof_nb.render.sections",
        "gpuprof_nb.render.units",
    ]
    for package in ("model", "analysis", "results"):
        for path in sorted((PACKAGE / package).rglob("*.py")):
            names.append(_module_name(path))
    return names


def test_pure_layers_import_without_torch_ipython_ipywidgets() -> None:
    modules = _modules()
    assert "gpuprof_nb.analysis.ops" in modules and "gpuprof_nb.model.trace" in modules
    assert "gpuprof_nb.analysis.memory.replay" in modules
    script = "\n".join(
        [
            "import sys",
            f"for name in {BLOCKED!r}:",
            "    sys.modules[name] = None  # any import of it now raises ImportError",
            "import importlib",
            f"for name in {modules!r}:",
            "    importlib.import_module(name)",
            f"leaked = [m for m in sys.modules if m.split('.')[0] in {BLOCKED!r} "
            "and sys.modules[m] is not None]",
            "assert not leaked, leaked",
            "heavy = [m for m in ('matplotlib',) if m in sys.modules]",
            "assert not heavy, heavy",
            "print('ok', len(" + repr(modules) + "))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok")


def test_blocking_really_blocks() -> None:
    # Guards the test above: with the block in place, importing torch must fail.
    script = (
        "import sys; sys.modules['torch'] = None\ntry:\n    import torch\nexcept "
        "ImportError:\n    print('blocked')"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "blocked"


# ---------------------------------------------------------------------------------------
# The direction of every import, those inside functions too.

# Layers from the bottom up. A module may import modules of its own layer (no cycles) and
# of layers below it, never above nor sideways: analysis and render are siblings (render
# draws the results and never calls analysis, analysis never renders), and so are capture
# and those two (capture imports no analysis); the session runs them and the magics (IPython
# glue) sit on top; the package root above everything.
LAYERS: dict[str, int] = {
    "errors": 0,
    "version": 0,
    "gcpause": 0,
    "model": 1,
    "io": 2,
    "results": 3,
    "analysis": 4,
    "render": 4,
    "capture": 4,
    "ladder": 6,
    "session": 6,
    "cli": 8,
    "pytest_plugin": 8,
    "magics": 7,
    "__main__": 9,
    "": 9,
}
GLUE = {"magics"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source (module level,
    inside functions, under TYPE_CHECKING)."""
    import ast

    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("gpuprof_nb"))
            elif (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and node.module
                and node.module.startswith("gpuprof_nb")
            ):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else node.module)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    layer = parts[1] if len(parts) > 1 else ""
    return "magics" if layer in GLUE else layer


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs that point up or sideways between layers."""
    bad = []
    for module, targets in graph.items():
        for target in targets:
            here, there = _layer(module), _layer(target)
            if here != there and LAYERS[there] >= LAYERS[here]:
                bad.append((module, target))
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle found by a depth-first walk (module granularity)."""
    state: dict[str, int] = {}
    path: list[str] = []
    found: list[list[str]] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                walk(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return found


def test_every_import_points_down_and_none_makes_a_cycle() -> None:
    graph = import_graph()
    assert {_layer(m) for m in graph} <= set(LAYERS), "a package not placed in LAYERS"
    assert "gpuprof_nb.results.display" in graph and graph["gpuprof_nb.analysis.report"]
    assert upward_imports(graph) == []
    assert cycles(graph) == []


def test_the_checks_catch_what_they_look_for() -> None:
    # Guards the test above: an upward import inside a function, a sideways one, a cycle.
    graph = {
        "gpuprof_nb.results.report": {"gpuprof_nb.render.bundle"},
        "gpuprof_nb.render.bundle": {"gpuprof_nb.capture.cell"},
        "gpuprof_nb.analysis.a": {"gpuprof_nb.analysis.b"},
        "gpuprof_nb.analysis.b": {"gpuprof_nb.analysis.a"},
    }
    assert upward_imports(graph) == [
        ("gpuprof_nb.render.bundle", "gpuprof_nb.capture.cell"),
        ("gpuprof_nb.results.report", "gpuprof_nb.render.bundle"),
    ]
    assert cycles(graph) == [
        ["gpuprof_nb.analysis.a", "gpuprof_nb.analysis.b", "gpuprof_nb.analysis.a"]
    ]


# Pairs the layer numbers alone would allow but the architecture rules out: analysis works
# on models, never files (io reads them, the session hands the models over).
FORBIDDEN: frozenset[tuple[str, str]] = frozenset({("analysis", "io")})


def forbidden_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs whose layers FORBIDDEN rules out."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if (_layer(module), _layer(target)) in FORBIDDEN
    )


def test_capture_analysis_render_and_io_keep_apart() -> None:
    # Capture imports no analysis, analysis no io, render no analysis (issue 34).
    graph = import_graph()
    assert forbidden_imports(graph) == []
    for importer, imported in (("capture", "analysis"), ("render", "analysis")):
        assert LAYERS[importer] <= LAYERS[imported], (importer, imported)
    fake = {
        "gpuprof_nb.analysis.a": {"gpuprof_nb.io.trace"},
        "gpuprof_nb.render.b": {"gpuprof_nb.analysis.a"},
    }
    assert forbidden_imports(fake) == [("gpuprof_nb.analysis.a", "gpuprof_nb.io.trace")]
    assert upward_imports(fake) == [("gpuprof_nb.render.b", "gpuprof_nb.analysis.a")]
