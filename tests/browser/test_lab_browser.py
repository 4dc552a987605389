"""The lab panel in a real browser: JupyterLab on 127.0.0.1, Debian's Chromium driven by Playwright.

Skipped, with the reason shown, where Chromium or Playwright is missing (``make setup-browser`` installs them).
Saves ``artifacts/lab_browser.png``.
"""

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (make setup-browser)")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                                      reason="Debian chromium not installed (make setup-browser)")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyter(tmp_path):
    from papermill.iorw import load_notebook_node, write_ipynb
    from papermill.parameterize import parameterize_notebook

    nb = parameterize_notebook(load_notebook_node(str(ROOT / "notebooks" / "lab.ipynb")),
                               {"world_size": 3, "steps": 1_000_000, "autostart": False, "wait": False})
    write_ipynb(nb, str(tmp_path / "lab.ipynb"))
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--ip", "127.0.0.1", "--port", str(port), "--no-browser", "--allow-root",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=open(tmp_path / "jupyter.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "JupyterLab did not start"
            time.sleep(0.3)
    yield f"http://127.0.0.1:{port}/lab/tree/lab.ipynb?token={token}"
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def widget_button(page, label):
    """An ipywidgets button by its label (an icon may precede it; JupyterLab's own buttons are not matched)."""
    return page.locator(".widget-button", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))


def figure_count(page, trace_name):
    return page.evaluate("""name => {
        const plots = [...document.querySelectorAll('.js-plotly-plot')];
        for (const gd of plots) {
            const t = (gd.data || []).find(t => t.name === name);
            if (t) return (t.x || []).length;
        }
        return -1; }""", trace_name)


def panel_status(page):
    """The panel's status line ("running — generation 0, ..."), or "" before it shows."""
    return page.evaluate("""() => {
        const line = document.querySelector('.wb-lab-status');
        return line ? line.innerText.trim() : ""; }""")


def test_lab_panel_live_curve_and_kill(jupyter):
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            errors = []  # the page's own errors, shown with a failure
            page.on("pageerror", lambda e: errors.append(str(e)[:300]))
            page.on("console", lambda m: errors.append(m.text[:300]) if m.type == "error" else None)
            page.goto(jupyter, timeout=90_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            select = page.locator(".jp-Dialog").get_by_role("button", name="Select", exact=True)
            try:  # a fresh JupyterLab may ask which kernel to start
                select.wait_for(timeout=10_000)
                select.click()
            except playwright_api.TimeoutError:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
            page.locator(".jp-Notebook .jp-Cell").first.click()
            for _ in range(page.locator(".jp-Notebook .jp-Cell").count()):
                page.keyboard.press("Shift+Enter")
            start = widget_button(page, "Start")
            start.wait_for(timeout=90_000)
            start.click()
            deadline = time.monotonic() + 120
            while not panel_status(page).startswith("running"):  # the ranks started
                assert time.monotonic() < deadline, f"the run did not start: {panel_status(page)!r}; {errors[-5:]}"
                time.sleep(0.5)
            curve = page.locator(".js-plotly-plot").first  # watched as a user would: in view (cells out of view
            curve.wait_for(timeout=60_000)                  # are not rendered by JupyterLab's default windowing)
            curve.scroll_into_view_if_needed()
            deadline = time.monotonic() + 120
            while figure_count(page, "training loss") < 20:  # the live curve moves
                assert time.monotonic() < deadline, (f"the curve did not move: {figure_count(page, 'training loss')} "
                                                     f"points, status {panel_status(page)!r}; {errors[-5:]}")
                time.sleep(0.5)
            widget_button(page, "Kill 1").click()
            page.get_by_text("generation 1", exact=False).first.wait_for(timeout=60_000)
            deadline = time.monotonic() + 30
            while figure_count(page, "kill") < 1:
                assert time.monotonic() < deadline, "no kill marker in the figure"
                time.sleep(0.3)
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "lab_browser.png"), full_page=True)
            widget_button(page, "Stop").click()
            page.get_by_text("stopped", exact=False).first.wait_for(timeout=60_000)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "lab_browser_failure.png"), full_page=True)
            raise
        finally:
            browser.close()
