"""Time to first token dominated by prefill."""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Quality, Risk
from diagnose.rules import advice, hardware
from diagnose.rules.base import Rule, bar, present, severity_for
from diagnose.units import pct

_METRICS = ("queue", "ttft", "prefill", "e2e")


def _first(ev: EvidenceSet, *keys: str) -> tuple[float | None, str]:
    for k in keys:
        v = ev.value(k)
        if v is not None:
            return v, k
    return None, ""


def _a(word: str) -> str:
    """``word`` with its article as it is spoken: "an H100", "an 8B", "a T4", "a 70B"."""
    spoken_vowel = word[:1] in "AEFHILMNORSX" or word.startswith(("8", "11", "18")) or word[:2] == "80"
    return f"{'an' if spoken_vowel else 'a'} {word}"


def _ms(x: float) -> str:
    if x >= 1000:
        return f"{x / 1000:.2f} s"
    return f"{x:.0f} ms" if x >= 10 else f"{x:.2g} ms"


OVERLOAD = 1.2  # a benchmark offered 20 % more requests per second than it served: the queue grew all run


def bench_queue(ev: EvidenceSet) -> str | None:
    """Why a serving benchmark's requests waited for one another, or None: its rate was ``inf`` (every request
    sent at once), it offered ``OVERLOAD`` × more than it served with no cap on those in flight, or it kept
    several in flight (its concurrency cap, and what Little's law gives when the latency is known)."""
    n = ev.value("requests.count") or 0.0
    served = ev.value("throughput.rps")
    offered = ev.value("bench.offered_rps")
    cap = ev.value("bench.concurrency")
    e2e = ev.value("latency.e2e_ms.mean")
    if ev.value("bench.burst") and n >= 2 and (cap is None or cap >= 2):
        return f"the benchmark sent its {n:,.0f} requests at once (request rate inf)"
    if offered is not None and served and cap is None and offered >= OVERLOAD * served:
        return f"the benchmark offered {offered:g} requests/s and the server completed {served:g}"
    if cap is not None and cap >= 2:
        inflight = served * e2e / 1000.0 if served and e2e else cap
        if inflight >= 2:
            return f"the benchmark kept about {min(cap, inflight):,.0f} requests in flight"
    return None


def _queue_in_evidence(ev: EvidenceSet, t: PrefillBoundTtft.Thresholds) -> bool:
    """Requests waited for one another: the engine's waiting requests reached ``max_waiting``, or the benchmark
    queued them (``bench_queue``)."""
    waiting = ev.value("serving.waiting_max")
    return (waiting is not None and waiting >= t.max_waiting) or bench_queue(ev) is not None


