"""Reports render without a kernel, a widget manager or a CDN: nbconvert HTML (what nbviewer
serves too) and the bare mimebundle show the summary, the findings and the plots (inline SVG).

The slow test executes tutorials/01_quickstart.ipynb the way `jupyter nbconvert --execute`
does (nbclient, widget state stored: its default), converts it with nbconvert's HTMLExporter,
and reads the HTML back with a parser, looking only at what a browser would show (never inside
<script>, where a saved widget state would hide the same strings).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuprof_nb.render.bundle import report_bundle, tabbed_html
from gpuprof_nb.render.html import html_table
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.svg import plot_html, svg_open
from gpuprof_nb.render.svg import title as svg_title
from gpuprof_nb.render.widgets import WIDGET_MIME

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "tutorials" / "01_quickstart.ipynb"
VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "wbr"}
)


# -- a reader for the HTML a browser would show ------------------------------------------------


class ReportReader(HTMLParser):
    """Collect, per gpuprof_nb report found outside <script>/<style>: the tab labels, and per
    panel (data-section) its text, its <img src> values and its inline <svg>s (size and how
    many marks carry a hover <title>)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.reports: list[dict[str, object]] = []
        self._skip = 0  # inside script/style
        self._stack: list[tuple[str, str | None]] = []  # (tag, role) of open elements
        self._panel: dict[str, object] | None = None
        self._label: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag in ("script", "style"):
            self._skip += 1
        role = None
        if self._skip == 0 and tag == "div" and "gp-report" in classes:
            self.reports.append({"labels": [], "panels": []})
            role = "report"
        elif self._skip == 0 and self.reports and tag == "div" and "gp-panel" in classes:
            self._panel = {"section": a.get("data-section"), "text": [], "imgs": [], "svgs": []}
            self.reports[-1]["panels"].append(self._panel)  # type: ignore[attr-defined]
            role = "panel"
        elif self._skip == 0 and tag == "label" and "gp-tab" in classes:
            self._label = []
            role = "label"
        elif tag == "img" and self._panel is not None and self._skip == 0:
            self._panel["imgs"].append(a.get("src") or "")  # type: ignore[attr-defined]
        elif tag == "svg" and self._panel is not None and self._skip == 0:
            # A drawing nested in another (the utilisation strip in a timeline) is part of it.
            if not any(t == "svg" for t, _ in self._stack):
                svg = {
                    "width": int(a.get("width") or 0),
                    "height": int(a.get("height") or 0),
                    "titles": 0,
                }
                self._panel["svgs"].append(svg)  # type: ignore[attr-defined]
        elif tag == "title" and self._panel is not None and self._panel["svgs"]:
            self._panel["svgs"][-1]["titles"] += 1  # type: ignore[index]
        if tag not in VOID:
            self._stack.append((tag, role))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip = max(0, self._skip - 1)
        if tag in VOID or all(t != tag for t, _ in self._stack):
            return
        while self._stack:
            open_tag, role = self._stack.pop()
            if role == "panel":
                self._panel = None
            if role == "label" and self._label is not None:
                self.reports[-1]["labels"].append("".join(self._label).strip())  # type: ignore[attr-defined]
                self._label = None
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._label is not None:
            self._label.append(data)
        if self._panel is not None:
            self._panel["text"].append(data)  # type: ignore[attr-defined]


def read_reports(html: str) -> list[dict[str, object]]:
    reader = ReportReader()
    reader.feed(html)
    reader.close()
    return reader.reports


def panel_text(report: dict[str, object], section: str) -> str:
    for panel in report["panels"]:  # type: ignore[attr-defined]
        if panel["section"] == section:
            return " ".join(" ".join(panel["text"]).split())
    shown = [p["section"] for p in report["panels"]]  # type: ignore[attr-defined]
    raise AssertionError(f"no {section!r} panel; panels: {shown}")


def _tiny_svg() -> str:
    """A 100x50 drawing with one hovered mark, made with the report's own SVG helpers."""
    return (
        svg_open(100, 50, "tiny plot")
        + '<rect x="10" y="10" width="80" height="30">'
        + svg_title("gemm<float> & co")
        + "</rect></svg>"
    )


def _sections() -> list[Section]:
    return [
        Section("Summary", "median 3.41 ms", "<p>median 3.41 ms</p>"),
        Section(
            "Top ops",
            "void gemm<float, 128> 2.2 ms",
            html_table(
                ["op", "time"], [["void gemm<float, 128>", "2.2 ms"]], numeric=[False, True]
            ),
        ),
        Section("Timeline <cpu & gpu>", "timeline", plot_html(_tiny_svg())),
    ]


# -- the bundle itself -------------------------------------------------------------------------


def test_bundle_is_html_and_text_only_even_in_a_live_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    from gpuprof_nb.render.widgets import live_kernel

    start_ipython()
    # What ipykernel's shell looks like to the renderer: a shell with a kernel attached.
    monkeypatch.setattr(get_ipython(), "kernel", object(), raising=False)
    assert live_kernel()
    bundle = report_bundle("profile", _sections())
    assert set(bundle) == {"text/plain", "text/html"}
    assert WIDGET_MIME not in bundle
    assert set(report_bundle("p", _sections(), include=["text/plain"])) == {"text/plain"}
    assert set(report_bundle("p", _sections(), exclude=["text/html"])) == {"text/plain"}


