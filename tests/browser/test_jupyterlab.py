"""The reports in a real JupyterLab, driven by headless Chromium (Debian's, never a download).

- Trusted, what a person would check after "Run All" of the quickstart: the report's tabs are
  there and each one opens when clicked, the top-ops table has rows, the timeline and roofline
  are drawn (inline SVG, shown, with hover titles on their marks), nothing printed a
  traceback or a widget error; at 948 px and 1400 px of output no chart's labels overlap
  and nothing overflows the output (measured in the page); every legend entry has a swatch;
  in the Dark theme the tables and the plots' text are still readable (the quickstart as
  `nbconvert --execute` left it, trusted).
- Untrusted, what a colleague sees opening a notebook that `jupyter nbconvert --execute` ran
  (and one holding every other kind of report, a live view among them): the banner first,
  every section under its heading, every chart drawn as an image, no text of an inline SVG
  leaking, no tab bar, nothing overflowing at either width.
- The nbconvert HTML export of both, opened offline: tabs, charts, the live view's static
  copy.

Screenshots go to build/screenshots/ (GPUPROF_SCREENSHOTS=docs also copies the ones the
README shows to docs/screenshots/).

JupyterLab and the browser are started and stopped here (process group killed in `finally`).
With CI=true a missing or broken browser fails the test; elsewhere it is skipped with a reason.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# Override for debugging the harness against another notebook (copied into tutorials/).
NOTEBOOK = Path(os.environ.get("GPUPROF_BROWSER_NOTEBOOK", REPO / "tutorials/01_quickstart.ipynb"))
SCREENSHOTS = REPO / "build" / "screenshots"
DOC_SCREENSHOTS = REPO / "docs" / "screenshots"
RUN_TIMEOUT_S = 240
# The reports on the page (a live view's static copy is hidden while the widget is drawn).
SHOWN_REPORTS = ".jp-OutputArea-output .gp-report:visible"
# The output widths checked: JupyterLab's at its default layout on a 1280 px window, and wide.
OUTPUT_WIDTHS = (948, 1400)
# WCAG AA for normal text.
MIN_CONTRAST = 4.5


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    """Fail under CI (the browser test must run there), skip elsewhere."""
    if _in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sync_api() -> object:
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} not found (`make browser-deps` installs Debian's chromium)")
    try:
        from playwright import sync_api
    except ImportError:
        _unavailable("python playwright is not installed (pip install -e '.[browser]')")
    return sync_api


def _use_default_kernel(path: Path) -> None:
    """Point the copy at the server's own `python3` kernel, so JupyterLab never stops at a
    "Select Kernel" dialog (a tutorial saved elsewhere may name another kernelspec)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb.setdefault("metadata", {})["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python",
    }  # fmt: skip
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")


# Appended to the copy of the quickstart: the first report's live view, which the page must
# draw (hiding its static copy) while the kernel runs, and replace by that copy where not.
LIVE_VIEW_CELL = "display(report.widget())"


def _add_live_view(path: Path) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"].append(
        {"cell_type": "code", "execution_count": None, "id": "gpuprof-live-view",
         "metadata": {}, "outputs": [], "source": [LIVE_VIEW_CELL]}
    )  # fmt: skip
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")


_JS_LIVE_VIEW = """
() => {
  // The live view's cell: is the widget drawn, is its static copy shown?
  const cells = [...document.querySelectorAll('.jp-CodeCell')]
    .filter(c => c.querySelector('.jp-InputArea').innerText.includes('.widget()'));
  if (!cells.length) return null;
  const cell = cells[cells.length - 1];
  const drawn = [...cell.querySelectorAll('.widget-tab, .jupyter-widget-Tab, .lm-TabBar')]
    .some(e => e.checkVisibility());
  const copy = cell.querySelector('.gp-widget-fallback');
  return {drawn, copy: !!copy && copy.checkVisibility(),
          error: cell.innerText.includes('Error displaying widget')};
}
"""


