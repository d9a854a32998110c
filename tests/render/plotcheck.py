"""How the report embeds a plot (render/svg.plot_html), read back: each plot is an inline SVG
in a hidden <details class="gp-plot"> followed by an <img class="gp-plot-img"> whose data URI
holds the same drawing made standalone (svg.image_svg)."""

from __future__ import annotations

import base64
import re

from gpuprof_nb.render import svg

_PLOT = re.compile(
    r'<details class="gp-plot" hidden="hidden" style="display:none"><summary>[^<]*</summary>'
    r"(<svg .*?</svg>)</details>"
    r'<img class="gp-plot-img" alt="[^"]*"(?: width="\d+" height="\d+")? style="[^"]*" '
    r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"/>',
    re.S,
)


def embedded_plots(html: str) -> list[str]:
    """Return the inline SVG of every plot in `html`, after checking that each comes with its
    <img> twin (the same drawing, standalone) and that no SVG sits outside that wrapper."""
    found = _PLOT.findall(html)
    for inline, data in found:
        assert base64.b64decode(data).decode("utf-8") == svg.image_svg(inline)
    assert "<svg " not in _PLOT.sub("", html), "an <svg> outside the plot wrapper"
    return [inline for inline, _ in found]
