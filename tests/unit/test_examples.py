"""The demo service, its load generator and the DemoService/Load helpers, against real processes.

The ``recompile`` pathology is not exercised here (each compile takes seconds); see
examples/service/recompile.py for how it was verified.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from typing import Any

import psutil
import pytest

from examples.demo import PATHOLOGIES, DemoService, ServiceStartError, background_load
from examples.loadgen import LoadResult, make_jpeg, make_payload, run_load


def _request(
    port: int, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": content_type} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return members


def _assert_gone(pid: int) -> None:
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _group_members(pid) == []


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

    from examples.service import decode_image, normalize, preprocess, resize

    img = decode_image(make_jpeg())
    assert img.size == (640, 480) and img.mode == "RGB"
    assert resize(img).size == (224, 224)
    arr = normalize(resize(img))
    assert arr.shape == (3, 224, 224) and arr.dtype == np.float32 and arr.flags.c_contiguous
    assert preprocess(make_jpeg()).shape == (3, 224, 224)


def test_healthy_service_serves_and_leaves_no_process() -> None:
    with DemoService("healthy") as svc:
        pid = svc.pid
        assert svc.url == f"http://127.0.0.1:{svc.port}" and svc.port > 0
        assert psutil.pid_exists(pid)
        status, doc = _request(svc.port, "GET", "/healthz")
        assert status == 200 and doc["status"] == "ok" and doc["pathology"] == "healthy"
        for i in range(3):
            status, doc = _request(svc.port, "POST", "/infer", json.dumps({"tokens": [i, 5, 7]}).encode())
            assert status == 200, doc
            assert doc["rows"] == 1 and len(doc["top_class"]) == 1 and 0 < doc["top_prob"][0] <= 1
            assert doc["latency_ms"] > 0
        status, doc = _request(svc.port, "POST", "/infer", b"not json")
        assert status == 400 and "JSON" in doc["error"]
        status, doc = _request(svc.port, "POST", "/infer", json.dumps({"tokens": []}).encode())
        assert status == 400
        status, doc = _request(svc.port, "GET", "/nope")
        assert status == 404
        status, stats = _request(svc.port, "GET", "/stats")
        assert status == 200 and stats["pid"] == pid and stats["completed"] == 3 and stats["in_flight"] == 0
        conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        assert 'vllm:request_success_total{model_name="healthy"} 3' in text
        assert "vllm:num_requests_waiting" in text and "vllm:e2e_request_latency_seconds_bucket" in text

        with background_load(svc.url, PATHOLOGIES["healthy"], duration_s=1.5, stop_on_exit=False) as load:
            assert load.running
        result = load.result
        assert result is not None and result.requests > 3 and result.errors == 0
        assert 0 < result.p50_ms <= result.p99_ms
    assert svc.proc is not None and svc.proc.returncode == 0  # clean exit on SIGTERM
    _assert_gone(pid)


def test_queueing_service_piles_up_requests() -> None:
    spec = PATHOLOGIES["queueing"]
    with DemoService("queueing") as svc:
        pid = svc.pid
        seen: list[dict[str, Any]] = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                seen.append(_request(svc.port, "GET", "/stats")[1])
                stop.wait(0.2)

        with background_load(svc.url, spec, duration_s=30) as load:
            time.sleep(1.0)
            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(2.0)
            stop.set()
            poller.join()
        # leaving the context stopped the clients long before 30 s
        result = load.result
        assert result is not None and result.duration_s < 20
        assert result.errors == 0 and result.requests >= 10
        assert max(s["in_flight"] for s in seen) >= 8
        assert max(s["queue_depth"] for s in seen) >= 4
        # queued requests wait for the one worker: latency well above one inference
        assert result.p50_ms > 200
        status, doc = _request(svc.port, "POST", "/infer", json.dumps({"tokens": [1, 2, 3]}).encode())
        assert status == 200 and doc["tokens"] == 128
    _assert_gone(pid)


def test_cpu_preprocess_service_accepts_jpeg() -> None:
    import base64

    with DemoService("cpu-preprocess") as svc:
        pid = svc.pid
        status, doc = _request(svc.port, "POST", "/infer", make_jpeg(), content_type="image/jpeg")
        assert status == 200 and doc["rows"] == 1
        body = json.dumps({"image_b64": base64.b64encode(make_jpeg()).decode()}).encode()
        status, doc = _request(svc.port, "POST", "/infer", body)
        assert status == 200
        status, doc = _request(svc.port, "POST", "/infer", b"\xff\xd8garbage", content_type="image/jpeg")
        assert status == 400
    _assert_gone(pid)


def test_demo_service_reports_a_failed_start() -> None:
    with pytest.raises(ValueError, match="unknown pathology"):
        DemoService("no-such-thing")
    svc = DemoService("healthy", extra_args=["--torch-threads", "many"])
    with pytest.raises(ServiceStartError, match="invalid int value"):
        svc.start()
    assert svc.proc is not None
    _assert_gone(svc.proc.pid)


# --------------------------------------------------------------------------------------------
# prefill: streaming generation and the vLLM-compatible metrics
# --------------------------------------------------------------------------------------------

_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
)
_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
_COUNTERS = (
    "vllm:request_success",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)


def _families(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(fams: dict[str, Any], family: str, sample: str) -> float:
    values = [s.value for s in fams[family].samples if s.name == sample]
    assert len(values) == 1, (sample, values)
    return values[0]


def _check_exposition(text: str, model_name: str) -> dict[str, Any]:
    """Every vLLM family parses with its type; histograms are cumulative and end in +Inf = _count."""
    fams = _families(text)
    for name in _HISTOGRAMS:
        fam = fams[name]
        assert fam.type == "histogram", name
        buckets = [s for s in fam.samples if s.name == name + "_bucket"]
        assert all(s.labels["model_name"] == model_name for s in fam.samples)
        assert buckets[-1].labels["le"] == "+Inf"
        counts = [s.value for s in buckets]
        assert counts == sorted(counts), name
        bounds = [float(s.labels["le"]) for s in buckets]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
        assert counts[-1] == _sample(fams, name, name + "_count")
    for name in _GAUGES:
        assert fams[name].type == "gauge", name
    for name in _COUNTERS:
        assert fams[name].type == "counter", name
    kv = _sample(fams, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc")
    assert 0.0 <= kv <= 1.0
    return fams


def test_metrics_exposition_without_a_process() -> None:
    from examples.service import GenerationTimings, Metrics

    m = Metrics()
    _check_exposition(m.prometheus("m", 0, 0), "m")
    m.begin()
    m.count_tokens(prompt=1000, generation=1, prefix_queries=1000)
    m.observe_token(ttft_s=0.8)
    m.count_tokens(generation=2)
    m.observe_token(itl_s=0.02)
    m.observe_token(itl_s=0.03)
    g = GenerationTimings(ttft_s=0.8, prefill_s=0.6, decode_s=0.05, inference_s=0.65, itl_s=(0.02, 0.03),
                          output_tokens=3)
    m.end(ok=True, e2e_s=0.9, queue_s=0.2, prompt_tokens=1000, generation=g)
    fams = _check_exposition(m.prometheus("m", 1, 2, 0.25), "m")
    assert _sample(fams, "vllm:num_requests_waiting", "vllm:num_requests_waiting") == 2
    assert _sample(fams, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc") == 0.25
    assert _sample(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 1000
    assert _sample(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == 3
    assert _sample(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 0
    assert _sample(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 2
    assert _sample(fams, "vllm:request_prefill_time_seconds", "vllm:request_prefill_time_seconds_sum") == 0.6
    ttft = {s.labels["le"]: s.value for s in fams["vllm:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")}
    assert ttft["0.75"] == 0 and ttft["1.0"] == 1 and ttft["+Inf"] == 1


def test_decoder_kv_cache_matches_a_full_prefill() -> None:
    import torch

    from examples.service import DecoderConfig, TinyDecoderLM, detokenize, tokenize

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


def _stream(port: int, doc: dict[str, Any]) -> tuple[http.client.HTTPResponse, list[tuple[float, dict[str, Any]]]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/infer", body=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        lines = [(time.perf_counter(), json.loads(raw)) for raw in resp if raw.strip()]
        return resp, lines
    finally:
        conn.close()


def test_prefill_service_streams_tokens_and_exposes_vllm_metrics(tmp_path, monkeypatch) -> None:
    import examples.loadgen as loadgen

    stage_log = tmp_path / "stages.jsonl"
    with DemoService("prefill", extra_args=["--stage-log", str(stage_log)]) as svc:
        pid = svc.pid
        prompt_tokens, output_tokens = 0, 0
        for words, max_tokens in ((40, 5), (600, 3)):
            prompt = " ".join(f"w{i % 97}" for i in range(words))
            resp, lines = _stream(svc.port, {"prompt": prompt, "max_tokens": max_tokens})
            assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
            assert resp.getheader("Content-Type") == "application/x-ndjson"
            tokens, summary = [d for _, d in lines[:-1]], lines[-1][1]
            assert [t["index"] for t in tokens] == list(range(max_tokens))
            assert all(isinstance(t["token"], int) and t["text"] for t in tokens)
            assert summary["done"] is True and summary["prompt_tokens"] == words
            assert summary["output_tokens"] == max_tokens
            assert 0 < summary["prefill_ms"] <= summary["ttft_ms"] <= summary["latency_ms"]
            assert lines[0][0] <= lines[-2][0]  # the first token arrived before the last one
            prompt_tokens += words
            output_tokens += max_tokens
        status, doc = _request(svc.port, "POST", "/infer",
                               json.dumps({"prompt_tokens": [1, 2, 3], "max_tokens": 4, "stream": False}).encode())
        assert status == 200 and len(doc["tokens"]) == 4 and doc["prompt_tokens"] == 3
        prompt_tokens += 3
        output_tokens += 4
        for bad in ({}, {"prompt": ""}, {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "stream": "yes"},
                    {"prompt_tokens": list(range(8190)), "max_tokens": 8}):
            status, doc = _request(svc.port, "POST", "/infer", json.dumps(bad).encode())
            assert status == 400 and doc["error"], bad

        conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10)
        conn.request("GET", "/metrics")
        fams = _check_exposition(conn.getresponse().read().decode(), "prefill")
        conn.close()
        n = 3
        assert _sample(fams, "vllm:request_success", "vllm:request_success_total") == n
        assert _sample(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == prompt_tokens
        assert _sample(fams, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == prompt_tokens
        assert _sample(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 0
        assert _sample(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == output_tokens
        assert _sample(fams, "vllm:num_preemptions", "vllm:num_preemptions_total") == 0
        for name in ("vllm:time_to_first_token_seconds", "vllm:request_prefill_time_seconds",
                     "vllm:request_decode_time_seconds", "vllm:request_queue_time_seconds",
                     "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens"):
            assert _sample(fams, name, name + "_count") == n, name
        itl = "vllm:inter_token_latency_seconds"
        assert _sample(fams, itl, itl + "_count") == output_tokens - n
        assert _sample(fams, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == prompt_tokens
        assert _sample(fams, "vllm:num_requests_running", "vllm:num_requests_running") == 0

        # the load generator streams and measures time to first token (short prompts: a fast test)
        monkeypatch.setattr(loadgen, "PROMPT_WORDS_RANGE", (16, 64))
        monkeypatch.setattr(loadgen, "PREFILL_MAX_TOKENS_RANGE", (2, 4))
        monkeypatch.setattr(loadgen, "START_STAGGER_S", {})
        result = run_load(svc.url, "prefill", 2, 30.0, max_requests=4)
        assert result.requests == 4 and result.errors == 0
        assert result.ttft_p50_ms is not None and result.ttft_p99_ms is not None
        assert 0 < result.ttft_p50_ms <= result.p99_ms
    _assert_gone(pid)

    records = [json.loads(line) for line in stage_log.read_text().splitlines()]
    assert len(records) == n + 4
    for rec in records:
        assert set(rec["stages_ms"]) == {"preprocess", "queue", "prefill", "decode"}
        assert rec["status"] == "ok" and rec["input_tokens"] > 0 and rec["output_tokens"] > 0
        assert rec["ttft_ms"] >= rec["stages_ms"]["prefill"] > 0
        assert rec["e2e_ms"] >= rec["ttft_ms"]


def test_loadgen_result_has_no_ttft_for_unary_replies() -> None:
    result = LoadResult(requests=1, errors=0, throughput_rps=1.0, p50_ms=1.0, p99_ms=1.0, duration_s=1.0)
    assert result.ttft_p50_ms is None and result.to_dict()["ttft_p99_ms"] is None