def _raise_on_sigterm(signum: int, frame: object) -> None:
    # Turn a CI timeout's SIGTERM into an exception so the fixtures' `finally` still runs.
    raise SystemExit(128 + signum)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def _set_theme(settings_dir: Path, theme: str) -> None:
    _write_json(
        settings_dir / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings",
        {"theme": theme},
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, sync_api: object) -> Iterator[dict[str, object]]:
    """A private JupyterLab on a free 127.0.0.1 port, serving a tmp copy of the tutorials."""
    if not NOTEBOOK.is_file():
        _unavailable(f"{NOTEBOOK} does not exist yet")
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    # A copy, so autosave or a crash can never write outputs into the repository's notebooks;
    # data and the repo's other folders are linked read-only-by-convention at the same
    # relative places the tutorials use.
    shutil.copytree(NOTEBOOK.parent, root / "tutorials")
    if NOTEBOOK.parent != REPO / "tutorials":
        shutil.copy2(NOTEBOOK, root / "tutorials" / NOTEBOOK.name)
    _use_default_kernel(root / "tutorials" / NOTEBOOK.name)
    _add_live_view(root / "tutorials" / NOTEBOOK.name)
    (root / "tests").mkdir()
    (root / "tests" / "data").symlink_to(REPO / "tests" / "data")
    settings = tmp / "settings"
    _set_theme(settings, "JupyterLab Light")
    _write_json(
        settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings",
        {"autosave": False},
    )
    # Every cell rendered and laid out, off screen too, so the page can be measured.
    _write_json(
        settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
        {"windowingMode": "none"},
    )
    _write_json(
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_DATA_DIR=str(tmp / "data"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
        JUPYTER_PLATFORM_DIRS="1",
        KINETO_LOG_LEVEL="6",
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])),
    )
    port = _free_port()
    log = (tmp / "lab.log").open("wb")
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--ServerApp.terminals_enabled=False",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    proc = subprocess.Popen(
        cmd, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}; log:\n{_tail(tmp)}")
            try:
                with urllib.request.urlopen(f"{base}/api/status", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {base} in 90 s; log:\n{_tail(tmp)}")
            time.sleep(0.5)
        yield {"base": base, "settings": settings, "tmp": tmp, "root": root}
    finally:
        _stop(proc)
        log.close()
        signal.signal(signal.SIGTERM, previous)


def _tail(tmp: Path) -> str:
    text = (tmp / "lab.log").read_text(encoding="utf-8", errors="replace")
    return text[-3000:]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop JupyterLab and its kernels (one process group), politely first."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGINT:
            # jupyter_server asks for confirmation on the first ^C unless sent twice quickly.
            time.sleep(0.2)
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # Kernels started by the server share its process group; make sure none survives.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def browser(sync_api: object) -> Iterator[object]:
    manager = sync_api.sync_playwright().start()  # type: ignore[attr-defined]
    try:
        try:
            chromium = manager.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
            )
        except Exception as exc:  # playwright raises its own Error types
            _unavailable(f"headless Chromium did not start: {str(exc).splitlines()[0]}")
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        manager.stop()


# -- what runs in the page ---------------------------------------------------------------------

_JS_RUN_ALL = """
async (timeoutMs) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  const ready = (async () => {
    await panel.context.ready;
    await panel.sessionContext.ready;
    return 'ready';
  })();
  const late = new Promise(r => setTimeout(() => r('kernel not ready in time'), timeoutMs));
  const outcome = await Promise.race([ready, late]);
  if (outcome !== 'ready') return outcome + ' (dialogs: ' +
    [...document.querySelectorAll('.jp-Dialog')].map(d => d.innerText).join(' | ') + ')';
  app.commands.execute('notebook:run-all-cells');
  return 'ok';
}
"""

_JS_NO_SIDEBAR = """
() => { const s = window.jupyterapp.shell; if (s.collapseLeft) s.collapseLeft(); }
"""

_JS_STATE = """
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
    .map(p => p.textContent.trim());
  return {status: kernel ? kernel.status : 'none', prompts};
}
"""

_JS_CONTRAST = """
(root) => {
  function rgba(s) {
    const m = s.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  }
  function background(el) {
    // The first ancestor with an opaque-enough background is what the text sits on.
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0.5) return c;
    }
    return [255, 255, 255, 1];
  }
  function lum(c) {
    const f = v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  }
  // SVG text drawn in currentColor (axes, labels) is checked like HTML text.
  const cells = [...root.querySelectorAll('.gp-panel td, .gp-panel th, .gp-tab, h3, '
                                          + '.gp-panel svg text:not([fill])')]
    .filter(e => e.getClientRects().length > 0 && e.textContent.trim());
  return cells.map(e => {
    const fg = rgba(getComputedStyle(e).color), bg = background(e);
    const a = lum(fg), b = lum(bg);
    return {text: e.textContent.trim().slice(0, 40), fg: getComputedStyle(e).color,
            bg: `rgb(${bg.slice(0, 3).join(',')})`,
            ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)};
  });
}
"""


_JS_PLOT_SHOWN = """
(svg) => {
  // Shown (the CSS un-hides its wrapper), a real size on the page, and marks with titles.
  const r = svg.getBoundingClientRect();
  const titled = [...svg.querySelectorAll('circle, rect, path')]
    .filter(m => m.querySelector('title')).length;
  return r.width > 100 && r.height > 60 && titled > 0;
}
"""


