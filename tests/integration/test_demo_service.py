"""The demo service and its DemoService/Load helpers against real processes (moved from the unit tests).

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

from diagnose.examples.demo import PATHOLOGIES, DemoService, ServiceStartError, background_load
from diagnose.examples.loadgen import make_jpeg, run_load
from tests.vllm_metrics import buckets, check_exposition, sample

pytestmark = pytest.mark.integration


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
    import diagnose.examples.loadgen as loadgen

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
            # a refused request has left /stats by the time its reply is read (it used to leave after it)
            status, stats = _request(svc.port, "GET", "/stats")
            assert status == 200 and stats["in_flight"] == 0, (bad, stats)
        assert stats["errors"] == 5 and stats["completed"] == 3

        conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10)
        conn.request("GET", "/metrics")
        fams = check_exposition(conn.getresponse().read().decode(), "prefill")
        conn.close()
        n = 3
        assert sample(fams, "vllm:request_success", "vllm:request_success_total") == n
        assert sample(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == prompt_tokens
        assert sample(fams, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == prompt_tokens
        assert sample(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 0
        assert sample(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == output_tokens
        assert sample(fams, "vllm:num_preemptions", "vllm:num_preemptions_total") == 0
        for name in ("vllm:time_to_first_token_seconds", "vllm:request_prefill_time_seconds",
                     "vllm:request_decode_time_seconds", "vllm:request_queue_time_seconds",
                     "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens"):
            assert sample(fams, name, name + "_count") == n, name
        itl = "vllm:inter_token_latency_seconds"
        assert sample(fams, itl, itl + "_count") == output_tokens - n
        assert sample(fams, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == prompt_tokens
        assert sample(fams, "vllm:num_requests_running", "vllm:num_requests_running") == 0
        # one request at a time: one engine step per output token (its prefill gives the first), and the
        # 600-token prompt's whole prefill is the one step of more than 512 tokens
        steps = buckets(fams, "demo_engine_step_tokens")
        assert steps["+Inf"] == output_tokens and steps["+Inf"] - steps["512.0"] == 1, steps
        assert sample(fams, "demo_engine_step_tokens", "demo_engine_step_tokens_sum") \
            == prompt_tokens + output_tokens

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

