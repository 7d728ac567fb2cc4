"""TensorRT-LLM's per-iteration statistics JSON: each iteration one scheduler sample, for QUE002."""

from __future__ import annotations

import json
import os
from pathlib import Path

from diagnose import pipeline
from diagnose.collectors.trtllm_stats import IterStatsParser
from diagnose.model import EvidenceSet, Mechanism
from tests.conftest import DATA


def _it(i: int, active: int, queued: int, used: int) -> dict[str, object]:
    return {"iter": i, "numActiveRequests": active, "numQueuedRequests": queued, "maxNumActiveRequests": 16,
            "kvCacheStats": {"usedNumBlocks": used, "maxNumBlocks": 7240}, "maxNumTokensRuntime": 8192}


def test_iterations_are_read_from_a_list_a_line_each_or_inside_a_sentence_and_counted_once() -> None:
    p = IterStatsParser()
    p.feed(json.dumps([_it(0, 1, 7, 5495), _it(1, 2, 6, 5600)]))
    p.feed("stats: " + json.dumps(_it(2, 16, 3, 7000)) + " (from /metrics)")
    p.feed(json.dumps(_it(2, 16, 3, 7000)))  # the same iteration polled twice
    p.feed('{"numActiveRequests": 1, "numQueuedRequests": ')  # cut: not JSON
    got = p.result().samples
    assert [(s.it, s.running, s.waiting) for s in got] == [(0, 1, 7), (1, 2, 6), (2, 16, 3)]
    assert got[0].kv_ratio == 5495 / 7240 and got[2].cap == 16


def test_a_posted_iteration_names_the_queue_and_the_token_budget() -> None:
    """NVIDIA/TensorRT-LLM#3376: 7 queued behind 1 active, KV 76 % used: before, the JSON was unreadable."""
    d = pipeline.analyze([os.path.join(DATA, "logs", "trtllm_iteration_stats_queued.txt")])
    ev = EvidenceSet(d.evidence)
    assert ev.get("serving.engine").value == "tensorrt-llm" and ev.value("serving.waiting_max") == 7
    lead = d.findings[0]
    assert lead.code == "QUE002" and "--max_num_tokens" in lead.message, lead.message


def test_running_pinned_at_the_schedulers_limit_is_the_admission_cap(tmp_path: Path) -> None:
    path = os.path.join(tmp_path, "iters.json")
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(6):
            fh.write(json.dumps([_it(i, 16, 9, 3000)]) + "\n")
    d = pipeline.analyze([path])
    assert d.findings[0].code == "QUE002" and d.findings[0].mechanism is Mechanism.ADMISSION_CAP, d.findings[0]


def test_iterations_inside_bracketed_prose_after_a_restart_and_of_each_rank_are_all_read() -> None:
    p = IterStatsParser()
    p.feed("[TensorRT-LLM][INFO] iteration stats: " + json.dumps(_it(0, 1, 7, 10)) + " [rank 0]")
    p.feed(json.dumps(_it(0, 2, 9, 20)))  # a restart counts from 0 again
    p.feed(json.dumps([{**_it(0, 1, 7, 10), "attentionDpRank": 1}]))  # another rank, the same iter number
    assert [(s.it, s.waiting) for s in p.result().samples] == [(0, 7), (0, 9), (0, 7)]
