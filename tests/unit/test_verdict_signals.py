"""A service the evidence covers is healthy only when nothing in it signals a failure: a median time to
first token of seconds is one (``diagnose.rules.verdict.signals``)."""

from __future__ import annotations

from diagnose.model import Evidence, EvidenceSet, Verdict
from diagnose.rules.verdict import SLOW_TTFT_MS, decide, signals


def _served(ttft_ms: float) -> EvidenceSet:
    """Per-request timings of 40 requests, with their time to first token and the requests in flight."""
    src = "stages.jsonl"
    return EvidenceSet([Evidence("requests.count", 40, "requests", src),
                        Evidence("latency.e2e_ms.p50", 9000.0, "ms", src),
                        Evidence("latency.ttft_ms.p50", ttft_ms, "ms", src),
                        Evidence("conn.inflight_mean", 2.0, "", src),
                        Evidence("stage.decode.share", 0.5, "ratio", src)])


def test_seconds_to_first_token_with_no_finding_is_not_healthy() -> None:
    verdict, steps = decide(_served(6250.0), [])
    assert verdict is Verdict.UNDETERMINED and steps
    assert signals(_served(6250.0)) == ["a median time to first token of 6.2 s"]


def test_a_fast_first_token_with_no_finding_is_healthy() -> None:
    verdict, _ = decide(_served(SLOW_TTFT_MS / 10), [])
    assert verdict is Verdict.HEALTHY and signals(_served(SLOW_TTFT_MS / 10)) == []
