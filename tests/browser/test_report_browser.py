"""The sweep report in a real browser: Debian's Chromium through Playwright, offline (every http(s) request is
refused), must draw every plotly figure of the page. Skipped where Chromium or Playwright is missing.
Saves ``artifacts/report_browser.png``."""

import os
import shutil
from pathlib import Path

import pytest
from sweep_fixtures import fake_sweep

from workbench.launch.sweeps.report import report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (make setup-browser)")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                                      reason="Debian chromium not installed (make setup-browser)")]


def test_report_renders_offline(tmp_path):
    fake_sweep(tmp_path / "sweep")
    page_path = report(tmp_path / "sweep", out=tmp_path / "report.html")
    expected = page_path.read_text().count('class="figure"')
    assert expected == 6
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            refused, errors = [], []
            page.route("http*://**", lambda route: (refused.append(route.request.url), route.abort()))
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(page_path.as_uri(), timeout=60_000)
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {expected}", timeout=60_000)
            drawn = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(
                gd => (gd.data || []).length)""")
            page.screenshot(path=str(ARTIFACTS / "report_browser.png"), full_page=True)
        finally:
            browser.close()
    assert len(drawn) == expected and all(n > 0 for n in drawn), drawn  # every figure has traces
    assert not errors, errors
    assert not refused, f"the page asked the network for {refused}"
