"""The HTML report opened in headless Chromium with the network off: it renders its charts, offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagnose.cli import main
from tests.chromium import chromium
from tests.conftest import DATA

pytestmark = pytest.mark.integration

PREFILL = os.path.join(DATA, "sessions", "prefill_long_prompts_demo")
CHARTS = 8  # findings impact, timeline, 4 request charts, CPU icicle, host memory over time


def test_html_report_renders_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    out = tmp_path / "report.html"
    assert main(["report", PREFILL, "-o", str(out)]) == 0
    capsys.readouterr()
    with chromium(offline=True) as driver:
        driver.get(out.as_uri())
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return document.querySelectorAll('.js-plotly-plot .main-svg').length")
            >= CHARTS)
        plots = driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
        assert plots == CHARTS
        # the charts drew their data: bars and lines, not empty axes
        marks = driver.execute_script(
            "return document.querySelectorAll('.js-plotly-plot .trace, .js-plotly-plot .slice').length")
        assert marks >= CHARTS
        verdict = driver.find_element(By.ID, "verdict").text
        assert "Verdict: the bottleneck is prefill_ttft" in verdict
        assert "Prefill is 68 % of time to first token" in verdict
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "No Nsight Systems timeline" in body  # what is missing is said on the page
        embedded = driver.execute_script(
            "return JSON.parse(document.getElementById('diagnosis').textContent).primary")
        assert embedded == "prefill_ttft"
        try:
            logs = driver.get_log("browser")
        except Exception:  # not every driver exposes the console log
            logs = []
        errors = [entry for entry in logs if entry.get("level") == "SEVERE"]
        assert errors == [], errors
        # nothing tried the network: every resource the page loaded is the file itself
        resources = driver.execute_script(
            "return performance.getEntriesByType('resource').map(function (e) { return e.name; })")
        assert [r for r in resources if not r.startswith("file:")] == []
