"""The in-process IPython shell the accuracy comparison runs its cells in, and the setup
cell every workload shares (the overhead comparison runs the same setup in a real kernel)."""

from __future__ import annotations

import contextlib
import gc
import io
import time
from typing import Any

SETUP = """
import torch
torch.set_num_threads({threads})
_dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
a = torch.randn({n}, {n}, device=_dev)
b = torch.randn({n}, {n}, device=_dev)
x = torch.randn(256, device=_dev)
"""


def start_shell() -> Any:
    """The in-process IPython shell with gpuprof_nb loaded (the magic tests use the same)."""
    from IPython.testing.globalipapp import get_ipython, start_ipython

    # start_ipython returns the shell the first time only; later calls get the same one.
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "gpuprof_nb")
    return shell


def run_cell(shell: Any, source: str) -> float:
    """Run one cell; return its wall time in seconds. Output is swallowed; errors raise.

    A full garbage collection is run first, untimed: otherwise the one that earlier cells'
    allocations make due lands on whichever cell crosses the threshold (hundreds of ms on
    this shell's heap), which measures the order of the cells rather than what they cost."""
    sink = io.StringIO()
    gc.collect()
    with contextlib.redirect_stdout(sink):
        t0 = time.perf_counter()
        result = shell.run_cell(source, store_history=False)
        elapsed = time.perf_counter() - t0
    if not result.success:
        err = result.error_in_exec or result.error_before_exec
        raise RuntimeError(f"benchmark cell failed: {err!r}\n{source}")
    return elapsed
