"""TensorRT-LLM's iteration statistics (``collectors/trtllm_stats.py``) → the scheduler's ``serving.*`` evidence,
read as a vLLM or SGLang stats line is: each iteration one sample of the requests running and waiting, the KV
cache's use and the limit on running requests (``serving.max_num_seqs``), for QUE002."""

from __future__ import annotations

from statistics import fmean

from diagnose.collectors.trtllm_stats import MARKERS, IterStatsParser
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality


class IterStatsSource:
    """TextSource for TensorRT-LLM's per-iteration statistics JSON (kind ``trtllm-iteration-stats``)."""

    kind = "trtllm-iteration-stats"
    triggers = MARKERS[:1]

    def __init__(self) -> None:
        self._p = IterStatsParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return bool(self._p.result().samples)

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        got = self._p.result().samples
        if not got:
            return []
        ev = Emit(source, quality=Quality.LOW if len(got) < 3 else Quality.GOOD)
        what = f"TensorRT-LLM iteration statistics ({len(got)} iteration(s))"
        ev.add("serving.engine", "tensorrt-llm", "", "TensorRT-LLM's iteration statistics (numActiveRequests, …)")
        ev.add("serving.log_engine", "tensorrt-llm", "", "the engine whose scheduler statistics these are")
        ev.add("serving.stat_samples", len(got), "count", what)
        running, waiting = [s.running for s in got], [s.waiting for s in got]
        ev.add("serving.running_max", max(running), "requests", f"numActiveRequests, {what}")
        ev.add("serving.running_mean", fmean(running), "requests", f"numActiveRequests, {what}")
        ev.add("serving.waiting_max", max(waiting), "requests", f"numQueuedRequests, {what}")
        ev.add("serving.waiting_mean", fmean(waiting), "requests", f"numQueuedRequests, {what}")
        ev.add("serving.waiting_last", waiting[-1], "requests", "numQueuedRequests of the last iteration")
        queued = [s for s in got if s.waiting > 0]
        ev.add("serving.queued_samples", len(queued), "count", "iterations with a request queued")
        ev.add("serving.queued_sample_ratio", len(queued) / len(got), "ratio", "share of iterations with one queued")
        if queued:
            ev.add("serving.running_when_queued_mean", fmean(s.running for s in queued), "requests",
                   "numActiveRequests of the iterations with requests queued")
            ev.add("serving.running_when_queued_max", max(s.running for s in queued), "requests",
                   "numActiveRequests of the iterations with requests queued")
        kv = [r for r in (s.kv_ratio for s in got) if r is not None]
        if kv:
            ev.add("serving.kv_cache_usage_max_ratio", max(kv), "ratio", "kvCacheStats usedNumBlocks / maxNumBlocks")
            ev.add("serving.kv_cache_usage_mean_ratio", fmean(kv), "ratio", "kvCacheStats usedNumBlocks / maxNumBlocks")
        kvq = [r for r in (s.kv_ratio for s in queued) if r is not None]
        if kvq:
            ev.add("serving.kv_cache_usage_when_queued_mean_ratio", fmean(kvq), "ratio",
                   "KV blocks in use on the iterations with requests queued")
            ev.add("serving.kv_cache_usage_when_queued_max_ratio", max(kvq), "ratio",
                   "KV blocks in use on the iterations with requests queued")
        caps = [s.cap for s in got if s.cap]
        if caps:
            ev.add("serving.max_num_seqs", max(caps), "requests", "maxNumActiveRequests (the scheduler's limit)")
        budgets = [s.token_budget for s in got if s.token_budget]
        if budgets:
            ev.add("serving.max_num_batched_tokens", max(budgets), "tokens", "maxNumTokensRuntime (tokens per step)")
        return ev.items


def sources() -> list[IterStatsSource]:
    return [IterStatsSource()]
