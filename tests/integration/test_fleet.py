"""`diagnose fleet` against a real fleet: the Debian Prometheus (started here on 127.0.0.1, a generated config,
scraping every second, a temporary storage folder, stopped at the end) scraping three demo replicas with
different pathologies under load, one target that is down, and two replayed real dcgm-exporter scrapes —
the power-capped T4 labelled with one replica's pod, an idle L4 that no replica claims. The fleet is
judged from Prometheus alone, through the real command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diagnose.examples.demo import PATHOLOGIES, DemoService, Load
from diagnose.examples.fleet import (
    T4_SCRAPE,
    DcgmReplay,
    Job,
    PrometheusServer,
    find_prometheus,
    free_port,
    write_openmetrics,
)
from tests.conftest import ROOT

REPO_ROOT = Path(ROOT)
pytestmark = pytest.mark.integration
needs_prometheus = pytest.mark.skipif(find_prometheus() is None, reason="prometheus is not installed (apt-get install "
                                      "prometheus; .ci/run does)")
L4_SCRAPE = REPO_ROOT / "tests" / "data" / "dcgm" / "l4_idle_full_default_scrape_kops.prom"
WINDOW_S = 30
MAX_REQUESTS = 50_000  # every load loop is bounded in count as well as in time


def _diagnose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


@needs_prometheus
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


@needs_prometheus
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


@needs_prometheus
@pytest.mark.timeout(300)
def test_a_backfilled_fleet_and_a_server_that_answers_only_part(tmp_path: Path) -> None:
    """15 minutes of three generated replicas (replica 0 carries 8× the load) backfilled with promtool: judged
    from the server; then the same blocks behind a server whose sample limit fails some queries (a partial
    answer: the problems are listed and no replica is called healthy); then one that cannot even find the
    replicas (one sentence, exit 2)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (it comes with apt-get install prometheus)")
    end = int(time.time()) // 60 * 60 - 3 * 3600
    om = tmp_path / "fleet.om"
    write_openmetrics(str(om), 3, 15, end)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(om),
                    str(tmp_path / "data")], check=True, timeout=120)
    args = ("--window", "15m", "--at", str(end), "--format", "json")
    with PrometheusServer([], storage=str(tmp_path / "data"), retention="3650d") as prom:
        whole = _diagnose("fleet", "--prometheus", prom.url, *args)
    assert whole.returncode == 0, whole.stderr
    doc = json.loads(whole.stdout)
    by = {r["instance"]: r for r in doc["replicas"]}
    assert by["10.0.0.1:8000"]["primary"] == "queueing"
    assert {by[i]["verdict"] for i in ("10.0.1.1:8000", "10.0.2.1:8000")} == {"healthy"}
    assert all(len(r["gpus"]) == 1 for r in doc["replicas"])  # each replica's GPU, by its pod label
    assert ("10.0.0.1:8000", "queue") in {(o["instance"], o["kind"]) for o in doc["outliers"]}
    assert doc["imbalance"]["imbalanced"] and doc["imbalance"]["busiest"] == "10.0.0.1:8000"
    assert doc["problems"] == []
    with PrometheusServer([], storage=str(tmp_path / "data"), retention="3650d",
                          extra_args=["--query.max-samples=500"]) as prom:
        part = _diagnose("fleet", "--prometheus", prom.url, *args)
        text = _diagnose("fleet", "--prometheus", prom.url, *args[:-2])
    assert part.returncode == 0, part.stderr
    pdoc = json.loads(part.stdout)
    assert pdoc["problems"] and all("too many samples" in p for p in pdoc["problems"])
    assert all(r["verdict"] != "healthy" for r in pdoc["replicas"])
    assert "Partial answer" in text.stdout
    with PrometheusServer([], storage=str(tmp_path / "data"), retention="3650d",
                          extra_args=["--query.max-samples=100"]) as prom:
        none = _diagnose("fleet", "--prometheus", prom.url, *args)
    assert none.returncode == 2 and none.stdout == ""
    assert "could not answer the query that finds the engine series" in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1


def test_demo_fleet_without_prometheus_says_how_to_install_it() -> None:
    r = subprocess.run([sys.executable, "-m", "diagnose", "demo", "--fleet"], capture_output=True, text=True,
                       cwd=REPO_ROOT, timeout=120, env={**os.environ, "DIAGNOSE_PROMETHEUS_BIN": "/nonexistent"})
    assert r.returncode == 2 and "apt-get install prometheus" in r.stderr and "Traceback" not in r.stderr
