"""Progress: an IntProgress widget in a live kernel, text lines elsewhere, nothing when off."""

from __future__ import annotations

import io

from gpuprof_nb.render.progress import Progress


def test_widget_in_a_live_kernel(live_display):
    shown, updates = live_display.shown, live_display.updates
    bar = Progress(3)
    assert len(shown) == 1
    widget = bar._bar
    assert (widget.min, widget.max, widget.value) == (0, 3, 0)
    bar.start("fp32: baseline")
    assert bar._label.value == "1/3: fp32: baseline"
    bar.finish("fp32: baseline (reference)")
    bar.finish("bf16: dropped")
    assert widget.value == 2
    box = shown[0]
    bar.close()
    # The saved notebook keeps a text line, not a widget that needs the kernel.
    assert [u.data for u in updates] == ["ladder: 2/3 measurements done"]
    assert box.comm is None  # the widget was closed
    bar.close()  # idempotent


def test_text_lines_outside_a_kernel():
    out = io.StringIO()
    bar = Progress(2, stream=out)
    bar.start("fp32: baseline")
    bar.finish("fp32: baseline (1,000 samples/s)")
    assert out.getvalue() == "[1/2] fp32: baseline ...\n    fp32: baseline (1,000 samples/s)\n"


def test_silent_when_disabled():
    out = io.StringIO()
    bar = Progress(2, enabled=False, stream=out)
    bar.start("x")
    bar.finish("y")
    bar.close()
    assert out.getvalue() == "" and bar.done == 1
