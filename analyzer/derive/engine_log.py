"""Serving-engine logs → ``serving.*`` evidence (and ``latency.*`` / ``throughput.*`` from benchmarks).

The parser (``diagnose.collectors.engine_log``) aggregates vLLM/SGLang scheduler stats lines, preemption
warnings, configuration dumps, TGI request spans and vLLM benchmark result blocks; this module
names the aggregates with the shared evidence keys.
"""

from __future__ import annotations

from diagnose.collectors.engine_log import EngineLogParser, EngineLogSummary, Series
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality
from diagnose.stats import quantile

KIND = "engine_log"

# TGI span field → stage name. TGI's "inference" is prefill + decode of a continuously batched
# request, not one execution of the model, so it stays "inference" rather than "compute".
_TGI_STAGES = {"queue": "queue", "validation": "preprocess", "tokenization": "preprocess", "inference": "inference"}
_BACKENDS = {"sglang": "SGLang", "vllm": "vLLM", "openai": "vLLM", "openai-chat": "vLLM", "lmdeploy": "LMDeploy",
             "tgi": "TGI", "trt": "TensorRT-LLM", "tensorrt-llm": "TensorRT-LLM"}
_BENCH_METRICS = {"TTFT": "ttft", "TPOT": "tpot", "ITL": "itl", "E2EL": "e2e"}


class EngineLogSource:
    """TextSource for serving-engine logs (kind ``engine_log``)."""

    kind = KIND
    # the gates of ``EngineLogParser.feed``, as literals
    triggers = ("Running:", "Waiting:", "Pending:", "-req:", "_req:", "preempt", "Preempt", "num_seqs", "num-seqs",
                "batched", "max_running",
                "max-running", "Maximum concurrency", "GPU blocks", "KV cache size", "retracted", "_time",
                "overloaded", ("Benchmark Result", 0, 60), "Throughput:", "request rate", "request-rate",
                "request_rate")  # with the rows of a result block

    def __init__(self) -> None:
        self._parser = EngineLogParser()

    def feed(self, line: str) -> None:
        self._parser.feed(line)

    def feed_raw(self, lines: list[str]) -> None:
        self._parser.feed_raw(lines)

    def matched(self) -> bool:
        return self._parser.matched()

    def problems(self) -> list[str]:
        out: list[str] = []
        s = self._parser.summary()
        if s.benchmark is not None and not s.benchmark.complete:
            out.append("the benchmark result block is cut short (no closing ===== line)")
        return out

    def evidence(self, source: str) -> list[Evidence]:
        return derive(self._parser.summary(), source)


def sources() -> list[EngineLogSource]:
    return [EngineLogSource()]


