"""Verdicts that do not flip on a measurement's noise: ramps, uncertainty, a cause leading its symptom.

Issue 13: six attaches to one LitServe image service under one load gave ``cpu_preprocessing`` four
times and ``queueing`` twice, because QUE001 cut at exactly 4.0 requests in flight (measured
3.91-4.0) and discounted the queue as pre-processing's symptom only at a share >= 0.5 (measured
0.39-0.59). These tests sweep those measurements across the old cut-offs.
"""

from __future__ import annotations

import itertools

import pytest

from diagnose.collectors.pyspy import Frame, StackSample
from diagnose.derive import cpu_profile
from diagnose.model import Evidence, EvidenceSet
from diagnose.rules.base import ramp
from diagnose.rules.engine import run_rules
from diagnose.rules.queueing import QueueingObserved


def _ev(inflight: float, pre: float, active: float = 1.05, stderr: float = 0.05) -> EvidenceSet:
    return EvidenceSet(
        [
            Evidence("conn.inflight_mean", inflight, "requests", "t"),
            Evidence("conn.inflight_mean.stderr", stderr, "requests", "t"),
            Evidence("workers.active_mean", active, "threads", "t"),
            Evidence("workers.busiest_active_ratio", 0.97, "ratio", "t"),
            Evidence("cpu.preprocess_share", pre, "ratio", "t"),
            Evidence("cpu.preprocess_share.stderr", 0.04, "ratio", "t"),
            Evidence("cpu.active_samples", 900, "samples", "t"),
        ]
    )


def _impact(inflight: float, pre: float = 0.0) -> float:
    found, _ = run_rules(_ev(inflight, pre), rules=[QueueingObserved])
    return found[0].impact if found else 0.0


def test_ramp() -> None:
    assert ramp(3.9, 4.0, 1.0) == 0.0 and ramp(4.0, 4.0, 1.0) == 0.0 and ramp(4.5, 4.0, 1.0) == 0.5
    assert ramp(5.5, 4.0, 1.0) == 1.0
    assert ramp(4.0, 4.0, 0.0) == 1.0 and ramp(3.99, 4.0, 0.0) == 0.0


def test_queueing_impact_moves_smoothly_across_four_requests_in_flight() -> None:
    xs = [3.80 + i * 0.02 for i in range(21)]  # 3.80 .. 4.20
    impacts = [_impact(x) for x in xs]
    jumps = [abs(b - a) for a, b in itertools.pairwise(impacts)]
    assert max(jumps) < 0.05, impacts  # a cut at 4.0 jumped from 0 to 0.74 here
    assert impacts[0] == 0 and impacts[-1] > 0.1  # no finding below the threshold, a growing one above


def test_the_cause_discount_ramps_instead_of_switching_at_half() -> None:
    shares = [0.30 + i * 0.02 for i in range(16)]  # 0.30 .. 0.60
    impacts = [_impact(4.0, s) for s in shares]
    jumps = [abs(b - a) for a, b in itertools.pairwise(impacts)]
    assert max(jumps) < 0.06, impacts  # the discount at >= 0.5 jumped by about 0.37 here
    assert impacts == sorted(impacts, reverse=True)  # more pre-processing: less of the queue is its own problem


@pytest.mark.parametrize("inflight", [3.91, 3.95, 4.0, 4.05])
@pytest.mark.parametrize("pre", [0.39, 0.45, 0.5, 0.59])
def test_issue_13s_operating_points_all_lead_with_pre_processing(inflight: float, pre: float) -> None:
    findings, _ = run_rules(_ev(inflight, pre))
    codes = [f.code for f in findings]
    assert codes[0] == "CPU001", [(f.code, round(f.score, 3)) for f in findings]
    if "QUE001" in codes:
        que = findings[codes.index("QUE001")]
        assert codes.index("QUE001") == 1 and "symptom" in que.message


def test_a_queue_alone_is_still_queueing() -> None:
    findings, _ = run_rules(_ev(12.0, 0.05))
    assert findings[0].code == "QUE001"


def test_a_barely_there_cause_does_not_take_the_lead() -> None:
    """At pre-processing 0.31 CPU001 sits at the bottom of its ramp: the queue leads, no flip to a cause
    that weighs nothing."""
    findings, _ = run_rules(_ev(8.0, 0.31))
    assert [f.code for f in findings] == ["QUE001", "CPU001"]


def _samples(pid: int, pre: int, fwd: int) -> list[StackSample]:
    pre_f = (Frame("decode", "PIL/Image.py", 10),)
    fwd_f = (Frame("forward", "torch/nn/modules/linear.py", 125),)
    return [StackSample(pid, "", pid * 10, "w", pre_f, pre), StackSample(pid, "", pid * 10, "w", fwd_f, fwd)]


def test_chunked_profiles_weigh_each_process_by_its_rate_and_carry_their_spread() -> None:
    """pid 1 sampled at 40 Hz, pid 2 at 10 Hz for the same 10 s: a sample of pid 2 is worth four."""
    s1, s2 = _samples(1, 400, 0), _samples(2, 0, 100)
    ev = {
        e.key: e.value
        for e in cpu_profile.derive(
            [*s1, *s2],
            window_s=10.0,
            rate_hz=50,
            coverage={1: (40.0, 10.0), 2: (10.0, 10.0)},
            chunks=[[*_samples(1, 200, 0), *_samples(2, 0, 50)], [*_samples(1, 200, 0), *_samples(2, 0, 50)]],
        )
    }
    assert ev["cpu.preprocess_share"] == pytest.approx(0.5) and ev["cpu.forward_share"] == pytest.approx(0.5)
    assert ev["workers.active_mean"] == pytest.approx(2.0)  # both threads ran the whole window
    assert 0 < ev["cpu.preprocess_share.stderr"] < 0.05
