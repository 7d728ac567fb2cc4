"""A session of a target that runs no Python (tests/data/sessions/native_busy_loop_no_python: a C program
attached for real): py-spy is skipped with its reason and remedy, and every reader of the session copes
with the missing profile — the pipeline, the terminal, Markdown, HTML and JSON reports, the tables and
every dashboard page say why there is no CPU profile instead of failing."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from diagnose import pipeline, tables
from diagnose.model import CaptureStatus
from diagnose.reports import figures, html, markdown, terminal

ROOT = Path(__file__).resolve().parents[2]
SESSION = str(ROOT / "tests" / "data" / "sessions" / "native_busy_loop_no_python")
PID = 22369
REASON = (f"process {PID} (busy) runs no Python interpreter (nor does any process of its tree): "
          "a Python profiler does not apply")
APP = ROOT / "dashboard" / "app.py"
PAGES = ("page_overview.py", "page_timeline.py", "page_requests.py", "page_cpu.py", "page_gpu.py",
         "page_memory.py")


def test_the_profiler_is_skipped_with_its_reason_and_the_rest_is_judged() -> None:
    d = pipeline.analyze([SESSION])
    spy = next(c for c in d.captures if c.collector == "py-spy")
    assert spy.status is CaptureStatus.SKIPPED and spy.reason == REASON
    assert f"perf top -p {PID}" in spy.remedy
    assert spy.notes == (f"pid {PID} (/tmp/ew/busy): runs no Python interpreter, not profiled",)
    ev = {e.key: e.value for e in d.evidence}
    assert ev["proc.cpu_cores_used"] > 0.3 and ev["threads.busy_count"] >= 1  # what remains is measured
    skipped = {s.code: s.reason for s in d.skipped}
    assert "runs no Python interpreter" in skipped["CPU001"]  # a rule that needed the profile says why


def test_the_capture_notes_survive_the_json_round_trip() -> None:
    d = pipeline.analyze([SESSION])
    doc = json.loads(d.to_json_text())
    spy = next(c for c in doc["captures"] if c["collector"] == "py-spy")
    assert spy["notes"] == [f"pid {PID} (/tmp/ew/busy): runs no Python interpreter, not profiled"]
    process = next(c for c in doc["captures"] if c["collector"] == "process")
    assert "notes" not in process  # only a capture that has notes carries the key


def test_every_report_says_why_there_is_no_profile() -> None:
    d = pipeline.analyze([SESSION])
    out = io.StringIO()
    terminal.render(d, file=out, width=400)
    for text in (out.getvalue(), markdown.render(d), html.render(tables.load(SESSION))):
        assert "runs no Python interpreter" in text and f"perf top -p {PID}" in text


def test_the_tables_and_every_chart_say_what_is_missing() -> None:
    data = tables.load(SESSION)
    assert "runs no Python interpreter" in data.missing["profile"]
    for page, charts in figures.PAGES.items():
        for chart in charts:
            got = chart(data)
            assert got.figure is not None or got.missing.strip(), (page, chart)


@pytest.mark.parametrize("page", PAGES)
def test_every_dashboard_page_opens(monkeypatch: pytest.MonkeyPatch, page: str) -> None:
    monkeypatch.setenv("DIAGNOSE_SESSIONS", os.pathsep.join([SESSION]))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    if page != "page_overview.py":
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    if page == "page_cpu.py":
        assert any("runs no Python interpreter" in str(i.value) for i in at.info)