def derive(s: EngineLogSummary, source: str) -> list[Evidence]:
    """Evidence from one log's aggregates."""
    few = Quality.LOW if s.samples < 3 else Quality.GOOD
    engines = "+".join(e for e in s.engines if e != "vllm-benchmark") or "engine"
    ev = Emit(source)

    def series(prefix: str, ser: Series, unit: str, what: str) -> None:
        if ser.count == 0:
            return
        top = ser.max
        if top is not None and unit == "requests" and top.is_integer():
            top = int(top)
        ev.add(f"{prefix}_max", top, unit, f"largest {what} over {ser.count} {engines} stats line(s)", few)
        ev.add(f"{prefix}_mean", ser.mean, unit, f"mean {what} over {ser.count} {engines} stats line(s)", few)

    if s.samples:
        ev.add("serving.stat_samples", s.samples, "count", f"{engines} scheduler stats lines read")
        named = [e for e in s.engines if e in ("vllm", "sglang", "lmdeploy")]
        if len(named) == 1:  # whose stats lines these are: the engine the advice names first
            ev.add("serving.log_engine", named[0], "", "the engine whose scheduler stats lines these are")
        series("serving.running", s.running, "requests", "running requests")
        series("serving.waiting", s.waiting, "requests", "waiting (pending/queued) requests")
        if s.swapped.count:
            ev.add("serving.swapped_max", int(s.swapped.max or 0), "requests", "largest swapped-out request count", few)
        if s.kv_usage.count:
            ev.add("serving.kv_cache_usage_max_ratio", s.kv_usage.max, "ratio",
                   "largest KV-cache usage (fraction of the KV pool)", few)
            ev.add("serving.kv_cache_usage_mean_ratio", s.kv_usage.mean, "ratio",
                   "mean KV-cache usage (fraction of the KV pool)", few)
        ev.add("serving.queued_samples", s.queued_samples, "count", "stats lines with at least one request waiting")
        ev.add("serving.queued_sample_ratio", s.queued_samples / s.samples, "ratio",
               "share of stats lines with at least one request waiting", few)
        if s.waiting.last is not None:
            ev.add("serving.waiting_last", int(s.waiting.last), "requests", "waiting requests on the last stats line",
                   few)
        if s.running_when_queued.count:
            ev.add("serving.running_when_queued_mean", s.running_when_queued.mean, "requests",
                   "mean running requests on the lines where requests were waiting", few)
            ev.add("serving.running_when_queued_max", int(s.running_when_queued.max or 0), "requests",
                   "most running requests on a line where requests were waiting", few)
        if s.running_when_queued_busy.count:
            ev.add("serving.running_when_queued_busy_mean", s.running_when_queued_busy.mean, "requests",
                   "mean running requests on the lines where requests were waiting and a batch ran", few)
        if s.kv_when_queued.count:
            ev.add("serving.kv_cache_usage_when_queued_mean_ratio", s.kv_when_queued.mean, "ratio",
                   "mean KV-cache usage on the lines where requests were waiting", few)
            ev.add("serving.kv_cache_usage_when_queued_max_ratio", s.kv_when_queued.max, "ratio",
                   "largest KV-cache usage on a line where requests were waiting", few)
        if s.kv_free_seqs_when_queued.count:
            ev.add("serving.kv_free_sequences_when_queued_min", s.kv_free_seqs_when_queued.low, "sequences",
                   "fewest sequences of the running ones' mean size the free KV cache held on a line where "
                   "requests were waiting", few)
        if s.prompt_tps.count:
            ev.add("serving.prompt_tokens_per_s", s.prompt_tps.mean, "tokens/s", "mean prompt (prefill) throughput",
                   few)
        if s.gen_tps.count:
            ev.add("serving.generation_tokens_per_s", s.gen_tps.mean, "tokens/s", "mean generation throughput", few)
            ev.add("serving.generation_tokens_per_s_max", s.gen_tps.max, "tokens/s", "peak generation throughput", few)
            ev.add("serving.generation_tokens_per_s_min", s.gen_tps.low, "tokens/s", "least generation throughput "
                   "of a stats line", few)
        if s.deferred_max:
            ev.add("serving.deferred_max", s.deferred_max, "requests", "most requests a stats line counted as "
                   "deferred (waiting for something other than room: grammar compilation, remote KV, LoRA budget)")
    prefix_ratio: float | None = None
    prefix_detail = ""
    if s.new_tokens + s.cached_tokens > 0:
        prefix_ratio = s.cached_tokens / (s.new_tokens + s.cached_tokens)
        prefix_detail = f"cached / (new + cached) prompt tokens over prefill batches ({s.cached_tokens} cached)"
    elif s.prefix_hit.count:
        prefix_ratio = s.prefix_hit.last
        prefix_detail = "prefix-cache hit rate on the last stats line"
    if prefix_ratio is not None:
        ev.add("serving.prefix_cache_hit_ratio", prefix_ratio, "ratio", prefix_detail)
    if s.preemption_lines or s.retracted or s.preemptions_cumulative or s.preempted_in_stats:
        modes = ", ".join(f"{m.lower()} {n}" for m, n in sorted(s.preempt_modes.items()))
        ev.add("serving.preemptions", s.preemptions, "count",
               "requests preempted for lack of KV cache (vLLM warnings and stats lines / SGLang retractions)"
               + (f"; modes: {modes}" if modes else ""))
    if "max_num_seqs" in s.config:
        ev.add("serving.max_num_seqs", s.config["max_num_seqs"], "requests", "stated in the log's configuration")
    if "max_num_batched_tokens" in s.config:
        ev.add("serving.max_num_batched_tokens", s.config["max_num_batched_tokens"], "tokens",
               "stated in the log's configuration")
    if s.kv_max_concurrency is not None:
        ev.add("serving.kv_max_concurrency", s.kv_max_concurrency, "requests",
               f"requests of {s.kv_max_concurrency_tokens} tokens the KV cache holds at once")
    if s.gpu_blocks is not None:
        ev.add("serving.kv_gpu_blocks", s.gpu_blocks, "blocks", "KV-cache blocks on the GPU")
    if s.kv_capacity_tokens is not None:
        ev.add("serving.kv_capacity_tokens", s.kv_capacity_tokens, "tokens", "KV-cache size in tokens")
    if s.overloaded:
        ev.add("serving.rejected_overloaded", s.overloaded, "count", "requests rejected: 'Model is overloaded'")
    _tgi(s, ev)
    _benchmark(s, ev)
    return ev.items


