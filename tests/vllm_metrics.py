"""The vLLM-compatible metrics the demo service exposes, parsed and checked (unit and integration tests)."""

from __future__ import annotations

import re
from typing import Any

HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "demo_engine_step_tokens",  # the demo's own (examples/service/metrics.py)
)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = (
    "vllm:request_success",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)


def families(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict[str, Any], family: str, sample: str) -> float:
    values = [s.value for s in fams[family].samples if s.name == sample]
    assert len(values) == 1, (sample, values)
    return values[0]


def check_exposition(text: str, model_name: str) -> dict[str, Any]:
    """Every vLLM family parses with its type; histograms are cumulative and end in +Inf = _count."""
    fams = families(text)
    for name in HISTOGRAMS:
        fam = fams[name]
        assert fam.type == "histogram", name
        buckets = [s for s in fam.samples if s.name == name + "_bucket"]
        assert all(s.labels["model_name"] == model_name for s in fam.samples)
        assert buckets[-1].labels["le"] == "+Inf"
        counts = [s.value for s in buckets]
        assert counts == sorted(counts), name
        bounds = [float(s.labels["le"]) for s in buckets]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
        assert counts[-1] == sample(fams, name, name + "_count")
    for name in GAUGES:
        assert fams[name].type == "gauge", name
    for name in COUNTERS:
        assert fams[name].type == "counter", name
    kv = sample(fams, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc")
    assert 0.0 <= kv <= 1.0
    return fams



def buckets(fams: dict[str, Any], family: str) -> dict[str, float]:
    """A histogram's cumulative counts by their ``le`` label, as exposed ("512.0", "+Inf")."""
    return {s.labels["le"]: s.value for s in fams[family].samples if s.name.endswith("_bucket")}


def split_scrapes(text: str) -> list[tuple[float, str]]:
    """The scrapes of a file diagnose wrote (``# scrape at TIME [from URL]`` before each), as (time, text)."""
    parts = re.split(r"^# scrape at (\S+).*\n", text, flags=re.MULTILINE)[1:]
    return [(float(parts[i]), parts[i + 1]) for i in range(0, len(parts), 2)]
