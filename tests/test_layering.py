"""model, io, analysis and the text/HTML render modules import without torch, IPython and
ipywidgets (run in a fresh interpreter where importing them fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "gpuprof_nb"
BLOCKED = ("torch", "IPython", "ipywidgets")


def _modules() -> list[str]:
    # Globbed, so modules added to model/ and analysis/ later are covered too.
    names = ["gpuprof_nb", "gpuprof_nb.errors", "gpuprof_nb.io.trace", "gpuprof_nb.render.text",
             "gpuprof_nb.render.html", "gpuprof_nb.render.sections", "gpuprof_nb.render.units"]
    for package in ("model", "analysis"):
        for path in sorted((PACKAGE / package).glob("*.py")):
            stem = path.stem
            names.append(f"gpuprof_nb.{package}" if stem == "__init__" else
                         f"gpuprof_nb.{package}.{stem}")
    return names


def test_pure_layers_import_without_torch_ipython_ipywidgets() -> None:
    modules = _modules()
    assert "gpuprof_nb.analysis.ops" in modules and "gpuprof_nb.model.trace" in modules
    script = "\n".join([
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
    ])
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok")


def test_blocking_really_blocks() -> None:
    # Guards the test above: with the block in place, importing torch must fail.
    script = "import sys; sys.modules['torch'] = None\ntry:\n    import torch\nexcept " \
             "ImportError:\n    print('blocked')"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip() == "blocked"