def _open_and_run(browser: object, lab: dict[str, object], shot_prefix: str) -> object:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page.set_default_timeout(60_000)
    # ?reset: a fresh workspace, so no notebook opened by an earlier page comes back.
    url = f"{lab['base']}/lab/tree/tutorials/{NOTEBOOK.name}?reset"
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget")
    page.evaluate(_JS_NO_SIDEBAR)
    started = page.evaluate(_JS_RUN_ALL, 90_000)
    if started != "ok":
        page.screenshot(path=str(SCREENSHOTS / f"{shot_prefix}-no-kernel.png"))
        pytest.fail(f"could not run the notebook: {started}")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state: dict[str, object] = {}
    while time.monotonic() < deadline:
        state = page.evaluate(_JS_STATE)
        prompts = state["prompts"]
        done = all(re.fullmatch(r"\[\d+\]:", p) for p in prompts)  # type: ignore[union-attr]
        if done and state["status"] == "idle":
            break
        page.wait_for_timeout(500)
    else:
        page.screenshot(path=str(SCREENSHOTS / f"{shot_prefix}-timeout.png"), full_page=True)
        pytest.fail(f"cells still running after {RUN_TIMEOUT_S} s: {state}")
    page.wait_for_timeout(500)  # let images decode and layout settle
    return page


def _assert_no_errors(page: object) -> None:
    stderr = page.locator(  # type: ignore[attr-defined]
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
    )
    bad = [
        t for t in stderr.all_inner_texts()
        if "Traceback" in t or re.search(r"\b\w*Error\b", t)
    ]  # fmt: skip
    assert not bad, "error output in the notebook:\n" + "\n----\n".join(t[:2000] for t in bad)
    body = page.locator("body").inner_text()  # type: ignore[attr-defined]
    live = page.evaluate(_JS_LIVE_VIEW)  # type: ignore[attr-defined]
    if "Error displaying widget" in body:
        # Only a live view without its kernel may say so, and then its static copy shows.
        assert live and live["error"] and live["copy"], "a widget failed to display"


def _check_reports(page: object, shot_prefix: str) -> dict[str, int]:
    """Click every tab of every report; return how many tables rows / images were seen."""
    reports = page.locator(SHOWN_REPORTS)  # type: ignore[attr-defined]
    count = reports.count()
    assert count >= 1, "no gpuprof_nb report rendered in the notebook"
    seen = {"top_ops_rows": 0, "timeline_svg": 0, "roofline_svg": 0, "hotspots_svg": 0, "tabs": 0}
    for r in range(count):
        report = reports.nth(r)
        report.scroll_into_view_if_needed()
        tabs = report.locator(".gp-tab")
        panels = report.locator(".gp-panel")
        n = tabs.count()
        assert n >= 1 and panels.count() == n, f"report {r}: {n} tabs, {panels.count()} panels"
        for i in range(n):
            tabs.nth(i).click()
            title = tabs.nth(i).inner_text().strip()
            assert panels.nth(i).is_visible(), f"report {r}: tab {title!r} shows nothing"
            hidden = [j for j in range(n) if j != i and panels.nth(j).is_visible()]
            assert not hidden, f"report {r}: tab {title!r} leaves panels {hidden} visible"
            assert panels.nth(i).get_attribute("data-section") == title
            seen["tabs"] += 1
            panel = panels.nth(i)
            if title == "Top ops":
                seen["top_ops_rows"] += panel.locator("table tbody tr").count()
            plots = panel.locator("svg.gp-svg")
            drawn = sum(
                1 for k in range(plots.count())
                if plots.nth(k).evaluate(_JS_PLOT_SHOWN)
            )  # fmt: skip
            offs = panel.locator(".gp-plot-off")
            assert not any(offs.nth(k).is_visible() for k in range(offs.count())), (
                f"report {r}: tab {title!r} shows the note meant for viewers without SVG"
            )
            if title == "Timeline":
                seen["timeline_svg"] += drawn
            if title == "Roofline":
                seen["roofline_svg"] += drawn
            if title == "Hotspots":
                seen["hotspots_svg"] += drawn
            if r == 0:  # one report's tabs are enough to look at (screenshots cost seconds)
                report.screenshot(path=str(SCREENSHOTS / f"{shot_prefix}-report{r}-{i}.png"))
    return seen


def _assert_readable(page: object, theme: str) -> None:
    reports = page.locator(SHOWN_REPORTS)  # type: ignore[attr-defined]
    for r in range(reports.count()):
        report = reports.nth(r)
        tabs = report.locator(".gp-tab")
        for i in range(tabs.count()):
            tabs.nth(i).click()
            results = report.evaluate(_JS_CONTRAST)
            assert results, f"{theme}: no visible text in report {r} tab {i}"
            low = [x for x in results if x["ratio"] < MIN_CONTRAST]
            assert not low, f"{theme}: text below {MIN_CONTRAST}:1 contrast: {low[:5]}"


# -- notebooks as others leave them ------------------------------------------------------------

