"""STG004 (cold start) and STG005 (latency scales with input size) beyond the registry fixtures."""

from __future__ import annotations

from diagnose.model import Evidence, EvidenceSet
from diagnose.rules.cold_start import ColdStart, LatencyScalesWithInputSize
from diagnose.rules.engine import run_rules


def _ev(**kv: float) -> EvidenceSet:
    return EvidenceSet(Evidence(k.replace("__", "."), v, "", "t") for k, v in kv.items())


def test_cold_start_on_new_shapes_only() -> None:
    ev = _ev(latency__steady_ms__p50=50.0, latency__new_shape_ms__mean=900.0, latency__new_shape__count=6,
             requests__count=300)
    findings, _ = run_rules(ev, rules=[ColdStart])
    assert [f.code for f in findings] == ["STG004"]
    assert "6 request(s) on an input shape not seen before" in findings[0].message
    assert "18.0×" in findings[0].message


def test_cold_start_needs_an_absolute_excess() -> None:
    ev = _ev(latency__steady_ms__p50=2.0, latency__first_requests_ms__mean=40.0)  # 20× but only 38 ms
    assert run_rules(ev, rules=[ColdStart])[0] == ()


def test_scaling_falls_back_to_e2e_and_says_queue_is_unknown() -> None:
    ev = _ev(scaling__input_size__requests=50, scaling__e2e_ms__input_size_corr=0.85)
    findings, _ = run_rules(ev, rules=[LatencyScalesWithInputSize])
    assert [f.code for f in findings] == ["STG005"]
    assert findings[0].title.startswith("End-to-end latency")
    assert "not ruled out" in findings[0].message


def test_scaling_vetoed_when_queue_explains_more() -> None:
    ev = _ev(scaling__input_size__requests=50, scaling__ttft_ms__input_size_corr=0.75,
             scaling__ttft_ms__queue_corr=0.78)
    assert run_rules(ev, rules=[LatencyScalesWithInputSize])[0] == ()


def test_scaling_needs_enough_requests_and_spread() -> None:
    few = _ev(scaling__input_size__requests=8, scaling__ttft_ms__input_size_corr=0.99)
    narrow = _ev(scaling__input_size__requests=80, scaling__ttft_ms__input_size_corr=0.99,
                 scaling__input_size__range_ratio=1.5)
    assert run_rules(few, rules=[LatencyScalesWithInputSize])[0] == ()
    assert run_rules(narrow, rules=[LatencyScalesWithInputSize])[0] == ()


def test_fixtures_and_docs_as_the_registry_test_will_check_them() -> None:
    from diagnose import rulesdoc
    from tests.unit import test_rules_registry as reg

    for rule in (ColdStart, LatencyScalesWithInputSize):
        for kind in reg.FIXTURE_KINDS:
            reg.test_rule_fixture(rule, kind)
        reg.test_rule_documents_every_section_and_threshold(rule)
        assert rulesdoc.sections(rule)
