"""Notebooks in a real JupyterLab, driven in headless Chromium through Playwright.

Serves JupyterLab on 127.0.0.1 over copies of the notebooks. The explorer notebook runs,
its statistic is changed, and the heatmap must change (its colour-bar title and its cells); a cell is
clicked, and the site detail must show the site and step the hover named under the pointer;
the trajectory widget's quantity is changed and its figure must follow, and so must the
precision notebook's ladder widget when its statistic changes; the replay-and-bisect
notebook runs to the end and must show its verdicts and figures.
Screenshots go to ``$WORKBENCH_TEST_ARTIFACTS`` (default ``build/test-artifacts``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02-divergence-explorer.ipynb"
BISECT_NOTEBOOK = ROOT / "notebooks" / "07-replay-and-bisect.ipynb"
TRAJECTORY_NOTEBOOK = ROOT / "notebooks" / "01-quick-start.ipynb"
LADDER_NOTEBOOK = ROOT / "notebooks" / "03-precision-study.ipynb"
LAYOUTS_NOTEBOOK = ROOT / "notebooks" / "04-parallelism-layouts.ipynb"
CHROMIUM = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("WORKBENCH_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
BUSY_MS = 300_000
"""How long a wait on the kernel's work may take: generous, for a machine busy with other jobs (a first heatmap
took over 60 s beside two other test suites)."""
SENT_POINTS = """(() => { window.__sent = []; const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    try { const text = typeof data === 'string' ? data : new TextDecoder().decode(data);
          const m = text.match(/"event_type":"(plotly_[a-z]+)"/); if (m) window.__sent.push(m[1]); } catch (e) {}
    return send.call(this, data); }; })();"""
"""Keeps, in ``window.__sent``, the event type of each points message (click, hover) the page sends a kernel."""
SLOW_PLOTLY = """(() => { const start = %s, create = URL.createObjectURL.bind(URL), Blob0 = window.Blob;
  const slow = new WeakSet();
  window.Blob = class extends Blob0 { constructor(parts, options) { super(parts, options);
    if (parts && typeof parts[0] === 'string' && parts[0].startsWith(start)) slow.add(this); } };
  URL.createObjectURL = function (blob) { const url = create(blob); if (!slow.has(blob)) return url;
    return create(new Blob0([`const t = performance.now(); while (performance.now() - t < %d) {} ` +
                             `export * from "${url}"; export { default } from "${url}";`],
                            {type: 'text/javascript'})); }; })();"""
"""Makes plotly's widget code (the module anywidget evaluates from a blob: ``window.Blob`` sees its text) take
that many more milliseconds to evaluate, the page's one thread held as a busy machine's slow compile holds it:
anywidget gives a widget's module 2 s, and a widget whose module came later lost every message (the explorer's
figures were empty axes on a busy machine)."""
WIRE = """(() => { window.__largest = 0; window.__closes = 0; const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    const n = typeof data === 'string' ? new TextEncoder().encode(data).length : (data.byteLength ?? data.size ?? 0);
    window.__largest = Math.max(window.__largest, n);
    if (!this.__watched) { this.__watched = true; this.addEventListener('close', () => { window.__closes += 1; }); }
    return send.call(this, data); }; })();"""
"""Keeps the largest message the page sent a kernel (``window.__largest``, bytes) and counts the kernel
connections that closed (``window.__closes``)."""
MESSAGE_LIMIT = 1_000_000
"""The most bytes one message from the page to the kernel may hold: a click sends its point, not the figure."""
CLICK_SIZE = os.environ.get("WORKBENCH_CLICK_SIZE", "307x60")
"""Sites x steps of the synthetic pair the explorer's click is tried on: the demo's size (``make demo``: 307 sites,
60 steps); ``make click-at-scale`` tries 3000x600."""
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or BROWSER_PATH)")


def _port(info: Path) -> int | None:
    """The port in a Jupyter server's info file, or None while the file is missing or half written."""
    try:
        return int(json.loads(info.read_text())["port"])
    except (OSError, ValueError, KeyError):
        return None


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture
def jupyterlab(mini_demo: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    with _lab(mini_demo, tmp_path) as lab:
        yield lab


@contextlib.contextmanager
def _lab(runs: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """JupyterLab serving copies of the notebooks, its kernels reading the runs of ``runs``."""
    for notebook in (NOTEBOOK, BISECT_NOTEBOOK, TRAJECTORY_NOTEBOOK, LADDER_NOTEBOOK, LAYOUTS_NOTEBOOK):
        shutil.copy(notebook, tmp_path / notebook.name)
    settings = tmp_path / "settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "overrides.json").write_text(json.dumps({
        "@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"}}))
    token = "workbench-test"
    # A suite running beside this one must not take this server's port or its kernel's between their choice and
    # their bind: the server picks its own port (0) and says which in its info file, and the kernel talks over Unix
    # sockets in a runtime folder short enough for a socket's path.
    runtime = Path(tempfile.mkdtemp(prefix="jr-"))
    env = {**os.environ, "WORKBENCH_RUNS": str(runs), "JUPYTERLAB_SETTINGS_DIR": str(settings / "user"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(runtime)}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", "--port=0", "--allow-root",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--LabApp.expose_app_in_browser=True",
         f"--LabServerApp.app_settings_dir={settings}", "--KernelManager.transport=ipc"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("w"))
    info = runtime / f"jpserver-{server.pid}.json"
    try:
        _wait(lambda: _port(info) is not None, BUSY_MS / 1000, f"JupyterLab's info file {info.name}")
        base = f"http://127.0.0.1:{_port(info)}"
        _wait(lambda: _get(f"{base}/api/status?token={token}") is not None, BUSY_MS / 1000, "JupyterLab to start")
        yield base, token
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(runtime, ignore_errors=True)


