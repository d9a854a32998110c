"""Out-of-memory entries in the history, with the state of memory when each happened."""

from __future__ import annotations

import numpy as np

from gpuprof_nb.analysis.memory.replay import _Replay
from gpuprof_nb.model.memory import OOM, MemorySnapshot
from gpuprof_nb.results.memory import OomEvent, Site


def _ooms(
    snapshot: MemorySnapshot,
    rep: _Replay,
    device: int,
    sites: tuple[Site, ...],
    site_of_stack: np.ndarray,
) -> tuple[OomEvent, ...]:
    """Return every OOM entry of `device`'s history: what it asked for, what the device
    had free, the active and reserved bytes then and the site that asked."""
    trace = snapshot.trace(device)
    if trace is None:
        return ()
    out = []
    for i in np.flatnonzero(trace.action == OOM).tolist():
        free = int(trace.device_free[i])
        out.append(
            OomEvent(
                index=i,
                x=float(rep.x[i]),
                requested_bytes=int(trace.size[i]),
                device_free_bytes=free if free >= 0 else None,
                active_bytes=int(rep.active[i]),
                reserved_bytes=int(rep.reserved[i]) if rep.reserved is not None else None,
                site=sites[int(site_of_stack[int(trace.stack[i]) + 1])],
            )
        )
    return tuple(out)
