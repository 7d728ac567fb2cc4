"""GPU rules (rules/gpu.py): fixtures, documented sections, and the false-alarm guards a GPU engineer
would insist on. Runs on diagnose.rules.gpu.RULES directly, so it holds before and after registration."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from diagnose import rulesdoc
from diagnose.model import Category, Evidence, EvidenceSet, Severity
from diagnose.rules.engine import rank, run_rules
from diagnose.rules.gpu import (
    RULES,
    GpuLaunchBound,
    GpuSaturated,
    GpuStarved,
    GpuThrottling,
    MemoryHeldByOtherProcess,
    PcieLinkDegraded,
)
from tests.conftest import DATA, ROOT

GiB = 1 << 30


def _ev(**kv: Any) -> EvidenceSet:
    return EvidenceSet(Evidence(k.replace("__", "."), v, "", "test") for k, v in kv.items())


def _codes(ev: EvidenceSet, rule: Any) -> list[str]:
    findings, _ = run_rules(ev, rules=[rule])
    return [f.code for f in findings]


def _one(ev: EvidenceSet, rule: Any) -> Any:
    findings, skipped = run_rules(ev, rules=[rule])
    assert not skipped, skipped
    assert len(findings) == 1, findings
    return findings[0]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
@pytest.mark.parametrize("kind", ["positive", "negative", "insufficient"])
def test_fixtures(rule: Any, kind: str) -> None:
    with open(os.path.join(DATA, "rules", rule.code, f"{kind}.json"), encoding="utf-8") as fh:
        doc = json.load(fh)
    findings, skipped = run_rules(EvidenceSet(Evidence.from_json(e) for e in doc["evidence"]), rules=[rule])
    assert (rule.code in {s.code for s in skipped}) is doc["expect_skipped"]
    assert [f.code for f in findings] == ([doc["expect"]] if doc["expect"] else [])
    if kind == "positive":
        f = findings[0]
        assert f.category is rule.category and f.fixes and all(x.steps for x in f.fixes)
        assert set(rule.requires) <= {e.key for e in f.evidence}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_documented_and_docs_current(rule: Any) -> None:
    secs = rulesdoc.sections(rule)
    for head in rulesdoc.SECTIONS:
        assert secs.get(head), f"{rule.code} lacks '{head}:'"
    for name, _, why in rulesdoc.thresholds_table(rule):
        assert why, f"{rule.code}.{name} has no '# why'"
    with open(os.path.join(ROOT, "docs", "rules", f"{rule.code}.md"), encoding="utf-8") as fh:
        assert fh.read() == rulesdoc.page(rule), f"docs/rules/{rule.code}.md is stale: run `make docs`"


# -- GPU001 gpu-starved ----------------------------------------------------------------------------

STARVED = {"gpu__util_ratio": 0.3, "gpu__util_samples": 60, "conn__inflight_mean": 5.0, "workers__active_mean": 1.2}


def test_starved_without_a_measured_cause_is_heuristic_and_names_the_other_idle_causes() -> None:
    f = _one(_ev(**STARVED), GpuStarved)
    assert f.category is Category.CPU_PREPROCESSING and f.confidence.value == "heuristic"
    assert "py-spy" in f.message and f.impact == pytest.approx(0.7)
    # it must not claim that only the host can idle a GPU under load
    assert "Nothing else" not in f.message
    for other in ("batcher", "lock", "event loop", "fetched slowly"):
        assert other in f.message
    assert f.fixes[0].summary == "Find what holds requests back before the GPU"


def test_starved_names_the_host_cause() -> None:
    f = _one(_ev(**STARVED, cpu__serialize_share=0.3), GpuStarved)
    assert f.confidence.value == "correlated" and "serialising" in f.message


def test_launch_overhead_is_its_own_category() -> None:
    ev = _ev(**STARVED, cpu__forward_share=0.7)
    assert _codes(ev, GpuStarved) == []
    f = _one(ev, GpuLaunchBound)
    assert f.category is Category.LAUNCH_OVERHEAD and "launch overhead" in f.message
    assert "CUDA graphs" in f.fixes[0].steps[0]
    # pre-processing over its bar comes first: the host's request path, GPU001's
    ev = _ev(**STARVED, cpu__forward_share=0.7, cpu__preprocess_share=0.4)
    assert _codes(ev, GpuLaunchBound) == [] and _codes(ev, GpuStarved) == ["GPU001"]


@pytest.mark.parametrize(("load", "starved"), [
    ({"conn__inflight_mean": 1.0}, False),  # one keep-alive connection is not load
    ({"conn__inflight_mean": 1.0, "conn__accept_queue_max": 3}, True),  # requests waiting to be accepted are
    ({"conn__inflight_mean": 4.0, "workers__active_mean": 0.3}, False),  # connections open, threads mostly idle
    ({"conn__inflight_mean": 4.0, "workers__active_mean": 0.9}, True),
    ({"conn__inflight_mean": 4.0}, True),  # py-spy did not run: the connections are all there is
    ({"serving__running_mean": 1.0}, True),  # the engine counts requests, not connections
])
def test_starved_needs_real_load(load: dict[str, float], starved: bool) -> None:
    ev = _ev(gpu__util_ratio=0.2, gpu__util_samples=60, **load)
    assert _codes(ev, GpuStarved) == (["GPU001"] if starved else [])


@pytest.mark.parametrize("extra", [
    {"conn__inflight_mean": 0.2},  # no load: idle, not starved
    {"workers__active_mean": 0.05},  # the host is idle too: requests wait on something else
    {"cpu__compile_share": 0.6},  # recompiling: the CMP rules own it
    {"cpu__copy_sync_share": 0.5},  # blocked in copies: the transfer rules own it
    {"pcie__rx_bytes_per_s": 20e9, "pcie__link_capacity_bytes_per_s": 31.5e9},  # the link is full
    {"gpu__util_ratio": 0.8},  # busy enough
])
def test_starved_stays_quiet(extra: dict[str, float]) -> None:
    assert _codes(_ev(**{**STARVED, **extra}), GpuStarved) == []


def test_starved_from_engine_load_alone_and_thin_when_few_readings() -> None:
    f = _one(_ev(gpu__util_ratio=0.1, gpu__util_samples=1, serving__running_mean=8.0), GpuStarved)
    assert f.confidence.value == "thin" and "8.0 requests running" in f.message


# -- GPU002 gpu-saturated --------------------------------------------------------------------------


def test_busy_but_underfilled() -> None:
    f = _one(_ev(gpu__util_ratio=1.0, gpu__util_p10_ratio=0.98, gpm__sm_activity_ratio=0.2), GpuSaturated)
    assert "SMs are idle" in f.title and f.impact == pytest.approx(0.8)


def test_saturated_without_gpm_is_heuristic_and_memory_bound_is_named() -> None:
    f = _one(_ev(gpu__util_ratio=0.97, gpu__util_samples=50), GpuSaturated)
    assert f.confidence.value == "heuristic" and "no GPM" in f.message
    assert _one(_ev(gpu__util_ratio=0.97), GpuSaturated).confidence.value == "thin"  # a snapshot
    f = _one(_ev(gpu__util_ratio=0.97, gpm__sm_activity_ratio=0.9, gpm__dram_bw_ratio=0.8), GpuSaturated)
    assert "memory-bandwidth bound" in f.message


def test_saturated_ranks_after_the_throttling_that_causes_it() -> None:
    ev = _ev(gpu__util_ratio=0.99, gpu__util_p10_ratio=0.97, gpm__sm_activity_ratio=0.85, gpu__throttle_ratio=0.9,
             gpu__power_cap_ratio=0.9, gpu__sm_clock_mhz=1200, gpu__sm_clock_max_mhz=1980,
             gpu__power_limit_w=400.0, gpu__power_default_limit_w=700.0)
    findings, _ = run_rules(ev, rules=[GpuSaturated, GpuThrottling])
    assert [f.code for f in rank(findings)] == ["GPU003", "GPU002"]


# -- GPU003 gpu-throttling -------------------------------------------------------------------------

THROTTLED = {"gpu__throttle_ratio": 0.8, "gpu__util_ratio": 0.95, "gpu__power_cap_ratio": 0.8,
             "gpu__thermal_throttle_ratio": 0.0, "gpu__hw_slowdown_ratio": 0.0,
             "gpu__sm_clock_mhz": 1500, "gpu__sm_clock_max_mhz": 1980, "gpu__power_w": 695.0}


def test_power_cap_at_the_rated_limit_is_minor_and_lowered_limit_is_major() -> None:
    f = _one(_ev(**THROTTLED, gpu__power_limit_w=700.0, gpu__power_default_limit_w=700.0), GpuThrottling)
    assert f.severity is Severity.MINOR and "power limit" in f.title
    f = _one(_ev(**THROTTLED, gpu__power_limit_w=450.0, gpu__power_default_limit_w=700.0), GpuThrottling)
    assert f.severity is Severity.MAJOR and "lowered from the board's default 700 W" in f.message
    assert any("-pl 700" in s for fx in f.fixes for s in fx.steps)


def test_throttling_of_an_idle_gpu_is_not_reported() -> None:
    assert _codes(_ev(**{**THROTTLED, "gpu__util_ratio": 0.05}), GpuThrottling) == []


def test_hardware_slowdown_without_heat() -> None:
    f = _one(_ev(**{**THROTTLED, "gpu__hw_slowdown_ratio": 0.6, "gpu__power_cap_ratio": 0.0}), GpuThrottling)
    assert "hardware slowdown" in f.title and f.severity is Severity.MAJOR


# -- GPU004 pcie-link-degraded ---------------------------------------------------------------------

LINK = {"pcie__link_gen": 4, "pcie__link_gen_max": 4, "pcie__link_width": 16, "pcie__link_width_max": 16,
        "pcie__loaded_samples": 40, "pcie__rx_bytes_per_s": 5e9, "pcie__tx_bytes_per_s": 1e9,
        "pcie__peak_bytes_per_s": 9e9, "pcie__link_capacity_bytes_per_s": 31.5e9,
        "pcie__link_capacity_max_bytes_per_s": 31.5e9}


def test_full_link_is_quiet_and_idle_gen_drop_is_quiet() -> None:
    assert _codes(_ev(**LINK), PcieLinkDegraded) == []
    assert _codes(_ev(**{**LINK, "pcie__link_gen": 1, "pcie__loaded_samples": 0}), PcieLinkDegraded) == []


def test_gen_drop_under_load_with_traffic_is_a_finding() -> None:
    f = _one(_ev(**{**LINK, "pcie__link_gen": 2, "pcie__link_capacity_bytes_per_s": 8e9}), PcieLinkDegraded)
    assert f.severity is not Severity.INFO and "gen2 x16" in f.message


def test_width_drop_without_traffic_is_only_informational() -> None:
    ev = _ev(**{**LINK, "pcie__link_width": 8, "pcie__loaded_samples": 0, "pcie__rx_bytes_per_s": 1e6,
                "pcie__tx_bytes_per_s": 1e6, "pcie__peak_bytes_per_s": 5e6, "pcie__link_capacity_bytes_per_s": 15.75e9})
    f = _one(ev, PcieLinkDegraded)
    assert f.severity is Severity.INFO and "costs nothing" in f.message


# -- GPU005 memory-held-by-other-process ------------------------------------------------------------


def test_other_process_minor_when_room_is_left_and_quiet_below_a_quarter() -> None:
    base = {"gpu__memory_total_bytes": 80 * GiB, "gpu__memory_used_bytes": 50 * GiB}
    f = _one(_ev(**base, mem__other_processes_bytes=24 * GiB), MemoryHeldByOtherProcess)
    assert f.severity is Severity.MINOR and "30 %" in f.message
    assert _codes(_ev(**base, mem__other_processes_bytes=10 * GiB), MemoryHeldByOtherProcess) == []


def test_other_process_defers_to_the_oom_rule() -> None:
    ev = _ev(gpu__memory_total_bytes=80 * GiB, mem__other_processes_bytes=70 * GiB, mem__oom_count=1)
    assert _codes(ev, MemoryHeldByOtherProcess) == []


# -- GPU121 decode-at-bandwidth-roofline -------------------------------------------------------------


def test_single_stream_generation_at_the_bandwidth_limit_is_a_note() -> None:
    from diagnose.rules.gpu import DecodeAtBandwidthRoofline

    # 7B fp16 (14 GB) on a 4090 (1,008 GB/s): at most 72 tokens/s for one stream; 65 is 90 % of it
    f = _one(_ev(model__params=7e9, gpu__name="NVIDIA GeForce RTX 4090", report__decode_tokens_per_s=65.0),
             DecodeAtBandwidthRoofline)
    assert f.severity is Severity.INFO and f.category is None and "at most 72 tokens/s" in f.message
    # 4-bit weights read a quarter of the bytes: the same 65 tokens/s is then far below the roofline
    assert _codes(_ev(model__params=7e9, gpu__name="4090", report__decode_tokens_per_s=65.0,
                      mem__weights_estimate_bytes=3.5e9), DecodeAtBandwidthRoofline) == []
    # a batch (or a stated concurrency) is not one stream; above the roofline the rate is not a dense stream's
    assert _codes(_ev(model__params=7e9, gpu__name="4090", report__decode_tokens_per_s=65.0,
                      report__concurrency_max=8), DecodeAtBandwidthRoofline) == []
    assert _codes(_ev(model__params=7e9, gpu__name="4090", report__decode_tokens_per_s=150.0),
                  DecodeAtBandwidthRoofline) == []
