"""report.widget(): a live ipywidgets Tab whose Top ops tab re-sorts from a dropdown."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

widgets = pytest.importorskip("ipywidgets")

import gpuprof_nb  # noqa: E402
from gpuprof_nb.analysis.ops import top_ops  # noqa: E402
from gpuprof_nb.render.profile import profile_sections  # noqa: E402

TRACE = (
    Path(__file__).parents[1]
    / "data"
    / "h100_bert_small"
    / "gaunernst_bert-small-uncased__1016001.json.gz"
)


def first_op_name(markup: str) -> str:
    """The op name in the first body row of the Top ops table."""
    body = markup.split("<tbody>", 1)[1]
    cell = body.split("<td", 2)[1]
    return html.unescape(cell.split(">", 1)[1].split("</td>", 1)[0])


def test_widget_tabs_and_resort() -> None:
    report = gpuprof_nb.analyze(gpuprof_nb.load_trace(TRACE))
    box = report.widget()
    tab = box.children[1]
    assert isinstance(tab, widgets.Tab)
    assert list(tab.titles) == [s.title for s in profile_sections(report)]
    assert list(tab.titles)[:3] == ["Diagnosis", "Summary", "Top ops"]
    ops_tab = tab.children[list(tab.titles).index("Top ops")]
    dropdown, table = ops_tab.children
    assert dropdown.value == report.ops.sort_key == "self_device_us"
    assert first_op_name(table.value) == report.ops.rows[0].name

    dropdown.value = "calls"
    expected = top_ops(report.trace, n=report.top, sort="calls").rows[0].name
    assert first_op_name(table.value) == expected
    assert expected != report.ops.rows[0].name  # the re-sort really changed the table


def test_ops_caption_shows_device_time_no_op_launched() -> None:
    # a100_event_sync: a spin kernel launched outside any op (36 of 51 us, worked out by
    # hand in tests/analysis/test_ops.py) must not vanish from the Top ops tab.
    path = next((Path(__file__).parents[1] / "data" / "a100_event_sync").glob("*.json*"))
    report = gpuprof_nb.analyze(gpuprof_nb.load_trace(path))
    assert report.ops.unattributed_device_us > 0
    from gpuprof_nb.render.profile import ops_section
    from gpuprof_nb.render.units import fmt_us

    section = ops_section(report.ops)
    shown = f"{fmt_us(report.ops.unattributed_device_us)} of device time was launched outside"
    assert shown in section.text and shown in html.unescape(section.html)


def test_timeline_tab_saves_the_trace_for_perfetto(tmp_path, monkeypatch) -> None:
    """The button writes the whole trace next to the notebook; it loads back as the same
    trace, and the line under the button names the file and links Perfetto's UI."""
    monkeypatch.chdir(tmp_path)
    report = gpuprof_nb.analyze(gpuprof_nb.load_trace(TRACE))
    tab = report.widget().children[1]
    timeline = tab.children[list(tab.titles).index("Timeline")]
    (button, status), _ = timeline.children[0].children, timeline.children[1]
    button.click()
    (saved,) = tmp_path.glob("gpuprof-trace-*.json.gz")
    again = gpuprof_nb.load_trace(saved)
    assert (len(again.ops), len(again.kernels)) == (
        len(report.trace.ops),
        len(report.trace.kernels),
    )
    assert saved.name in status.value and "https://ui.perfetto.dev" in status.value


def test_displayed_widget_carries_the_static_report_beside_it() -> None:
    """Displaying the live view publishes the widget view, then the static report (which its
    own style hides while the widget is drawn): an export or a closed kernel still shows
    the report, and the widget's own text is one line, not a VBox's repr."""
    from IPython.display import display
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    from gpuprof_nb.render.widgets import FALLBACK_NOTE, WIDGET_MIME

    start_ipython()
    report = gpuprof_nb.analyze(gpuprof_nb.load_trace(TRACE))
    with capture_output() as captured:
        display(report.widget())
    live, static = (o.data for o in captured.outputs)
    assert WIDGET_MIME in live and "text/html" not in live
    assert live["text/plain"].startswith("<gpuprof_nb live view of 'gpuprof_nb profile'")
    assert set(static) == {"text/html", "text/plain"}
    assert static["text/plain"] == report._repr_mimebundle_()["text/plain"]
    html_ = static["text/html"]
    assert 'class="gp-widget-fallback"' in html_ and html.escape(FALLBACK_NOTE) in html_
    assert ":has(.widget-box) + .jp-OutputArea-child:has(.gp-widget-fallback)" in html_
    assert report._repr_mimebundle_()["text/html"] in html_
