"""The GPU-timeline rules (rules/gpu_trace.py): fixtures, documentation, and the false alarms they avoid."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from diagnose import rulesdoc
from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Quality, Severity
from diagnose.rules import gpu_trace, registry
from diagnose.rules.engine import run_rules
from tests.conftest import DATA, ROOT

RULES = gpu_trace.RULES
BY_CODE = {r.code: r for r in RULES}


def _ev(values: dict[str, Any], quality: Quality = Quality.GOOD) -> EvidenceSet:
    return EvidenceSet(Evidence(k, v, "", "test", None, quality) for k, v in values.items())


def _run(code: str, values: dict[str, Any], quality: Quality = Quality.GOOD):  # type: ignore[no-untyped-def]
    findings, skipped = run_rules(_ev(values, quality), rules=[BY_CODE[code]])
    assert not skipped, skipped
    return findings[0] if findings else None


def _hist(**ms: float) -> dict[str, dict[str, float]]:
    names = {"lt10us": "<10us", "us10_100": "10us-100us", "us100_1ms": "100us-1ms", "ms1_10": "1ms-10ms",
             "ge10ms": ">=10ms"}
    return {names[k]: {"count": 1, "time_ms": v} for k, v in ms.items()}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
@pytest.mark.parametrize("kind", ("positive", "negative", "insufficient"))
def test_fixtures(rule, kind: str) -> None:  # type: ignore[no-untyped-def]
    with open(os.path.join(DATA, "rules", rule.code, f"{kind}.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    findings, skipped = run_rules(EvidenceSet(Evidence.from_json(e) for e in doc["evidence"]), rules=[rule])
    if kind == "insufficient":
        assert [s.code for s in skipped] == [rule.code] and skipped[0].reason.startswith("needs `")
        return
    assert not skipped
    assert [f.code for f in findings] == ([rule.code] if kind == "positive" else [])
    if findings:
        f = findings[0]
        assert f.category is rule.category and f.fixes and all(fx.steps for fx in f.fixes)
        assert set(rule.requires) <= {e.key for e in f.evidence}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_documented_like_every_rule(rule) -> None:  # type: ignore[no-untyped-def]
    secs = rulesdoc.sections(rule)
    for head in rulesdoc.SECTIONS:
        assert secs.get(head), f"{rule.code} lacks '{head}:'"
    assert all(why for _, _, why in rulesdoc.thresholds_table(rule))
    page = os.path.join(ROOT, "docs", "rules", f"{rule.code}.md")
    with open(page, encoding="utf-8") as fh:
        assert fh.read() == rulesdoc.page(rule), f"docs/rules/{rule.code}.md is stale"


def test_codes_and_names_do_not_clash_with_the_registry() -> None:
    combined = registry.RULES + tuple(r for r in RULES if r not in registry.RULES)
    registry._check_unique(combined)
    assert [r.code for r in RULES] == [f"GPU10{i}" for i in range(1, 8)]


COPY_BOUND = {"copy.exposed_share": 0.95, "trace.gpu_busy_ratio": 0.9, "copy.time_ms": 120.0,
              "copy.h2d_bytes": 1.6e9, "copy.h2d_gbps": 12.8, "copy.count": 40, "copy.small_count": 0}


def test_copy_bound_pageable_says_pin_first() -> None:
    f = _run("GPU101", COPY_BOUND | {"copy.pageable_ratio": 0.97, "copy.pageable_gbps": 3.1, "copy.pinned_gbps": 12.0})
    assert f is not None and f.severity is Severity.CRITICAL and f.impact == pytest.approx(0.855)
    assert "97 % of those bytes come from pageable host memory (achieved 3.1 GB/s vs 12.0 GB/s" in f.message
    assert f.fixes[0].summary == "Pin the host buffers the copies use"


def test_copy_bound_pinned_at_speed_is_about_volume() -> None:
    f = _run("GPU101", COPY_BOUND | {"copy.pageable_ratio": 0.0})
    assert f is not None and "pinned memory and reach 12.8 GB/s" in f.message and "1.5 GiB" in f.message
    assert [fx.summary for fx in f.fixes] == ["Move fewer bytes over PCIe", "Overlap copies with compute"]


def test_copy_bound_small_or_slow_pinned_copies() -> None:
    small = _run("GPU101", COPY_BOUND | {"copy.h2d_gbps": 0.4, "copy.count": 5000, "copy.small_count": 4900})
    assert small is not None and small.title == "Many small copies keep the GPU waiting"
    slow = _run("GPU101", COPY_BOUND | {"copy.h2d_gbps": 3.0})
    assert slow is not None and "GPU004" in slow.message and "3.0 GB/s" in slow.message


def test_copy_bound_needs_real_copy_time_and_exposure() -> None:
    assert _run("GPU101", COPY_BOUND | {"copy.time_ms": 0.1}) is None  # a 0.6 ms vector add: not a service's problem
    assert _run("GPU101", COPY_BOUND | {"copy.exposed_share": 0.2}) is None  # copies hidden behind kernels
    thin = _run("GPU101", COPY_BOUND, Quality.LOW)
    assert thin is not None and thin.confidence is Confidence.THIN


def test_microsecond_pageable_copy_in_a_compute_bound_trace_is_not_a_finding() -> None:
    assert _run("GPU102", {"copy.pageable_async_count": 17, "copy.pageable_async_time_ms": 0.013,
                           "trace.gpu_busy_ms": 535.0}) is None
    assert _run("GPU102", {"copy.pageable_async_count": 40, "copy.pageable_async_time_ms": 15.0,
                           "trace.gpu_busy_ms": 535.0}) is None  # 3 % of busy time
    f = _run("GPU102", {"copy.pageable_async_count": 40, "copy.pageable_async_time_ms": 90.0,
                        "trace.gpu_busy_ms": 535.0})
    assert f is not None and f.impact == pytest.approx(90 / 535)


def test_many_small_copies_weighs_their_fixed_cost_against_the_window() -> None:
    assert _run("GPU103", {"copy.small_count": 200, "copy.count": 300, "trace.window_ms": 1000.0}) is None  # 2 ms
    f = _run("GPU103", {"copy.small_count": 20000, "copy.count": 20500, "trace.window_ms": 1000.0,
                        "copy.sync_count": 20000})
    assert f is not None and f.impact == pytest.approx(0.2) and "synchronous" in f.message


SYNC_STALL = {"api.sync_wall_share": 0.6, "api.sync_time_ms": 600.0, "trace.window_ms": 1000.0,
              "trace.idle_gaps.histogram": _hist(us100_1ms=50.0, ms1_10=300.0, lt10us=5.0)}


def test_host_sync_stalls_only_when_the_gpu_waits_too() -> None:
    f = _run("GPU104", SYNC_STALL | {"trace.gpu_busy_ratio": 0.5})
    assert f is not None and f.impact == pytest.approx(0.35)  # the GPU's host-scale idle bounds the impact
    assert f.confidence is Confidence.CORRELATED
    assert _run("GPU104", SYNC_STALL | {"trace.gpu_busy_ratio": 0.9}) is None  # busy GPU: waiting for it is healthy
    short = SYNC_STALL | {"trace.gpu_busy_ratio": 0.8, "trace.idle_gaps.histogram": _hist(lt10us=150.0, us100_1ms=40.0)}
    assert _run("GPU104", short) is None  # the idle is launch-scale, not the host's round trips


STARVED = {"trace.gpu_busy_ratio": 0.3, "trace.window_ms": 2000.0,
           "trace.idle_gaps.histogram": _hist(ms1_10=600.0, ge10ms=700.0, lt10us=10.0)}


def test_starved_by_host_attributes_the_cause_from_the_same_window() -> None:
    generic = _run("GPU105", STARVED)
    assert generic is not None and generic.category is Category.CPU_PREPROCESSING
    assert generic.confidence is Confidence.HEURISTIC and "Profile the host" in generic.message
    pre = _run("GPU105", STARVED | {"cpu.preprocess_share": 0.7})
    assert pre is not None and pre.confidence is Confidence.CORRELATED and "70 %" in pre.message
    stages = [{"name": "decode", "cpu_ms": 900.0, "in_gpu_window_ms": 800.0, "gpu_ratio": 0.02},
              {"name": "forward", "cpu_ms": 600.0, "in_gpu_window_ms": 600.0, "gpu_ratio": 0.9}]
    named = _run("GPU105", STARVED | {"trace.nvtx_ranges": stages})
    assert named is not None and named.confidence is Confidence.CORRELATED and "`decode`" in named.message
    other = _run("GPU105", STARVED | {"cpu.preprocess_share": 0.05})
    assert other is not None and other.confidence is Confidence.HEURISTIC and "only 5 %" in other.message
    assert _run("GPU105", STARVED | {"trace.window_ms": 20.0}) is None  # one burst
    assert _run("GPU105", STARVED | {"trace.gpu_busy_ratio": 0.75}) is None


LAUNCH = {"trace.kernel_count": 50000, "trace.tiny_kernel_ratio": 0.8, "trace.launch_overhead_ratio": 1.4,
          "trace.gpu_busy_ratio": 0.5, "trace.window_ms": 1000.0,
          "trace.idle_gaps.histogram": _hist(lt10us=300.0, us10_100=150.0, us100_1ms=20.0)}


def test_launch_bound() -> None:
    f = _run("GPU106", LAUNCH | {"api.launch_mean_us": 11.0, "trace.kernel_mean_us": 4.5})
    # the launch path, not input pre-processing: a decode loop's owner must not look at image decoding
    assert f is not None and f.impact == pytest.approx(0.45) and f.category is Category.LAUNCH_OVERHEAD
    assert "CUDA graphs" in f.fixes[0].summary and "11.0 µs per launch" in f.message
    graphs = _run("GPU106", LAUNCH | {"api.graph_launches": 12})
    assert graphs is not None and "already used" in graphs.message
    assert _run("GPU106", LAUNCH | {"trace.gpu_busy_ratio": 0.9}) is None  # saturated, not waiting for launches
    assert _run("GPU106", LAUNCH | {"trace.launch_overhead_ratio": 0.1}) is None  # launches are cheap here


def test_saturated_gpu_is_a_capacity_limit_with_its_caveats() -> None:
    base = {"trace.gpu_busy_ratio": 0.99, "trace.kernel_busy_ratio": 0.98, "trace.window_ms": 50967.0}
    f = _run("GPU107", base | {"trace.kernel_count": 1, "copy.uvm_count": 24576, "copy.uvm_bytes": 4 * 2**30})
    assert f is not None and f.severity is Severity.MAJOR and f.impact == 0.5
    assert f.confidence is Confidence.HEURISTIC  # one kernel: busy in time, how full is unknown
    assert "24576 unified-memory migrations (4.0 GiB)" in f.message
    many = _run("GPU107", base | {"trace.kernel_count": 4000})
    assert many is not None and many.confidence is Confidence.MEASURED
    assert _run("GPU107", base | {"trace.kernel_busy_ratio": 0.02}) is None  # busy with copies: GPU101's case


def test_a_busy_gpu_silences_the_host_side_rules() -> None:
    ev = _ev(COPY_BOUND | SYNC_STALL | LAUNCH | STARVED | {"trace.gpu_busy_ratio": 0.95, "trace.kernel_busy_ratio": 0.9,
                                                         "copy.exposed_share": 0.05})
    findings, _ = run_rules(ev, rules=RULES)
    assert [f.code for f in findings] == ["GPU107"]