@contextlib.contextmanager
def _notebook_running(jupyterlab, notebook: Path, height: int, slow_plotly_ms: int = 0):  # type: ignore[no-untyped-def]
    """A Chromium page on ``notebook`` in JupyterLab, its kernel connected and every cell started; with
    ``slow_plotly_ms``, plotly's widget code loads that much later (``SLOW_PLOTLY``)."""
    from playwright.sync_api import sync_playwright

    base, token = jupyterlab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.add_init_script(SENT_POINTS)
            page.add_init_script(WIRE)
            if slow_plotly_ms:
                import plotly.graph_objects as go

                start = str(go.FigureWidget._esm)[:200]  # the first characters of plotly's widget code
                page.add_init_script(SLOW_PLOTLY % (json.dumps(start), slow_plotly_ms))
            page.goto(f"{base}/lab/tree/{notebook.name}?token={token}")

            def kernel_ready() -> bool:
                kernels = _get(f"{base}/api/kernels?token={token}")
                return bool(kernels) and all(k["execution_state"] == "idle" and k["connections"] >= 1
                                             for k in kernels)  # type: ignore[union-attr]
            _wait(kernel_ready, BUSY_MS / 1000, "the notebook's kernel to connect")
            page.wait_for_function("window.jupyterapp !== undefined", timeout=BUSY_MS)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            try:
                yield page
            except BaseException:  # what the page showed when a wait ran out: its screenshot and its text
                page.screenshot(path=str(ARTIFACTS / f"failed-{notebook.stem}.png"), full_page=True)
                text = page.locator(".jp-Notebook").inner_text(timeout=10_000)
                print(f"{notebook.name}: the page's text when the test failed (screenshot in "
                      f"{ARTIFACTS / f'failed-{notebook.stem}.png'}):\n{text[-3000:]}")
                raise
        finally:
            browser.close()