EXECUTED = "01_quickstart.executed.ipynb"
TRUSTED = "01_quickstart.trusted.ipynb"
SHAPES = "report_shapes.ipynb"


def _shapes_notebook() -> object:
    """A notebook, saved with outputs and never run here, holding a report of every other
    kind: memory, comparison, distributed run, ladder, hotspots by line, a Timeline with a
    strip of steps, will it fit (by category, predictions, a checkpointing plan), a
    transformer's Modules tab, a compiled run's Compile tab, and a displayed live view (with
    its widget state, as nbclient saves it)."""
    from concurrent.futures import ThreadPoolExecutor

    import ipywidgets as widgets
    import nbformat
    from IPython.display import display
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    import gpuprof_nb
    from gpuprof_nb.ladder.verdicts import BatchPoint, BatchSweep, LadderReport, RungResult

    data = REPO / "tests" / "data"
    planted = data / "planted_cpu"
    before = gpuprof_nb.analyze(gpuprof_nb.load_trace(planted / "dataloader.json.gz"))
    after = gpuprof_nb.analyze(gpuprof_nb.load_trace(planted / "launch_overhead.json.gz"))
    with ThreadPoolExecutor(2) as pool:
        run = gpuprof_nb.analyze_run(
            sorted((data / "gloo_run" / "slow_rank1").glob("*.json.gz")),
            executor=pool,
            progress=False,
        )

    def rung(name: str, status: str, step_us: float) -> RungResult:
        return RungResult(
            name, f"{name} settings", status, "", step_times_us=(step_us,) * 3,
            samples_per_step=32, peak_memory_bytes=2**28, final_loss=0.5, loss_drift=0.0,
        )  # fmt: skip

    ladder = LadderReport(
        rungs=(rung("fp32", "baseline", 1000.0), rung("bf16", "kept", 600.0)),
        three_run=None, device_name="cpu", memory_method="tensor bytes", steps=3, warmup=1,
        batch_size=32, seed=0, loss_tolerance=0.05, label="shapes",
        batch_sweep=BatchSweep("fp32", (BatchPoint(8, "ok", (100.0,) * 2),
                                        BatchPoint(16, "ok", (150.0,) * 2),
                                        BatchPoint(32, "oom", error="does not fit"))),
    )  # fmt: skip
    fit_main = gpuprof_nb.load_snapshot(data / "fit" / "tiny_b8.pickle")
    fit_peak = gpuprof_nb.analyze_memory(fit_main).peak_bytes
    shown = {
        "memory": gpuprof_nb.analyze_memory(
            gpuprof_nb.load_snapshot(data / "snapshots" / "leak_steps.pickle")
        ),
        "comparison": gpuprof_nb.compare(before, after),
        "run": run,
        "ladder": ladder,
        "bert": gpuprof_nb.analyze(
            gpuprof_nb.load_trace(
                data / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
            )
        ),  # fmt: skip
        "steps": gpuprof_nb.analyze(
            gpuprof_nb.load_trace(data / "ddp_nccl_sampled" / "sampled_rank-0.json.gz")
        ),  # fmt: skip
        # Will it fit: by category (a bar beside the timeline), predictions, the plan's code.
        "fit": gpuprof_nb.analyze_batches(
            fit_main,
            8,
            gpuprof_nb.load_snapshot(data / "fit" / "tiny_b4.pickle"),
            4,
            variable="batch_size",
            budget_bytes=int(fit_peak * 0.9),
            budget_source="--budget",
        ),
        # Modules (a transformer's tree), Compile, the critical path lane, the queue strip.
        "modules": gpuprof_nb.analyze(
            gpuprof_nb.load_trace(data / "gpu" / "modules_transformer.json.gz")
        ),  # fmt: skip
        "compiled": gpuprof_nb.analyze(
            gpuprof_nb.load_trace(data / "mi300_compile_triton" / "trace.json.gz")
        ),  # fmt: skip
    }
    nb = nbformat.v4.new_notebook()
    for n, (name, result) in enumerate(shown.items(), start=1):
        cell = nbformat.v4.new_code_cell(name)
        cell.outputs = [
            nbformat.v4.new_output("execute_result", data=result._repr_mimebundle_(),
                                   execution_count=n)
        ]  # fmt: skip
        nb.cells.append(cell)
    start_ipython()
    with capture_output() as captured:
        display(before.widget())
    cell = nbformat.v4.new_code_cell("display(before.widget())")
    cell.outputs = [nbformat.v4.new_output("display_data", data=o.data) for o in captured.outputs]
    nb.cells.append(cell)
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": widgets.Widget.get_manager_state()
    }
    return nb