def _tgi(s: EngineLogSummary, ev: Emit) -> None:
    if not s.tgi_requests:
        return
    q = Quality.LOW if s.tgi_requests < 10 else Quality.GOOD
    who = "TEI" if "tei" in s.engines and "tgi" not in s.engines else "TGI"
    ev.add("requests.count", s.tgi_requests, "requests", f"{who} request spans with timings")
    means: dict[str, float] = {}
    for field, values in sorted(s.tgi.items()):
        if not values:
            continue
        mean = sum(values) / len(values)
        p50 = quantile(values, 0.5)
        p99 = quantile(values, 0.99)
        if field == "total":
            prefix = "latency.e2e_ms"
        elif field == "time_per_token":
            prefix = "latency.itl_ms"
        else:
            prefix = f"stage.{_TGI_STAGES.get(field, field)}_ms"
        means[prefix] = mean
        ev.add(f"{prefix}.mean", mean, "ms", f"{who} {field} over {len(values)} requests", q)
        ev.add(f"{prefix}.p50", p50, "ms", f"{who} {field}", q)
        ev.add(f"{prefix}.p99", p99, "ms", f"{who} {field}", q)
    total = means.get("latency.e2e_ms")
    if total:
        for prefix, mean in means.items():
            if prefix.startswith("stage."):
                stage = prefix[len("stage."):-len("_ms")]
                ev.add(f"stage.{stage}.share", mean / total, "ratio", f"mean {who} {stage} time / mean total time", q)


def _benchmark(s: EngineLogSummary, ev: Emit) -> None:
    if s.offline_throughput:
        ev.add("throughput.rps", s.offline_throughput["rps"], "requests/s", "vLLM offline throughput benchmark")
        if "output_tokens_per_s" in s.offline_throughput:
            ev.add("throughput.tokens_per_s", s.offline_throughput["output_tokens_per_s"], "tokens/s",
                   "vLLM offline throughput benchmark (output tokens)")
    b = s.benchmark
    if b is None:
        return
    q = Quality.GOOD if b.complete else Quality.PARTIAL
    what = f"{_BACKENDS.get(s.bench_backend, s.bench_backend or 'vLLM')} serving benchmark"
    if s.offered_rps is not None and s.offered_rps == float("inf"):
        ev.add("bench.burst", 1, "flag", f"{what}: request rate inf, every request sent at once", q)
    elif s.offered_rps is not None:
        ev.add("bench.offered_rps", s.offered_rps, "requests/s", f"{what}: the request rate it offered", q)
    rows = b.rows
    n = rows.get("Successful requests")
    if n is not None:
        ev.add("requests.count", int(n), "requests", f"{what}: successful requests", q)
    if rows.get("Failed requests"):
        ev.add("requests.failed", int(rows["Failed requests"]), "requests", f"{what}: failed requests", q)
    cap = next((rows[label] for label in ("Maximum request concurrency", "Max request concurrency") if label in rows),
               s.bench_cap)
    if cap is not None:
        ev.add("bench.concurrency", cap, "requests", f"{what}: client-side concurrency cap", q)
    if "Benchmark duration (s)" in rows:
        ev.add("bench.duration_s", rows["Benchmark duration (s)"], "s", what, q)
    if "Request throughput (req/s)" in rows:
        ev.add("throughput.rps", rows["Request throughput (req/s)"], "requests/s", what, q)
    if "Output token throughput (tok/s)" in rows:
        ev.add("throughput.tokens_per_s", rows["Output token throughput (tok/s)"], "tokens/s",
               f"{what}: output tokens", q)
    if "Total Token throughput (tok/s)" in rows:
        ev.add("throughput.total_tokens_per_s", rows["Total Token throughput (tok/s)"], "tokens/s",
               f"{what}: input + output tokens", q)
    if n:
        if "Total input tokens" in rows:
            ev.add("tokens.input_mean", rows["Total input tokens"] / n, "tokens", f"{what}: total input / requests", q)
        if "Total generated tokens" in rows:
            ev.add("tokens.output_mean", rows["Total generated tokens"] / n, "tokens",
                   f"{what}: total generated / requests", q)
    for metric, name in _BENCH_METRICS.items():
        for stat, value in sorted(b.latency(metric).items()):
            ev.add(f"latency.{name}_ms.{stat}", value, "ms", f"{what}: {metric}", q)

