"""`diagnose fleet` without a fleet: the command line's values, the query API client against real loopback
HTTP servers (one that is not Prometheus, one that wants a token, a closed port), and the judging and
summary of replicas whose answers are given as the server would give them.

The whole path against a real Prometheus scraping real replicas is tests/integration/test_fleet.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diagnose import fleet
from diagnose.collectors.dcgm import DcgmBuffer
from diagnose.collectors.promapi import MAX_POINTS, Auth, PromApi, PromApiError, check_url, load_auth, step_for
from diagnose.errors import InputError
from diagnose.examples.fleet import relabel
from diagnose.reports import fleet as render
from tests.cli import run_cli
from tests.conftest import DATA
from tests.verdicts import committed_as_calibrated, rules_primary

T4 = Path(DATA) / "dcgm" / "t4_busy_util91_engine16_power_capped_ericsson.prom"
SECRET = "s3cr3t-t0ken-do-not-print"


# -- the command line's values -------------------------------------------------------------------------


def test_selector_duration_and_time_parsing() -> None:
    assert fleet.parse_selector('{job="vllm", namespace=~"llm-.*"}') == 'job="vllm", namespace=~"llm-.*"'
    assert fleet.parse_selector("") == ""
    for bad in ('job="vllm"', '{job=vllm}', '{__name__="up"}', "{job='x'}"):
        with pytest.raises(InputError) as err:
            fleet.parse_selector(bad)
        assert "--selector" in err.value.message and err.value.remedy
    assert fleet.parse_duration("15m") == 900 and fleet.parse_duration("1h") == 3600
    assert fleet.parse_duration("90") == 90
    with pytest.raises(InputError):
        fleet.parse_duration("fifteen minutes")
    assert fleet.parse_time("2025-06-02T10:00:00Z") == 1748858400.0
    assert fleet.parse_time("now", now=lambda: 42.0) == 42.0
    with pytest.raises(InputError) as err:
        fleet.parse_time("2025-06-02T10:00:00")
    assert "time zone" in err.value.message


@given(st.floats(min_value=1.0, max_value=400 * 86400.0))
def test_the_step_never_exceeds_the_servers_point_limit(window: float) -> None:
    step = step_for(window, fleet.TARGET_POINTS)
    assert window / step + 1 <= MAX_POINTS
    assert step >= 1.0


def test_step_for_fifteen_minutes_gives_about_the_target_points() -> None:
    step = step_for(900, fleet.TARGET_POINTS)
    assert 100 <= 900 / step + 1 <= 140


def test_urls_with_credentials_or_no_scheme_are_refused() -> None:
    with pytest.raises(PromApiError) as err:
        check_url("http://admin:hunter2@prom:9090")
    assert "hunter2" not in err.value.message and "hunter2" not in err.value.remedy
    with pytest.raises(PromApiError):
        check_url("prom:9090")
    assert check_url("http://prom:9090/graph") == "http://prom:9090"
    assert check_url("https://mimir:8080/prometheus/api/v1/query") == "https://mimir:8080/prometheus"


def test_credentials_come_from_a_file_or_the_environment_and_never_show(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text(SECRET + "\n")
    auth = load_auth(str(tok), None, env={})
    assert auth.header() == f"Bearer {SECRET}"
    assert SECRET not in repr(auth) and SECRET not in auth.describe()
    assert load_auth(None, None, env={"DIAGNOSE_PROMETHEUS_TOKEN": "abc"}).header() == "Bearer abc"
    basic = tmp_path / "basic"
    basic.write_text("alice:pw")
    assert load_auth(None, str(basic), env={}).header() == "Basic YWxpY2U6cHc="
    basic.write_text("no colon here")
    with pytest.raises(PromApiError) as err:
        load_auth(None, str(basic), env={})
    assert "USER:PASSWORD" in err.value.message
    assert load_auth(None, None, env={}) == Auth()


# -- the client against real loopback HTTP servers -------------------------------------------------------


@contextmanager
def server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


class NotPrometheus(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = b"<html><body>Grafana login</body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class WantsToken(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        WantsToken.seen.append(self.headers.get("Authorization", ""))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Authorization") != f"Bearer {SECRET}":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"instance": "a:1"}, "value": [1.0, "3"]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_answer_that_is_not_the_query_api_is_named() -> None:
    with server(NotPrometheus) as url, pytest.raises(PromApiError) as err:
        PromApi(url).query("vector(1)", 0.0)
    assert err.value.kind == "not_api"
    assert "does not answer the Prometheus query API" in err.value.message and "HTTP 404, HTML" in err.value.message
    assert "base URL" in err.value.remedy


def test_a_bearer_token_is_sent_and_a_refusal_never_shows_it(tmp_path: Path) -> None:
    with server(WantsToken) as url:
        with pytest.raises(PromApiError) as err:
            PromApi(url, auth=Auth(token="wrong", origin="$DIAGNOSE_PROMETHEUS_TOKEN")).query("up", 0.0)
        assert err.value.kind == "auth" and "HTTP 401" in err.value.message
        assert "wrong" not in err.value.message + err.value.remedy
        got = PromApi(url, auth=Auth(token=SECRET, origin="a file")).query("up", 0.0)
    assert got == [{"metric": {"instance": "a:1"}, "value": [1.0, "3"]}]
    assert WantsToken.seen[-1] == f"Bearer {SECRET}"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("case", ["unreachable", "not_api", "bad_selector", "credentials_in_url", "bad_window"])
def test_fleet_bad_input_is_one_sentence_and_exit_2(case: str, tmp_path: Path) -> None:
    if case == "not_api":
        with server(NotPrometheus) as url:
            r = run_cli("fleet", "--prometheus", url)
    elif case == "unreachable":
        r = run_cli("fleet", "--prometheus", f"http://127.0.0.1:{_closed_port()}", "--timeout", "5")
    elif case == "bad_selector":
        r = run_cli("fleet", "--prometheus", "http://127.0.0.1:9", "--selector", "job=vllm")
    elif case == "credentials_in_url":
        r = run_cli("fleet", "--prometheus", f"http://admin:{SECRET}@127.0.0.1:9")
    else:
        r = run_cli("fleet", "--prometheus", "http://127.0.0.1:9", "--window", "a while")
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagnose: ") and "Traceback" not in r.stderr
    assert SECRET not in r.stderr
    expected = {"unreachable": "cannot reach Prometheus at", "not_api": "does not answer the Prometheus query API",
                "bad_selector": "is not a PromQL label selector", "credentials_in_url": "carries credentials",
                "bad_window": "is not a duration"}[case]
    assert expected in lines[0]


# -- judging and summarising replicas ------------------------------------------------------------------------


def _series(values: list[float], t0: float = 1000.0) -> list[tuple[float, float]]:
    return [(t0 + i, v) for i, v in enumerate(values)]


def _replica(name: str, *, waiting: float, running: float, rps: float, queue_ms: float, e2e_ms: float,
             pod: str = "") -> fleet.Replica:
    labels = {"instance": name, "job": "vllm", **({"pod": pod, "namespace": "llm"} if pod else {})}
    r = fleet.Replica(key=(name,), labels=labels, names={"vllm:num_requests_running", "vllm:num_requests_waiting",
                                                           "vllm:e2e_request_latency_seconds_bucket"})
    r.gauges = {"running": _series([running] * 60), "waiting": _series([waiting] * 60),
                "kv_usage": _series([0.5 if waiting < 1 else 0.97] * 60)}
    n = rps * 60
    r.counters = {"requests_success": n}
    r.histograms = {
        "e2e": {"quantiles": {0.5: e2e_ms * 0.8, 0.9: e2e_ms, 0.99: e2e_ms * 1.3}, "sum": e2e_ms * n, "count": n},
        "queue": {"quantiles": {0.5: queue_ms * 0.8, 0.9: queue_ms, 0.99: queue_ms * 1.3}, "sum": queue_ms * n,
                  "count": n},
    }
    return r


def _t4_for(pod: str) -> Any:
    buf = DcgmBuffer()
    for line in relabel(T4.read_text(), {"pod": pod, "namespace": "llm", "container": "engine"}).splitlines():
        buf.feed(line)
    return buf.result()


def _data(replicas: list[fleet.Replica], dcgm: Any = None) -> fleet.FleetData:
    return fleet.FleetData(url="http://prom:9090", start=1000.0, end=1060.0, step_s=1.0, scrape_s=1.0,
                           by=("instance",), selector="", replicas={r.key: r for r in replicas}, dcgm=dcgm,
                           problems=[], queries=50, bytes=1000)


def test_each_replica_is_judged_and_the_fleet_summarised() -> None:
    reps = [
        _replica("10.0.0.1:8000", waiting=0.0, running=3, rps=5.0, queue_ms=2, e2e_ms=400, pod="vllm-0"),
        _replica("10.0.0.2:8000", waiting=0.1, running=3, rps=5.2, queue_ms=3, e2e_ms=420, pod="vllm-1"),
        _replica("10.0.0.3:8000", waiting=60.0, running=32, rps=5.1, queue_ms=9000, e2e_ms=12000, pod="vllm-2"),
        fleet.Replica(key=("10.0.0.4:8000",), labels={"instance": "10.0.0.4:8000", "job": "vllm"}, up_ratio=0.0),
    ]
    data = _data(reps, dcgm=_t4_for("vllm-1"))  # vllm-1's GPU: the real power-capped T4
    fleet.judge_fleet(data)
    doc = fleet.summarise(data)
    by = {r["instance"]: r for r in doc["replicas"]}
    assert by["10.0.0.3:8000"]["primary"] == "queueing"
    assert by["10.0.0.1:8000"]["verdict"] == "healthy"
    assert by["10.0.0.2:8000"]["primary"] == "gpu_compute" and by["10.0.0.2:8000"]["gpus"] == [
        "GPU 0 (Tesla T4) on cp-bm14r7"]
    assert by["10.0.0.4:8000"]["verdict"] is None and "up = 0" in by["10.0.0.4:8000"]["missing"]
    assert doc["counts"] == {"gpu_compute": 1, "queueing": 1, "healthy": 1}
    assert doc["schema"] == "diagnose/fleet/v1" and doc["verdict"] == "bottleneck"
    kinds = {(o["instance"], o["kind"]) for o in doc["outliers"]}
    assert ("10.0.0.3:8000", "queue") in kinds  # 60 waiting against a median of 0.1
    assert ("10.0.0.2:8000", "throttling") in kinds  # its GPU is held at the power limit
    assert not any(k == "foreign_memory" for _, k in kinds)  # the T4 is only vllm-1's own pod
    assert doc["imbalance"]["imbalanced"] is False  # 5.0 / 5.1 / 5.2 req/s
    assert doc["headroom"]["kv_cache"]["fullest"] == "10.0.0.3:8000"
    assert "1 replica(s) could not be judged" in doc["summary"]
    assert any("10.0.0.3:8000" in t for t in doc["where_to_look"])
    # every format renders the same document
    text = render.render_text(doc)
    assert "10.0.0.3:8000 (vllm-2)" in text and "Outliers" in text and "up = 0" in text
    assert render.heatmap(doc).figure is not None
    html = render.render_html(doc)
    assert '<script type="application/json" id="fleet">' in html
    assert 'src="http' not in html and "10.0.0.3:8000 (vllm-2)" in html  # one file, nothing fetched
    assert "| 10.0.0.3:8000 (vllm-2) | queueing |" in render.render_markdown(doc)


def test_uneven_load_and_a_shared_gpu_are_named() -> None:
    reps = [_replica(f"10.0.1.{i}:8000", waiting=0.0, running=2, rps=rps, queue_ms=1, e2e_ms=100, pod=f"p{i}")
            for i, rps in enumerate((12.0, 2.0, 2.1, 1.9))]
    t4 = _t4_for("p1")
    # the same GPU also labelled with another tenant's pod (time-slicing): dcgm-exporter lists it once per pod
    buf = DcgmBuffer()
    for line in (relabel(T4.read_text(), {"pod": "p1", "namespace": "llm"})
                 + relabel(T4.read_text(), {"pod": "batch-job", "namespace": "research"})).splitlines():
        buf.feed(line)
    assert len(t4.gpus) == 1
    data = _data(reps, dcgm=buf.result())
    fleet.judge_fleet(data)
    doc = fleet.summarise(data)
    assert doc["imbalance"]["imbalanced"] is True and doc["imbalance"]["busiest"] == "10.0.1.0:8000"
    shared = [o for o in doc["outliers"] if o["kind"] == "foreign_memory"]
    assert shared and "research/batch-job" in shared[0]["message"] and shared[0]["instance"] == "10.0.1.1:8000"


def test_a_gpu_no_replica_claims_is_judged_on_its_own() -> None:
    reps = [_replica("10.0.2.1:8000", waiting=0.0, running=1, rps=1.0, queue_ms=1, e2e_ms=50, pod="other")]
    data = _data(reps, dcgm=_t4_for("not-a-replica"))
    fleet.judge_fleet(data)
    doc = fleet.summarise(data)
    assert doc["replicas"][0]["gpus"] == []
    # one DCGM reading of a throttled T4: gpu_compute is what the rules name; one reading is not sure enough
    # to commit to (the calibrated probability decides), so the document's primary is it or nothing
    (_, judged), = data.unclaimed
    assert rules_primary(judged) == "gpu_compute" and committed_as_calibrated(judged)
    assert [g["primary"] for g in doc["unclaimed_gpus"]] == [judged.primary.value if judged.primary else None]
    assert "GPUs no replica claims" in render.render_text(doc)