@pytest.fixture(scope="module")
def notebooks(lab: dict[str, object]) -> dict[str, Path]:
    """The quickstart executed as `jupyter nbconvert --execute` does it (nbclient, widget
    state saved), saved untrusted and, signed with the lab's own secret, trusted; the
    notebook of other shapes; and the nbconvert HTML export of both."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter
    from nbformat.sign import NotebookNotary

    tutorials = Path(lab["root"]) / "tutorials"  # type: ignore[arg-type]
    nb = nbformat.read(tutorials / NOTEBOOK.name, as_version=4)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved]))
    try:
        NotebookClient(
            nb, timeout=600, kernel_name="python3",
            resources={"metadata": {"path": str(tutorials)}},
        ).execute()  # fmt: skip
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs
        if o.get("output_type") == "error"
    ]  # fmt: skip
    assert not errors, f"the quickstart failed under nbclient: {errors[:1]}"
    nbformat.write(nb, tutorials / EXECUTED)
    data_dir = Path(lab["tmp"]) / "data"  # type: ignore[arg-type]
    data_dir.mkdir(parents=True, exist_ok=True)
    # Trust goes by content: the signed copy differs from the untrusted one by a marker.
    signed = copy.deepcopy(nb)
    signed.metadata["gpuprof_browser_test"] = "the signed copy"
    NotebookNotary(data_dir=str(data_dir)).sign(signed)
    nbformat.write(signed, tutorials / TRUSTED)
    shapes = _shapes_notebook()
    nbformat.write(shapes, tutorials / SHAPES)
    html_dir = Path(lab["tmp"]) / "html"  # type: ignore[arg-type]
    html_dir.mkdir()
    out = {"executed": tutorials / EXECUTED, "shapes": tutorials / SHAPES}
    for name, node in (("executed", nb), ("shapes", shapes)):
        body, _ = HTMLExporter().from_notebook_node(node)
        (html_dir / f"{name}.html").write_text(body, encoding="utf-8")
        out[f"{name}_html"] = html_dir / f"{name}.html"
    return out


# -- measured in the page ------------------------------------------------------------------------

_JS_TRUSTED = """
() => {
  // Whether the cells that hold outputs are trusted (a cell without outputs always is).
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  const held = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type === 'code' && c.outputs.length) held.push(c.trusted);
  }
  return held.length ? held.every(Boolean) : null;
}
"""

_JS_OUTPUT_WIDTH = """
() => {
  const outs = [...document.querySelectorAll('.jp-OutputArea-output')]
    .filter(o => o.getClientRects().length);
  return outs.length ? Math.round(outs[0].getBoundingClientRect().width) : 0;
}
"""

_JS_UNTRUSTED = """
(report) => {
  // What an untrusted view shows of one report: the banner first, no tab bar, per panel the
  // charts (wrappers present, images drawn) and any text of an inline SVG that shows.
  const shown = e => e && e.checkVisibility();
  const text = report.innerText;
  const panels = [...report.querySelectorAll('.gp-panel')].map(p => {
    const wrappers = [...p.querySelectorAll('details.gp-plot')];
    const imgs = [...p.querySelectorAll('img.gp-plot-img')]
      .filter(i => shown(i) && i.complete && i.naturalWidth > 0
              && i.getBoundingClientRect().width > 50);
    // The text an inline SVG left behind (the sanitizer drops its tags, not their text).
    const leftover = w => [...w.childNodes].filter(n => n.nodeName !== 'SUMMARY')
      .map(n => n.textContent).join('').trim().slice(0, 60);
    const leaked = wrappers.filter(w => shown(w) || (leftover(w) && text.includes(leftover(w))))
      .length;
    const h = p.querySelector('h4.gp-h');
    return {section: p.dataset.section, charts: wrappers.length, drawn: imgs.length, leaked,
            heading: shown(h)};
  });
  const tabbar = report.querySelector('.gp-tabbar');
  return {
    bannerFirst: text.trim().startsWith('Static view:'),
    tabbar: shown(tabbar),
    inputs: [...report.querySelectorAll('input')].filter(shown).length,
    panels,
  };
}
"""

_JS_OVERFLOW = """
() => [...document.querySelectorAll('.jp-OutputArea-output, .jp-RenderedHTMLCommon')]
  .filter(o => o.getClientRects().length && o.querySelector('.gp-report'))
  .map(o => ({scroll: o.scrollWidth, client: o.clientWidth}))
  .filter(o => o.scroll > o.client + 1)
