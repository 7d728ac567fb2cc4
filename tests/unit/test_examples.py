"""The demo service, its load generator and the DemoService/Load helpers, against real processes.

The ``recompile`` pathology is not exercised here (each compile takes seconds); see
examples/service.py for how it was verified.
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
    assert set(PATHOLOGIES) == {"cpu-preprocess", "recompile", "queueing", "healthy"}
    categories = {name: spec.expected_category for name, spec in PATHOLOGIES.items()}
    assert categories == {
        "cpu-preprocess": "cpu_preprocessing",
        "recompile": "recompilation",
        "queueing": "queueing",
        "healthy": None,
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
