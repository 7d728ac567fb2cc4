"""Request bookkeeping and metrics, exposed with vLLM's metric names and buckets (``GET /metrics``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

# Bucket bounds follow vLLM's (vllm/v1/metrics/loggers.py). The request-latency families (e2e,
# queue, prefill, decode, inference) start at 0.3 s in vLLM; the fine bounds below 0.3 s are
# added here so that the millisecond-scale pathologies (healthy, queueing) keep usable quantiles.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# the tokens one engine step computes, on vLLM's ITERATION_TOKENS_BUCKETS (vllm/v1/metrics/buckets.py)
STEP_TOKENS_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
REQUEST_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0,
                           2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                           1920.0, 7680.0)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


class _Histogram:
    """A cumulative Prometheus histogram (``le`` buckets, ``_sum``, ``_count``); not locked itself."""

    def __init__(self, buckets: tuple[float, ...] = REQUEST_LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.n += 1
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1

    def exposition(self, name: str, help_: str, label: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for b, c in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{name}_bucket{{{label},le="{float(b)!r}"}} {c}')
        lines.append(f'{name}_bucket{{{label},le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum{{{label}}} {self.total!r}")
        lines.append(f"{name}_count{{{label}}} {self.n}")
        return lines


@dataclass(frozen=True)
class GenerationTimings:
    """What a finished text-generation request measured, in seconds (vLLM's definitions).

    ``ttft_s``: arrival → first token; ``prefill_s``: scheduled → first token; ``decode_s``: first
    → last token; ``inference_s``: scheduled → last token; ``itl_s``: the gaps between tokens.
    """

    ttft_s: float
    prefill_s: float
    decode_s: float
    inference_s: float
    itl_s: tuple[float, ...]
    output_tokens: int


# (attribute, exposed name, help, buckets)
_HISTOGRAMS: tuple[tuple[str, str, str, tuple[float, ...]], ...] = (
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("queue_time", "vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS),
    ("inference_time", "vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS),
    ("prefill_time", "vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS),
    ("decode_time", "vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS),
    ("prompt_len", "vllm:request_prompt_tokens", "Number of prefill tokens processed.",
     build_1_2_5_buckets(8192)),
    ("generation_len", "vllm:request_generation_tokens", "Number of generation tokens processed.",
     build_1_2_5_buckets(8192)),
    # The demo's own (no vLLM family shows it): vLLM's vllm:iteration_tokens_total counts a prompt whole, at
    # the step that emits its first token (vllm/v1/metrics/stats.py, IterationStats.update_from_output), so
    # it cannot show chunked prefill; this counts each step's prompt chunks where they are computed.
    ("step_tokens", "demo_engine_step_tokens",
     "Histogram of the tokens one engine step computes: the prompt tokens it prefills and the tokens it generates.",
     STEP_TOKENS_BUCKETS),
)

# (attribute, exposed name, help)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("completed", "vllm:request_success_total", "Count of successfully processed requests."),
    ("prompt_tokens", "vllm:prompt_tokens_total", "Number of prefill tokens processed."),
    ("generation_tokens", "vllm:generation_tokens_total", "Number of generation tokens processed."),
    ("preemptions", "vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
    ("prefix_cache_queries", "vllm:prefix_cache_queries_total",
     "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
)


class Metrics:
    """Thread-safe counters and histograms of the service, exposed with vLLM's metric names.

    Every pathology exposes every family; a family that has no meaning for a pathology (time to
    first token for an image classifier, the KV cache of a model without one) stays at zero.
    As in vLLM, token counters are counted when the engine processes the tokens, time to first
    token and inter-token latency when each token is produced, and the other histograms when a
    request finishes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.completed = 0
        self.errors = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.e2e = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.prompt_len = _Histogram(build_1_2_5_buckets(8192))
        self.generation_len = _Histogram(build_1_2_5_buckets(8192))
        self.step_tokens = _Histogram(STEP_TOKENS_BUCKETS)
        self.started = time.time()

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1

    def count_tokens(
        self,
        *,
        prompt: int = 0,
        generation: int = 0,
        prefix_queries: int = 0,
        prefix_hits: int = 0,
        preemptions: int = 0,
    ) -> None:
        """Add tokens the service has just processed (a request's, outside an engine step)."""
        with self._lock:
            self._count(prompt, generation, prefix_queries, prefix_hits, preemptions)

    def _count(self, prompt: int, generation: int, prefix_queries: int, prefix_hits: int, preemptions: int) -> None:
        self.prompt_tokens += prompt
        self.generation_tokens += generation
        self.prefix_cache_queries += prefix_queries
        self.prefix_cache_hits += prefix_hits
        self.preemptions += preemptions

    def engine_step(self, *, prompt: int = 0, generation: int = 0, prefix_queries: int = 0, prefix_hits: int = 0,
                    preemptions: int = 0) -> None:
        """One engine step's tokens (a generation engine's ``on_tokens``): counted as ``count_tokens``
        counts them, and the prompt tokens it prefilled plus those it generated observed in
        ``demo_engine_step_tokens``, in one hold of the lock (a scrape sees both or neither)."""
        with self._lock:
            self._count(prompt, generation, prefix_queries, prefix_hits, preemptions)
            self.step_tokens.observe(prompt + generation)

    def observe_token(self, *, ttft_s: float | None = None, itl_s: float | None = None) -> None:
        """A generated token reached the client: its time to first token, or its gap to the previous one."""
        with self._lock:
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            if itl_s is not None:
                self.itl.observe(itl_s)

    def end(
        self,
        *,
        ok: bool,
        e2e_s: float,
        queue_s: float | None,
        prompt_tokens: int | None = None,
        generation: GenerationTimings | None = None,
    ) -> None:
        """Close one request: the histograms of a successful one, the error count otherwise.

        ``generation`` feeds the prefill, decode, inference and generation-length histograms; its
        time to first token and inter-token gaps were observed already, through ``observe_token``.
        """
        with self._lock:
            self.in_flight -= 1
            if not ok:
                self.errors += 1
                return
            self.completed += 1
            self.e2e.observe(e2e_s)
            if queue_s is not None:
                self.queue_time.observe(queue_s)
            if prompt_tokens is not None:
                self.prompt_len.observe(prompt_tokens)
            if generation is not None:
                g = generation
                self.prefill_time.observe(g.prefill_s)
                self.decode_time.observe(g.decode_s)
                self.inference_time.observe(g.inference_s)
                self.generation_len.observe(g.output_tokens)

    def prometheus(self, model_name: str, running: int, waiting: int, kv_cache_usage: float = 0.0) -> str:
        """The Prometheus text exposition (format 0.0.4) of every family."""
        label = f'model_name="{model_name}"'
        lines: list[str] = []
        with self._lock:
            for name, help_, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.", running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_cache_usage),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{{{label}}} {value!r}"]
            for attr, name, help_ in _COUNTERS:
                value = getattr(self, attr)
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name}{{{label}}} {value}"]
            for attr, name, help_, _buckets in _HISTOGRAMS:
                lines += getattr(self, attr).exposition(name, help_, label)
        return "\n".join(lines) + "\n"


