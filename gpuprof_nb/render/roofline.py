"""PLACEHOLDER (owned by the roofline work): Roofline section."""

from __future__ import annotations

from gpuprof_nb.analysis.roofline import Roofline
from gpuprof_nb.render.html import esc
from gpuprof_nb.render.sections import Section


def roofline_section(roofline: Roofline) -> Section:
    return Section("Roofline", roofline.note, esc(roofline.note))
