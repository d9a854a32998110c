"""The quickstart in a real JupyterLab, driven by headless Chromium (Debian's, never a download).

What a person would check after "Run All": the report's tabs are there and each one opens when
clicked, the top-ops table has rows, the timeline and roofline are drawn (inline SVG, shown,
with hover titles on their marks), nothing printed a traceback or a widget error, and in the
Dark theme the tables and the plots' text are still readable. Screenshots go to
build/screenshots/.

JupyterLab and the browser are started and stopped here (process group killed in `finally`).
With CI=true a missing or broken browser fails the test; elsewhere it is skipped with a reason.
"""

from __future__ import annotations

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
RUN_TIMEOUT_S = 240
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
    (root / "tests").mkdir()
    (root / "tests" / "data").symlink_to(REPO / "tests" / "data")
    settings = tmp / "settings"
    _set_theme(settings, "JupyterLab Light")
    _write_json(
        settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings",
        {"autosave": False},
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
        yield {"base": base, "settings": settings, "tmp": tmp}
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
    url = f"{lab['base']}/lab/tree/tutorials/{NOTEBOOK.name}"
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget")
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
    assert "Error displaying widget" not in body


def _check_reports(page: object, shot_prefix: str) -> dict[str, int]:
    """Click every tab of every report; return how many tables rows / images were seen."""
    reports = page.locator(".jp-OutputArea-output .gp-report")  # type: ignore[attr-defined]
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
            report.screenshot(path=str(SCREENSHOTS / f"{shot_prefix}-report{r}-{i}.png"))
    return seen


def _assert_readable(page: object, theme: str) -> None:
    reports = page.locator(".jp-OutputArea-output .gp-report")  # type: ignore[attr-defined]
    for r in range(reports.count()):
        report = reports.nth(r)
        tabs = report.locator(".gp-tab")
        for i in range(tabs.count()):
            tabs.nth(i).click()
            results = report.evaluate(_JS_CONTRAST)
            assert results, f"{theme}: no visible text in report {r} tab {i}"
            low = [x for x in results if x["ratio"] < MIN_CONTRAST]
            assert not low, f"{theme}: text below {MIN_CONTRAST}:1 contrast: {low[:5]}"


def test_quickstart_in_jupyterlab(lab: dict[str, object], browser: object) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for theme, prefix in (("JupyterLab Light", "light"), ("JupyterLab Dark", "dark")):
        _set_theme(lab["settings"], theme)  # type: ignore[arg-type]
        page = _open_and_run(browser, lab, prefix)
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
            _assert_readable(page, theme)
            page.locator(".gp-report").first.locator(".gp-tab").first.click()  # type: ignore[attr-defined]
            page.screenshot(path=str(SCREENSHOTS / f"{prefix}-notebook.png"), full_page=False)
        finally:
            # Shut the kernel down so the second pass starts clean and nothing is left over.
            page.evaluate(  # type: ignore[attr-defined]
                "async () => { const p = window.jupyterapp.shell.currentWidget;"
                " if (p && p.sessionContext) await Promise.race(["
                " p.sessionContext.shutdown(), new Promise(r => setTimeout(r, 15000))]); }"
            )
            page.close()  # type: ignore[attr-defined]
