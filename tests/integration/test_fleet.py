"""`diagnose fleet` against a real fleet: the Debian Prometheus (started here on 127.0.0.1, a generated config,
scraping every second, a temporary storage folder, stopped at the end) scraping three demo replicas with
different pathologies under load, one target that is down, and two replayed real dcgm-exporter scrapes —
the power-capped T4 labelled with one replica's pod, an idle L4 that no replica claims. The fleet is
judged from Prometheus alone, through the real command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from examples.demo import PATHOLOGIES, DemoService, Load
from examples.fleet import (
    REPO_ROOT,
    T4_SCRAPE,
    DcgmReplay,
    Job,
    PrometheusServer,
    find_prometheus,
    free_port,
)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_prometheus() is None, reason="prometheus is not installed (apt-get install "
                                 "prometheus; .ci/run does)")]
L4_SCRAPE = REPO_ROOT / "tests" / "data" / "dcgm" / "l4_idle_full_default_scrape_kops.prom"
WINDOW_S = 30
MAX_REQUESTS = 50_000  # every load loop is bounded in count as well as in time


def _diagnose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


@pytest.mark.timeout(600)
def test_fleet_names_each_replicas_bottleneck_from_a_real_prometheus() -> None:
    specs = [("replica-1", "queueing", 8), ("replica-2", "prefill", None), ("replica-3", "healthy", None)]
    down = f"127.0.0.1:{free_port()}"  # nothing listens there: Prometheus records up = 0
    with DemoService("queueing") as q, DemoService("prefill") as p, DemoService("healthy") as h, \
            DcgmReplay(T4_SCRAPE, pod="replica-3", namespace="demo", container="engine") as t4, \
            DcgmReplay(L4_SCRAPE) as l4:
        services = [q, p, h]
        jobs = [Job("demo", [f"127.0.0.1:{s.port}" for s in services] + [down],
                    per_target_labels=[{"pod": pod, "namespace": "demo"} for pod, _, _ in specs]
                    + [{"pod": "replica-down", "namespace": "demo"}]),
                Job("dcgm-exporter", [t4.address, l4.address])]
        loads = [Load(s.url, PATHOLOGIES[name], WINDOW_S + 90, concurrency=c, max_requests=MAX_REQUESTS)
                 for s, (_, name, c) in zip(services, specs, strict=True)]
        with PrometheusServer(jobs, scrape_interval="1s") as prom, loads[0], loads[1], loads[2]:
            prom.wait_for_targets(min_samples=3)
            threading.Event().wait(WINDOW_S)  # let Prometheus record the window under load
            r = _diagnose("fleet", "--prometheus", prom.url, "--window", f"{WINDOW_S}s", "--by", "pod",
                          "--selector", '{job="demo"}', "--format", "json")
            text = _diagnose("fleet", "--prometheus", prom.url, "--window", f"{WINDOW_S}s", "--by", "pod",
                             "--selector", '{job="demo"}')
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "diagnose/fleet/v1" and doc["verdict"] == "bottleneck"
    by = {rep["instance"]: rep for rep in doc["replicas"]}
    assert set(by) == {"replica-1", "replica-2", "replica-3", "replica-down"}
    assert by["replica-1"]["primary"] == "queueing", by["replica-1"]
    assert by["replica-2"]["primary"] == "prefill_ttft", by["replica-2"]
    # the healthy service carries the replayed T4: its GPU, power-capped and under-filled, is the finding
    assert by["replica-3"]["primary"] == "gpu_compute", by["replica-3"]
    assert by["replica-3"]["gpus"] == ["GPU 0 (Tesla T4) on cp-bm14r7"]
    assert {f["code"] for f in by["replica-3"]["findings"]} >= {"GPU002", "GPU003"}
    assert not any(f["category"] in ("queueing", "prefill_ttft") for f in by["replica-3"]["findings"])
    # the replica that was never up is listed with the reason, not judged
    assert by["replica-down"]["verdict"] is None and "up = 0" in by["replica-down"]["missing"]
    assert doc["counts"] == {"queueing": 1, "prefill_ttft": 1, "gpu_compute": 1}
    assert doc["primary"] in ("queueing", "prefill_ttft", "gpu_compute")
    kinds = {(o["instance"], o["kind"]) for o in doc["outliers"]}
    assert ("replica-1", "queue") in kinds and ("replica-3", "throttling") in kinds
    # the idle L4 names no pod and no replica's host: judged alone
    assert [g["gpu"] for g in doc["unclaimed_gpus"]] == ["GPU 0 (NVIDIA L4) on i-030791dc5a37cd257"]
    assert doc["unclaimed_gpus"][0]["primary"] is None
    # the numbers behind the verdicts came from the server's aggregation
    q1 = by["replica-1"]["key_numbers"]
    assert q1["serving.waiting_mean"] >= 2 and q1["throughput.rps"] > 1
    assert by["replica-2"]["key_numbers"]["latency.ttft_ms.p99"] > by["replica-3"]["key_numbers"].get(
        "latency.ttft_ms.p99", 0)
    assert by["replica-1"]["series"]["serving.waiting"]  # the drill-down series
    assert doc["queries"] < 200 and doc["step_s"] >= 1
    assert text.returncode == 0 and "replica-1" in text.stdout and "Where to look:" in text.stdout


@pytest.mark.timeout(900)
def test_demo_fleet_prints_the_fleet_document() -> None:
    r = _diagnose("demo", "--fleet", "--duration", "30", "--format", "json", timeout=800)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    by = {rep["instance"]: rep for rep in doc["replicas"]}
    assert set(by) == {"replica-1", "replica-2", "replica-3", "replica-4"}
    assert by["replica-1"]["primary"] == by["replica-2"]["primary"] == "queueing"
    assert by["replica-3"]["primary"] == "prefill_ttft"
    assert by["replica-4"]["gpus"] and any(o["instance"] == "replica-4" and o["kind"] == "throttling"
                                           for o in doc["outliers"])
    assert doc["primary"] == "queueing" and doc["counts"]["queueing"] == 2
    assert "queueing is the bottleneck most replicas share (2 of 4 judged)" in doc["summary"]
    assert "diagnose fleet --prometheus" in r.stderr  # how to run it on your own fleet