"""

_JS_LAYOUT = """
(report) => {
  // For each tab of a trusted report: click it, then measure what shows. Problems only:
  // a panel wider than the output, labels that overlap, a label over a dot, a legend entry
  // without its swatch, an inline chart not shown or its image twin shown.
  const problems = [];
  const boxes = el => el.getBoundingClientRect();
  const overlap = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5
                         && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const tabs = [...report.querySelectorAll('.gp-tab > input')];
  const panels = [...report.querySelectorAll('.gp-panel')];
  tabs.forEach((input, i) => {
    input.click();
    const panel = panels[i];
    const name = panel.dataset.section;
    if (panel.scrollWidth > panel.clientWidth + 1)
      problems.push(`${name}: panel ${panel.scrollWidth} px wide in ${panel.clientWidth} px`);
    for (const img of panel.querySelectorAll('img.gp-plot-img'))
      if (img.checkVisibility()) problems.push(`${name}: the image twin of a chart shows`);
    for (const svg of panel.querySelectorAll('svg.gp-svg')) {
      if (!svg.checkVisibility() || boxes(svg).width < 100) {
        problems.push(`${name}: a chart does not show`);
        continue;
      }
      if (boxes(svg).right > boxes(panel).right + 1)
        problems.push(`${name}: a chart overflows its panel`);
      // Text drawn in the plot (labels, roof and ridge names, cause names, tick labels).
      const texts = [...svg.querySelectorAll(':scope > text')]
        .filter(t => t.textContent.trim() && t.getClientRects().length);
      for (let a = 0; a < texts.length; a++)
        for (let b = a + 1; b < texts.length; b++)
          if (overlap(boxes(texts[a]), boxes(texts[b])))
            problems.push(`${name}: "${texts[a].textContent}" overlaps "${texts[b].textContent}"`);
      const dots = [...svg.querySelectorAll('circle.gp-point')].map(boxes);
      // A numbered label (its name in the key and in its hover title) may sit on a dot.
      for (const t of svg.querySelectorAll('text.gp-label')) {
        const own = [...t.childNodes].filter(c => c.nodeType === 3).map(c => c.nodeValue).join('');
        if (!/^\\d+$/.test(own.trim()) && dots.some(d => overlap(boxes(t), d)))
          problems.push(`${name}: label "${own}" covers a dot`);
      }
      for (const legend of svg.querySelectorAll('.gp-legend')) {
        for (const entry of legend.querySelectorAll(':scope > g')) {
          const swatch = entry.firstElementChild;
          const label = entry.querySelector('text');
          if (!swatch || swatch.tagName === 'text' || boxes(swatch).width < 3)
            problems.push(`${name}: legend entry "${label && label.textContent}" has no swatch`);
        }
      }
    }
  });
  if (tabs.length) tabs[0].click();
  return problems;
}
"""


def _set_output_width(page: object, width: int) -> int:
    """Resize the window until the notebook's outputs are `width` px wide; return it."""
    got = 0
    for _ in range(3):
        got = page.evaluate(_JS_OUTPUT_WIDTH)  # type: ignore[attr-defined]
        if got == width or not got:
            break
        size = page.viewport_size  # type: ignore[attr-defined]
        page.set_viewport_size({"width": size["width"] + width - got, "height": size["height"]})  # type: ignore[attr-defined]
        page.wait_for_timeout(400)
    return int(page.evaluate(_JS_OUTPUT_WIDTH))  # type: ignore[attr-defined]