def test_tabs_one_per_section_first_checked_and_escaped() -> None:
    sections = _sections()
    html = tabbed_html("profile <1>", sections)
    (report,) = read_reports(html)
    assert report["labels"] == [s.title for s in sections]
    assert [p["section"] for p in report["panels"]] == [s.title for s in sections]  # type: ignore[attr-defined]
    assert html.count('type="radio"') == len(sections)
    assert html.count(" checked") == 1
    assert "profile &lt;1&gt;" in html and "Timeline &lt;cpu &amp; gpu&gt;" in html
    assert "void gemm&lt;float, 128&gt;" in html and "<float" not in html
    # Without CSS (GitHub strips it) each panel still says what it is.
    assert panel_text(report, "Summary").startswith("Summary")
    assert "<script" not in html


def test_tabs_deterministic_and_distinct_per_report() -> None:
    a = tabbed_html("profile", _sections())
    assert a == tabbed_html("profile", _sections())
    names = set(re.findall(r'name="(gp-[0-9a-f]+)"', a))
    other = set(re.findall(r'name="(gp-[0-9a-f]+)"', tabbed_html("profile", _sections()[:2])))
    assert len(names) == 1 and len(other) == 1 and names != other


def test_nbconvert_shows_the_html_of_a_stored_output() -> None:
    """A notebook saved with the bundle as output (no kernel, no widget state) converts to
    HTML that shows every section, the numbers of the text form and the SVG with its
    hover title."""
    import nbformat
    from nbconvert import HTMLExporter

    bundle = report_bundle("profile", _sections())
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("report")
    cell.outputs = [nbformat.v4.new_output("execute_result", data=bundle, execution_count=1)]
    nb.cells = [cell]
    html, _ = HTMLExporter().from_notebook_node(nb)
    (report,) = read_reports(html)
    assert panel_text(report, "Summary").endswith("median 3.41 ms")
    assert "void gemm<float, 128> 2.2 ms" in panel_text(report, "Top ops")
    (svg,) = [s for p in report["panels"] for s in p["svgs"]]  # type: ignore[attr-defined]
    assert (svg["width"], svg["height"], svg["titles"]) == (100, 50, 1)
    assert "<title>gemm&lt;float&gt; &amp; co</title>" in html
    assert "html-manager" not in html


def live_view_notebook(with_state: bool) -> object:
    """A notebook whose one cell displayed `report.widget()` of a real trace: the outputs
    and, with `with_state`, the widget state nbclient saves (`nbconvert --execute`)."""
    import ipywidgets as widgets
    import nbformat
    from IPython.display import display
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    import gpuprof_nb

    start_ipython()
    trace = REPO / "tests" / "data" / "planted_cpu" / "dataloader.json.gz"
    report = gpuprof_nb.analyze(gpuprof_nb.load_trace(trace))
    with capture_output() as captured:
        display(report.widget())
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("display(report.widget())")
    cell.outputs = [nbformat.v4.new_output("display_data", data=o.data) for o in captured.outputs]
    nb.cells = [cell]
    if with_state:
        state = widgets.Widget.get_manager_state(drop_defaults=True)
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    return nb


@pytest.mark.parametrize("with_state", [False, True], ids=["no widget state", "widget state"])
def test_nbconvert_of_a_live_view_shows_the_static_report(with_state: bool) -> None:
    """A displayed live view exported by nbconvert: the static report is in the page (not
    only in a script), with or without the widget state that makes nbconvert load the
    widget manager from a CDN."""
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(live_view_notebook(with_state))
    (report,) = read_reports(html)
    assert "Summary" in report["labels"] and "Timeline" in report["labels"]
    assert "inside torch ops" in panel_text(report, "Timeline")
    assert ('type="application/vnd.jupyter.widget-view+json"' in html) == with_state
    if not with_state:
        assert "gpuprof_nb live view of" in html  # the widget's one-line text


# -- the executed quickstart ---------------------------------------------------------------------

_PROBE = """
import json as _json, statistics as _st
_t = {name}.timing
print("GPUPROF_PROBE " + _json.dumps({{
    "times_us": list(_t.times_us),
    "top_op": {name}.ops.rows[0].name,
    "findings": [f.title for f in {name}.diagnosis.findings],
}}))
"""


