"""The issue's "done when", end to end: one `diagnose demo` run gives a Markdown summary for the ticket,
an HTML file, and a dashboard whose pages show real data from that run; `compare` shows the
before/after of the pathology and its `--fixed` variant.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.cli import main
from tests.unit.test_dashboard_pages import CHART_PAGES, app, open_page, texts

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_one_demo_run_gives_ticket_html_dashboard_and_compare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # as `make demo` runs it: no -o, a new session in the current folder
    assert main(["demo", "--pathology", "queueing", "--duration", "6"]) == 0
    (before,) = tmp_path.glob("diagnose-*[0-9]Z")
    err = capsys.readouterr().err
    assert f"diagnose dashboard {before.name}" in err and "--fixed" in err

    md = Path(f"{before}.md").read_text()
    assert md.startswith("# Diagnosis: `queueing`") and "## Request stages" in md and "| queue |" in md
    html = Path(f"{before}.html").read_text()
    assert 'id="diagnosis"' in html and "Plotly" in html and "queueing" in html

    at = app(monkeypatch, str(before))
    assert "the bottleneck is" in texts(open_page(at)) and "queueing" in texts(at)
    drawn = {}
    for page, script in CHART_PAGES.items():
        open_page(at, script)
        drawn[page] = len(at.get("plotly_chart"))
    # this run recorded py-spy, psutil, the stage log and /metrics (no GPU here): those pages have charts
    # (Requests: stage percentiles, slowest requests, cold start; no input sizes in this service)
    assert drawn["Timeline"] >= 1 and drawn["Requests"] >= 3 and drawn["CPU profile"] >= 1
    gpu_page = texts(open_page(at, CHART_PAGES["GPU"]))
    assert drawn["GPU"] == 0 and "NVML" in gpu_page and "nsys" in gpu_page  # says what is missing and how to get it

    # a second run (`make demo` again) is not refused: it writes a session of its own
    assert main(["demo", "--pathology", "queueing", "--fixed", "--duration", "6"]) == 0
    (after,) = set(tmp_path.glob("diagnose-*[0-9]Z")) - {before}
    assert Path(f"{after}.md").is_file() and Path(f"{after}.html").is_file()
    capsys.readouterr()
    # an -o that names an existing session is refused before anything starts
    assert main(["demo", "--pathology", "queueing", "-o", str(before)]) == 2
    err = capsys.readouterr().err
    assert "already holds a session" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert main(["compare", str(before), str(after), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["before_primary"] == "queueing" and doc["after_primary"] != "queueing"
    # the queueing findings are gone: QUE004 (the stage log's measured queue share) always, and at least one
    # more; QUE001 (in-flight over serving, a correlated finding) fires in the queueing run on a quiet machine
    # but not in every run under CI load, so it is not required here (test_demo_fixed holds the fixed run free
    # of it)
    lost = {f["code"] for f in doc["lost"]}
    assert "QUE004" in lost and len({c for c in lost if c.startswith("QUE")}) >= 2, doc["lost"]
    rows = {r["metric"]: r for r in doc["rows"]}
    assert rows["stage.queue_ms.p99"]["verdict"] == "better"
