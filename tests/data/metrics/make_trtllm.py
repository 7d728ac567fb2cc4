"""Writes ``trtllm_two_scrapes_queue.txt``: two scrapes of TensorRT-LLM trtllm-serve's /metrics, by
prometheus_client itself, to the names, types, labels and default buckets that
``tensorrt_llm/metrics/collector.py`` (NVIDIA/TensorRT-LLM) declares; the values are invented (seeded).

    python tests/data/metrics/make_trtllm.py > tests/data/metrics/trtllm_two_scrapes_queue.txt
"""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LABELS = {"model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine_type": "trtllm"}
P = "trtllm_"
E2E = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
       960.0, 1920.0, 7680.0]
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]
TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
PREFILL = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
           2560.0]

reg = CollectorRegistry()
L = list(LABELS)
FINISHED = {**LABELS, "finished_reason": "length"}
success = Counter(P + "request_success_total", "Count of successfully processed requests.", list(FINISHED),
                  registry=reg)
hists = {
    "e2e": Histogram(P + "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", L,
                     buckets=E2E, registry=reg),
    "ttft": Histogram(P + "time_to_first_token_seconds", "Histogram of time to first token in seconds.", L,
                      buckets=TTFT, registry=reg),
    "tpot": Histogram(P + "time_per_output_token_seconds", "Histogram of time per output token in seconds.", L,
                      buckets=TPOT, registry=reg),
    "queue": Histogram(P + "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                       L, buckets=E2E, registry=reg),
    "prefill": Histogram(P + "request_prefill_time_seconds", "Histogram of prefill (context) phase duration in "
                         "seconds (first_token_time - first_scheduled_time).", L, buckets=PREFILL, registry=reg),
    "decode": Histogram(P + "request_decode_time_seconds", "Histogram of decode (generation) phase duration in "
                        "seconds (last_token_time - first_token_time).", L, buckets=E2E, registry=reg),
}
prompt_tokens = Counter(P + "prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.", L,
                        registry=reg)
generation_tokens = Counter(P + "generation_tokens_total", "Cumulative number of generation (output) tokens "
                            "produced.", L, registry=reg)
gauges = {
    "kv": Gauge(P + "kv_cache_utilization", "KV cache utilization", L, registry=reg),
    "running": Gauge(P + "num_requests_running", "Number of active requests", L, registry=reg),
    "waiting": Gauge(P + "num_requests_waiting", "Number of queued requests", L, registry=reg),
    "limit": Gauge(P + "max_num_active_requests", "Maximum number of active requests", L, registry=reg),
    "iteration": Gauge(P + "iteration_latency_seconds", "Iteration latency in seconds", L, registry=reg),
}
rng = random.Random(7)


def serve(n: int, queue_mean_s: float) -> None:
    for _ in range(n):
        queued, prefill = rng.expovariate(1 / queue_mean_s), rng.uniform(0.04, 0.09)
        decode = 256 * rng.uniform(0.018, 0.024)
        for name, value in (("queue", queued), ("prefill", prefill), ("decode", decode),
                            ("ttft", queued + prefill), ("tpot", decode / 255), ("e2e", queued + prefill + decode)):
            hists[name].labels(**LABELS).observe(value)
        prompt_tokens.labels(**LABELS).inc(rng.randint(700, 1300))
        generation_tokens.labels(**LABELS).inc(256)
        success.labels(**FINISHED).inc()


def scrape(at: float, running: int, waiting: int, kv_used: float) -> str:
    for name, value in (("running", running), ("waiting", waiting), ("kv", kv_used), ("limit", 64),
                        ("iteration", 0.021)):
        gauges[name].labels(**LABELS).set(value)
    return f"# scrape at {at:.0f}\n" + generate_latest(reg).decode()


if __name__ == "__main__":
    serve(5000, 0.05)  # the hours before: no queue to speak of
    out = scrape(1764950000, 64, 188, 0.41)
    serve(450, 9.0)  # the window: more requests than the 64 the scheduler runs at once
    out += scrape(1764950060, 64, 231, 0.42)
    print(out, end="")