@pytest.fixture(scope="module")
def executed_quickstart(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    if not QUICKSTART.is_file():
        pytest.skip(f"{QUICKSTART} does not exist yet")
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    root = tmp_path_factory.mktemp("static")
    shutil.copytree(QUICKSTART.parent, root / "tutorials")
    (root / "tests").mkdir()
    (root / "tests" / "data").symlink_to(REPO / "tests" / "data")
    nb = nbformat.read(root / "tutorials" / QUICKSTART.name, as_version=4)
    match = None
    for cell in nb.cells:
        if cell.cell_type == "code":
            match = match or re.search(r"^%%gpuprofile\b.*?-o\s+(\w+)", cell.source, re.M)
    assert match, "the quickstart has no `%%gpuprofile -o NAME` cell to check"
    # The probe reads the result object after the notebook ran; it is not converted.
    probe = nbformat.v4.new_code_cell(_PROBE.format(name=match.group(1)))
    nb.cells.append(probe)
    # As `jupyter nbconvert --execute` does it: widget state stored (nbclient's default).
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(root / "tutorials")}},
    )  # fmt: skip
    client.execute()
    printed = "".join(o.text for o in probe.outputs if o.get("name") == "stdout")
    facts = json.loads(printed.split("GPUPROF_PROBE ", 1)[1].splitlines()[0])
    nb.cells.remove(probe)
    html, _ = HTMLExporter().from_notebook_node(nb)
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / "01_quickstart.static.html").write_text(html, encoding="utf-8")
    return {"nb": nb, "html": html, "facts": facts}


@pytest.mark.slow
def test_quickstart_html_shows_numbers_findings_and_plots(
    executed_quickstart: dict[str, object],
) -> None:
    from gpuprof_nb.render.units import fmt_us

    nb, html, facts = (executed_quickstart[k] for k in ("nb", "html", "facts"))
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]  # type: ignore[attr-defined]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert not [o for o in outputs if WIDGET_MIME in o.get("data", {})]
    assert "@jupyter-widgets/html-manager" not in html  # nothing needs a CDN to show

    reports = [r for r in read_reports(html) if "Summary" in r["labels"]]  # type: ignore[operator]
    assert reports, "no profile report in the converted HTML"
    report = reports[0]
    assert {"Diagnosis", "Summary", "Top ops", "Timeline", "Roofline"} <= set(report["labels"])  # type: ignore[arg-type]

    # The median computed here from the raw run times, formatted as the report formats it.
    median = fmt_us(statistics.median(facts["times_us"]))  # type: ignore[index]
    assert median in panel_text(report, "Summary"), (median, panel_text(report, "Summary"))
    assert facts["top_op"] in panel_text(report, "Top ops")  # type: ignore[index]
    diagnosis = panel_text(report, "Diagnosis")
    assert facts["findings"], "the quickstart's diagnosis has no findings"  # type: ignore[index]
    for title in facts["findings"]:  # type: ignore[index]
        # `names` show as <code>: the browser shows them without the backticks (and the
        # panel's text is read in pieces, a space between each).
        assert "".join(title.replace("`", "").split()) in "".join(diagnosis.split()), title

    for section in ("Timeline", "Roofline"):
        svgs = [s for p in report["panels"] if p["section"] == section for s in p["svgs"]]  # type: ignore[attr-defined]
        assert svgs, f"no drawing in the {section} panel"
        assert svgs[0]["width"] > 100 and svgs[0]["height"] > 100, (section, svgs[0])
        assert svgs[0]["titles"] >= 1, (section, svgs[0])  # marks have hover titles
        # Each drawing has its twin for viewers that strip inline SVG: an SVG image, no PNG.
        imgs = [s for p in report["panels"] if p["section"] == section for s in p["imgs"]]  # type: ignore[attr-defined]
        assert len(imgs) == len(svgs), (section, len(imgs), len(svgs))
        assert all(i.startswith("data:image/svg+xml;base64,") for i in imgs), section


def test_style_takes_colours_from_the_frontend_theme() -> None:
    """Every colour in the report CSS comes from the frontend's theme variables (JupyterLab
    first, VS Code second) or is inherited; only plots keep a white card (matplotlib draws
    black on white)."""
    from gpuprof_nb.render.html import STYLE

    rules = re.findall(r"([^{}]+)\{([^{}]*)\}", STYLE.replace("@supports selector(:has(a)) {", ""))
    checked = 0
    for selector, body in rules:
        for prop, value in re.findall(r"(?:^|;)\s*([\w-]+)\s*:\s*([^;]+)", body):
            if prop not in ("color", "background", "background-color"):
                continue
            value = " ".join(value.split())
            if selector.strip() == ".gpuprof img":
                assert value == "white"
                continue
            checked += 1
            assert value in ("inherit", "transparent") or value.startswith("var(--jp-"), (
                selector.strip(),
                prop,
                value,
            )
            if value.startswith("var(--jp-"):
                assert "var(--vscode-" in value, (selector.strip(), value)
    assert checked >= 8


def test_style_shows_every_tab_of_the_longest_report_and_degrades_without_has() -> None:
    from gpuprof_nb.render.html import STYLE

    guard = STYLE.index("@supports selector(:has(a))")
    # Hiding panels happens only inside the guard: no :has(), no hiding, all sections show.
    assert STYLE.index(".gp-panel { display: none; }") > guard
    shown = set(map(int, re.findall(r"\.gp-panel:nth-of-type\((\d+)\)", STYLE)))
    assert shown == set(range(1, len(shown) + 1)) and len(shown) >= 6
