"""The single-file HTML report: self-contained (no URL to fetch), the diagnosis embedded, everything escaped."""

from __future__ import annotations

import base64
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import plotly.offline
import pytest

from diagnose import tables
from diagnose.model import Category, Confidence, Diagnosis, Finding, Severity, Target
from diagnose.reports import data, html, json_report
from tests.conftest import DATA

PREFILL = os.path.join(DATA, "sessions", "prefill_long_prompts_demo")
PLOTLY_JS = plotly.offline.get_plotlyjs()


class _Page(HTMLParser):
    """Tags, attributes and the contents of every <script>, by what the browser would see."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.attrs: list[tuple[str, str, str | None]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text: list[str] = []
        self._script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attrs.extend((tag, k, v) for k, v in attrs)
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, d: str) -> None:
        if self._script is not None:
            attrs, body = self.scripts[-1]
            self.scripts[-1] = (attrs, body + d)
        else:
            self.text.append(d)


def _parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    p.close()
    return p


@pytest.fixture(scope="module")
def prefill_html() -> str:
    return html.render(tables.load(PREFILL))


def test_plotly_is_inlined_once_and_nothing_is_fetched(prefill_html: str) -> None:
    assert prefill_html.count(PLOTLY_JS) == 1
    page = _parse(prefill_html)
    # no element loads anything: no src at all, links only to anchors on the page
    assert [a for a in page.attrs if a[1] in ("src", "srcset", "data", "poster", "action", "formaction")] == []
    hrefs = [v for tag, k, v in page.attrs if k == "href"]
    assert hrefs and all(v and v.startswith("#") for v in hrefs), hrefs
    assert not re.search(r"<(link|iframe|img|object|embed|base)\b", prefill_html.replace(PLOTLY_JS, ""), re.I)
    # and no URL anywhere outside the plotly bundle (whose code mentions a few, never fetched offline)
    rest = prefill_html.replace(PLOTLY_JS, "")
    assert not re.search(r"https?://|//cdn|@import|url\(", rest, re.I), re.findall(r".{40}https?://.{40}", rest)
    kinds = [a.get("type") for a, _ in page.scripts]
    assert kinds.count("text/javascript") == 1 and kinds.count(None) == 1  # plotly + the boot script


def test_the_diagnosis_json_is_embedded_and_reads_back(prefill_html: str) -> None:
    page = _parse(prefill_html)
    blocks = [body for attrs, body in page.scripts if attrs.get("id") == "diagnosis"]
    assert len(blocks) == 1
    doc = json.loads(blocks[0])
    d = tables.load(PREFILL).diagnosis
    assert doc == json.loads(json_report.render(d))
    assert Diagnosis.from_json(doc).primary is Category.PREFILL_TTFT


def test_verdict_findings_and_every_section(prefill_html: str) -> None:
    page = _parse(prefill_html)
    text = " ".join(" ".join(page.text).split())
    assert ("Verdict: the bottleneck is prefill_ttft (probability 92 %) — Prefill is 68 % of time to first token "
            "(671 ms of 984 ms).") in text
    assert "1. TTF001 prefill-bound-ttft — Time to first token is prefill-bound (primary)" in text
    assert "Stop long prefills from blocking (risk: safe)" in text
    ids = {v for tag, k, v in page.attrs if k == "id"}
    assert {"verdict", "overview", "timeline", "requests", "cpu-profile", "gpu", "memory", "health",
            "environment", "finding-TTF001"} <= ids
    charts = [body for attrs, body in page.scripts if attrs.get("data-chart")]
    assert len(charts) == 8  # impact, timeline, 4 request charts, icicle, host memory over time
    for body in charts:
        fig = json.loads(body)
        assert fig["data"] and "layout" in fig
    # what the session lacks is said where the chart would be
    assert "GPU busy vs idle: No Nsight Systems timeline: the session has no nsys capture." in text
    assert "GPU memory by use: No GPU memory breakdown" in text
    assert "Not shown: GPU rows: No NVML samples: no NVIDIA driver on this machine" in text
    assert "nvml skipped no NVIDIA driver on this machine (the NVML library libnvidia-ml.so.1" in text


def test_rendering_is_deterministic(prefill_html: str) -> None:
    assert html.render(tables.load(PREFILL)) == prefill_html


def test_nothing_from_the_session_is_inserted_unescaped(tmp_path: Path) -> None:
    evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    f = Finding(code="CPU001", name="cpu-bound-preprocess", category=Category.CPU_PREPROCESSING,
                severity=Severity.CRITICAL, confidence=Confidence.MEASURED, title=f"slow {evil}",
                message=f"Decode {evil} is slow. More.", impact=0.5, why=evil)
    d = Diagnosis(findings=(f,), target=Target(pid=1, cmdline=("python", evil, "--api-key", "s3cr3t"),
                                               user=evil))
    page_html = html.render(data.SessionData(path=str(tmp_path), label=evil, diagnosis=d, t0=0.0, window_s=1.0))
    rest = page_html.replace(PLOTLY_JS, "")
    assert "<script>alert" not in rest and "<img" not in rest and "onerror=alert(2)>" not in rest
    assert "s3cr3t" not in rest
    page = _parse(page_html)
    # the script blocks are exactly ours, each one whole
    assert [a.get("type") or a.get("id") for a, _ in page.scripts] == \
        ["text/javascript", "application/json", "application/json", "application/json", None]
    doc = json.loads(next(body for attrs, body in page.scripts if attrs.get("id") == "diagnosis"))
    assert doc["findings"][0]["title"] == f"slow {evil}"  # the JSON still says it, safely
    chart = json.loads(next(body for attrs, body in page.scripts if attrs.get("data-chart")))
    assert evil[:20] in json.dumps(chart)
    text = " ".join(page.text)
    assert f"slow {evil}" in text  # shown as text
    assert html.script_json('{"a": "</script><!--"}') == '{"a": "\\u003c/script\\u003e\\u003c!--"}'


def test_a_session_without_findings_renders(tmp_path: Path) -> None:
    d = Diagnosis(findings=())
    page = _parse(html.render(data.SessionData(path="x", label="empty", diagnosis=d, t0=0.0, window_s=0.0)))
    text = " ".join(" ".join(page.text).split())
    assert "Verdict: undetermined — the evidence given is too thin to name a bottleneck" in text
    assert "Findings by impact: No findings" in text
    assert [a for a, body in page.scripts if a.get("data-chart")] == []


def test_a_session_holding_a_trace_shows_its_gpu_timeline(tmp_path: Path, prefill_html: str) -> None:
    from tests import sessions

    d = tables.load(sessions.gpu_session(tmp_path))  # with a PyTorch-profiler trace (SGLang decode on MI300X)
    page = _parse(html.render(d))
    figs = [json.loads(body) for attrs, body in page.scripts if attrs.get("data-chart")]
    (timeline,) = [f for f in figs if f["layout"]["title"]["text"] == "GPU busy over time (PyTorch-profiler trace)"]
    (line,) = timeline["data"]
    y = line["y"]  # plotly writes number arrays as typed base64 ({"dtype", "bdata"}), as plotly.js reads them
    values = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]) if isinstance(y, dict) else y
    assert list(values) == pytest.approx([100 * b for b in d.gpu_timeline["busy_ratio"]])
    assert [a["text"] for a in timeline["layout"]["annotations"]] == ["rank 0 · GPU 9"]
    text = " ".join(" ".join(page.text).split())
    assert "No GPU busy/idle timeline" not in text
    # a session without a trace says where the timeline comes from, where the chart would be
    prefill = " ".join(" ".join(_parse(prefill_html).text).split())
    assert "GPU busy over time (PyTorch-profiler trace): No GPU busy/idle timeline: it is drawn from a " \
           "PyTorch-profiler trace in the session" in prefill
