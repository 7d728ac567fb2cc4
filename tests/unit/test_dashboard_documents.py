"""The Fleet and Sweep dashboard pages, run by ``streamlit.testing.v1.AppTest``: empty, and with a document.

Documents are given as the launcher gives them (``DIAGNOSE_SESSIONS``, the command line's paths):
``diagnose dashboard fleet.json sweep.json SESSION``. The fleet document is the one ``diagnose.fleet``
writes for replicas judged by the real rules (the helpers of test_fleet.py); the sweep document the one
``diagnose.sweep`` writes for a one-worker ladder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose import fleet
from diagnose.dashboard import launch
from diagnose.errors import InputError
from tests.unit.test_dashboard_pages import HEALTHY, app, charts, frames, open_page, texts
from tests.unit.test_fleet import _data, _replica, _t4_for
from tests.unit.test_sweep import ONE_WORKER, _doc


@pytest.fixture
def fleet_json(tmp_path: Path) -> str:
    reps = [
        _replica("10.0.0.1:8000", waiting=0.0, running=3, rps=5.0, queue_ms=2, e2e_ms=400, pod="vllm-0"),
        _replica("10.0.0.2:8000", waiting=0.1, running=3, rps=5.2, queue_ms=3, e2e_ms=420, pod="vllm-1"),
        _replica("10.0.0.3:8000", waiting=60.0, running=32, rps=5.1, queue_ms=9000, e2e_ms=12000, pod="vllm-2"),
        fleet.Replica(key=("10.0.0.4:8000",), labels={"instance": "10.0.0.4:8000", "job": "vllm"}, up_ratio=0.0),
    ]
    data = _data(reps, dcgm=_t4_for("vllm-1"))
    for r in reps[:3]:
        r.rps_series = [(1000.0 + i, 5.0) for i in range(60)]
    fleet.judge_fleet(data)
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet.summarise(data)))
    return str(path)


@pytest.fixture
def sweep_json(tmp_path: Path) -> str:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(_doc(ONE_WORKER)))
    return str(path)


def test_fleet_page_without_a_document_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, HEALTHY), "page_fleet.py")
    assert at.title[0].value == "Fleet"
    assert any("diagnose fleet --prometheus URL --format json" in i.value for i in at.info)
    assert not charts(at) and not at.error


def test_fleet_page_with_a_document(monkeypatch: pytest.MonkeyPatch, fleet_json: str) -> None:
    at = open_page(app(monkeypatch, fleet_json, HEALTHY), "page_fleet.py")
    assert "Fleet verdict: bottleneck" in at.error[0].value
    assert [m.value for m in at.metric] == ["4", "3", str(len(json.loads(Path(fleet_json).read_text())["outliers"]))]
    assert len(charts(at)) == 2  # the replicas × findings map and the first replica's series
    replicas = next(f for f in frames(at) if "replica" in f.columns and "primary" in f.columns)
    assert set(replicas["primary"]) >= {"queueing", "gpu_compute", "healthy", "not judged"}
    outliers = next(f for f in frames(at) if "kind" in f.columns)
    assert {"queue", "throttling"} <= set(outliers["kind"])
    assert "Load balance:" in texts(at)
    # drill down: the replica that was down is not judged, and says why
    at.selectbox[0].set_value("10.0.0.4:8000").run()
    assert not at.exception
    assert any("up = 0" in i.value for i in at.info)
    at.selectbox[0].set_value("10.0.0.3:8000").run()
    findings = next(f for f in frames(at) if "code" in f.columns and "message" in f.columns)
    assert "QUE002" in set(findings["code"])


def test_sweep_page_without_a_document_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, HEALTHY), "page_sweep.py")
    assert at.title[0].value == "Sweep"
    assert any("diagnose sweep URL --format json" in i.value for i in at.info)
    assert not charts(at)


def test_sweep_page_with_a_document(monkeypatch: pytest.MonkeyPatch, sweep_json: str, fleet_json: str) -> None:
    at = open_page(app(monkeypatch, fleet_json, sweep_json), "page_sweep.py")
    assert "Knee: the knee is at 2 concurrent clients" in at.error[0].value
    assert len(charts(at)) == 1
    steps = next(f for f in frames(at) if "clients" in f.columns)
    assert list(steps["clients"]) == ["1", "2 ← knee", "4", "8", "16"]
    # a document-only dashboard: the session pages say that no session was given, without failing
    over = open_page(app(monkeypatch, sweep_json))
    assert "No session was given" in over.error[0].value


def test_an_unreadable_document_is_one_sentence_on_the_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    at = open_page(app(monkeypatch, str(bad)), "page_fleet.py")
    assert "is not readable JSON" in at.error[0].value


def test_the_launcher_accepts_documents_and_refuses_other_json(tmp_path: Path, fleet_json: str) -> None:
    assert launch.check_sessions([fleet_json]) == [fleet_json]
    other = tmp_path / "other.json"
    other.write_text('{"schema": "something/else"}')
    with pytest.raises(InputError) as err:
        launch.check_sessions([str(other)])
    assert "not a diagnose fleet or sweep document" in err.value.message
