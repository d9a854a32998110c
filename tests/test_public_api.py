"""Every name in gpuprof_nb.__all__ resolves, and `import gpuprof_nb` stays light."""

from __future__ import annotations

import subprocess
import sys

import gpuprof_nb


def test_every_public_name_resolves() -> None:
    for name in gpuprof_nb.__all__:
        assert getattr(gpuprof_nb, name) is not None, name
    assert callable(gpuprof_nb.ladder.run_ladder)


def test_import_pulls_in_neither_torch_nor_ipython() -> None:
    code = (
        "import sys, gpuprof_nb; gpuprof_nb.ladder; "
        "print(sorted(m for m in ('torch', 'IPython', 'ipywidgets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
