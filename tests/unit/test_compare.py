"""Before/after comparison: metric rows from the evidence of either side, findings gained/lost/kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from diagnose import pipeline
from diagnose.model import Category, Confidence, Diagnosis, Evidence, Finding, Severity
from diagnose.reports import compare
from tests.conftest import DATA

SESSIONS = os.path.join(DATA, "sessions")


@pytest.fixture(scope="module")
def queueing_vs_healthy() -> compare.Comparison:
    before = pipeline.analyze([os.path.join(SESSIONS, "queueing_one_worker_demo")])
    after = pipeline.analyze([os.path.join(SESSIONS, "healthy_light_load_demo")])
    return compare.compare(before, after, "queueing", "healthy")


def _row(c: compare.Comparison, metric: str) -> compare.Row:
    found = [r for r in c.rows if r.metric == metric]
    assert len(found) == 1, [r.metric for r in c.rows]
    return found[0]


def test_recorded_sessions_the_queueing_finding_is_lost(queueing_vs_healthy: compare.Comparison) -> None:
    c = queueing_vs_healthy
    assert [f.code for f in c.lost] == ["QUE001"] and c.gained == [] and c.kept == []
    assert c.before_primary is Category.QUEUEING and c.after_primary is None
    inflight = _row(c, "conn.inflight_mean")
    assert inflight.before == 16.0 and inflight.after == pytest.approx(0.24)
    assert inflight.verdict == "better" and inflight.change == pytest.approx(0.24 / 16 - 1)
    assert _row(c, "conn.accept_queue_max").verdict == "better"  # 1 → 0
    assert _row(c, "proc.cpu_cores_used").verdict == "changed"  # no better direction for CPU used
    assert _row(c, "proc.rss_bytes").unit == "bytes"
    assert not any(r.metric.startswith("latency.") for r in c.rows)  # neither session measured latency


def test_recorded_sessions_render_as_text_markdown_and_json(queueing_vs_healthy: compare.Comparison) -> None:
    c = queueing_vs_healthy
    text = compare.render_text(c)
    assert "\x1b[" not in text  # no colour codes
    assert "Primary bottleneck queueing → none." in text
    assert "QUE001 queueing: Requests queue behind saturated workers (critical, impact 93 %)" in text
    assert "Findings new (only after): none" in text
    assert any("conn.inflight_mean" in ln and "-98 %" in ln and "better" in ln for ln in text.splitlines()), text
    md = compare.render_markdown(c)
    assert md.startswith("# Compare: queueing → healthy\n")
    assert "| `conn.inflight_mean` | 16 requests | 0.24 requests | -98 % | better |" in md
    assert "## Findings gone (only before)\n\n- QUE001 queueing:" in md
    assert "## Findings new (only after)\n\nNone." in md
    doc = compare.to_json(c)
    assert json.loads(json.dumps(doc)) == doc
    assert doc["schema"] == "diagnose/compare/v1"
    assert doc["before_primary"] == "queueing" and doc["after_primary"] is None
    assert [f["code"] for f in doc["lost"]] == ["QUE001"] and doc["gained"] == []
    row = next(r for r in doc["rows"] if r["metric"] == "conn.inflight_mean")
    assert row == {"metric": "conn.inflight_mean", "unit": "requests", "before": 16.0, "after": 0.24,
                   "change": -0.985, "better": "lower", "verdict": "better"}


def _ev(key: str, value: object, unit: str = "ms") -> Evidence:
    return Evidence(key, value, unit, "test")


def _finding(code: str, category: Category, impact: float, severity: Severity = Severity.MAJOR) -> Finding:
    return Finding(code=code, name=code.lower(), category=category, severity=severity,
                   confidence=Confidence.MEASURED, title=f"{code} title", message="m", impact=impact)


def test_rows_directions_missing_sides_and_findings() -> None:
    before = Diagnosis(
        findings=(_finding("TTF001", Category.PREFILL_TTFT, 0.7), _finding("QUE001", Category.QUEUEING, 0.3)),
        evidence=(_ev("latency.e2e_ms.p99", 4000.0), _ev("latency.ttft_ms.p50", 800.0),
                  _ev("throughput.rps", 1.0, "rps"), _ev("stage.prefill_ms.p99", 2000.0),
                  _ev("stage.queue_ms.p99", 50.0), _ev("gpu.util_ratio", 0.4, "ratio"),
                  _ev("cpu.top.other", [{"f": 1}], "list"), _ev("serving.engine", "vllm", ""),
                  _ev("unrelated.key", 5.0, "x")))
    after = Diagnosis(
        findings=(_finding("QUE001", Category.QUEUEING, 0.5, Severity.CRITICAL),
                  _finding("GPU001", Category.GPU_COMPUTE, 0.2)),
        evidence=(_ev("latency.e2e_ms.p99", 1000.0), _ev("latency.ttft_ms.p50", 790.0),
                  _ev("throughput.rps", 3.0, "rps"), _ev("stage.prefill_ms.p99", 500.0),
                  _ev("gpu.util_ratio", 0.9, "ratio"), _ev("latency.e2e_ms.p50", 300.0)))
    c = compare.compare(before, after, "before", "after")
    by = {r.metric: r for r in c.rows}
    assert set(by) == {"latency.e2e_ms.p50", "latency.e2e_ms.p99", "latency.ttft_ms.p50", "throughput.rps",
                       "stage.prefill_ms.p99", "stage.queue_ms.p99", "gpu.util_ratio"}
    assert [r.metric for r in c.rows][:3] == ["latency.e2e_ms.p50", "latency.e2e_ms.p99", "latency.ttft_ms.p50"]
    assert by["latency.e2e_ms.p99"].verdict == "better" and by["latency.e2e_ms.p99"].change == pytest.approx(-0.75)
    assert by["latency.ttft_ms.p50"].verdict == "same"  # 1 % apart: noise
    assert by["throughput.rps"].verdict == "better" and by["throughput.rps"].change == pytest.approx(2.0)
    assert by["gpu.util_ratio"].verdict == "better"
    assert by["stage.prefill_ms.p99"].verdict == "better"
    queue = by["stage.queue_ms.p99"]
    assert queue.after is None and queue.verdict == "n/a" and queue.change is None
    p50 = by["latency.e2e_ms.p50"]
    assert p50.before is None and p50.after == 300.0 and p50.verdict == "n/a"
    assert [f.code for f in c.lost] == ["TTF001"] and [f.code for f in c.gained] == ["GPU001"]
    assert [(b.impact, a.impact) for b, a in c.kept] == [(0.3, 0.5)]
    assert c.before_primary is Category.PREFILL_TTFT and c.after_primary is Category.QUEUEING
    md = compare.render_markdown(c)
    assert "Primary bottleneck prefill_ttft → queueing." in md
    assert "- QUE001 `queueing`: impact 30 % → 50 %, major → critical" in md
    assert "| `latency.e2e_ms.p99` | 4,000 ms | 1,000 ms | -75 % | better |" in md


def test_worse_and_zero_baselines() -> None:
    before = Diagnosis(findings=(), evidence=(_ev("latency.e2e_ms.p99", 100.0),
                                              _ev("conn.accept_queue_max", 0, "requests"),
                                              _ev("serving.preemptions", 0, "count")))
    after = Diagnosis(findings=(), evidence=(_ev("latency.e2e_ms.p99", 150.0),
                                             _ev("conn.accept_queue_max", 3, "requests"),
                                             _ev("serving.preemptions", 0, "count")))
    by = {r.metric: r for r in compare.compare(before, after).rows}
    assert by["latency.e2e_ms.p99"].verdict == "worse"
    assert by["conn.accept_queue_max"].change is None and by["conn.accept_queue_max"].verdict == "worse"
    assert by["serving.preemptions"].verdict == "same"


def test_chart_is_after_relative_to_before() -> None:
    before = Diagnosis(findings=(), evidence=(_ev("latency.e2e_ms.p99", 400.0), _ev("throughput.rps", 2.0, "rps"),
                                              _ev("stage.queue_ms.p99", 9.0)))
    after = Diagnosis(findings=(), evidence=(_ev("latency.e2e_ms.p99", 100.0), _ev("throughput.rps", 3.0, "rps")))
    fig = compare.chart(compare.compare(before, after, "v1", "v2"))
    assert [t.name for t in fig.data] == ["v1", "v2"]
    assert all(t.type == "bar" for t in fig.data) and fig.layout.barmode == "group"
    assert list(fig.data[0].x) == ["latency.e2e_ms.p99", "throughput.rps"]  # only metrics on both sides
    assert list(fig.data[0].y) == [1.0, 1.0]
    assert list(fig.data[1].y) == pytest.approx([0.25, 1.5])
    assert fig.data[1].customdata[0][2] == "better"


def test_chart_without_common_metrics_says_so() -> None:
    fig = compare.chart(compare.compare(Diagnosis(findings=()), Diagnosis(findings=())))
    assert len(fig.data) == 0
    assert "No metric was measured in both sessions." in fig.layout.annotations[0].text
    assert "No metric was measured in either session." in compare.render_text(
        compare.compare(Diagnosis(findings=()), Diagnosis(findings=())))


def test_labels_and_titles_print_as_written_not_as_markup(tmp_path) -> None:
    import shutil

    cmp = compare
    sessions_dir = Path(DATA) / "sessions"
    odd = tmp_path / "a[red]b[bold]"
    shutil.copytree(sessions_dir / "queueing_one_worker_demo", odd)
    before = pipeline.analyze([str(odd)])
    after = pipeline.analyze([str(sessions_dir / "healthy_light_load_demo")])
    out = cmp.render_text(cmp.compare(before, after, odd.name, "after[/bold]"))
    assert "a[red]b[bold]" in out and "after[/bold]" in out