def _open(browser: object, lab: dict[str, object], name: str) -> object:
    """Open a saved notebook in JupyterLab (no kernel work) and wait for its outputs."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page.set_default_timeout(60_000)
    page.goto(f"{lab['base']}/lab/tree/tutorials/{name}?reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-OutputArea-output .gp-report", timeout=90_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget")
    page.evaluate(_JS_NO_SIDEBAR)  # type: ignore[attr-defined]
    page.wait_for_timeout(1500)  # let images decode and layout settle
    return page


def _all_reports(page: object) -> object:
    """Scroll through the notebook so every output is rendered, then its reports."""
    page.evaluate(  # type: ignore[attr-defined]
        "async () => { const s = document.querySelector('.jp-WindowedPanel-outer')"
        " || document.querySelector('.jp-Notebook'); for (let y = 0; y < s.scrollHeight;"
        " y += 600) { s.scrollTop = y; await new Promise(r => setTimeout(r, 60)); } }"
    )
    page.wait_for_timeout(800)
    return page.locator(".jp-OutputArea-output .gp-report")  # type: ignore[attr-defined]


def _refresh_doc_screenshots(pairs: dict[str, str]) -> None:
    """With GPUPROF_SCREENSHOTS=docs, copy build/screenshots/<src> to docs/screenshots/<dst>."""
    if os.environ.get("GPUPROF_SCREENSHOTS") != "docs":
        return
    for src, dst in pairs.items():
        if (SCREENSHOTS / src).is_file():
            shutil.copy2(SCREENSHOTS / src, DOC_SCREENSHOTS / dst)


def test_untrusted_notebooks_show_every_chart_and_no_svg_text(
    lab: dict[str, object], browser: object, notebooks: dict[str, Path]
) -> None:
    """The quickstart as `nbconvert --execute` left it, and a notebook of every other kind of
    report, opened untrusted: in every report the banner comes first, the tab bar is gone,
    every section shows under its heading with each of its charts drawn as an image, no text
    of an inline SVG shows, and no output is wider than the page at 948 and 1400 px."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    seen_charts = 0
    for name in (EXECUTED, SHAPES):
        page = _open(browser, lab, name)
        try:
            trusted = page.evaluate(_JS_TRUSTED)  # type: ignore[attr-defined]
            assert trusted is False, f"{name} opened trusted: the test needs it untrusted"
            # A widget view is not "safe" untrusted: the live view's static copy shows.
            live = page.evaluate(_JS_LIVE_VIEW)  # type: ignore[attr-defined]
            assert live and live["copy"] and not live["drawn"], f"{name}: live view {live}"
            for width in OUTPUT_WIDTHS:
                assert _set_output_width(page, width) == width
                reports = _all_reports(page)
                assert reports.count() >= (2 if name == EXECUTED else 10), name  # type: ignore[attr-defined]
                for r in range(reports.count()):  # type: ignore[attr-defined]
                    got = reports.nth(r).evaluate(_JS_UNTRUSTED)  # type: ignore[attr-defined]
                    where = f"{name} report {r} at {width} px"
                    assert got["bannerFirst"], f"{where}: the banner is not first"
                    assert not got["tabbar"] and not got["inputs"], f"{where}: a tab bar shows"
                    for panel in got["panels"]:
                        assert panel["heading"], f"{where} {panel['section']}: no heading"
                        assert panel["leaked"] == 0, f"{where} {panel['section']}: SVG text shows"
                        assert panel["drawn"] == panel["charts"], (where, panel)
                        seen_charts += panel["charts"] if width == OUTPUT_WIDTHS[0] else 0
                wide = page.evaluate(_JS_OVERFLOW)  # type: ignore[attr-defined]
                assert not wide, f"{name} at {width} px: outputs overflow: {wide}"
                if width == OUTPUT_WIDTHS[0]:
                    shot = (
                        "untrusted-quickstart.png" if name == EXECUTED else "untrusted-shapes.png"
                    )
                    # The first report from its banner down.
                    reports.first.evaluate("e => e.scrollIntoView({block: 'start'})")  # type: ignore[attr-defined]
                    page.wait_for_timeout(200)  # type: ignore[attr-defined]
                    page.screenshot(path=str(SCREENSHOTS / shot))  # type: ignore[attr-defined]
        finally:
            page.close()  # type: ignore[attr-defined]
    # Timeline (strip + step), Roofline, Hotspots, memory, changes, heatmap, ladder (2)...
    assert seen_charts >= 12, seen_charts
    _refresh_doc_screenshots({"untrusted-quickstart.png": "untrusted-jupyterlab.png"})


def test_nbconvert_html_export_offline(browser: object, notebooks: dict[str, Path]) -> None:
    """`jupyter nbconvert --to html` of both notebooks, opened with the network cut: the tabs
    switch, every chart is drawn inline (its image twin hidden), the live view's static copy
    shows (its widget manager would come from a CDN), nothing overflows."""
    for name in ("executed_html", "shapes_html"):
        page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
        try:
            page.route(  # type: ignore[attr-defined]
                "**/*",
                lambda route: (
                    route.continue_() if route.request.url.startswith("file:") else route.abort()
                ),
            )
            page.goto(notebooks[name].as_uri())  # type: ignore[attr-defined]
            page.wait_for_timeout(800)
            reports = page.locator(".gp-report")  # type: ignore[attr-defined]
            assert reports.count() >= 2, name
            for r in range(reports.count()):
                report = reports.nth(r)
                if not report.is_visible():
                    continue
                problems = report.evaluate(_JS_LAYOUT)
                problems = [p for p in problems if "overlaps" not in p]  # measured in the lab
                assert not problems, f"{name} report {r}: {problems[:5]}"
            # Both hold a live view whose widget manager would come from a CDN.
            fallback = page.locator(".gp-widget-fallback")  # type: ignore[attr-defined]
            assert fallback.count() == 1 and fallback.is_visible(), name
        finally:
            page.close()  # type: ignore[attr-defined]


def _show_tab(report: object, title: str) -> bool:
    tabs = report.locator(".gp-tab")  # type: ignore[attr-defined]
    for i in range(tabs.count()):
        if tabs.nth(i).inner_text().strip() == title:
            tabs.nth(i).click()
            return True
    return False


def _report_shot(page: object, report: object, tab: str, name: str) -> None:
    """A screenshot of one report with `tab` open, at the current output width."""
    if _show_tab(report, tab):
        report.scroll_into_view_if_needed()  # type: ignore[attr-defined]
        page.wait_for_timeout(200)  # type: ignore[attr-defined]
        report.screenshot(path=str(SCREENSHOTS / name))  # type: ignore[attr-defined]


