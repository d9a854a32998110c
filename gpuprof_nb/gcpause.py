"""The pause of the cyclic garbage collector while many objects are made: trace and snapshot
loading, and a report's analysis and rendering."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a loader builds many objects (or an analysis
    reads them), restoring its state on the way out, whatever happens.

    The loaders make hundreds of thousands to millions of objects and no reference cycles;
    every automatic collection would walk all the ones made so far again. An analysis makes
    fewer, short-lived ones, but a full collection it sets off still walks the whole trace.

    On the way out, the objects made meanwhile are moved to the collector's oldest
    generation (gc.freeze() then gc.unfreeze(): two moves of whole lists, nothing walked)
    instead of being left young: otherwise the first allocation after the pause starts a
    collection that walks every one of them, and another follows a few thousand allocations
    later. So that this moves no garbage along with them (a young reference cycle holding
    tensors would then wait for the next full collection), the young generations are
    collected first, a cheap collection of the objects made since the last one. Neither is
    done when the collector was off to begin with (it stays as the caller set it), or when
    something in the process keeps frozen objects (gc.freeze() before a fork), which
    unfreezing would release.

    What the pause and the move save: benchmarks/RESULTS.md, section 17 (`gc_pause.py`)."""
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
