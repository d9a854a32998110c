"""PLACEHOLDER (owned by the memory work): the %%memsnap magic."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class


@magics_class
class MemsnapMagics(Magics):
    @cell_magic
    def memsnap(self, line: str, cell: str) -> None:
        raise UsageError("%%memsnap is not available yet")