def test_quickstart_in_jupyterlab(
    lab: dict[str, object], browser: object, notebooks: dict[str, Path]
) -> None:
    """Trusted: Run All of the quickstart in the Light theme; then, in Dark, the quickstart
    as nbclient executed it, trusted. Tabs, tables, charts and their hover titles, no error,
    no overlap or overflow at 948 and 1400 px of output, readable text in both themes."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for theme, prefix in (("JupyterLab Light", "light"), ("JupyterLab Dark", "dark")):
        _set_theme(lab["settings"], theme)  # type: ignore[arg-type]
        if prefix == "light":
            page = _open_and_run(browser, lab, prefix)
        else:
            page = _open(browser, lab, TRUSTED)
            assert page.evaluate(_JS_TRUSTED) is True, f"{TRUSTED} opened untrusted"
        try:
            try:
                page.wait_for_function(  # type: ignore[attr-defined]
                    "t => document.body.dataset.jpThemeName === t", arg=theme, timeout=20_000
                )
            except Exception:
                shown = page.evaluate("() => document.body.dataset.jpThemeName")  # type: ignore[attr-defined]
                pytest.fail(f"asked for {theme!r}, JupyterLab shows {shown!r}")
            _assert_no_errors(page)
            seen = _check_reports(page, prefix)
            assert seen["top_ops_rows"] > 0, f"{theme}: no 'Top ops' tab with table rows: {seen}"
            assert seen["timeline_svg"] > 0, f"{theme}: no 'Timeline' tab with a plot: {seen}"
            assert seen["roofline_svg"] > 0, f"{theme}: no 'Roofline' tab with a plot: {seen}"
            # The quickstart's --stack cell: its lines and the icicle chart.
            assert seen["hotspots_svg"] > 0, f"{theme}: no 'Hotspots' tab with a plot: {seen}"
            live = page.evaluate(_JS_LIVE_VIEW)  # type: ignore[attr-defined]
            assert live is not None, f"{theme}: no live view cell"
            if prefix == "light":  # drawn by the running kernel: the static copy hides
                assert live["drawn"] and not live["copy"], f"{theme}: live view {live}"
            else:  # no kernel: drawn from the saved state, or else the static copy shows
                assert live["drawn"] != live["copy"], f"{theme}: live view {live}"
            page.set_viewport_size({"width": 1400, "height": 2400})  # type: ignore[attr-defined]
            reports = page.locator(SHOWN_REPORTS)  # type: ignore[attr-defined]
            for width in OUTPUT_WIDTHS:
                assert _set_output_width(page, width) == width
                for r in range(reports.count()):
                    problems = reports.nth(r).evaluate(_JS_LAYOUT)
                    assert not problems, f"{theme}, report {r} at {width} px: {problems[:6]}"
                wide = page.evaluate(_JS_OVERFLOW)  # type: ignore[attr-defined]
                assert not wide, f"{theme} at {width} px: outputs overflow: {wide}"
                if width == OUTPUT_WIDTHS[0]:
                    first, lines = reports.nth(0), reports.nth(1)
                    if prefix == "light":
                        _report_shot(page, first, "Timeline", "light-timeline.png")
                        _report_shot(page, lines, "Hotspots", "light-hotspots.png")
                    else:
                        _report_shot(page, first, "Summary", "dark-summary.png")
                        _report_shot(page, first, "Roofline", "dark-roofline.png")
            _assert_readable(page, theme)
            page.set_viewport_size({"width": 1400, "height": 1000})  # type: ignore[attr-defined]
            page.locator(".gp-report").first.locator(".gp-tab").first.click()  # type: ignore[attr-defined]
            page.locator(".gp-report").first.scroll_into_view_if_needed()  # type: ignore[attr-defined]
            page.screenshot(path=str(SCREENSHOTS / f"{prefix}-notebook.png"), full_page=False)
        finally:
            # Shut the kernel down so nothing is left over.
            page.evaluate(  # type: ignore[attr-defined]
                "async () => { const p = window.jupyterapp.shell.currentWidget;"
                " if (p && p.sessionContext) await Promise.race(["
                " p.sessionContext.shutdown(), new Promise(r => setTimeout(r, 15000))]); }"
            )
            page.close()  # type: ignore[attr-defined]
    _refresh_doc_screenshots(
        {
            "light-notebook.png": "quickstart-jupyterlab.png",
            "light-timeline.png": "quickstart-timeline.png",
            "light-hotspots.png": "hotspots.png",
            "dark-summary.png": "quickstart-summary-dark.png",
            "dark-roofline.png": "quickstart-roofline-dark.png",
        }
    )
