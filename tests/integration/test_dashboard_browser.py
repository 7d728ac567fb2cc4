"""The dashboard as a user meets it: a real Streamlit server, opened in headless Chromium.

``diagnose.dashboard.launch.start`` starts the server on the prefill demo session (127.0.0.1, a free port);
the overview must render the verdict and a plotly chart, and the other pages must be reachable by
their URL. The server is always stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnose.dashboard import launch
from tests.chromium import chromium

pytestmark = pytest.mark.integration

PREFILL = str(Path(__file__).resolve().parents[1] / "data" / "sessions" / "prefill_long_prompts_demo")
WAIT_S = 60


@pytest.fixture
def server() -> Iterator[str]:
    proc, url = launch.start([PREFILL])
    try:
        assert url.startswith("http://127.0.0.1:")
        yield url
    finally:
        launch.stop(proc)
        assert proc.poll() is not None, "the dashboard server was left running"


def _wait_for(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))
    return list(driver.find_elements(By.CSS_SELECTOR, css))


def _wait_for_text(driver: Any, text: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(lambda d: text in d.find_element(By.TAG_NAME, "body").text)
    return str(driver.find_element(By.TAG_NAME, "body").text)


def test_overview_renders_the_verdict_and_a_chart(server: str) -> None:
    driver: Any
    with chromium() as driver:
        driver.get(server)
        body = _wait_for_text(driver, "the bottleneck is")
        assert "prefill_ttft" in body
        assert "Capture health" in _wait_for_text(driver, "Capture health")
        plots = _wait_for(driver, ".js-plotly-plot")
        assert plots and plots[0].size["height"] > 100  # drawn, not an empty placeholder
        assert "Traceback" not in body


def test_requests_page_draws_its_charts(server: str) -> None:
    driver: Any
    with chromium() as driver:
        driver.get(f"{server}/requests")
        _wait_for_text(driver, "4 of 4 charts have data")
        body = _wait_for_text(driver, "Stage latency (ms)")  # a chart's title: drawn a moment after the caption
        assert "Traceback" not in body
        _wait_for(driver, ".js-plotly-plot")
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, WAIT_S).until(lambda d: len(d.find_elements("css selector", ".js-plotly-plot")) == 4)


def test_ctrl_c_stops_the_launcher_and_its_server() -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "diagnose.dashboard.launch", PREFILL], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the server answers
        assert line.startswith("Dashboard: http://127.0.0.1:") and line.rstrip().endswith("(Ctrl-C to stop)")
        url = line.split()[1]
        assert launch._healthy(url)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert not launch._healthy(url), "the Streamlit server outlived the launcher"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