def test_explorer_reacts_to_a_control(jupyterlab) -> None:  # type: ignore[no-untyped-def]
    # plotly's widget code 3 s late: its figures must still come, and still answer (the busy machine's failure)
    with _notebook_running(jupyterlab, NOTEBOOK, height=1800, slow_plotly_ms=3000) as page:
        statistic = page.locator(".widget-dropdown", has=page.locator("label", has_text="statistic")).locator("select")
        statistic.wait_for(timeout=BUSY_MS)
        heatmap = page.locator(".js-plotly-plot").first
        page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=BUSY_MS)
        title = heatmap.locator(".cbtitle")
        page.wait_for_function("document.querySelector('.js-plotly-plot .cbtitle') !== null", timeout=BUSY_MS)
        before_title = title.text_content() or ""
        before_cells = heatmap.locator(".hm image, .heatmaplayer image").first.get_attribute("href") or ""
        assert "l2" in before_title
        # the first divergent site (the mini demo snapshots it at step 0) shows its snapshots' differences too
        _wait_for_text(page, ".js-plotly-plot .gtitle", "t.includes('element-wise differences of 1 snapshots')")

        statistic.select_option("max")
        page.wait_for_function(
            "document.querySelector('.js-plotly-plot .cbtitle') && "
            "document.querySelector('.js-plotly-plot .cbtitle').textContent.includes('max')", timeout=BUSY_MS)
        after_title = title.text_content() or ""
        after_cells = heatmap.locator(".hm image, .heatmaplayer image").first.get_attribute("href") or ""
        assert "max" in after_title and "l2" not in after_title
        assert before_cells and after_cells and before_cells != after_cells, "the heatmap's cells did not change"

        site, step = _click_a_heatmap_cell(page, ".workbench-explorer")
        page.screenshot(path=str(ARTIFACTS / "explorer-in-jupyterlab.png"), full_page=True)
        detail = [t for t in _plot_texts(page, ".gtitle") if "clicked at step" in t]
    assert len(detail) == 1 and detail[0].startswith(f"max of {site} (") and detail[0].endswith(f"at step {step}")