class PrefillBoundTtft(Rule):
    """Time to first token is dominated by prefill.

    What it detects: the prompt's prefill is most of the time to first token (or of the whole
    request); or waiting grows with prompt length and not with concurrency (long prompts' prefill
    blocks the prompts behind them); or prompts of many thousand tokens with a TTFT of seconds.

    Why it matters: prefill is compute-bound and grows with prompt length (quadratically in
    attention); without chunking, one long prefill also stalls every running decode. Adding
    replicas for "queueing" does not help; shorter or cached prompts and chunked prefill do.

    How it decides: (1) the prefill share, ``stage.prefill.share`` or ``stage.prefill_ms`` over ``latency.ttft_ms``,
    is at least ``min_share`` while TTFT (when known) is at least ``min_ttft_ms``; or (2) a load-condition table
    shows the wait (queue or TTFT) at least ``min_prompt_ratio`` × longer for long prompts than for short ones while
    concurrency alone moves it less than ``max_concurrency_ratio`` ×; or (2b) a prompt-length sweep (TTFT against
    prompt tokens, one request at a time, no concurrency column) whose fitted line explains at least ``sweep_r2`` of
    its points and whose slope is at least ``sweep_share`` of the longest prompt's TTFT, itself at least
    ``slow_ttft_ms``, with no sign of requests in flight together (an engine's waiting requests, a benchmark that
    queues them, concurrency stated or set on a load generator's command line): the prefill's work is the TTFT
    (impact the slope's share, confidence correlated); or (3) prompts average at least
    ``min_prompt_tokens`` and TTFT (with none measured, the prefill's own time, its floor: llama.cpp's "prompt eval
    time") is at least ``slow_ttft_ms`` with no sign of a request queue
    (``serving.waiting_max`` under ``max_waiting``, and no benchmark load that queues requests: every request sent
    at once, more offered than served, or several in flight at a time: ``bench_queue``). Then the prefill is judged
    against the model and the device, not a fixed token count: with ``model.params`` and ``gpu.name`` known, the
    prefill's dense compute (2 FLOPs per parameter per token, at ``diagnose.rules.hardware.PREFILL_MFU`` of the
    GPU's datasheet TFLOP/s, times ``mem.tensor_parallel``) either explains at least ``explains`` of the TTFT
    (prefill-bound) or the measured rate is that many times slower (a slow prefill: attention backend, offload, time
    before the prefill); with only the model's size, the useful TFLOP/s is stated; with neither, the finding says
    the rate cannot be judged.

    Evidence: one of stage.prefill.share, stage.prefill_ms.* with latency.ttft_ms.*,
    scaling.<queue|ttft|prefill|e2e>_ms.prompt_length_ratio, tokens.input_mean with
    latency.ttft_ms.*, scaling.ttft_prompt_share with scaling.ttft_prompt_r2 and scaling.ttft_prompt_longest_ms;
    optionally serving.prefix_cache_hit_ratio, scaling.*.concurrency_ratio,
    serving.waiting_max, model.params, gpu.name, mem.tensor_parallel, serving.engine_version,
    serving.vllm_v1.

    Fix: chunked prefill so long prompts stop blocking (on by default in vLLM V1, where a larger
    ``--max-num-batched-tokens`` favours TTFT and a smaller one the running requests' ITL;
    ``--enable-chunked-prefill`` in V0); prefix caching (on by default in V1,
    ``--enable-prefix-caching`` in V0; keep the shared prefix byte-identical; for API providers,
    keep the cache warm within its TTL); shorter prompts; more tensor parallelism for
    prefill-heavy loads.

    False positives: a healthy service where prefill is naturally most of a fast TTFT (hence
    ``min_ttft_ms``); a benchmark client that queues requests itself before sending them.
    """

    code = "TTF001"
    name = "prefill-bound-ttft"
    category = Category.PREFILL_TTFT
    requires = ()
    requires_any = (
        ("stage.prefill.share",),
        ("stage.prefill_ms.mean", "latency.ttft_ms.mean"),
        ("stage.prefill_ms.p50", "latency.ttft_ms.p50"),
        *((f"scaling.{m}_ms.prompt_length_ratio",) for m in _METRICS),
        ("tokens.input_mean", "latency.ttft_ms.mean"),
        ("tokens.input_mean", "latency.ttft_ms.p50"),
        ("tokens.input_mean", "stage.prefill_ms.mean"),
        ("scaling.ttft_prompt_share", "scaling.ttft_prompt_r2", "scaling.ttft_prompt_longest_ms"),
    )
    optional = (
        "stage.prefill.share", "stage.prefill_ms.p50", "stage.prefill_ms.mean", "latency.ttft_ms.p50",
        "latency.ttft_ms.mean", "latency.e2e_ms.p50", "latency.e2e_ms.mean", "tokens.input_mean",
        "serving.prefix_cache_hit_ratio", "serving.waiting_max", "model.params", "gpu.name", "mem.tensor_parallel",
        "serving.engine_version", "serving.vllm_v1", "bench.burst", "bench.offered_rps", "bench.concurrency",
        "throughput.rps", "requests.count", "report.concurrency_max", "report.load_concurrency",
        "scaling.ttft_prompt_share", "scaling.ttft_prompt_r2",
        "scaling.ttft_prompt_longest_ms", "scaling.ttft_prompt_longest_tokens", "scaling.prefill_rate_tps",
        *(f"scaling.{m}_ms.{k}" for m in _METRICS for k in ("prompt_length_ratio", "concurrency_ratio",
                                                              "long_prompt_p50", "short_prompt_max")),
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.5  # prefill more than half of TTFT (or of the request) is what to fix first
        min_ttft_ms: float = 500.0  # under half a second, prefill dominating a TTFT is normal and fine
        min_prompt_ratio: float = 10.0  # long prompts waiting 10× longer than short ones: prefill blocks them
        max_concurrency_ratio: float = 3.0  # while concurrency alone barely moves the wait: not a capacity queue
        min_prompt_tokens: float = 1000.0  # shorter prompts are not what makes a TTFT of seconds
        slow_ttft_ms: float = 2000.0  # a TTFT above 2 s is what users report
        explains: float = 0.5  # the device's prefill time is at least half the TTFT: prefill compute explains it
        sweep_share: float = 0.8  # a prompt sweep's slope is 80 % of its longest TTFT: the prefill, not a fixed cost
        sweep_r2: float = 0.9  # ... and a line fits its points: TTFT proportional to the prompt, not noise
        max_waiting: float = 1.0  # requests waiting in the engine's queue point to queueing instead
        low_cache_hit: float = 0.5  # under half of prompt tokens from the prefix cache: caching would help

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        # Means first: mean TTFT is the sum of the mean stages, a ratio of medians mixes requests.
        ttft, ttft_key, prefill = None, None, None
        for stat in ("mean", "p50"):
            ttft, ttft_key = _first(ev, f"latency.ttft_ms.{stat}")
            prefill, _ = _first(ev, f"stage.prefill_ms.{stat}")
            if ttft is not None and prefill is not None:
                break
        if ttft is None:
            ttft, ttft_key = _first(ev, "latency.ttft_ms.mean", "latency.ttft_ms.p50")
        if prefill is None:
            prefill, _ = _first(ev, "stage.prefill_ms.mean", "stage.prefill_ms.p50")
        share = ev.value("stage.prefill.share")
        of_ttft = prefill / ttft if (prefill is not None and ttft) else None
        # per request prefill ≤ TTFT; a larger mean means the two histograms counted different requests (an
        # engine records TTFT at the first token, prefill when the request ends): few requests in the window
        mismatched = of_ttft is not None and of_ttft > 1.0
        if of_ttft is not None:
            of_ttft = min(of_ttft, 1.0)
        best_share = max((s for s in (share, of_ttft) if s is not None), default=None)
        # without a measured TTFT, the prefill itself must take that long (a 100 ms prompt eval is no incident)
        slow_enough = ttft >= t.min_ttft_ms if ttft is not None else (prefill is None or prefill >= t.min_ttft_ms)
        parts: list[str] = []
        impact = 0.0
        confidence = Confidence.MEASURED
        if best_share is not None and best_share >= t.min_share and slow_enough:
            impact = min(0.95, best_share)
            what = "time to first token" if of_ttft is not None and of_ttft >= (share or 0) else "the request"
            whole = ttft if ttft else _first(ev, "latency.e2e_ms.p50", "latency.e2e_ms.mean")[0]
            parts.append(f"Prefill is {'all' if mismatched else pct(best_share)} of {what}"
                         + (f" ({_ms(prefill)} of {_ms(whole)})" if prefill is not None and whole else
                            f" ({_ms(prefill)} per request)" if prefill is not None else "")
                         + (": the two histograms counted different requests (few finished in the window)"
                            if mismatched else "") + ".")
            if mismatched:
                confidence = Confidence.HEURISTIC
        else:
            scaled = self._scaling(ev, t)
            swept = self._prompt_sweep(ev, t) if scaled is None else None
            if scaled is not None:
                impact, text = scaled
                confidence = Confidence.CORRELATED
                parts.append(text)
            elif swept is not None:
                impact, text = swept
                confidence = Confidence.CORRELATED  # a fitted line, one request at a time as far as the text says
                parts.append(text)
            else:
                # with no TTFT measured, the prefill itself is its floor: the first token comes after it
                floor = ttft is None and prefill is not None
                judged = self._long_prompt(ev, t, ttft if ttft is not None else prefill, floor=floor)
                if judged is None:
                    return None
                impact, text = judged
                confidence = Confidence.HEURISTIC
                parts.append(text)
        if confidence is Confidence.MEASURED:
            ttft_ev = ev.get(ttft_key) if ttft_key else None
            if isinstance(ttft_ev, Evidence) and ttft_ev.quality is not Quality.GOOD:
                confidence = Confidence.HEURISTIC
        hit = ev.value("serving.prefix_cache_hit_ratio")
        if hit is not None and hit < t.low_cache_hit:
            parts.append(f"Only {pct(hit)} of prompt tokens were served from the prefix cache.")
        tokens = ev.value("tokens.input_mean")
        if tokens is not None and "-token prompts" not in " ".join(parts):
            parts.append(f"Prompts average {tokens:,.0f} tokens.")
        return self.finding(
            severity=severity_for(impact),
            confidence=confidence,
            title="Time to first token is prefill-bound",
            message=" ".join(parts),
            impact=impact,
            evidence=present(ev, *self.optional),
            why=f"prefill |{bar(impact)}| {pct(impact)}",
            fixes=[
                Fix(
                    "Stop long prefills from blocking",
                    (advice.chunked_prefill(ev), "SGLang: --chunked-prefill-size; TGI: --max-batch-prefill-tokens"),
                    Risk.SAFE,
                ),
                Fix(
                    "Do not prefill the same prefix twice",
                    (advice.prefix_caching(ev),
                     "Hosted APIs: mark the stable prefix cacheable and keep it warm within the provider's cache "
                     "TTL (e.g. a cheap refresh before it expires)"),
                    Risk.SAFE,
                ),
                Fix(
                    "Make prefill cheaper",
                    ("Trim prompts (fewer/shorter retrieved chunks, summarised history)",
                     "More tensor parallelism or a faster GPU for prefill-heavy traffic; disaggregated prefill "
                     "for mixed loads"),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )

    @staticmethod
    def _long_prompt(ev: EvidenceSet, t: PrefillBoundTtft.Thresholds, ttft: float | None,
                     floor: bool = False) -> tuple[float, str] | None:
        """Long prompts and a slow TTFT with no queue: how long the prefill should take on this model and GPU.
        ``floor``: no TTFT was measured and ``ttft`` is the prefill's own time, which the first token comes after."""
        tokens = ev.value("tokens.input_mean")
        if (tokens is None or ttft is None or tokens < t.min_prompt_tokens or ttft < t.slow_ttft_ms
                or _queue_in_evidence(ev, t)):
            return None
        rate = tokens / (ttft / 1000)
        head = (f"{tokens:,.0f}-token prompts take {_ms(ttft)} to prefill ({rate:,.0f} prompt tokens/s) before their "
                "first token" if floor else
                f"{tokens:,.0f}-token prompts meet a time to first token of {_ms(ttft)} ({rate:,.0f} prompt tokens/s)")
        params = ev.value("model.params")
        spec = hardware.dense_tflops(hardware.gpu_name(ev))
        devices = int(ev.value("mem.tensor_parallel") or 1)
        if params and spec:
            gpu, tflops = spec
            on = f"{devices} × {gpu}" if devices > 1 else _a(gpu)
            expect = hardware.prefill_ms(params, tokens, tflops, devices)
            size = f"{params / 1e9:,.3g}B"
            if expect >= t.explains * ttft:
                peak = hardware.prefill_ms(params, tokens, tflops, devices, mfu=1.0)
                return (min(0.9, expect / ttft),
                        f"{head} with no request queue in evidence. Prefilling them through a {size}-parameter model "
                        f"is {2 * params * tokens / 1e15:,.3g} PFLOP: {_ms(peak)} on {on} at its full "
                        f"{tflops:,.0f} TFLOP/s, about {_ms(expect)} at the {pct(hardware.PREFILL_MFU)} a prefill "
                        "typically reaches. The prefill's compute is the time to first token.")
            return (0.5,
                    f"{head} with no request queue in evidence: {ttft / expect:,.0f}× slower than {_a(size)}-parameter "
                    f"model prefills on {on} (about {_ms(expect)} at {pct(hardware.PREFILL_MFU)} of its "
                    f"{tflops:,.0f} TFLOP/s). The prefill is slow, not just long: check the attention backend "
                    "(FlashAttention, not eager), weights or KV cache offloaded to the CPU, a queue in front of the "
                    "engine, or time before the prefill (tokenisation, image preprocessing).")
        if params:
            useful = 2 * params * rate / 1e12
            return (0.5,
                    f"{head} with no request queue in evidence: {useful:,.3g} TFLOP/s of useful work for a "
                    f"{params / 1e9:,.3g}B-parameter model. The GPU is not named: on a data-centre GPU (100+ TFLOP/s "
                    "at 40 % of peak) that would be a slow prefill; on a small one it is the prefill's compute.")
        return (0.4,
                f"{head} with no request queue in evidence: the prefill of long prompts is the likely time to first "
                "token. Neither the model's size nor the GPU is in the evidence, so whether that rate is slow for "
                "them cannot be judged.")

    @staticmethod
    def _prompt_sweep(ev: EvidenceSet, t: PrefillBoundTtft.Thresholds) -> tuple[float, str] | None:
        """A table of TTFT against prompt length, one request at a time: the TTFT grows in proportion to the prompt
        (a line through its points explains ``sweep_r2`` of them, and its slope is ``sweep_share`` of the longest
        prompt's TTFT) and that TTFT is at least ``slow_ttft_ms``: the prefill's work is the TTFT."""
        share, r2 = ev.value("scaling.ttft_prompt_share"), ev.value("scaling.ttft_prompt_r2")
        longest, tokens = ev.value("scaling.ttft_prompt_longest_ms"), ev.value("scaling.ttft_prompt_longest_tokens")
        if share is None or r2 is None or longest is None or tokens is None:
            return None
        together = max(ev.value("report.concurrency_max") or 0.0, ev.value("report.load_concurrency") or 0.0)
        if _queue_in_evidence(ev, t) or together >= 2:
            return None  # requests in flight together: each TTFT holds the others' prefills, a queue
        if share < t.sweep_share or r2 < t.sweep_r2 or longest < t.slow_ttft_ms:
            return None
        rate = ev.value("scaling.prefill_rate_tps")
        text = (f"Time to first token grows in proportion to the prompt: {pct(share)} of the longest prompt's "
                f"{_ms(longest)} ({tokens:,.0f} tokens) is the prompt's own share of a line through the sweep "
                f"(R² {r2:.2f})" + (f", about {rate:,.0f} prompt tokens a second" if rate else "")
                + ": the prefill's work is the time to first token, not a queue or a fixed overhead.")
        return min(0.9, share), text

    @staticmethod
    def _scaling(ev: EvidenceSet, t: PrefillBoundTtft.Thresholds) -> tuple[float, str] | None:
        for m in _METRICS:
            ratio = ev.value(f"scaling.{m}_ms.prompt_length_ratio")
            if ratio is None or ratio < t.min_prompt_ratio:
                continue
            conc = ev.value(f"scaling.{m}_ms.concurrency_ratio")
            if conc is not None and conc >= t.max_concurrency_ratio:
                continue
            long_v = ev.value(f"scaling.{m}_ms.long_prompt_p50")
            short_max = ev.value(f"scaling.{m}_ms.short_prompt_max")
            label = {"queue": "Queue time", "ttft": "Time to first token", "e2e": "Latency"}.get(m, m.title())
            text = f"{label} grows {ratio:,.0f}× with long prompts"
            if long_v is not None and short_max is not None:
                text += f" (median {_ms(long_v)} against at most {_ms(short_max)} for short prompts)"
            if conc is not None:
                text += f", while raising concurrency with short prompts moves it only {conc:.1f}×"
            text += (": requests wait for earlier prompts' prefill, not for capacity. Long prompts are "
                     "prefilled whole and serialise behind each other.")
            return min(0.8, 1.0 - 1.0 / ratio), text
        return None


RULES: tuple[type[Rule], ...] = (PrefillBoundTtft,)
