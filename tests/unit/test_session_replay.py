"""Real sessions recorded by `diagnose demo` replay to the same verdict (record first, parse after)."""

from __future__ import annotations

import os

import pytest

from diagnose import pipeline
from diagnose.model import CaptureStatus
from tests.conftest import DATA

CASES = {
    "cpu_preprocess_jpeg_demo": ("cpu_preprocessing", "CPU001"),
    "recompile_varying_batch_demo": ("recompilation", "CMP001"),
    "queueing_one_worker_demo": ("queueing", "QUE001"),
    "healthy_light_load_demo": (None, None),
    "prefill_long_prompts_demo": ("prefill_ttft", "TTF001"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_replayed_session_verdict(name: str) -> None:
    diagnosis = pipeline.analyze([os.path.join(DATA, "sessions", name)])
    category, code = CASES[name]
    assert (diagnosis.primary.value if diagnosis.primary else None) == category
    if code:
        assert diagnosis.findings[0].code == code
        assert diagnosis.findings[0].evidence
    assert all(c.status is CaptureStatus.OK for c in diagnosis.captures if c.collector != "nvml")
    keys = {e.key for e in diagnosis.evidence}
    assert {"cpu.preprocess_share", "workers.active_mean", "conn.inflight_mean", "host.cores"} <= keys


def test_missing_capture_makes_rules_skip_with_the_capture_reason(tmp_path) -> None:
    import json
    import shutil

    src = os.path.join(DATA, "sessions", "healthy_light_load_demo")
    dst = tmp_path / "s"
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for cap in manifest["captures"]:
        if cap["collector"] == "py-spy":
            cap["status"] = "failed"
            cap["reason"] = "py-spy was not permitted to read the process (ptrace denied)"
    (dst / "manifest.json").write_text(json.dumps(manifest))
    diagnosis = pipeline.analyze([str(dst)])
    reasons = {s.code: s.reason for s in diagnosis.skipped}
    assert "ptrace denied" in reasons["CPU001"]
    assert "ptrace denied" in reasons["CMP001"]