@pytest.fixture
def large_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two synthetic runs of ``CLICK_SIZE`` sites x steps that part a third of the way down, half-way through."""
    from workbench.store.synthetic import write_synthetic_run

    sites, steps = map(int, CLICK_SIZE.split("x"))
    root = tmp_path_factory.mktemp("large")
    write_synthetic_run(root / "a", steps=steps, sites=sites, seed=1)
    write_synthetic_run(root / "b", steps=steps, sites=sites, seed=1, diverge_at=(steps // 2, sites // 3))
    return root


def test_the_explorer_click_survives_the_demos_size(large_pair: Path, tmp_path: Path) -> None:
    """A click on a heatmap of the demo's size (307 sites x 60 steps; 3000 x 600 with ``make click-at-scale``)
    updates the detail, no message from the page to the kernel comes near the size of the figure, and the kernel's
    connection never drops (a 45 MB report of plotly's defaults closed it: ``widgets.common.REPORTED_ARRAY_LIMIT``)."""
    with _lab(large_pair, tmp_path) as lab, _notebook_running(lab, NOTEBOOK, height=1800) as page:
        page.locator(".workbench-explorer .js-plotly-plot .cbtitle").first.wait_for(timeout=BUSY_MS)
        site, step = _click_a_heatmap_cell(page, ".workbench-explorer")
        largest, closes = page.evaluate("window.__largest"), page.evaluate("window.__closes")
        page.screenshot(path=str(ARTIFACTS / f"explorer-click-{CLICK_SIZE}.png"), full_page=True)
    print(f"\nexplorer of {CLICK_SIZE} sites x steps: clicked {site} at step {step}; largest page-to-kernel message "
          f"{largest:,} bytes (limit {MESSAGE_LIMIT:,}); kernel connections closed: {closes}")
    assert largest <= MESSAGE_LIMIT and closes == 0


def _click_a_heatmap_cell(page, root: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Click a cell of the heatmap of the explorer under ``root``, as a user clicks: the site and step the hover
    names under the pointer; waits until the detail's title shows that site and step."""
    heatmap = page.locator(f"{root} .js-plotly-plot").first
    _wait_for_text(page, f"{root} .js-plotly-plot .gtitle", "t.includes('clicked at step')")
    heatmap.scroll_into_view_if_needed()  # the notebook scrolls in its own panel; the pointer acts on what is seen
    box = heatmap.locator(".nsewdrag").first.bounding_box()
    assert box is not None
    x, y = box["x"] + 0.8 * box["width"], box["y"] + 0.6 * box["height"]
    # One click. It was lost on a busy machine (plotly's widget failed on the redraw's report sent in the same
    # message: tests/unit/test_widget_common.py); if it is lost again, the test says what the page did: plotly's
    # events and the points messages it sent to the kernel.
    page.evaluate(f"window.__events = []; const gd = document.querySelector({root + ' .js-plotly-plot'!r});"
                  "for (const e of ['click', 'hover', 'unhover']) gd.on('plotly_' + e, () => window.__events.push(e));")
    page.mouse.move(x, y)
    heatmap.locator(".hoverlayer .hovertext").first.wait_for(timeout=BUSY_MS)
    hover = heatmap.locator(".hoverlayer .hovertext").first.text_content() or ""
    match = re.search(r"step (\d+)(.+?)log10", hover) or re.search(r"^(.+?)first differs at step (\d+)", hover)
    assert match is not None, hover
    step, site = (match[1], match[2]) if hover.startswith("step") else (match[2], match[1])
    page.mouse.click(x, y)
    try:
        _wait_for_text(page, f"{root} .js-plotly-plot .gtitle",
                       f"t.includes('clicked at step {step}') && t.includes({site!r})")
    except Exception:
        print(f"the click on {site} at step {step} was not shown: plotly's events in the page "
              f"{page.evaluate('window.__events')}, points messages sent {page.evaluate('window.__sent')}, "
              f"titles {_plot_texts(page, '.gtitle')}")
        raise
    return site, step


def test_a_pair_matrix_click_opens_an_explorer_whose_click_shows_the_site(jupyterlab) -> None:  # type: ignore[no-untyped-def]
    with _notebook_running(jupyterlab, LAYOUTS_NOTEBOOK, height=2400) as page:
        matrix = page.locator(".workbench-pairs .js-plotly-plot").first
        matrix.locator(".nsewdrag").first.wait_for(timeout=BUSY_MS)
        page.wait_for_function("document.querySelector('.workbench-pairs .js-plotly-plot .hm image, "
                               ".workbench-pairs .js-plotly-plot .heatmaplayer image') !== null", timeout=BUSY_MS)
        box = matrix.locator(".nsewdrag").first.bounding_box()
        runs = matrix.locator(".ytick").count()
        assert box is not None and runs >= 2
        cell = 1 / runs
        for column in range(runs):  # along the bottom row, the first pair that diverges: what the hover names
            x, y = box["x"] + (column + 0.5) * cell * box["width"], box["y"] + (1 - 0.5 * cell) * box["height"]
            page.mouse.move(x, y)
            matrix.locator(".hoverlayer .hovertext").first.wait_for(timeout=BUSY_MS)
            hover = matrix.locator(".hoverlayer .hovertext").first.text_content() or ""
            found = re.match(r"(\S+) vs (\S+): first divergent step (\d+)", hover)
            if found:
                break
        assert found is not None, f"no diverging pair in the matrix's bottom row ({hover})"
        a, b = found[1], found[2]
        page.mouse.click(x, y)
        explorer = ".workbench-pairs .workbench-explorer"
        page.locator(f"{explorer} .js-plotly-plot .cbtitle").first.wait_for(timeout=BUSY_MS)
        selects = page.locator(f"{explorer} select")
        pair_shown = (selects.nth(0).input_value(), selects.nth(1).input_value())
        site, step = _click_a_heatmap_cell(page, explorer)
        page.screenshot(path=str(ARTIFACTS / "pair-matrix-explorer-in-jupyterlab.png"), full_page=True)
    assert pair_shown == (a, b)
    assert site and step.isdigit()


def test_replay_and_bisect_notebook_shows_its_verdicts(jupyterlab) -> None:  # type: ignore[no-untyped-def]
    with _notebook_running(jupyterlab, BISECT_NOTEBOOK, height=2400) as page:
        # The last cell bisects the nondeterministic pair; its verdict names the randperm.
        page.get_by_text("randperm", exact=False).first.wait_for(timeout=2 * BUSY_MS)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4",
                               timeout=BUSY_MS)
        text = page.locator(".jp-Notebook").inner_text()
        plots = page.locator(".js-plotly-plot").count()
        page.screenshot(path=str(ARTIFACTS / "replay-and-bisect-in-jupyterlab.png"), full_page=True)
    assert "the replay reproduces the original" in text
    assert "workbench/runner/faults.py" in text
    assert plots >= 4  # loss with anomalies, replay, two operation figures


def _plot_texts(page, selector: str) -> list[str]:  # type: ignore[no-untyped-def]
    return page.eval_on_selector_all(f".js-plotly-plot {selector}", "els => els.map(e => e.textContent)")


def _wait_for_text(page, selector: str, condition: str, timeout: float = BUSY_MS / 1000) -> None:  # type: ignore[no-untyped-def]
    """Until some element matching ``selector`` has a text for which the JS ``condition`` (on ``t``) holds."""
    page.wait_for_function(f"[...document.querySelectorAll({selector!r})].some(e => {{ const t = e.textContent; "
                           f"return {condition}; }})", timeout=timeout * 1000)


def test_the_trajectory_widget_reacts_to_its_quantity(jupyterlab) -> None:  # type: ignore[no-untyped-def]
    with _notebook_running(jupyterlab, TRAJECTORY_NOTEBOOK, height=2400) as page:
        quantity = page.locator(".widget-dropdown", has=page.locator("label", has_text="quantity")).locator("select")
        quantity.wait_for(timeout=BUSY_MS)
        _wait_for_text(page, ".js-plotly-plot .ytitle", "t === 'loss'")
        quantity.select_option("grad_norm")
        _wait_for_text(page, ".js-plotly-plot .ytitle", "t === 'grad_norm'")
        page.screenshot(path=str(ARTIFACTS / "trajectories-in-jupyterlab.png"), full_page=True)
        trajectory_titles = _plot_texts(page, ".ytitle")
    assert "grad_norm" in trajectory_titles


def test_the_ladder_widget_reacts_to_its_statistic(jupyterlab) -> None:  # type: ignore[no-untyped-def]
    with _notebook_running(jupyterlab, LADDER_NOTEBOOK, height=3000) as page:
        label = page.locator("label", has_text="statistic")
        statistic = page.locator(".workbench-ladder .widget-dropdown", has=label).locator("select")
        statistic.wait_for(timeout=BUSY_MS)
        _wait_for_text(page, ".workbench-ladder .js-plotly-plot .gtitle", "t.includes('relative difference of l2')")
        statistic.select_option("max")
        _wait_for_text(page, ".workbench-ladder .js-plotly-plot .gtitle", "t.includes('relative difference of max')")
        # the trajectory widget below shows the validation loss with both bands
        _wait_for_text(page, ".workbench-trajectories .js-plotly-plot .legendtext", "t === 'seed-to-seed spread'")
        legend = _plot_texts(page, ".legendtext")
        page.screenshot(path=str(ARTIFACTS / "ladder-in-jupyterlab.png"), full_page=True)
    assert "seed-to-seed spread" in legend and "noise floor (repeats)" in legend
