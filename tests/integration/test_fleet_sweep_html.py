"""The fleet and sweep HTML reports opened in headless Chromium with the network off: their charts draw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose import fleet
from diagnose.cli import main
from tests.chromium import chromium
from tests.unit.test_fleet import _data, _replica, _t4_for
from tests.unit.test_sweep import ONE_WORKER, _doc

pytestmark = pytest.mark.integration


def _open(path: Path, charts: int) -> tuple[str, int, list[str]]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium(offline=True) as driver:
        driver.get(path.as_uri())
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return document.querySelectorAll('.js-plotly-plot .main-svg').length")
            >= charts)
        marks = driver.execute_script(
            "return document.querySelectorAll('.js-plotly-plot .trace, .js-plotly-plot .hm').length")
        verdict = driver.find_element(By.ID, "verdict").text
        resources = driver.execute_script(
            "return performance.getEntriesByType('resource').map(function (e) { return e.name; })")
    return verdict, marks, [r for r in resources if not r.startswith("file:")]


def test_sweep_html_draws_throughput_and_p99_against_concurrency(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "sweep.json"
    doc.write_text(json.dumps(_doc(ONE_WORKER)))
    out = tmp_path / "sweep.html"
    assert main(["report", str(doc), "-o", str(out)]) == 0
    capsys.readouterr()
    verdict, marks, network = _open(out, 1)
    assert "Knee: the knee is at 2 concurrent clients" in verdict
    assert marks >= 3  # throughput, p99 and p50 traces
    assert network == []


def test_fleet_html_draws_the_map_and_the_replicas_series(tmp_path: Path) -> None:
    reps = [_replica("10.0.0.1:8000", waiting=0.0, running=3, rps=5.0, queue_ms=2, e2e_ms=400, pod="vllm-0"),
            _replica("10.0.0.3:8000", waiting=60.0, running=32, rps=5.1, queue_ms=9000, e2e_ms=12000, pod="vllm-2")]
    data = _data(reps, dcgm=_t4_for("vllm-0"))
    fleet.judge_fleet(data)
    out = tmp_path / "fleet.html"
    from diagnose.reports import fleet as render

    out.write_text(render.render_html(fleet.summarise(data)))
    verdict, marks, network = _open(out, 3)  # the map and two replicas' series
    assert verdict.startswith("Fleet verdict: bottleneck")
    assert marks >= 3 and network == []
