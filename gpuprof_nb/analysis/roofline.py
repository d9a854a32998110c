"""PLACEHOLDER (owned by the roofline work): per-op FLOPs, bytes and roofs."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof_nb.model.trace import Trace


@dataclass(frozen=True, slots=True)
class Roofline:
    points: tuple[object, ...] = ()
    note: str = "roofline not computed yet"


def compute_roofline(trace: Trace, device: object | None = None) -> Roofline:
    """Return the roofline of the trace's ops (placeholder: empty)."""
    return Roofline()
