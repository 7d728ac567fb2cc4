"""Order-dependent figures of the stage-timing log feed the cold-start and size-scaling rules."""

from __future__ import annotations

import json

from diagnose import loose
from diagnose.model import EvidenceSet
from diagnose.pipeline import judge


def _diagnose(records: list[dict]) -> tuple[dict[str, object], list[str]]:
    res = loose.analyze_lines("stages.jsonl", [json.dumps(r) for r in records])
    ev = EvidenceSet(res.evidence)
    d = judge(ev)
    return {e.key: e.value for e in res.evidence}, [f.code for f in d.findings]


def test_slow_first_requests_are_a_cold_start() -> None:
    recs = [{"ts": i, "stages_ms": {"queue": 1.0, "compute": 2500.0 if i < 5 else 40.0}} for i in range(40)]
    ev, codes = _diagnose(recs)
    assert ev["latency.first_requests_ms.mean"] == 2501.0
    assert ev["latency.steady_ms.p50"] == 41.0
    assert "STG004" in codes


def test_ttft_growing_with_prompt_length_is_prefill_scaling() -> None:
    recs = [{"ts": i, "stages_ms": {"queue": 2.0, "prefill": 0.5 * t, "decode": 100.0}, "input_tokens": t,
             "ttft_ms": 2.0 + 0.5 * t} for i, t in enumerate(range(100, 4100, 100))]
    ev, codes = _diagnose(recs)
    assert ev["scaling.ttft_ms.input_size_corr"] > 0.99
    assert abs(ev["scaling.ttft_ms.per_1k_input_ms"] - 500.0) < 1e-6
    assert ev["scaling.input_size.range_ratio"] == 40.0
    assert "STG005" in codes


def test_steady_service_has_neither() -> None:
    recs = [{"ts": i, "stages_ms": {"queue": 1.0, "compute": 40.0 + (i % 3)}, "input_tokens": 512}
            for i in range(40)]
    _, codes = _diagnose(recs)
    assert "STG004" not in codes and "STG005" not in codes
