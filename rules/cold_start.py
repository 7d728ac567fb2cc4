"""Rules over the order and the size of requests in a stage-timing log: cold start, size scaling.

Both read per-request figures that the stage-timing derivation computes from the JSONL in arrival
(``ts``) order: the first requests against the steady state (STG004), and how time to first token
moves with each request's input size (STG005).
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, EvidenceSet, Finding, Fix, Risk, Severity
from diagnose.rules import advice
from diagnose.rules.base import Rule, any_low_quality, bar, fmt_ms, present
from diagnose.units import pct


class ColdStart(Rule):
    """The first requests after start (or on a new input shape) are much slower than the steady state.

    What it detects: in a stage-timing log, the first requests after the service started, or the
    first request of each new input shape, take several times the steady-state median end-to-end
    latency: lazy CUDA context and cuDNN/cuBLAS initialisation, torch.compile or TensorRT building
    on the first call, memory pools growing, caches filling, with no warm-up before traffic.

    Why it matters: users routed to a fresh replica (every deploy, every autoscaling step) get the
    slow requests; timeouts and retries on them make a scale-out look like an outage.

    How it decides: ``latency.first_requests_ms.mean`` (the first requests of the log) or
    ``latency.new_shape_ms.mean`` (requests on a shape not seen before) is at least ``min_ratio`` ×
    ``latency.steady_ms.p50`` and at least ``min_extra_ms`` slower in absolute terms. Impact is the
    extra time's share of all request time when ``requests.count`` is known, floored at
    ``min_impact`` (a cold start hurts the first users whatever its share).

    Evidence: latency.steady_ms.p50 with latency.first_requests_ms.mean or latency.new_shape_ms.mean;
    optionally latency.first_requests.count, latency.first_requests_ms.max, latency.new_shape.count,
    requests.count.

    Fix: warm up before taking traffic (run each batch size / shape bucket once, then mark the
    replica ready); bucket or pad shapes so new ones are rare; cache compiled artefacts
    (``TORCHINDUCTOR_CACHE_DIR``, TensorRT engine/timing caches); keep a readiness probe that waits.

    False positives: a load test whose first requests met a cold client or DNS, or a log whose first
    lines are a different, heavier request type.
    """

    code = "STG004"
    name = "cold-start-slow-requests"
    category = Category.RECOMPILATION
    requires = ("latency.steady_ms.p50",)
    requires_any = (("latency.first_requests_ms.mean",), ("latency.new_shape_ms.mean",))
    optional = (
        "latency.first_requests_ms.mean", "latency.first_requests_ms.max", "latency.first_requests.count",
        "latency.new_shape_ms.mean", "latency.new_shape.count", "requests.count",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_ratio: float = 3.0  # 3× the steady median is beyond request-to-request noise
        min_extra_ms: float = 100.0  # under 0.1 s extra per request nobody notices a cold start
        min_impact: float = 0.2  # the first users of every new replica pay it, whatever the share of all time

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        steady = ev.value("latency.steady_ms.p50")
        if not steady or steady <= 0:
            return None
        parts: list[str] = []
        extra_total = 0.0
        worst = 0.0
        for key, count_key, what in (
            ("latency.first_requests_ms.mean", "latency.first_requests.count", "first request(s) after start"),
            ("latency.new_shape_ms.mean", "latency.new_shape.count", "request(s) on an input shape not seen before"),
        ):
            slow = ev.value(key)
            if slow is None or slow < t.min_ratio * steady or slow - steady < t.min_extra_ms:
                continue
            n = ev.value(count_key)
            ratio = slow / steady
            worst = max(worst, ratio)
            extra_total += (slow - steady) * (n or 1.0)
            parts.append(f"The {f'{n:.0f} ' if n else ''}{what} took {fmt_ms(slow)} on average, "
                         f"{ratio:.1f}× the steady-state median of {fmt_ms(steady)}.")
        if not parts:
            return None
        peak = ev.value("latency.first_requests_ms.max")
        if peak is not None and peak > steady:
            parts.append(f"The slowest of the first requests took {fmt_ms(peak)}.")
        total = ev.value("requests.count")
        share = extra_total / (extra_total + steady * total) if total else None
        if share is not None:
            parts.append(f"The extra time is {pct(share)} of all request time in the log.")
        parts.append("Compilation or initialisation runs on live requests: there is no warm-up before traffic.")
        impact = max(t.min_impact, min(0.7, share if share is not None else t.min_impact))
        confidence = Confidence.THIN if any_low_quality(ev, *self.requires, *self.optional) else Confidence.MEASURED
        return self.finding(
            severity=_severity(worst),
            confidence=confidence,
            title="Cold start: the first requests are much slower",
            message=" ".join(parts),
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"first  |{bar(1.0)}| {worst:.1f}×\nsteady |{bar(1.0 / worst)}| 1×",
            fixes=[
                Fix(
                    "Warm up before taking traffic",
                    ("At start-up run one dummy request per batch size and shape bucket, then report ready "
                     "(readiness probe / load-balancer health check waits for it)",
                     "vLLM/SGLang do this themselves; custom services: call the model under torch.inference_mode "
                     "on representative inputs"),
                    Risk.SAFE,
                ),
                Fix(
                    "Make new shapes rare and builds cached",
                    ("Pad or bucket inputs to a few lengths/batch sizes; torch.compile(dynamic=True) or mark_dynamic",
                     "Persist compiled artefacts across restarts: TORCHINDUCTOR_CACHE_DIR / "
                     "TORCHINDUCTOR_FX_GRAPH_CACHE=1, TensorRT engine and timing caches"),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


def _severity(ratio: float) -> Severity:
    """A cold start ten times the steady state is major; less is minor."""
    return Severity.MAJOR if ratio >= 10 else Severity.MINOR


class LatencyScalesWithInputSize(Rule):
    """Time to first token (or end-to-end latency) grows with each request's input size.

    What it detects: across the requests of a stage-timing log, TTFT (else end-to-end latency)
    correlates strongly with the request's input size (prompt tokens, image pixels) while the time
    spent queued does not explain it: the work on the input itself (prefill, preprocessing) is
    what makes slow requests slow, not waiting behind others.

    Why it matters: it separates prefill-bound from queue-bound TTFT. Adding replicas or workers
    fixes a queue; it does not shorten a long prompt's prefill, which chunked prefill, prefix
    caching or shorter inputs do.

    How it decides: ``scaling.ttft_ms.input_size_corr`` (else ``scaling.e2e_ms.input_size_corr``),
    over ``scaling.input_size.requests`` ≥ ``min_requests`` requests whose input sizes span
    ``scaling.input_size.range_ratio`` ≥ ``min_range_ratio``, is at least ``min_corr``; and the
    latency's correlation with the request's own queue time, ``scaling.ttft_ms.queue_corr`` (when
    known), is not higher than the correlation with size and not above ``max_queue_corr``.
    Impact is the squared correlation (the share of latency variance that size explains), capped.

    Evidence: scaling.input_size.requests and scaling.ttft_ms.input_size_corr or
    scaling.e2e_ms.input_size_corr; optionally scaling.input_size.range_ratio,
    scaling.ttft_ms.per_1k_input_ms, scaling.e2e_ms.per_1k_input_ms, scaling.ttft_ms.queue_corr,
    tokens.input_mean, latency.ttft_ms.p50.

    Fix: chunked prefill and a prefill token budget, prefix caching for shared prefixes, capping
    or trimming inputs, more tensor parallelism for prefill-heavy traffic.

    False positives: a load pattern where large requests arrive exactly when the service is busy
    (size and load confounded); the queue correlation guards the common case.
    """

    code = "STG005"
    name = "latency-scales-with-input-size"
    category = Category.PREFILL_TTFT
    requires = ("scaling.input_size.requests",)
    requires_any = (("scaling.ttft_ms.input_size_corr",), ("scaling.e2e_ms.input_size_corr",))
    optional = (
        "scaling.ttft_ms.input_size_corr", "scaling.e2e_ms.input_size_corr", "scaling.input_size.range_ratio",
        "scaling.ttft_ms.per_1k_input_ms", "scaling.e2e_ms.per_1k_input_ms", "scaling.ttft_ms.queue_corr",
        "tokens.input_mean", "latency.ttft_ms.p50",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_corr: float = 0.7  # r ≥ 0.7: size explains about half of the latency's variance or more
        min_requests: float = 20  # fewer requests make a correlation coefficient noise
        min_range_ratio: float = 4.0  # inputs spanning under 4× cannot show a size effect above noise
        max_queue_corr: float = 0.8  # latency that tracks its own queue time that closely is queue-bound
        max_impact: float = 0.8  # a correlation is never the whole story

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = ev.value("scaling.input_size.requests", 0.0) or 0.0
        metric = "ttft" if ev.value("scaling.ttft_ms.input_size_corr") is not None else "e2e"
        r = ev.value(f"scaling.{metric}_ms.input_size_corr")
        if r is None or n < t.min_requests or r < t.min_corr:
            return None
        spread = ev.value("scaling.input_size.range_ratio")
        if spread is not None and spread < t.min_range_ratio:
            return None
        q = ev.value("scaling.ttft_ms.queue_corr") if metric == "ttft" else None
        if q is not None and (q > t.max_queue_corr or q > r):
            return None
        label = "Time to first token" if metric == "ttft" else "End-to-end latency"
        parts = [f"{label} grows with the request's input size: correlation r = {r:.2f} over {n:.0f} requests"]
        if spread is not None:
            parts[0] += f" whose sizes span {spread:.0f}×"
        parts[0] += "."
        slope = ev.value(f"scaling.{metric}_ms.per_1k_input_ms")
        if slope is not None:
            parts.append(f"Each 1,000 more input tokens (or size units) add about {fmt_ms(slope)}.")
        if q is not None:
            parts.append(f"Its correlation with the request's own queue time is only {q:.2f}: "
                         "the input's processing (prefill), not waiting, makes slow requests slow.")
        else:
            parts.append("Queue time per request is not in evidence, so queueing is not ruled out.")
        impact = min(t.max_impact, r * r)
        confidence = Confidence.CORRELATED if q is not None else Confidence.HEURISTIC
        if any_low_quality(ev, *self.requires, f"scaling.{metric}_ms.input_size_corr"):
            confidence = Confidence.THIN
        return self.finding(
            severity=Severity.MAJOR if impact >= 0.5 else Severity.MINOR,
            confidence=confidence,
            title=f"{label} scales with input size",
            message=" ".join(parts),
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"size explains |{bar(r * r)}| {pct(r * r)} of the variance",
            fixes=[
                Fix(
                    "Bound the prefill work per step",
                    (advice.chunked_prefill(ev), "SGLang: --chunked-prefill-size; TGI: --max-batch-prefill-tokens"),
                    Risk.SAFE,
                ),
                Fix(
                    "Send less input, or reuse it",
                    (advice.prefix_caching(ev),
                     "Trim or summarise long contexts; cap --max-model-len to what requests need"),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


RULES: tuple[type[Rule], ...] = (ColdStart, LatencyScalesWithInputSize)
