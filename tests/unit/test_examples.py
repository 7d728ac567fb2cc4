"""The demo service's parts without a process: pathology specs, the load generator, payloads, the
preprocessing, the metrics exposition and the decoder (the service itself, started for real, is
tests/integration/test_demo_service.py).
"""

from __future__ import annotations

import json

import pytest

from diagnose.examples.demo import PATHOLOGIES
from diagnose.examples.loadgen import LoadResult, make_jpeg, make_payload, run_load
from tests.vllm_metrics import buckets, check_exposition, sample


def test_pathology_specs_are_consistent() -> None:
    assert set(PATHOLOGIES) == {"cpu-preprocess", "recompile", "queueing", "healthy", "prefill"}
    categories = {name: spec.expected_category for name, spec in PATHOLOGIES.items()}
    assert categories == {
        "cpu-preprocess": "cpu_preprocessing",
        "recompile": "recompilation",
        "queueing": "queueing",
        "healthy": None,
        "prefill": "prefill_ttft",
    }
    for name, spec in PATHOLOGIES.items():
        assert spec.name == name
        assert spec.concurrency >= 1 and spec.think_s >= 0 and spec.description
    assert PATHOLOGIES["queueing"].concurrency >= 12


def test_loadgen_only_targets_the_local_host() -> None:
    with pytest.raises(ValueError, match="local host"):
        run_load("http://example.com:80", "healthy", 1, 1.0)
    with pytest.raises(ValueError, match="port"):
        run_load("http://127.0.0.1", "healthy", 1, 1.0)
    with pytest.raises(ValueError):
        run_load("http://127.0.0.1:1", "healthy", 0, 1.0)


def test_loadgen_counts_errors_against_a_closed_port() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_load(f"http://127.0.0.1:{port}", "healthy", 2, 0.5, max_requests=6, timeout_s=2)
    assert isinstance(result, LoadResult)
    assert result.requests == result.errors > 0
    assert result.throughput_rps == 0.0


def test_payloads() -> None:
    import io
    import random

    from PIL import Image

    jpeg = make_jpeg()
    assert jpeg[:2] == b"\xff\xd8"
    assert Image.open(io.BytesIO(jpeg)).size == (640, 480)
    body, ctype = make_payload("queueing", random.Random(0))
    assert ctype == "application/json" and len(json.loads(body)["tokens"]) == 128
    body, ctype = make_payload("cpu-preprocess", random.Random(0))
    assert ctype == "image/jpeg" and body == jpeg
    rng = random.Random(0)
    lengths = []
    for _ in range(50):
        body, ctype = make_payload("prefill", rng)
        doc = json.loads(body)
        assert ctype == "application/json" and doc["stream"] is True and 16 <= doc["max_tokens"] <= 48
        lengths.append(len(doc["prompt"].split()))
    assert 64 <= min(lengths) < 1000 and 3000 < max(lengths) <= 4096  # widely varying prompt lengths


def test_preprocess_pipeline_shape() -> None:
    import numpy as np

    from diagnose.examples.service import decode_image, normalize, preprocess, resize

    img = decode_image(make_jpeg())
    assert img.size == (640, 480) and img.mode == "RGB"
    assert resize(img).size == (224, 224)
    arr = normalize(resize(img))
    assert arr.shape == (3, 224, 224) and arr.dtype == np.float32 and arr.flags.c_contiguous
    assert preprocess(make_jpeg()).shape == (3, 224, 224)


# --------------------------------------------------------------------------------------------
# prefill: streaming generation and the vLLM-compatible metrics
# --------------------------------------------------------------------------------------------


def test_metrics_exposition_without_a_process() -> None:
    from diagnose.examples.service import GenerationTimings, Metrics

    m = Metrics()
    check_exposition(m.prometheus("m", 0, 0), "m")
    m.begin()
    m.engine_step(prompt=1000, generation=1, prefix_queries=1000)
    m.observe_token(ttft_s=0.8)
    m.engine_step(generation=2)
    m.observe_token(itl_s=0.02)
    m.observe_token(itl_s=0.03)
    g = GenerationTimings(ttft_s=0.8, prefill_s=0.6, decode_s=0.05, inference_s=0.65, itl_s=(0.02, 0.03),
                          output_tokens=3)
    m.end(ok=True, e2e_s=0.9, queue_s=0.2, prompt_tokens=1000, generation=g)
    fams = check_exposition(m.prometheus("m", 1, 2, 0.25), "m")
    assert sample(fams, "vllm:num_requests_waiting", "vllm:num_requests_waiting") == 2
    assert sample(fams, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc") == 0.25
    assert sample(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 1000
    assert sample(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == 3
    assert sample(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 0
    assert sample(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 2
    assert sample(fams, "vllm:request_prefill_time_seconds", "vllm:request_prefill_time_seconds_sum") == 0.6
    ttft = {s.labels["le"]: s.value for s in fams["vllm:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")}
    assert ttft["0.75"] == 0 and ttft["1.0"] == 1 and ttft["+Inf"] == 1
    steps = buckets(fams, "demo_engine_step_tokens")  # one step of 1,001 tokens, one of 2
    assert steps["1.0"] == 0 and steps["8.0"] == 1
    assert steps["512.0"] == 1 and steps["1024.0"] == 2 == steps["+Inf"]
    assert sample(fams, "demo_engine_step_tokens", "demo_engine_step_tokens_sum") == 1003
    m.count_tokens(prompt=7)  # a request's tokens outside an engine step are no step
    fams = check_exposition(m.prometheus("m", 0, 0), "m")
    assert buckets(fams, "demo_engine_step_tokens")["+Inf"] == 2


def test_decoder_kv_cache_matches_a_full_prefill() -> None:
    import torch

    from diagnose.examples.service import DecoderConfig, TinyDecoderLM, detokenize, tokenize

    torch.manual_seed(0)
    model = TinyDecoderLM(DecoderConfig(vocab=97, d_model=32, n_heads=4, d_hidden=64, n_layers=2,
                                        max_model_len=64)).eval()
    ids = torch.randint(1, 97, (12,))
    with torch.no_grad():
        a, b = model.new_cache(16), model.new_cache(16)
        model.prefill(ids[:7], a)
        model.prefill(ids[:4], b)
        # one batched decode step of two sequences of different lengths ...
        logits = model.decode([int(ids[7]), int(ids[4])], [7, 4], [a, b])
        # ... equals prefilling each one token longer
        assert torch.allclose(logits[0], model.prefill(ids[:8], model.new_cache(16)), atol=1e-4)
        assert torch.allclose(logits[1], model.prefill(ids[:5], model.new_cache(16)), atol=1e-4)
    tokens = tokenize("Hello, world! hello", 97)
    assert len(tokens) == 5 and tokens[0] == tokens[4] and all(1 <= t < 97 for t in tokens)  # words, ",", "!"
    assert detokenize(5) == " t5"


def test_loadgen_result_has_no_ttft_for_unary_replies() -> None:
    result = LoadResult(requests=1, errors=0, throughput_rps=1.0, p50_ms=1.0, p99_ms=1.0, duration_s=1.0)
    assert result.ttft_p50_ms is None and result.to_dict()["ttft_p99_ms"] is None
