from __future__ import annotations

import json
import os

import jsonschema
import pytest

from diagnose.model import (
    SCHEMA,
    Capture,
    CaptureStatus,
    Category,
    Confidence,
    Diagnosis,
    Evidence,
    EvidenceSet,
    Finding,
    Fix,
    InputRecord,
    Missing,
    Risk,
    Session,
    Severity,
    Skipped,
    Target,
    Window,
)

SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "analyzer", "diagnosis.schema.json")


def _schema() -> dict:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return json.load(fh)


def _finding(code: str, cat: Category, sev: Severity, impact: float) -> Finding:
    return Finding(code, code.lower(), cat, sev, Confidence.MEASURED, "t", "m", impact,
                   (Evidence("cpu.preprocess_share", 0.5, "ratio", "py-spy"),),
                   (Fix("do it", ("step",), Risk.SAFE),))


def test_evidence_set_returns_missing_with_reason_never_none() -> None:
    ev = EvidenceSet([Evidence("a.b", 1.0, "ratio", "x")])
    assert isinstance(ev.get("a.b"), Evidence)
    got = ev.get("c.d")
    assert isinstance(got, Missing) and not got and "c.d" in got.reason
    ev.explain_missing("gpu.", "nvml capture skipped: no GPU")
    assert ev.get("gpu.util_ratio").reason == "nvml capture skipped: no GPU"


def test_evidence_set_first_source_wins_and_keeps_alternatives() -> None:
    ev = EvidenceSet([Evidence("k", 1, "n", "first"), Evidence("k", 2, "n", "second")])
    assert ev.get("k").source == "first"
    assert [e.source for e in ev.all("k")] == ["first", "second"]
    assert ev.value("k") == 1.0
    assert ev.value("missing", 7.0) == 7.0


def test_primary_is_first_non_info_finding_or_null() -> None:
    info = _finding("HLT001", Category.OOM_EXTERNAL, Severity.INFO, 0.0)
    assert Diagnosis(findings=(info,)).primary is None
    real = _finding("CPU001", Category.CPU_PREPROCESSING, Severity.MAJOR, 0.5)
    assert Diagnosis(findings=(real, info)).primary is Category.CPU_PREPROCESSING


def test_diagnosis_json_round_trip_follows_schema() -> None:
    d = Diagnosis(
        findings=(_finding("CPU001", Category.CPU_PREPROCESSING, Severity.CRITICAL, 0.7),),
        skipped=(Skipped("QUE001", "needs `conn.inflight_mean`: none"),),
        inputs=(InputRecord("x.log", "oom", "ok"),),
        captures=(Capture("py-spy", CaptureStatus.PARTIAL, "stopped early", "", Window(1.0, 2.0), ("pyspy.raw",)),),
        target=Target(42, ("python", "serve.py")),
        window=Window(1.0, 11.0),
        evidence=(Evidence("x", float("nan"), "ratio", "s"),),
    )
    doc = json.loads(json.dumps(d.to_json()))
    jsonschema.validate(doc, _schema())
    assert doc["schema"] == SCHEMA and doc["primary"] == "cpu_preprocessing"
    assert doc["evidence"][0]["value"] is None  # NaN is not JSON
    back = Diagnosis.from_json(doc)
    assert back.findings[0].fixes[0].risk is Risk.SAFE
    assert back.captures[0].status is CaptureStatus.PARTIAL
    assert back.to_json()["findings"] == doc["findings"]


def test_from_json_rejects_other_schema() -> None:
    with pytest.raises(ValueError, match="diagnose/diagnosis/v1"):
        Diagnosis.from_json({"schema": "something/else"})


def test_session_manifest_round_trip() -> None:
    s = Session("/tmp/s", Target(1, ("python",)), Window(0.0, 5.0),
                (Capture("process", CaptureStatus.OK, files=("process.jsonl",)),))
    doc = s.manifest()
    assert doc["files"] == ["process.jsonl"]
    assert Session.from_manifest("/tmp/s", doc) == s
    with pytest.raises(ValueError):
        Session.from_manifest("/tmp/s", {"schema": "nope"})
