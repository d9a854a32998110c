"""IPython glue: `%%gpuprofile` (gpuprofile.py) and `%%memsnap` (memsnap.py). Each magic
parses its line into the session's frozen options (options.py), has the session run the
cell into a report (gpuprof_nb/session), and publishes it: stores it under -o, shows it."""

from __future__ import annotations

from typing import Any


def register(ipython: Any) -> None:
    """Register %%gpuprofile and %%memsnap with an IPython shell."""
    from gpuprof_nb.magics.gpuprofile import GpuprofileMagics
    from gpuprof_nb.magics.memsnap import MemsnapMagics

    ipython.register_magics(GpuprofileMagics)
    ipython.register_magics(MemsnapMagics)
