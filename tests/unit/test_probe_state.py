"""The probe's allocator state at an OOM feeds the OOM rules, and beats the message's numbers."""

from __future__ import annotations

import json

from diagnose import loose
from diagnose.model import EvidenceSet
from diagnose.pipeline import judge
from tests.verdicts import committed_as_calibrated, rules_primary

GiB = 1 << 30


def _state(alloc: int, reserved: int, free: int, total: int, retries: int = 14) -> dict:
    return {"devices": {"0": {"allocated_bytes.all.current": alloc, "reserved_bytes.all.current": reserved,
                              "inactive_split_bytes.all.current": reserved - alloc, "num_alloc_retries": retries,
                              "num_ooms": 1, "free_bytes": free, "total_bytes": total, "weights_bytes": 6 * GiB}},
            "alloc_conf": "", "expandable_segments": False}


def test_oom_record_gives_allocator_numbers_that_win_over_the_message() -> None:
    lines = [
        json.dumps({"ts": 1.0, "request_id": "r1", "stages_ms": {"queue": 1.0, "forward": 20.0}}),
        json.dumps({"ts": 2.0, "cuda_memory": _state(7 * GiB, 8 * GiB, 14 * GiB, 24 * GiB)}),
        json.dumps({"ts": 3.0, "oom": {"error": "OutOfMemoryError", "cuda_memory":
                                       _state(9 * GiB, 23 * GiB, GiB // 4, 24 * GiB)}}),
        # the message the same OOM printed, with rounded (older) figures
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.50 GiB of which 250.00 MiB is free. Of the allocated memory 5.00 GiB is allocated by PyTorch, and "
        "1.00 GiB is reserved by PyTorch but unallocated.",
    ]
    res = loose.analyze_lines("stages.jsonl", lines)
    ev = EvidenceSet(res.evidence)
    assert ev.get("mem.allocated_bytes").value == 9 * GiB  # the allocator's, not the message's 5 GiB
    assert ev.get("mem.reserved_minus_allocated_bytes").value == 14 * GiB
    assert ev.get("mem.alloc_retries").value == 14
    assert "probe" in ev.get("mem.allocated_bytes").detail
    d = judge(ev)
    assert rules_primary(d) == "oom_fragmentation" and committed_as_calibrated(d)  # 14 GiB free-but-unusable


def test_periodic_state_alone_is_not_an_oom() -> None:
    state = _state(GiB, GiB + GiB // 8, 20 * GiB, 24 * GiB, retries=0)  # a healthy allocator
    res = loose.analyze_lines("s.jsonl", [json.dumps({"ts": 1, "cuda_memory": state})])
    ev = EvidenceSet(res.evidence)
    assert "mem.oom_count" not in ev and ev.get("mem.reserved_bytes").value == GiB + GiB // 8
    assert judge(ev).primary is None
